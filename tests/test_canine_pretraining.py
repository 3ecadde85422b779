"""CANINE-C pretraining (Clark et al. 2022, §3.2.1; lmlab/objectives/characters.py): its
whitespace-bounded span masking on real text (KJV verses through the character tokenizer and
its token shards), the predictor's causality (a step never sees the character it predicts), a
CANINE folder's tokenizer through ``lmlab.Tokenizer.from_pretrained``, and ``lmlab pretrain
--family canine`` (loss falls, cost.md written, transformers loads the model)."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from conftest import assert_parity, run_lmlab, write_kjv_corpus

import lmlab
from lmlab.objectives.characters import WHITESPACE, AutoregressiveCharacters
from lmlab.objectives.masking import IGNORE_INDEX
from lmlab.objectives.special_tokens import SpecialTokens
from lmlab.tokenization.characters import CharacterTokenizer
from lmlab.utils.errors import LmlabError

MASK = 0xE003
TINY = dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, intermediate_size=128)


@pytest.fixture(scope="module")
def shards(tmp_path_factory):
    """KJV chapters (12 train, 2 validation) as codepoint shards, and the tokenizer folder."""
    from lmlab.data.shards import build_shards

    root = tmp_path_factory.mktemp("canine-c")
    corpus = write_kjv_corpus(root / "corpus", 12, 2)
    CharacterTokenizer().save_pretrained(root / "tok")
    build_shards(lmlab.Tokenizer.from_pretrained(root / "tok"), corpus, root / "shards",
                 shard_tokens=1 << 16, show_progress=False)
    return root


@pytest.fixture(scope="module")
def corrupted(shards):
    """64 packed rows of 256 characters from the shards, corrupted once (seeded)."""
    from lmlab.data.pretraining import PretrainingStream

    objective = AutoregressiveCharacters(SpecialTokens.from_tokenizer(CharacterTokenizer()))
    stream = PretrainingStream(shards / "shards", split="train", objective=objective,
                               batch_size=64, seq_len=256, seed=0)
    return objective, next(iter(stream))


def test_a_canine_folder_loads_as_the_character_tokenizer(tmp_path):
    CharacterTokenizer(model_max_length=512).save_pretrained(tmp_path)
    tok = lmlab.Tokenizer.from_pretrained(tmp_path)
    assert isinstance(tok, CharacterTokenizer) and tok.model_max_length == 512
    assert tok("Ωμέγα 日本")["input_ids"] == [0xE000, *map(ord, "Ωμέγα 日本"), 0xE001]
    transformers = pytest.importorskip("transformers")
    theirs = transformers.CanineTokenizer()
    theirs.save_pretrained(tmp_path / "theirs")  # and the folder transformers writes
    again = lmlab.Tokenizer.from_pretrained(tmp_path / "theirs")
    assert isinstance(again, CharacterTokenizer)
    assert again("naïve café")["input_ids"] == theirs("naïve café")["input_ids"]


def test_shards_hold_codepoints_with_word_starts(shards):
    from lmlab.data.shard_reader import ShardReader

    manifest = json.loads((shards / "shards" / "manifest.json").read_text())
    assert manifest["dtype"] == "uint32" and manifest["tokenizer"]["size"] == 0x110000
    reader = ShardReader(shards / "shards", "train")
    ids, starts = reader.window(0, 40), reader.word_starts(0, 40)
    text = "".join(map(chr, ids))
    assert text.startswith("In the beginning God created")
    assert [i for i, s in enumerate(starts) if s] == \
        [i for i, c in enumerate(text) if i == 0 or c.isspace() or text[i - 1].isspace()]


def test_masked_spans_are_whole_words_at_the_rate(corrupted):
    """Every masked span is a whole whitespace-bounded word, all of it [MASK] (no random
    replacement), about 15% of the non-space characters (never above), words of every length
    (their mean near the text's), and the order a shuffled permutation of the masked ones."""
    _, batch = corrupted
    ids = batch["input_ids"].numpy()
    labels, order = batch["labels"].numpy(), batch["order"].numpy()
    starts = batch["word_starts"].numpy().astype(bool)
    masked = labels != IGNORE_INDEX
    original = np.where(masked, labels, ids)
    assert (ids[masked] == MASK).all() and not (ids[~masked] == MASK).any()
    space = np.isin(original, WHITESPACE)
    text_chars = (batch["attention_mask"].numpy() == 1) & ~space & (original < 0xE000)
    rates = masked.sum(1) / text_chars.sum(1)
    assert 0.12 < rates.mean() <= 0.15 and rates.max() <= 0.15 + 1 / text_chars.sum(1).min()
    span_lengths, word_lengths = [], []
    for row in range(len(ids)):
        edges = np.flatnonzero(np.diff(np.concatenate([[0], masked[row], [0]])))
        for start, end in edges.reshape(-1, 2):
            before = original[row, start - 1] if start else None
            after = original[row, end] if end < ids.shape[1] else None
            # a boundary: whitespace, [CLS]/[SEP]/padding, or a sentence start (the shards
            # pack a document's sentences with nothing between them)
            assert before is None or before in WHITESPACE or before >= 0xE000 or \
                starts[row, start], (row, start)
            assert after is None or after in WHITESPACE or after >= 0xE000 or \
                starts[row, end], (row, end)
            assert not space[row, start:end].any()
            span_lengths.append(end - start)
        words = "".join(map(chr, original[row][text_chars[row] | space[row]])).split()
        word_lengths += [len(w) for w in words[1:-1]]  # the row's ends may be cut words
        steps = order[row][order[row] >= 0]
        assert sorted(steps) == list(np.flatnonzero(masked[row]))
    assert len(set(span_lengths)) > 5
    # tol: a sampling statistic (spans are whole words, short ones a little likelier), not rounding
    assert abs(np.mean(span_lengths) - np.mean(word_lengths)) < 0.6
    in_order = [np.all(np.diff(o[o >= 0]) > 0) for o in order]
    assert sum(in_order) < 3  # shuffled, not left to right


def test_no_step_sees_the_character_it_predicts(corrupted):
    """Changing the gold character of step k changes the logits of the later steps only."""
    from lmlab.models.canine import CanineModel
    from lmlab.models.presets import preset

    objective, batch = corrupted
    torch.manual_seed(0)
    model = CanineModel(preset("canine", "small", **TINY)).eval()
    objective.prepare(model)
    objective.eval()
    batch = {k: v[:4] for k, v in batch.items()}
    captured = []
    hook = objective.predictor.output.register_forward_hook(lambda m, i, o: captured.append(o))
    with torch.no_grad():
        objective.compute_loss(model, batch)
        changed = dict(batch, labels=batch["labels"].clone())
        row, k = 0, 5
        position = int(batch["order"][row, k])
        changed["labels"][row, position] = ord("Z") if changed["labels"][row, position] != \
            ord("Z") else ord("Q")
        objective.compute_loss(model, changed)
    hook.remove()
    before, after = captured
    differs = (before[row] - after[row]).abs().amax(-1) > 0
    assert not differs[:k + 1].any() and differs[k + 1:][(batch["order"][row] >= 0)[k + 1:]].all()


def test_canine_c_needs_a_canine_model():
    from lmlab.models.model import LanguageModel
    from lmlab.models.presets import preset

    objective = AutoregressiveCharacters(SpecialTokens.from_tokenizer(CharacterTokenizer()))
    with pytest.raises(LmlabError, match="hash embeddings"):
        objective.prepare(LanguageModel(preset("bert", "tiny", vocab_size=99)))


def _pretrain(shards, out, steps: int, *extra: object):
    return run_lmlab("pretrain", "--family", "canine", "--size", "small", "--objective",
                     "canine-c", "--shards", shards / "shards", "--seq-len", 128,
                     "--batch-size", 8, "--lr", "1e-3", "--steps", steps, "--precision", "fp32",
                     "--threads", 1, "--out", out, *extra, timeout=900)  # 1: shared cores


def _losses(run) -> list[float]:
    rows = [json.loads(line) for line in (run / "metrics.jsonl").open()]
    return [r["loss"] for r in rows if r["kind"] == "train"]


def test_lmlab_pretrain_family_canine(shards, tmp_path):
    """Tens of steps of a 2-layer CANINE through the CLI: the loss falls, cost.md is written
    and the run's model is a CanineModel folder transformers loads."""
    config = tmp_path / "tiny.json"
    config.write_text(json.dumps({"hparams": {"model_args": TINY}}))
    done = _pretrain(shards, tmp_path / "run", 30, "--config", config, "--log-every", 5)
    assert done.returncode == 0, done.stderr[-2000:]
    losses = _losses(tmp_path / "run")
    assert losses[-1] < losses[0] - 1.0, losses
    assert "FLOPs per token" in (tmp_path / "run" / "cost.md").read_text()
    config = json.loads((tmp_path / "run" / "model" / "config.json").read_text())
    assert config["model_type"] == "canine" and config["num_hidden_layers"] == 2
    transformers = pytest.importorskip("transformers")
    theirs = transformers.CanineModel.from_pretrained(tmp_path / "run" / "model").eval()
    ours = lmlab.from_pretrained(tmp_path / "run" / "model").eval()
    batch = lmlab.Tokenizer.from_pretrained(tmp_path / "run" / "model")(
        ["In the beginning", "Ἐν ἀρχῇ"], padding=True, return_tensors="pt")
    with torch.no_grad():
        got, ref = ours(**batch).last_hidden_state, theirs(**batch).last_hidden_state
    assert_parity(got, ref, "the pretrained CANINE's last hidden states")


def test_other_objectives_are_refused_for_canine(shards, tmp_path):
    done = _pretrain(shards, tmp_path / "run", 2, "--objective", "mlm")
    assert done.returncode != 0 and "canine-c" in done.stderr


@pytest.mark.slow
def test_a_few_hundred_steps_at_the_small_size(shards, tmp_path):
    """300 steps of the ``small`` preset (4 x 256): the loss falls by more than half."""
    done = _pretrain(shards, tmp_path / "run", 300, "--log-every", 20)
    assert done.returncode == 0, done.stderr[-2000:]
    losses = _losses(tmp_path / "run")
    assert np.mean(losses[-3:]) < 0.5 * losses[0], losses
    assert (tmp_path / "run" / "cost.md").is_file()
