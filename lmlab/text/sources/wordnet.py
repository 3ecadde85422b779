"""The WordNet 3.0 database (Debian ``wordnet-base``): one reader of ``data.{noun,verb,adj,adv}``
(a synset per line, its gloss after ``|``) for the tasks (:func:`read_synsets`: supersense,
definition and examples) and the ``wordnet`` corpus source (a document per synset, its gloss
cleaned by :func:`synset_sentences`); and a lemma's inflected forms in a sentence
(:class:`LemmaMatcher`: regular inflections and the ``*.exc`` irregular forms).
"""

from __future__ import annotations

import functools
import re
from collections import defaultdict
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from lmlab.text.corpus import Document
from lmlab.text.sentences import normalize_text, split_sentences
from lmlab.text.sources.base import Source
from lmlab.utils.errors import LmlabError
from lmlab.utils.paths import find_system_path

# The 45 lexicographer files of WordNet 3.0 (lexnames(5WN)), index = lex_filenum.
STANDARD_LEXNAMES = (
    "adj.all", "adj.pert", "adv.all", "noun.Tops", "noun.act", "noun.animal", "noun.artifact",
    "noun.attribute", "noun.body", "noun.cognition", "noun.communication", "noun.event",
    "noun.feeling", "noun.food", "noun.group", "noun.location", "noun.motive", "noun.object",
    "noun.person", "noun.phenomenon", "noun.plant", "noun.possession", "noun.process",
    "noun.quantity", "noun.relation", "noun.shape", "noun.state", "noun.substance", "noun.time",
    "verb.body", "verb.change", "verb.cognition", "verb.communication", "verb.competition",
    "verb.consumption", "verb.contact", "verb.creation", "verb.emotion", "verb.motion",
    "verb.perception", "verb.possession", "verb.social", "verb.stative", "verb.weather",
    "adj.ppl",
)
POS_FILES = {"n": "noun", "v": "verb", "a": "adj", "r": "adv"}
_SYNTACTIC_MARKER = re.compile(r"\((?:a|p|ip)\)$")
_QUOTED = re.compile(r'"([^"]*)"(?:\s*-{1,2}\s*[^;"]*)?')  # an example and its attribution
_EXAMPLE = re.compile(r'"([^"]*)"')
_VOWELS = set("aeiou")


@dataclass
class Synset:
    """One WordNet synset: id ``<pos><offset>``, lemmas (spaces, no markers), supersense."""

    id: str
    pos: str  # n, v, a, r (adjective satellites ``s`` are folded into ``a``)
    lex_filenum: int
    lemmas: list[str]
    definition: str
    examples: list[str] = field(default_factory=list)
    gloss: str = ""  # as in the file: definition and quoted examples


def wordnet_dir() -> Path:
    """The folder holding WordNet's ``data.*`` files (``/usr/share/wordnet``)."""
    path = find_system_path("usr/share/wordnet/data.noun")
    if path is None:
        raise LmlabError("WordNet's database files (data.noun, ...) are not installed",
                         "install the Debian package wordnet-base (apt-get install wordnet-base)")
    return path.parent


def lexnames(folder: Path | None = None) -> list[str]:
    """Lexicographer file names by number: from ``lexnames`` if installed, else the standard 45."""
    folder = folder or wordnet_dir()
    path = folder / "lexnames"
    if path.is_file():
        names: dict[int, str] = {}
        for line in path.read_text(encoding="utf-8").splitlines():
            parts = line.split()
            if len(parts) >= 2 and parts[0].isdigit():
                names[int(parts[0])] = parts[1]
        if names:
            return [names.get(i, f"lex{i}") for i in range(max(names) + 1)]
    return list(STANDARD_LEXNAMES)


def split_gloss(gloss: str) -> tuple[str, list[str]]:
    """(definition, example sentences) of a gloss; the definition keeps no quoted examples."""
    examples = [m.group(1).strip() for m in _QUOTED.finditer(gloss) if m.group(1).strip()]
    rest = _QUOTED.sub("", gloss)
    parts = [p.strip() for p in rest.split(";")]
    definition = "; ".join(p for p in parts if p)
    return definition, examples


def _clean_lemma(word: str) -> str:
    return _SYNTACTIC_MARKER.sub("", word).replace("_", " ")


