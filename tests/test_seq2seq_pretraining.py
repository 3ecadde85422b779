"""Encoder-decoder pretraining through ``lmlab pretrain``: T5's span corruption (and a row of its
objective study) and BART's denoising on real text, on the one Trainer; the run's model loads
in transformers and in a fresh process; a tokenizer without sentinels is refused up front."""

from __future__ import annotations

import json

import pytest
from conftest import run_lmlab, write_kjv_corpus

import lmlab
from lmlab import PretrainConfig
from lmlab.data.shards import build_shards
from lmlab.objectives.registry import build_objective
from lmlab.objectives.special_tokens import SpecialTokens
from lmlab.tokenization.tokenizer import Tokenizer
from lmlab.training import TrainingConfig
from lmlab.training.pretrain import DataSettings, ModelSettings, ObjectiveSettings
from lmlab.utils.errors import LmlabError

SMALL_T5 = {"hidden_size": 64, "num_hidden_layers": 2, "num_decoder_layers": 2,
            "num_attention_heads": 4, "head_dim": 16, "intermediate_size": 128}


@pytest.fixture(scope="module")
def t5_shards(tmp_path_factory):
    """KJV chapters tokenized by a Unigram tokenizer with 20 sentinels (T5's template)."""
    corpus = write_kjv_corpus(tmp_path_factory.mktemp("corpus"), 24, 6)
    tokenizer = Tokenizer.train(corpus, kind="unigram", vocab_size=600, extra_ids=20)
    folder = tmp_path_factory.mktemp("tokenizer")
    tokenizer.save_pretrained(folder)
    out = tmp_path_factory.mktemp("shards")
    build_shards(Tokenizer.from_pretrained(folder), corpus, out, shard_tokens=8192,
                 show_progress=False)
    return out, Tokenizer.from_pretrained(folder)


def _config(out, shards, family: str, objective: str, **args) -> PretrainConfig:
    training = TrainingConfig(seq_len=64, batch_size=8, lr=3e-3, max_steps=40, log_every=10,
                              eval_every=40, seed=0, warmup_fraction=0.1, progress=False)
    return PretrainConfig(out=out, training=training,
                          model=ModelSettings(family, "small" if family == "t5" else "base",
                                              model_args=SMALL_T5 if family == "t5" else {
                                                  **SMALL_T5, "head_dim": None,
                                                  "max_position_embeddings": 130}),
                          objective=ObjectiveSettings(objective, args),
                          data=DataSettings(shards, None, 2), track_cost=False)


def test_span_corruption_batches_follow_t5(t5_shards):
    """Inputs end with eos and hold sentinels in order; targets start with the first sentinel;
    about 15% of the window's tokens are in the targets."""
    from lmlab.data.pretraining import PretrainingStream

    shards, tokenizer = t5_shards
    special = SpecialTokens.from_tokenizer(tokenizer)
    assert len(special.sentinel_ids) == 20
    objective = build_objective("t5", special)
    stream = PretrainingStream(shards, split="train", objective=objective, batch_size=16,
                               seq_len=100, seed=0)
    batch = next(iter(stream))
    noise = 0
    for ids, mask, labels in zip(batch["input_ids"], batch["attention_mask"], batch["labels"]):
        source = ids[mask.bool()].tolist()
        target = labels[labels != -100].tolist()
        assert source[-1] == tokenizer.eos_token_id and target[-1] == tokenizer.eos_token_id
        used = [t for t in source if t in special.sentinel_ids]
        assert used == list(special.sentinel_ids[:len(used)]) and used
        assert target[0] == special.sentinel_ids[0]
        noise += len([t for t in target[:-1] if t not in special.sentinel_ids])
    assert 0.13 <= noise / (100 * len(batch["input_ids"])) <= 0.17


@pytest.mark.parametrize("family,objective,args", [
    ("t5", "t5", {}), ("t5", "t5", {"variant": "deshuffling"}), ("bart", "bart", {})])
def test_pretraining_lowers_the_loss_and_saves_a_loadable_model(t5_shards, tmp_path, family,
                                                                objective, args):
    shards, _ = t5_shards
    if family == "bart":  # BART masks with <mask>: a RoBERTa-template tokenizer
        pytest.importorskip("transformers")
    result = lmlab.pretrain(_config(tmp_path / "run", shards, family, objective, **args)) \
        if family == "t5" else None
    if family == "bart":
        bart_shards = _bart_shards(tmp_path)
        result = lmlab.pretrain(_config(tmp_path / "run", bart_shards, family, objective))
    rows = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").open()]
    losses = [r["loss"] for r in rows if r["kind"] == "train"]
    assert losses[-1] < losses[0] - 0.5, losses
    assert result.last_eval["eval_loss"] < losses[0]
    transformers = pytest.importorskip("transformers")
    model_dir = tmp_path / "run" / "model"
    config = json.loads((model_dir / "config.json").read_text())
    assert config["model_type"] == family and config["is_encoder_decoder"]
    getattr(transformers, config["architectures"][0]).from_pretrained(model_dir)
    # a fresh process generates with the saved model (a 40-step model mostly writes
    # sentinels, which decoding drops: the text may be empty)
    check = run_lmlab("generate", model_dir, "In the beginning", "--max-new-tokens", "5",
                      "--json")
    assert check.returncode == 0, check.stderr
    assert json.loads(check.stdout)["prompt"] == "In the beginning"


