"""Quick-thought's representation [f(s); g(s)] (Logeswaran & Lee 2018):
:class:`lmlab.sentence.ConcatenatedEncoder` and ``lmlab sentence evaluate --concat``. The
vector is checked against ``torch.cat`` of the two encoders' own vectors, in this process and
in a fresh one; mismatched or missing parts are refused before any weights are read."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys

import pytest
import torch

from lmlab.sentence import ConcatenatedEncoder, SentenceEncoder
from lmlab.utils.errors import LmlabError
from tests.conftest import (
    assert_clean_refusal,
    assert_close_rounding,
    run_lmlab,
    run_lmlab_here,
    save_tiny_bert_folder,
)

TEXTS = ["The light came before the water.", "A king sat in the field at night.",
         "bread", "The river ran past the stone and on into the dark."]


@pytest.fixture(scope="module")
def f_and_g(tmp_path_factory):
    """Two tiny BERTs of different widths (32 and 48) on MiniLM's tokenizer: different
    weights, so a swapped or repeated part shows."""
    root = tmp_path_factory.mktemp("concat")
    return (save_tiny_bert_folder(root / "f", hidden=32),
            save_tiny_bert_folder(root / "g", hidden=48))


@pytest.mark.numerics
def test_concatenation_is_torch_cat_of_the_parts_in_a_fresh_process(f_and_g):
    f, g = f_and_g
    expected = torch.cat([SentenceEncoder.load(f).encode(TEXTS),
                          SentenceEncoder.load(g).encode(TEXTS)], dim=-1)
    encoder = ConcatenatedEncoder.load([f, g])
    assert encoder.dimension == 80 and expected.shape == (len(TEXTS), 80)
    # batches of 3 pad the texts to other lengths than one batch of 4: the same vectors up to
    # the rounding of each part's two layers (widths 32 and 48, feed-forward 64)
    assert_close_rounding(encoder.encode(TEXTS, batch_size=3), expected, terms=64, depth=2)
    with pytest.raises(AssertionError):  # the order of the parts is the order given
        assert_close_rounding(ConcatenatedEncoder.load([g, f]).encode(TEXTS)[:, :32],
                              expected[:, :32], terms=64, depth=2)
    script = ("import json, sys\n"
              "from lmlab.sentence import ConcatenatedEncoder\n"
              f"vectors = ConcatenatedEncoder.load(sys.argv[1:]).encode({TEXTS!r})\n"
              "print(json.dumps(vectors.tolist()))\n")
    done = subprocess.run([sys.executable, "-c", script, str(f), str(g)], capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    vectors = torch.tensor(json.loads(done.stdout.strip().splitlines()[-1]))
    assert torch.equal(vectors, expected)  # exact: the same texts, batch and weights


def _other_vocabulary(source, folder):
    """``source`` with one WordPiece renamed: the same size, another vocabulary."""
    shutil.copytree(source, folder)
    state = json.loads((folder / "tokenizer.json").read_text(encoding="utf-8"))
    vocab = state["model"]["vocab"]
    vocab["zzzz"] = vocab.pop("river")
    (folder / "tokenizer.json").write_text(json.dumps(state), encoding="utf-8")
    return folder


def test_bad_parts_are_refused_before_any_weights_are_read(f_and_g, tmp_path, monkeypatch):
    import lmlab.load

    f, g = f_and_g
    other = _other_vocabulary(g, tmp_path / "other")

    def no_weights(*args, **kwargs):
        raise AssertionError("weights were read before the parts were checked")

    monkeypatch.setattr(lmlab.load, "from_pretrained", no_weights)
    with pytest.raises(LmlabError, match="another tokenizer") as error:
        ConcatenatedEncoder.load([f, other])
    assert "30,522 pieces each" in error.value.problem and "context_model" in error.value.fix
    with pytest.raises(LmlabError, match="does not exist"):
        ConcatenatedEncoder.load([f, tmp_path / "missing"])
    with pytest.raises(LmlabError, match="one model folder"):
        ConcatenatedEncoder.load([f, f])
    with pytest.raises(LmlabError, match="1 encoder"):
        ConcatenatedEncoder.load([f])


def test_cli_evaluates_a_run_folder_with_f_and_g(f_and_g, tmp_path):
    """A quick-thought run's layout (model/ = f, context_model/ = g; the training run that
    writes it is tests/test_sentence_encoders.py's): --concat gives what the library gives."""
    from lmlab.sentence.evaluate import gloss_retrieval

    run = tmp_path / "quick"
    shutil.copytree(f_and_g[0], run / "model")
    shutil.copytree(f_and_g[1], run / "context_model")
    pairs = tmp_path / "pairs"
    pairs.mkdir()
    with open(pairs / "test.jsonl", "w", encoding="utf-8") as handle:
        for i, text in enumerate(TEXTS * 2):
            handle.write(json.dumps({"sentence1": f"{text} ({i})", "sentence2": TEXTS[i % 3],
                                     "label": 1, "group": f"s{i % 3}"}) + "\n")
    result = run_lmlab("sentence", "evaluate", run, "--concat", run / "context_model",
                       "--tasks", "retrieval", "--pairs", pairs, "--out", tmp_path / "fg.json")
    assert result.returncode == 0, result.stderr[-2000:]
    written = json.loads((tmp_path / "fg.json").read_text(encoding="utf-8"))
    expected = gloss_retrieval(ConcatenatedEncoder.load([run / "model", run / "context_model"]),
                               pairs)
    assert written == {"model": str(run), "concat": str(run / "context_model"),
                       "retrieval": expected}
    # the run directory itself resolves to model/: f beside f is refused, nothing written
    result = run_lmlab_here("sentence", "evaluate", run, "--concat", run, "--tasks", "retrieval",
                       "--pairs", pairs, "--out", tmp_path / "ff.json")
    assert_clean_refusal(result, "one model folder", fix="context_model")
    assert not (tmp_path / "ff.json").exists()