def read_synsets(folder: Path | None = None) -> list[Synset]:
    """Every synset of the four data files in file order, parsed once per process (about
    1.5 s): treat the result as read-only."""
    return _read_synsets(folder or wordnet_dir())


@functools.lru_cache(maxsize=2)
def _read_synsets(folder: Path) -> list[Synset]:
    return list(iter_synsets(folder))


def iter_synsets(folder: Path | None = None) -> Iterator[Synset]:
    """Every synset of the four data files in file order, read afresh."""
    folder = folder or wordnet_dir()
    for pos, name in POS_FILES.items():
        with open(folder / f"data.{name}", encoding="utf-8", errors="replace") as handle:
            for line in handle:
                synset = parse_synset_line(line, pos)
                if synset is not None:
                    yield synset


def parse_synset_line(line: str, pos: str) -> Synset | None:
    """The synset of one line of ``data.<pos>`` (None for the license header). A line is
    ``offset lex_filenum ss_type w_cnt word lex_id [word lex_id ...] ... | gloss`` (w_cnt in
    hex), the gloss a definition and quoted examples separated by ``;``."""
    if line.startswith("  ") or "|" not in line:
        return None
    head, _, gloss = line.partition("|")
    fields = head.split()
    count = int(fields[3], 16)
    words = [_clean_lemma(fields[4 + 2 * i]) for i in range(count)]
    definition, examples = split_gloss(gloss.strip())
    return Synset(id=f"{pos}{fields[0]}", pos=pos, lex_filenum=int(fields[1]), lemmas=words,
                  definition=definition, examples=examples, gloss=gloss.strip())


def read_exceptions(folder: Path | None = None) -> dict[str, dict[str, list[str]]]:
    """Irregular forms per POS: ``{pos: {base form: [inflected forms]}}`` from the .exc files."""
    folder = folder or wordnet_dir()
    table: dict[str, dict[str, list[str]]] = {}
    for pos, name in POS_FILES.items():
        forms: dict[str, list[str]] = defaultdict(list)
        path = folder / f"{name}.exc"
        if path.is_file():
            for line in path.read_text(encoding="utf-8", errors="replace").splitlines():
                parts = line.split()
                for base in parts[1:]:
                    forms[base.replace("_", " ")].append(parts[0].replace("_", " "))
        table[pos] = dict(forms)
    return table


def _regular_forms(word: str, pos: str) -> set[str]:
    """Regular inflections of one word (over-generating is harmless: we only search for them)."""
    forms = {word}
    if not word.isalpha():
        return forms
    last = word[-1]
    double = (len(word) >= 3 and last not in _VOWELS and last not in "wxy"
              and word[-2] in _VOWELS and word[-3] not in _VOWELS)
    if pos in ("n", "v"):
        forms |= {word + "s", word + "es"}
        if last == "y" and len(word) > 1 and word[-2] not in _VOWELS:
            forms.add(word[:-1] + "ies")
    if pos == "v":
        forms |= {word + "ed", word + "ing", word + "d"}
        if last == "e":
            forms.add(word[:-1] + "ing")
        if last == "y" and len(word) > 1 and word[-2] not in _VOWELS:
            forms.add(word[:-1] + "ied")
        if double:
            forms |= {word + last + "ed", word + last + "ing"}
    if pos in ("a", "r"):
        forms |= {word + "er", word + "est", word + "r", word + "st"}
        if last == "y" and len(word) > 1:
            forms |= {word[:-1] + "ier", word[:-1] + "iest"}
        if double:
            forms |= {word + last + "er", word + last + "est"}
    return forms


def surface_forms(lemma: str, pos: str, exceptions: dict[str, dict[str, list[str]]]) -> set[str]:
    """All lower-case forms under which ``lemma`` may appear in running text."""
    lemma = lemma.lower()
    irregular = exceptions.get(pos, {})
    forms = {lemma, *irregular.get(lemma, [])}
    words = lemma.split(" ")
    head = 0 if pos == "v" else len(words) - 1  # verbs inflect first word, nouns the last
    for form in _regular_forms(words[head], pos) | set(irregular.get(words[head], [])):
        forms.add(" ".join(words[:head] + [form] + words[head + 1:]))
    return {f.lower() for f in forms}


_TOKEN = re.compile(r"\w+(?:-\w+)*")
_SIMPLE_FORM = re.compile(r"\w+(?:-\w+)*(?: \w+(?:-\w+)*)*")


