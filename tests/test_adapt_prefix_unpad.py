"""Prefix tuning keeps lmlab's padding skipping (core/unpad.py): the pre-filled key/value cache
holds the prefix, only the call's real tokens are gathered, and every sequence attends to its
prefix and its own real tokens. Checked against the padded computation (``skip_padding=False``)
on BERT, Llama (grouped key/value heads, rotary) and GPT-2, and against peft's prefix tuning on
the same weights with a padded batch (transformers computes the padding).

Tolerance: fp32 rounding over a few chained sums (conftest's ``assert_close_rounding``); a
sequence seeing another's tokens, a missing prefix or a prefix at the wrong columns moves the
outputs by about their own size.
"""

from __future__ import annotations

import pytest
import torch
from conftest import assert_close_rounding

import lmlab
from lmlab.adapt import apply_method
from lmlab.adapt.peft_format import load_peft
from lmlab.models.core import unpad
from lmlab.models.families import get_family
from lmlab.models.model import LanguageModel

SIZES = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64,
             vocab_size=64, max_position_embeddings=64)


def _prefix_model(family: str) -> LanguageModel:
    torch.manual_seed(0)
    extra = dict(num_key_value_heads=2) if family == "llama" else {}
    config = get_family(family).config(**SIZES, **extra, hidden_dropout_prob=0.0,
                                       attention_probs_dropout_prob=0.0)
    model = LanguageModel(config, heads=("clm",) if family != "bert" else ())
    apply_method(model, "prefix", num_virtual_tokens=3)
    with torch.no_grad():  # a prefix the size of real keys and values
        model.transformer.prefix_key_values.weight.normal_()
    return model.eval()


def _batch() -> dict[str, torch.Tensor]:
    ids = torch.tensor([[5, 9, 13, 2, 7, 11], [4, 8, 15, 16, 23, 42], [3, 1, 6, 0, 0, 0]])
    mask = torch.ones_like(ids)
    mask[0, 4:] = 0
    mask[2, 3:] = 0
    return {"input_ids": ids, "attention_mask": mask}


def _count_unpadding(monkeypatch) -> list[int]:
    """Record the number of real tokens each time the stack gathers them."""
    calls: list[int] = []
    original = unpad.PaddingIndex.from_mask.__func__

    def spy(cls, mask):
        calls.append(int(mask.sum()))
        return original(cls, mask)

    monkeypatch.setattr(unpad.PaddingIndex, "from_mask", classmethod(spy))
    return calls


@pytest.mark.parametrize("family", ["bert", "llama", "gpt2"])
def test_prefix_tuning_skips_padding_with_the_padded_outputs(monkeypatch, family):
    model = _prefix_model(family)
    batch = _batch()
    real = batch["attention_mask"].bool()
    with torch.no_grad():
        padded = model(**batch, skip_padding=False, output_hidden_states=True)
        calls = _count_unpadding(monkeypatch)
        skipped = model(**batch, output_hidden_states=True)
    assert calls == [int(real.sum())]  # the real tokens only: the prefix is not gathered
    assert torch.all(skipped.last_hidden_state[~real] == 0)  # padding was not computed
    for ours, reference in zip(skipped.hidden_states, padded.hidden_states, strict=True):
        assert_close_rounding(ours[real], reference[real], terms=64, depth=4)
    if family != "bert":
        assert_close_rounding(skipped.logits[real], padded.logits[real], terms=64, depth=4)
    # the prefix matters: without it the outputs move by about their own size
    with torch.no_grad():
        model.transformer.prefix_key_values.weight.zero_()
        moved = model(**batch).last_hidden_state
    assert (moved[real] - skipped.last_hidden_state[real]).abs().max() > 0.1


@pytest.mark.numerics
def test_each_row_sees_its_prefix_and_its_own_real_tokens():
    """A row computed alone (no padding at all) equals the same row inside a padded batch."""
    model = _prefix_model("bert")
    batch = _batch()
    with torch.no_grad():
        together = model(**batch).last_hidden_state
        for row in range(3):
            length = int(batch["attention_mask"][row].sum())
            alone = model(input_ids=batch["input_ids"][row:row + 1, :length],
                          attention_mask=torch.ones(1, length, dtype=torch.long))
            assert_close_rounding(together[row, :length], alone.last_hidden_state[0],
                                  terms=64, depth=4)


TINY_HF = {
    "bert": lambda t: ("BertModel", t.BertConfig(
        vocab_size=64, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
        intermediate_size=64, max_position_embeddings=40, hidden_dropout_prob=0.0,
        attention_probs_dropout_prob=0.0), "FEATURE_EXTRACTION"),
    "llama": lambda t: ("LlamaForCausalLM", t.LlamaConfig(
        vocab_size=64, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, intermediate_size=64, max_position_embeddings=64), "CAUSAL_LM"),
}


@pytest.mark.numerics
@pytest.mark.parametrize("case", list(TINY_HF))
def test_skipped_padding_prefix_matches_peft(tmp_path, monkeypatch, case):
    transformers = pytest.importorskip("transformers")
    peft = pytest.importorskip("peft")
    class_name, config, task = TINY_HF[case](transformers)
    torch.manual_seed(0)
    base = getattr(transformers, class_name)(config).eval()
    base.save_pretrained(tmp_path / "base")
    theirs = peft.get_peft_model(base, peft.PrefixTuningConfig(
        task_type=task, num_virtual_tokens=3)).eval()
    with torch.no_grad():
        theirs.prompt_encoder["default"].embedding.weight.normal_()
    theirs.save_pretrained(tmp_path / "adapter")
    ours = load_peft(tmp_path / "adapter", lmlab.from_pretrained(tmp_path / "base")).eval()
    batch = _batch()
    real = batch["attention_mask"].bool()
    with torch.no_grad():
        expected = theirs(**batch)
        calls = _count_unpadding(monkeypatch)
        actual = ours(**batch)
    assert calls == [int(real.sum())]
    if case == "bert":
        expected, actual = expected.last_hidden_state, actual.last_hidden_state
    else:
        expected, actual = expected.logits, actual.logits
    assert_close_rounding(actual[real], expected[real], terms=64, depth=6)
    assert expected[real].abs().max() > 0.1