def _bart_shards(tmp_path):
    corpus = write_kjv_corpus(tmp_path / "corpus", 24, 6)
    tokenizer = Tokenizer.train(corpus, kind="bpe", vocab_size=600)
    tokenizer.save_pretrained(tmp_path / "tok")
    build_shards(Tokenizer.from_pretrained(tmp_path / "tok"), corpus, tmp_path / "shards",
                 shard_tokens=8192, show_progress=False)
    return tmp_path / "shards"


def test_a_tokenizer_without_sentinels_is_refused(tmp_path):
    from lmlab.utils.catalog import minilm_dir

    special = SpecialTokens.from_tokenizer(Tokenizer.from_pretrained(minilm_dir()))
    with pytest.raises(LmlabError, match="no sentinel tokens"):
        build_objective("t5", special)


@pytest.mark.parametrize("variant", ["bert_style", "mass_style"])
def test_masking_variants_mask_with_the_first_sentinel(t5_shards, variant):
    """A sentinel-only T5 tokenizer (no <mask>): bert_style and mass_style replace tokens by
    <extra_id_0>, as T5's code does (about 15% of the tokens; BERT-style: 90% of those), and
    reconstruct the whole window."""
    from lmlab.data.pretraining import PretrainingStream

    shards, tokenizer = t5_shards
    special = SpecialTokens.from_tokenizer(tokenizer)
    assert special.mask_id is None and tokenizer.convert_ids_to_tokens(
        special.sentinel_ids[0]) == "<extra_id_0>"
    stream = PretrainingStream(shards, split="train", batch_size=16, seq_len=100, seed=0,
                               objective=build_objective("t5", special, variant=variant))
    batch = next(iter(stream))
    changed = masked = total = 0
    for ids, mask, labels in zip(batch["input_ids"], batch["attention_mask"], batch["labels"]):
        source, target = ids[mask.bool()], labels[labels != -100]
        assert source.shape == target.shape and target[-1] == tokenizer.eos_token_id
        differ = source != target
        changed += int(differ.sum())
        masked += int((source[differ] == special.sentinel_ids[0]).sum())
        total += len(source) - 1
        assert not set(source.tolist()) & set(special.sentinel_ids[1:])
    assert 0.12 <= changed / total <= 0.18  # tol: sampling, 1,600 tokens
    # tol: a sampling rate over a few hundred corrupted tokens (binomial spread about 0.02)
    assert masked / changed == (pytest.approx(0.9, abs=0.06) if variant == "bert_style" else 1.0)


def test_masking_variants_without_sentinel_or_mask_are_refused_up_front():
    plain = SpecialTokens(vocab_size=50, pad_id=0, cls_id=1, sep_id=2, eos_id=2)
    for variant in ("bert_style", "mass_style"):
        with pytest.raises(LmlabError, match=f"neither sentinel tokens .* nor a mask token, one "
                                             f"of which T5's {variant} masks with"):
            build_objective("t5", plain, variant=variant)
    with_mask = SpecialTokens(vocab_size=50, pad_id=0, cls_id=1, sep_id=2, eos_id=2, mask_id=3)
    assert build_objective("t5", with_mask, variant="mass_style").tokens.mask_id == 3
    assert build_objective("t5", plain, variant="deshuffling").tokens.mask_id is None


def test_the_objective_refuses_an_encoder(t5_shards, tmp_path):
    shards, _ = t5_shards
    config = _config(tmp_path / "run", shards, "t5", "t5")
    config.model = ModelSettings("bert", "tiny")
    with pytest.raises(LmlabError, match="trains encoder-decoders"):
        lmlab.pretrain(config)


def test_seq_len_must_leave_room_for_the_end_token_and_offset(t5_shards, tmp_path):
    """BART's table of 130 rows holds 128 positions (offset 2), one of them for </s>."""
    shards, _ = t5_shards
    config = _config(tmp_path / "run", shards, "bart", "bart")
    config.training.seq_len = 128
    with pytest.raises(LmlabError, match="--seq-len 128 exceeds the bart-base model's 127"):
        config.validate()
