"""BigBird (family big_bird; lmlab/models/core/block_sparse.py): the block-sparse computation
equals dense attention weighted by the pattern written out here on its own (padded batch, eval
and training blocks, values and gradients); parity both ways with transformers'
BigBirdForMaskedLM / BigBirdForSequenceClassification (block_sparse, eval) on random weights at
lengths that take the sparse path and one that falls back; fresh-process reload; the random
blocks of training; presets; refusals; fine-tuning through the CLI."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import torch
from conftest import assert_close_rounding, assert_parity, perturb
from torch.nn import functional as F

import lmlab
from lmlab.models.core.block_sparse import (
    block_sparse_attention,
    random_blocks,
    sparse_applies,
)
from lmlab.models.model import LanguageModel
from lmlab.models.presets import family_config, preset
from lmlab.utils.errors import LmlabError

transformers = pytest.importorskip("transformers")

BLOCK, RANDOM = 4, 2  # sparse above (5 + 2 * 2) * 4 = 36 tokens
SHAPE = dict(vocab_size=97, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
             intermediate_size=64, max_position_embeddings=128)


def _pattern(blocks: int, chosen: torch.Tensor) -> torch.Tensor:
    """(nh, n, n) how often each query block sees each key block, from the paper's ITC
    description: blocks 0 and n-1 see all; block i sees {0, i-1, i, i+1, n-1} once and each of
    its random blocks ``chosen[:, i-1]`` once more (transformers' eval draws block 0)."""
    heads = chosen.shape[0]
    counts = torch.zeros(heads, blocks, blocks, dtype=torch.float64)
    counts[:, [0, -1]] = 1
    for i in range(1, blocks - 1):
        counts[:, i, sorted({0, i - 1, i, i + 1, blocks - 1})] = 1
        for h in range(heads):
            for j in chosen[h, i - 1].tolist():
                counts[h, i, j] += 1
    return counts


@pytest.mark.parametrize("seed", [None, 3])
def test_block_sparse_equals_dense_attention_under_the_pattern(seed):
    """softmax(scores + log(count)) over real keys is attention in which a key seen twice
    counts twice: the sparse op's values, gradients and returned probabilities."""
    length, heads = 45, 2  # 12 blocks of 4, the last one padded
    real = torch.ones(3, length, dtype=torch.bool)
    real[1, 30:] = False
    real[2, 9:] = False
    q, k, v = (torch.randn(3, heads, length, 8, dtype=torch.float64, requires_grad=True)
               for _ in range(3))
    ours, probs = block_sparse_attention(q, k, v, real, BLOCK, RANDOM, scale=0.3, seed=seed,
                                         probabilities=True)
    blocks = 12
    counts = _pattern(blocks, random_blocks(blocks, heads, RANDOM, seed))
    counts = counts.repeat_interleave(BLOCK, 1).repeat_interleave(BLOCK, 2)[:, :length, :length]
    bias = counts.log().masked_fill(~real[:, None, None, :], float("-inf"))  # (B, nh, T, T)
    theirs = F.scaled_dot_product_attention(q, k, v, attn_mask=bias, scale=0.3)
    read = real[:, None, :, None].expand_as(ours)  # padding queries are never read
    assert_close_rounding(ours[read], theirs[read], terms=length)
    weights = torch.randn_like(ours)
    ours_grad = torch.autograd.grad((ours * weights)[read].sum(), (q, k, v))
    theirs_grad = torch.autograd.grad((theirs * weights)[read].sum(), (q, k, v))
    for a, b in zip(ours_grad, theirs_grad):
        assert_close_rounding(a, b, terms=length, scale=max(1.0, float(b.abs().max())))
    dense = torch.softmax(q.detach() @ k.detach().transpose(-1, -2) * 0.3 + bias, -1)
    rows = real[:, None, :].expand(-1, heads, -1)
    assert_close_rounding(probs[rows], dense[rows], terms=length)


def test_training_draws_distinct_blocks_outside_window_and_globals():
    blocks, heads = 14, 3
    chosen = random_blocks(blocks, heads, 3, seed=0)
    assert chosen.shape == (heads, blocks - 2, 3)
    for i in range(1, blocks - 1):
        row = chosen[:, i - 1]
        assert all(len(set(r.tolist())) == 3 for r in row)  # distinct
        assert ((row > 0) & (row < blocks - 1) & ((row - i).abs() > 1)).all()
    assert (chosen[:, 0] != blocks - 2).all() and (chosen[:, -1] != 1).all()
    assert torch.equal(chosen, random_blocks(blocks, heads, 3, seed=0))  # seeded
    assert not torch.equal(chosen, random_blocks(blocks, heads, 3, seed=1))
    assert not torch.equal(chosen[0], chosen[1])  # each head its own


def test_sparse_path_threshold_is_transformers():
    assert not sparse_applies(36, BLOCK, RANDOM) and sparse_applies(37, BLOCK, RANDOM)


def _inputs(length: int, pad: int = 9) -> dict[str, torch.Tensor]:
    ids = torch.randint(3, 97, (2, length), generator=torch.Generator().manual_seed(length))
    mask = torch.ones_like(ids)
    mask[1, length - pad:] = 0
    ids[1, length - pad:] = 0
    types = torch.zeros_like(ids)
    types[:, length // 2:] = 1
    return dict(input_ids=ids, attention_mask=mask, token_type_ids=types)


def _hf_config(**overrides):
    return transformers.BigBirdConfig(**SHAPE, block_size=BLOCK, num_random_blocks=RANDOM,
                                      attention_type="block_sparse", **overrides)


HF_CLASSES = {"mlm": "BigBirdForMaskedLM", "sequence-classification":
              "BigBirdForSequenceClassification"}
LENGTHS = (50, 64, 30)  # sparse (padded to 52 inside), sparse, dense fallback (<= 36)


@pytest.fixture(scope="module")
def theirs_folders(tmp_path_factory):
    """Each head's transformers model (random weights moved off init) saved once."""
    root = tmp_path_factory.mktemp("bigbird")
    torch.manual_seed(0)
    for head, name in HF_CLASSES.items():
        model = perturb(getattr(transformers, name)(_hf_config(num_labels=3)), scale=0.2)
        model.save_pretrained(root / head)
    return root


def _hf_logits(model, length: int) -> torch.Tensor:
    model.bert.set_attention_type("block_sparse")  # a short input left it dense for good
    with torch.no_grad():
        return model(**_inputs(length)).logits


def _ours_logits(model, head: str, batch):
    from lmlab.models.task_heads import task_logits

    with torch.no_grad():
        return model(**batch).logits if head == "mlm" else task_logits(model, head, batch)


@pytest.mark.numerics
@pytest.mark.parametrize("head", list(HF_CLASSES))
def test_reads_transformers_folders(theirs_folders, head):
    theirs = getattr(transformers, HF_CLASSES[head]).from_pretrained(theirs_folders / head).eval()
    ours = lmlab.from_pretrained(theirs_folders / head).eval()
    assert ours.config.block_sparse == {"block_size": BLOCK, "num_random_blocks": RANDOM}
    for length in LENGTHS:
        batch = _inputs(length)
        want = _hf_logits(theirs, length)
        where = batch["attention_mask"].bool() if head == "mlm" else None
        assert_parity(_ours_logits(ours, head, batch), want, f"{head} at {length}", where)
    dense = LanguageModel(ours.config.__class__.from_dict({**ours.config.to_dict(),
                                                           "block_sparse": None}),
                          heads=list(ours.heads))
    dense.load_state_dict(ours.state_dict(), strict=False)
    gap = (_ours_logits(dense.eval(), head, _inputs(64)) - _hf_logits(theirs, 64)).abs().max()
    assert gap > 1e-3  # the sparse pattern matters at this length: dense would not pass


@pytest.mark.numerics
@pytest.mark.parametrize("head", list(HF_CLASSES))
def test_saves_what_transformers_reads(tmp_path, head):
    torch.manual_seed(1)
    config = family_config("big_bird", **SHAPE,
                           block_sparse={"block_size": BLOCK, "num_random_blocks": RANDOM})
    if head == "mlm":
        ours = LanguageModel(config, heads=["mlm"])
    else:
        from lmlab.models.task_heads import add_task_head

        ours = LanguageModel(config)
        add_task_head(ours, head, 3)
    perturb(ours, seed=5)
    lmlab.save_pretrained(ours, tmp_path)
    saved = json.loads((tmp_path / "config.json").read_text())
    assert saved["attention_type"] == "block_sparse" and saved["block_size"] == BLOCK
    theirs, info = getattr(transformers, HF_CLASSES[head]).from_pretrained(
        tmp_path, output_loading_info=True)
    # MLM: transformers' BigBirdForMaskedLM holds a pooler it never reads
    assert set(info["missing_keys"]) <= ({"bert.pooler.weight", "bert.pooler.bias"}
                                         if head == "mlm" else set()), info
    for length in LENGTHS:
        batch = _inputs(length)
        where = batch["attention_mask"].bool() if head == "mlm" else None
        assert_parity(_ours_logits(ours, head, batch), _hf_logits(theirs.eval(), length),
                      f"{head} at {length}", where)


_RELOAD = """
import json, sys, torch, lmlab
model = lmlab.from_pretrained(sys.argv[1]).eval()
batch = {k: torch.tensor(v) for k, v in json.loads(sys.argv[2]).items()}
with torch.no_grad():
    print(json.dumps(model(**batch).logits.tolist()))
"""


@pytest.mark.numerics
def test_saved_model_loads_in_a_fresh_process(theirs_folders, tmp_path):
    """transformers' folder read by lmlab, saved again by lmlab, read in a new process."""
    theirs = transformers.BigBirdForMaskedLM.from_pretrained(theirs_folders / "mlm").eval()
    lmlab.save_pretrained(lmlab.from_pretrained(theirs_folders / "mlm"), tmp_path)
    batch = _inputs(50)
    result = subprocess.run([sys.executable, "-c", _RELOAD, str(tmp_path),
                             json.dumps({k: v.tolist() for k, v in batch.items()})],
                            capture_output=True, text=True, check=True)
    logits = torch.tensor(json.loads(result.stdout.strip().splitlines()[-1]))
    assert_parity(logits, _hf_logits(theirs, 50), "fresh process", batch["attention_mask"].bool())


def test_training_blocks_are_random_and_fixed_per_layer():
    """In training the random blocks come from a torch generator seeded by the layer: two
    forwards agree (dropout off), and differ from eval's pattern (every random block is 0)."""
    config = family_config("big_bird", **SHAPE, hidden_dropout_prob=0.0,
                           attention_probs_dropout_prob=0.0,
                           block_sparse={"block_size": BLOCK, "num_random_blocks": RANDOM})
    torch.manual_seed(0)
    model = perturb(LanguageModel(config, heads=["mlm"]))
    batch = _inputs(64)
    with torch.no_grad():
        evaluated = model.eval()(**batch).logits
        first, second = (model.train()(**batch).logits for _ in range(2))
    # exact: the same ops on the same inputs and the same drawn blocks
    assert torch.equal(first, second)
    assert (first - evaluated).abs().max() > 1e-3


def test_presets_match_transformers_counts():
    with torch.device("meta"):
        theirs = transformers.BigBirdModel(transformers.BigBirdConfig(), add_pooling_layer=False)
    assert preset("big_bird", "base").num_parameters() == theirs.num_parameters()
    tiny = preset("big_bird", "tiny")
    assert tiny.block_sparse == {"block_size": 16, "num_random_blocks": 1}
    assert sparse_applies(128, **tiny.block_sparse)  # pretraining at 128 tokens is sparse


@pytest.mark.parametrize("settings,problem", [
    ({"block_size": 0, "num_random_blocks": 3}, "block_size 0"),
    ({"block_size": 8, "num_random_blocks": -1}, "num_random_blocks -1"),
    ({"block_size": 8.0, "num_random_blocks": 1}, "block_size 8.0"),
    ({"block_size": 8}, "is not a block_size and num_random_blocks"),
])
def test_bad_settings_are_refused(settings, problem):
    with pytest.raises(LmlabError, match=problem):
        family_config("big_bird", **SHAPE, block_sparse=settings)


def test_decoders_windows_and_global_tokens_are_refused():
    sparse = {"block_size": 8, "num_random_blocks": 1}
    for other in (dict(causal=True), dict(attention_window=8)):
        with pytest.raises(LmlabError, match="block-sparse attention in a decoder"):
            family_config("bert", **SHAPE, block_sparse=sparse, **other)
    model = LanguageModel(family_config("big_bird", **SHAPE, block_sparse=sparse))
    batch = _inputs(20)
    with pytest.raises(LmlabError, match="global_attention_mask"):
        model(**batch, global_attention_mask=batch["attention_mask"])
    with pytest.raises(LmlabError, match="is a decoder"):
        lmlab.models.families.get_family("big_bird").config_from_hf(
            {**_hf_config().to_dict(), "is_decoder": True})


def test_finetune_through_the_cli(tiny_bert_folder, tmp_path):
    """`lmlab finetune` of a BigBird folder (MiniLM's WordPiece) on 20-token sentences, past the
    sparse threshold of blocks of 2 (14 tokens): the classification head trains (loss falls),
    the saved model is BigBirdForSequenceClassification with its block-sparse pattern."""
    import shutil

    from conftest import finetune_kinds

    torch.manual_seed(0)
    sparse = {"block_size": 2, "num_random_blocks": 1}
    config = family_config("big_bird", **{**SHAPE, "vocab_size": 30522}, block_sparse=sparse)
    folder = lmlab.save_pretrained(LanguageModel(config), tmp_path / "bigbird")
    for name in tiny_bert_folder.iterdir():
        if name.name.startswith(("tokenizer", "vocab", "special_tokens")):
            shutil.copy(name, folder / name.name)
    saved = finetune_kinds(folder, tmp_path / "run", sentence="the {w} is here, look at the {w} "
                           "over there by the old wall near the road")
    assert saved["architectures"] == ["BigBirdForSequenceClassification"]
    assert (saved["attention_type"], saved["block_size"]) == ("block_sparse", 2)


def test_cost_counts_the_blocks_the_pattern_computes():
    """flops_breakdown by hand (S = 45 pads to 12 blocks of 4: 2 global blocks' 4 rows x 48
    keys, 10 blocks' 4 rows x (5 + 2) x 4 keys, QK and PV), dense at 30 tokens; and a
    training pass of lmlab's BigBird counts what the formula says (FlopCounterMode)."""
    from lmlab.cost.flop_counter import measure_flops
    from lmlab.cost.flops import flops_breakdown, flops_per_token

    config = family_config("big_bird", **SHAPE, block_sparse={"block_size": BLOCK,
                                                              "num_random_blocks": RANDOM})
    got = flops_breakdown(config, 45, training=False, head="none").attention_scores
    per_sequence = 4 * (2 * 4 * 48 + 10 * 4 * 7 * 4) * 32  # x 2 layers / 45 tokens
    assert got == pytest.approx(2 * per_sequence / 45, rel=1e-12)
    short = flops_breakdown(config, 30, training=False, head="none").attention_scores
    assert short == 2 * 4 * 30 * 32
    torch.manual_seed(0)
    model = LanguageModel(config, heads=["mlm"]).train()
    for length in (45, 30):
        ids = torch.randint(3, 97, (2, length))
        measured, _ = measure_flops(model, {"input_ids": ids, "labels": ids})
        assert measured == pytest.approx(flops_per_token(config, length) * ids.numel(), rel=1e-9)


def test_original_full_reads_as_dense_and_writes_back():
    family = lmlab.models.families.get_family("big_bird")
    config = family.config_from_hf({**_hf_config().to_dict(), "attention_type": "original_full"})
    assert config.block_sparse is None and config.extra["classifier_act"] == "gelu_new"
    assert family.config_to_hf(config)["attention_type"] == "original_full"
    written = family.config_to_hf(family.config_from_hf(_hf_config().to_dict()))
    assert (written["attention_type"], written["block_size"], written["num_random_blocks"]) == (
        "block_sparse", BLOCK, RANDOM)
    relu = family_config("big_bird", **SHAPE, hidden_act="relu")  # its head would apply relu
    with pytest.raises(LmlabError, match="classification head applies hidden_act"):
        family.config_to_hf(relu)


def test_a_bert_with_block_sparse_attention_is_saved_in_lmlabs_format(tmp_path, capsys):
    """BERT's config.json cannot say block_sparse: lmlab's own format, which reads it back."""
    sparse = {"block_size": BLOCK, "num_random_blocks": RANDOM}
    model = LanguageModel(family_config("bert", **SHAPE, block_sparse=sparse), heads=["mlm"])
    lmlab.save_pretrained(model, tmp_path)
    assert "no block-sparse attention" in capsys.readouterr().out
    assert lmlab.from_pretrained(tmp_path).config.block_sparse == sparse
