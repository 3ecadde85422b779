"""The analytic FLOPs of windowed attention (Longformer's windows and global tokens, GPT-Neo's
local layers) and of DeBERTa's enhanced mask decoder: against a hand computation for small
shapes, and against FlopCounterMode on lmlab's own models (both count the same matmuls)."""

from __future__ import annotations

import pytest
import torch

from lmlab.cost.flop_counter import measure_flops
from lmlab.cost.flops import flops_breakdown, flops_per_token
from lmlab.models.model import LanguageModel
from lmlab.models.presets import family_config
from lmlab.utils.errors import LmlabError

SHAPE = dict(vocab_size=50, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
             intermediate_size=64, max_position_embeddings=64, attention_probs_dropout_prob=0.1)


def _longformer(**overrides):
    return family_config("longformer", **{**SHAPE, "attention_window": [4, 6], **overrides})


def test_longformer_windows_and_global_tokens_by_hand():
    """S = 21, G = 2, windows 4 and 6 (2 and 3 keys each side), H = q = 32, F = 64, forward:
    window 4: blocks of 2 queries (22 rows) x (2 + 2 + 2 band + 2 global) keys, QK and PV;
    window 6: blocks of 3 (21 rows) x (3 + 3 + 3 + 2); the 2 global rows x 21 keys each."""
    config = _longformer()
    got = flops_breakdown(config, 21, training=False, head="none", global_tokens=2)
    per_sequence = (4 * 22 * (6 + 2) + 4 * 2 * 21) + (4 * 21 * (9 + 2) + 4 * 2 * 21)
    assert got.attention_scores == pytest.approx(per_sequence * 32 / 21, rel=1e-12)
    # q, k, v, o (4 x 2 H q) and the three global maps (3 x 2 H q), in each layer
    assert got.attention_projections == 2 * (4 + 3) * 2 * 32 * 32
    assert got.ffn == 2 * 2 * 2 * 32 * 64
    dense = flops_breakdown(_longformer(attention_window=0), 21, training=False, head="none")
    assert dense.attention_scores == 2 * 4 * 21 * 32  # every key for every query
    local = flops_breakdown(config, 21, training=False, head="none")  # no global tokens
    assert local.attention_scores == pytest.approx((4 * 22 * 6 + 4 * 21 * 9) * 32 / 21)
    assert local.attention_projections == 2 * 4 * 2 * 32 * 32
    # at 4,096 tokens the band is a small fraction of dense attention
    long = flops_breakdown(config, 4096, training=False, head="none", global_tokens=1)
    assert long.attention_scores < 0.01 * flops_breakdown(
        _longformer(attention_window=0), 4096, training=False, head="none").attention_scores


def test_gpt_neo_local_layers_by_hand():
    """Causal window 4: blocks of 3 queries see 3 + 3 keys (the 3 before the block and its
    own); S = 20 pads to 21 rows; the dense layer every key; "half" halves only dense layers."""
    config = family_config("gpt_neo", **{**SHAPE, "attention_window": [0, 4]})
    got = flops_breakdown(config, 20, training=True, head="clm")
    forward = 4 * 20 * 32 + 4 * 21 * 6 * 32 / 20
    assert got.attention_scores == pytest.approx(3 * forward, rel=1e-12)
    half = flops_breakdown(config, 20, training=True, head="clm", causal_attention="half")
    assert half.attention_scores == pytest.approx(3 * (2 * 20 * 32 + 4 * 21 * 6 * 32 / 20))
    with pytest.raises(LmlabError, match="global_tokens"):
        flops_breakdown(config, 20, global_tokens=-1)


@pytest.mark.parametrize("family", ["longformer", "gpt_neo"])
def test_windowed_models_match_the_flop_counter(family):
    """A training pass of lmlab's windowed model (blocked path; global rows through SDPA's
    math path, which attention dropout selects on CPU) counts what the formula says."""
    torch.manual_seed(0)
    if family == "longformer":
        config, head, glob = _longformer(), "mlm", torch.zeros(2, 21, dtype=torch.long)
        glob[:, 0] = 1
        glob[0, 9] = glob[1, 4] = 1  # two global tokens per row
        count = 2
    else:
        config = family_config("gpt_neo", **{**SHAPE, "attention_window": [0, 4]})
        head, glob, count = "clm", None, 0
    model = LanguageModel(config, heads=[head]).train()
    ids = torch.randint(3, 50, (2, 21))
    inputs = {"input_ids": ids, "labels": ids}
    if glob is not None:
        inputs["global_attention_mask"] = glob
    measured, _ = measure_flops(model, inputs)
    analytic = flops_per_token(config, 21, head=head, global_tokens=count) * ids.numel()
    assert measured == pytest.approx(analytic, rel=1e-9)


def test_enhanced_mask_decoder_counts_its_passes():
    """head="emd": the MLM head plus emd_layers (2) more passes of the last layer over every
    token (q, k, v, o, dense scores, feed-forward), whatever fraction the head predicts."""
    config = family_config("deberta-v2", vocab_size=50, hidden_size=32, num_hidden_layers=3,
                           num_attention_heads=4, intermediate_size=64,
                           max_position_embeddings=64)
    mlm = flops_breakdown(config, 16, training=True, head="mlm", sparse_prediction_fraction=0.15)
    emd = flops_breakdown(config, 16, training=True, head="emd", sparse_prediction_fraction=0.15)
    layer = 4 * 2 * 32 * 32 + 4 * 16 * 32 + 2 * 2 * 32 * 64
    assert emd.mask_decoder == 3 * 2 * layer
    assert emd.total - mlm.total == pytest.approx(3 * 2 * layer, rel=1e-12)
    assert "enhanced mask decoder" in emd.to_markdown()
    assert "enhanced mask decoder" not in mlm.to_markdown()


def test_the_mlm_objective_counts_its_decoder():
    """MaskedLM(enhanced_mask_decoder=True) asks the cost report for the "emd" count."""
    from lmlab.objectives.mlm import MaskedLM
    from lmlab.objectives.special_tokens import SpecialTokens

    special = SpecialTokens(vocab_size=50, pad_id=0, cls_id=2, sep_id=3, mask_id=1)
    assert MaskedLM(special, enhanced_mask_decoder=True).flops_head == "emd"
    assert MaskedLM(special).flops_head == "mlm"


def test_the_cli_counts_global_tokens(capsys):
    """`lmlab cost flops|estimate --global-tokens G` on a windowed preset: the table's scores
    are flops_breakdown's with G, and the assumptions say how windows are counted."""
    from lmlab.cli import main
    from lmlab.cost.presets import preset_config

    assert main(["cost", "flops", "--model", "longformer-base", "--seq-len", "4096",
                 "--global-tokens", "1"]) in (0, None)
    want = flops_breakdown(preset_config("longformer-base"), 4096, global_tokens=1)
    assert f"| attention scores | {want.attention_scores:,.0f} |" in capsys.readouterr().out
    assert main(["cost", "estimate", "--model", "gpt_neo-125m", "--tokens", "1e9",
                 "--device", "a100"]) == 0
    assert "windowed layers by their band" in capsys.readouterr().out
