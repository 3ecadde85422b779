"""Layer-wise probing: Tenney's summaries, the control task, probes, the feature cache, the
probing tasks (silver spaCy labels, user CoNLL files) and ``lmlab probe``."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest
import torch
from conftest import assert_close_rounding, run_lmlab

from lmlab.analysis.layer_cache import (
    WordRequest,
    _align,
    cached_word_features,
    extract_word_features,
)
from lmlab.analysis.probing import center_of_gravity, control_labels, expected_layer, train_probes
from lmlab.tasks.probing import load_conll_probing_task, read_labelled_words
from lmlab.utils.errors import LmlabError


# -- summaries -----------------------------------------------------------------------------------
def test_center_of_gravity_and_expected_layer_on_a_hand_made_example():
    assert center_of_gravity([0.1, 0.2, 0.7]) == pytest.approx(0 * 0.1 + 1 * 0.2 + 2 * 0.7)
    assert center_of_gravity([2.0, 0.0, 2.0]) == pytest.approx(1.0)  # weights are normalised
    # cumulative scores 0.5, 0.7, 0.8, 0.8: deltas 0.2 (l=1), 0.1 (l=2), 0 (l=3)
    assert expected_layer([0.5, 0.7, 0.8, 0.8]) == pytest.approx((1 * 0.2 + 2 * 0.1) / 0.3)
    assert expected_layer([0.5, 0.5, 0.9]) == pytest.approx(2.0)  # all gain at layer 2
    assert expected_layer([0.6, 0.6, 0.6]) is None  # no layer adds anything: undefined


# -- control task --------------------------------------------------------------------------------
def test_control_labels_are_per_type_deterministic_and_follow_the_label_distribution():
    types = [f"w{i % 3000}" for i in range(9000)]  # 3,000 types, each 3 times
    labels = ["NOUN"] * 800 + ["VERB"] * 200
    control = control_labels(types, labels, seed=0, salt="pos")
    by_type: dict[str, set[str]] = {}
    for kind, label in zip(types, control):
        by_type.setdefault(kind, set()).add(label)
    assert all(len(found) == 1 for found in by_type.values())  # one label per type
    assert control == control_labels(types, labels, seed=0, salt="pos")  # deterministic
    nouns = sum(found == {"NOUN"} for found in by_type.values()) / len(by_type)
    assert abs(nouns - 0.8) < 0.04  # tol: sampling, 3 sd = 0.022; drawn from the task's distribution
    other = control_labels(types, labels, seed=1, salt="pos")
    assert other != control  # another seed draws again


# -- probes --------------------------------------------------------------------------------------
def _synthetic(informative: int, layers: int = 4, dim: int = 16, classes: int = 4,
               random_labels: bool = False):
    """Vectors (N, layers, dim): only layer ``informative`` holds the class (a class centre)."""
    g = torch.Generator().manual_seed(0)
    sizes = {"train": 600, "dev": 200, "test": 200}
    y = {s: torch.randint(0, classes, (n,), generator=g) for s, n in sizes.items()}
    centres = 3 * torch.randn(classes, dim, generator=g)
    x = {s: torch.randn(n, layers, dim, generator=g) for s, n in sizes.items()}
    for s in x:
        x[s][:, informative] += centres[y[s]]
    if random_labels:
        y = {s: torch.randint(0, classes, (len(v),), generator=g) for s, v in y.items()}
    return x, y


@pytest.mark.parametrize("kind", ["linear", "mlp"])
def test_probes_learn_a_separable_task_and_fail_a_random_one(kind):
    x, y = _synthetic(informative=2)
    per_layer = train_probes(x, y, 4, kind)
    assert per_layer[2].test > 0.95
    assert all(per_layer[k].test < 0.45 for k in (0, 1, 3))  # chance is 0.25
    cumulative = train_probes(x, y, 4, kind, mixes=True)
    assert [c.test > 0.95 for c in cumulative] == [False, False, True, True]
    weights = cumulative[-1].weights
    assert sum(weights) == pytest.approx(1.0) and int(np.argmax(weights)) == 2
    assert cumulative[1].weights[2:] == [0.0, 0.0]  # the mix of layers 0..1 sees no more
    assert expected_layer([c.test for c in cumulative]) == pytest.approx(2.0, abs=0.15)  # tol: trained probes' accuracies
    full, = train_probes(x, y, 4, kind, mixes=True, cumulative=False)  # the full mix alone
    assert full.test > 0.95 and int(np.argmax(full.weights)) == 2
    x, y = _synthetic(informative=2, random_labels=True)
    assert all(r.test < 0.4 for r in train_probes(x, y, 4, kind))


# -- the feature cache ---------------------------------------------------------------------------
SENTENCES = ["The vase broke into unbelievably many pieces.",
             "Dawn broke over Kathmandu.",
             "She didn't like New York's weather."]


def _word_spans(text: str) -> list[tuple[int, int]]:
    import re

    return [m.span() for m in re.finditer(r"\w+|[^\w\s]", text)]


def test_cache_equals_a_direct_transformers_forward_and_is_reused(minilm_dir, tmp_path,
                                                                   monkeypatch):
    import transformers

    import lmlab
    from lmlab.tokenization.tokenizer import Tokenizer

    model = lmlab.from_pretrained(minilm_dir).eval()
    tokenizer = Tokenizer.from_pretrained(minilm_dir)
    requests = [WordRequest(t, _word_spans(t)) for t in SENTENCES]
    features = cached_word_features(model, tokenizer, requests, tmp_path, batch_size=2)
    assert not features.from_cache and features.valid.all()
    assert features.array.shape == (sum(len(r.spans) for r in requests), 7, 384)

    theirs = transformers.AutoModel.from_pretrained(str(minilm_dir)).eval()
    their_tokenizer = transformers.AutoTokenizer.from_pretrained(str(minilm_dir))
    for number, text in enumerate(SENTENCES):
        batch = their_tokenizer(text, return_tensors="pt")
        with torch.no_grad():
            hidden = theirs(**batch, output_hidden_states=True).hidden_states
        word_ids = batch.word_ids(0)
        for word in range(len(requests[number].spans)):  # these words are BERT's words
            pieces = [p for p, w in enumerate(word_ids) if w == word]
            for layer in range(7):
                expected = hidden[layer][0, pieces].mean(0)
                got = torch.from_numpy(np.array(features.array[features.row(number, word),
                                                               layer]))
                assert_close_rounding(got, expected, terms=1536, depth=max(layer, 1))

    def forward_must_not_run(*args, **kwargs):
        raise AssertionError("the second call ran the model")

    monkeypatch.setattr(model, "forward", forward_must_not_run)
    again = cached_word_features(model, tokenizer, requests, tmp_path, batch_size=2)
    assert again.from_cache and again.folder == features.folder
    assert np.array_equal(np.asarray(again.array), np.asarray(features.array))


def test_truncation_drops_and_counts_the_words_past_the_cut(minilm_dir):
    import lmlab
    from lmlab.tokenization.tokenizer import Tokenizer

    model = lmlab.from_pretrained(minilm_dir).eval()
    tokenizer = Tokenizer.from_pretrained(minilm_dir)
    long = " ".join(["word"] * 20)
    requests = [WordRequest(long, _word_spans(long)), WordRequest("Short one.", [(0, 5)])]
    out = np.zeros((21, 7, 384), dtype=np.float32)
    valid = np.ones(21, dtype=bool)
    stats = extract_word_features(model, tokenizer, requests, out, max_length=8, valid=valid)
    # 8 tokens = [CLS] + 6 words + [SEP]: 14 of the 20 words are past the cut
    assert (stats.truncated_texts, stats.words_past_cut, stats.unaligned_words) == (1, 14, 0)
    assert valid.tolist() == [True] * 6 + [False] * 14 + [True]
    assert "truncated" in stats.warning() and "14 word(s)" in stats.warning()


def test_spacy_words_align_to_the_tokenizers_pieces(minilm_dir):
    from lmlab.tasks.probing import doc_words, load_spacy
    from lmlab.tokenization.tokenizer import Tokenizer

    nlp = load_spacy()
    tokenizer = Tokenizer.from_pretrained(minilm_dir)
    text = "She didn't like New York's  weather."
    spans, _ = doc_words(nlp(text))
    words = [text[s:e] for s, e in spans]
    assert words == ["She", "did", "n't", "like", "New", "York", "'s", "weather", "."]
    encoding = tokenizer(text, return_offsets_mapping=True)
    pieces = tokenizer.convert_ids_to_tokens(encoding["input_ids"])
    aligned = [[pieces[p] for p in found] for found in _align(encoding["offset_mapping"], spans)]
    # spaCy splits "didn't" into did + n't; BERT into didn + ' + t: "didn" straddles both words
    assert aligned == [["she"], ["didn"], ["didn", "'", "t"], ["like"], ["new"], ["york"],
                       ["'", "s"], ["weather"], ["."]]


def test_builtin_silver_task_words_and_splits(tmp_path, monkeypatch):
    from lmlab.tasks import probing

    monkeypatch.setenv("LMLAB_CACHE", str(tmp_path))
    task = probing.load_probing_task("pos", 40)
    assert task.silver and len(task.targets) == 40
    assert set(task.labels) <= {"ADJ", "ADP", "ADV", "AUX", "CCONJ", "DET", "INTJ", "NOUN",
                                "NUM", "PART", "PRON", "PROPN", "PUNCT", "SCONJ", "SYM",
                                "VERB", "X"}
    for target in task.targets:
        sentence = task.sentences[target.sentence]
        (first, last), = target.spans
        assert last == first + 1 and sentence.words[first].lower() == target.type
        assert sentence.split == probing.split_of("probe:" + sentence.text)
    cached = probing.load_probing_task("pos", 40)  # read back from the cache
    assert cached.to_dict() == task.to_dict()


# -- user files ----------------------------------------------------------------------------------
def _conll(path, sentences):
    path.write_text("\n\n".join("\n".join(f"{w}\t{t}" for w, t in s) for s in sentences) + "\n")
    return path


def test_conll_file_round_trip(tmp_path):
    sentences = [[("The", "DET"), ("cat", "NOUN"), ("sat", "VERB")],
                 [("Dogs", "NOUN"), ("bark", "VERB"), (".", "PUNCT")]]
    train = _conll(tmp_path / "train.conll", sentences * 3)
    dev = _conll(tmp_path / "dev.conll", sentences)
    test = _conll(tmp_path / "test.conll", sentences[:1])
    assert read_labelled_words(train)[:2] == [([w for w, _ in s], [t for _, t in s])
                                              for s in sentences]
    task = load_conll_probing_task([train, dev, test])
    assert task.name == "train" and task.labels == ["DET", "NOUN", "PUNCT", "VERB"]
    assert task.split_counts() == {"train": 18, "dev": 6, "test": 3}
    got = [(task.sentences[t.sentence].words[t.spans[0][0]], t.label) for t in task.targets]
    assert got == [pair for s in sentences * 4 + sentences[:1] for pair in s]


@pytest.mark.parametrize("lines, problem", [
    ("The\tDET\ncat\tNOUN\tx\n", "line 2: 3 columns where the file's first line has 2"),
    ("The\tDET\ncat\t\n", "line 2: 'cat\\t' has no label"),
    ("The\tDET\ncat\n", "line 2: 'cat' has no label"),
])
def test_conll_labels_not_aligned_with_words_are_refused(tmp_path, lines, problem):
    path = tmp_path / "bad.conll"
    path.write_text(lines)
    with pytest.raises(LmlabError, match=problem.replace("\\", "\\\\").replace("'", ".")):
        read_labelled_words(path)


# -- the command ---------------------------------------------------------------------------------
def test_probe_cli_refuses_bad_input_before_any_work(tmp_path):
    bad = tmp_path / "bad.conll"
    bad.write_text("The\tDET\ncat\n")
    taken = tmp_path / "taken"
    taken.mkdir()
    (taken / "results.json").write_text("{}")
    cases = [(["--task", "syntax"], "unknown probing task 'syntax'"),
             (["--conll", str(bad), "--out", str(tmp_path / "o")], "has no label"),
             (["--task", "pos", "--out", str(taken)], "already holds results.json"),
             ([], "no probing task given")]
    for args, message in cases:
        result = run_lmlab("probe", tmp_path / "no-model-needed", *args)
        assert result.returncode == 2, result.stderr
        assert message in result.stderr + result.stdout
    assert not (tmp_path / "o").exists()


def test_probe_cli_on_minilm_writes_table_and_plot_loadable_in_a_new_process(tmp_path):
    sentences = [[("The", "DET"), ("cat", "NOUN"), ("sat", "VERB"), ("down", "ADV")],
                 [("Dogs", "NOUN"), ("bark", "VERB"), ("loudly", "ADV"), (".", "PUNCT")],
                 [("A", "DET"), ("bird", "NOUN"), ("sings", "VERB"), ("!", "PUNCT")]]
    train = _conll(tmp_path / "tags.conll", sentences * 4)
    dev = _conll(tmp_path / "dev.conll", sentences * 2)
    test = _conll(tmp_path / "test.conll", sentences * 2)
    out = tmp_path / "probe"
    result = run_lmlab("probe", "minilm", "--conll", f"{train},{dev},{test}", "--probe",
                       "linear", "--out", out)
    assert result.returncode == 0, result.stderr
    assert {p.name for p in out.iterdir()} == {"results.json", "results.md", "probing.png"}
    assert (out / "probing.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    table = (out / "results.md").read_text()
    assert "| tags | linear |" in table and "SILVER" in table and "selectivity" in table
    code = ("import json; from lmlab.analysis.probing import load_results; "
            f"r = load_results({str(out)!r}); e = r['tasks']['tags']['probes']['linear']; "
            "print(json.dumps([len(e['layers']), e['mix']['weights'], r['host']]))")
    loaded = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                            check=True)
    layers, weights, host = json.loads(loaded.stdout)
    assert layers == 7 and sum(weights) == pytest.approx(1.0) and "torch" in host
    entry = json.loads((out / "results.json").read_text())["tasks"]["tags"]["probes"]["linear"]
    row = entry["layers"][3]
    assert row["selectivity"] == pytest.approx(row["test"] - row["control"])
    assert {"random_init", "cumulative"} <= set(row) and "random_init_mix" in entry


@pytest.mark.slow
def test_probe_cli_on_every_builtin_task(tmp_path):
    out = tmp_path / "probe"
    result = run_lmlab("probe", "minilm", "--task", "pos,dep,ner,supersense",
                       "--max-examples", "400", "--out", out, timeout=1800)
    assert result.returncode == 0, result.stderr
    results = json.loads((out / "results.json").read_text())
    assert set(results["tasks"]) == {"pos", "dep", "ner", "supersense"}
    for task in results["tasks"].values():
        for entry in task["probes"].values():
            assert entry["mix"]["test"] > task["majority"]


def test_builtin_tasks_without_spacy_name_the_extra(monkeypatch):
    from lmlab.tasks import probing

    monkeypatch.setitem(sys.modules, "spacy", None)  # import spacy raises ImportError
    with pytest.raises(LmlabError, match=r"pip install 'lmlab\[analysis\]'"):
        probing.load_probing_task("pos", 40)


def test_the_feature_cache_key_changes_with_settings_that_are_not_weights(tiny_bert_folder):
    """Two models with the same weights but another setting (here the norm's epsilon) compute
    other vectors: their cached features must not be shared."""
    import dataclasses

    from lmlab.analysis.layer_cache import model_fingerprint
    from lmlab.load import load_model_and_tokenizer

    model, tok = load_model_and_tokenizer(tiny_bert_folder)
    before = model_fingerprint(model, tok)
    model.config = dataclasses.replace(model.config, norm_eps=model.config.norm_eps * 10)
    assert model_fingerprint(model, tok) != before