def tokenize_with_spans(sentence: str) -> list[tuple[str, int, int]]:
    """Lower-cased word tokens with their character spans; hyphenated compounds stay one token
    (so ``well`` is not found inside ``well-known``), apostrophes split (``dog's`` has ``dog``)."""
    return [(m.group().lower(), m.start(), m.end()) for m in _TOKEN.finditer(sentence)]


@functools.lru_cache(maxsize=1 << 18)
def _form_key(form: str) -> tuple[str, ...]:
    """A form as the token tuple :func:`tokenize_with_spans` would produce for it."""
    if _SIMPLE_FORM.fullmatch(form):
        return tuple(form.split())
    return tuple(t for t, _, _ in tokenize_with_spans(form))


class LemmaMatcher:
    """Finds any inflected form of a set of lemmas in a sentence, by whole tokens looked up
    as tuples in a dict (all of WordNet in about a second; a regex per lemma is slower)."""

    def __init__(self, lemmas: list[str], pos: str, exceptions: dict[str, dict[str, list[str]]]):
        self.forms: dict[tuple[str, ...], int] = {}
        for index, lemma in enumerate(lemmas):
            for form in surface_forms(lemma, pos, exceptions):
                key = _form_key(form)
                if key:
                    self.forms.setdefault(key, index)
        self.lengths = sorted({len(k) for k in self.forms}, reverse=True)

    def find_all(self, sentence: str) -> dict[int, tuple[int, int]]:
        """``{lemma index: (start, end)}``: the first (longest) occurrence of each lemma."""
        tokens = tokenize_with_spans(sentence)
        words = [t for t, _, _ in tokens]
        found: dict[int, tuple[int, int]] = {}
        for i in range(len(words)):
            for length in self.lengths:
                if i + length > len(words):
                    continue
                index = self.forms.get(tuple(words[i:i + length]))
                if index is not None and index not in found:
                    found[index] = (tokens[i][1], tokens[i + length - 1][2])
                    break
        return found


def lemma_occurrences(synsets: list[Synset], exceptions: dict[str, dict[str, list[str]]]
                      ) -> Iterator[tuple[Synset, str, dict[int, tuple[int, int]]]]:
    """``(synset, example sentence, {lemma index: (start, end)})`` for every example sentence
    in which one of its synset's lemmas occurs, in file order."""
    for synset in synsets:
        if not synset.examples:
            continue
        matcher = LemmaMatcher(synset.lemmas, synset.pos, exceptions)
        for sentence in synset.examples:
            found = matcher.find_all(sentence)
            if found:
                yield synset, sentence, found


class WordNetSource(Source):
    name = "wordnet"
    description = "WordNet 3.0 glosses and examples, a document per synset"
    install_hint = "sudo apt-get install wordnet-base"

    def files(self) -> list[Path]:
        paths = [find_system_path(f"usr/share/wordnet/data.{name}") for name in POS_FILES.values()]
        return [p for p in paths if p is not None] if all(paths) else []

    def iter_documents(self) -> Iterator[Document]:
        self.require()
        for synset in iter_synsets():
            document = synset_document(synset)
            if document is not None:
                yield document


def synset_document(synset: Synset) -> Document | None:
    """A synset as a corpus document (None when it has no text): ``lemma, lemma: definition.``,
    then its examples split into sentences. Unlike :func:`split_gloss` (the tasks' cleaning)
    the definition keeps an example's attribution (``-- Shakespeare``) and its own spacing
    before ``;``."""
    examples = [normalize_text(e) for e in _EXAMPLE.findall(synset.gloss)]
    definition = normalize_text(_EXAMPLE.sub("", synset.gloss)).strip(" ;")
    definition = re.sub(r"\s*;(\s*;)+", ";", definition).strip(" ;")
    sentences = []
    if definition:
        text = f"{', '.join(dict.fromkeys(synset.lemmas))}: {definition}"
        sentences.append(text if text.endswith((".", "!", "?")) else text + ".")
    for example in examples:
        sentences.extend(split_sentences(example))
    if not sentences:
        return None
    offset = synset.id[1:]  # the id is pos letter + offset
    return Document(f"wordnet/{POS_FILES[synset.pos]}/{offset}", "wordnet", sentences)
