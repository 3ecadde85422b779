"""The chunked, fused projection + cross-entropy equals F.linear + F.cross_entropy: loss,
argmax count and gradients, with ignored rows, without gradients, and inside the CLM
objective."""

from __future__ import annotations

import pytest
import torch
from conftest import assert_close_rounding
from torch.nn import functional as F

from lmlab.objectives.linear_cross_entropy import linear_cross_entropy


def _data(rows: int = 37, hidden: int = 16, vocab: int = 50, ignored: int = 5):
    g = torch.Generator().manual_seed(0)
    h = torch.randn(rows, hidden, generator=g, requires_grad=True)
    w = torch.randn(vocab, hidden, generator=g, requires_grad=True)
    t = torch.randint(0, vocab, (rows,), generator=g)
    t[torch.randperm(rows, generator=g)[:ignored]] = -100
    return h, w, t


def _logit_size(h, w) -> float:
    """The largest |logit|: the size of the numbers the loss sums (rounding scales with it)."""
    with torch.no_grad():
        return float(F.linear(h, w).abs().max())


def _reference(h, w, t):
    logits = F.linear(h, w)
    loss = F.cross_entropy(logits, t, ignore_index=-100)
    correct = int(((logits.argmax(-1) == t) & (t != -100)).sum())
    return loss, correct


@pytest.mark.numerics
@pytest.mark.parametrize("chunk_rows", [1, 8, 37, 1000])
def test_loss_count_and_gradients_equal_the_unfused_computation(chunk_rows):
    h, w, t = _data()
    loss, correct = linear_cross_entropy(h, w, t, chunk_rows=chunk_rows)
    (2.5 * loss).backward()  # a non-unit upstream gradient reaches both inputs
    grads = h.grad.clone(), w.grad.clone()
    h.grad, w.grad = None, None
    expected, expected_correct = _reference(h, w, t)
    (2.5 * expected).backward()
    # Chunks sum in another order: log-sum-exps over 50 words, gradients over 50 words (h)
    # or 37 rows (w), in float32. A wrong chunk offset or a counted ignored row is far above.
    assert_close_rounding(loss, expected, terms=50, depth=2, scale=_logit_size(h, w))
    assert int(correct) == expected_correct
    assert_close_rounding(grads[0], h.grad, terms=50, depth=2)
    assert_close_rounding(grads[1], w.grad, terms=37, depth=2)


@pytest.mark.numerics
@pytest.mark.parametrize("chunk_rows", [8, 1000])
def test_with_a_bias_equals_the_unfused_computation(chunk_rows):
    """The recurrent LMs' softmax has a bias (Merity et al., Peters et al.): it enters the
    logits and receives the summed (softmax - one-hot) of the kept rows."""
    h, w, t = _data()
    b = torch.randn(w.shape[0], generator=torch.Generator().manual_seed(1), requires_grad=True)
    loss, correct = linear_cross_entropy(h, w, t, chunk_rows=chunk_rows, bias=b)
    (2.5 * loss).backward()
    grads = h.grad.clone(), w.grad.clone(), b.grad.clone()
    h.grad, w.grad, b.grad = None, None, None
    logits = F.linear(h, w, b)
    expected = F.cross_entropy(logits, t, ignore_index=-100)
    (2.5 * expected).backward()
    scale = float(logits.detach().abs().max())
    assert_close_rounding(loss, expected, terms=50, depth=2, scale=scale)
    assert int(correct) == int(((logits.argmax(-1) == t) & (t != -100)).sum())
    assert_close_rounding(grads[0], h.grad, terms=50, depth=2)
    assert_close_rounding(grads[1], w.grad, terms=37, depth=2)
    assert_close_rounding(grads[2], b.grad, terms=37, depth=2)


@pytest.mark.numerics
def test_without_gradients_and_with_every_row_ignored():
    h, w, t = _data()
    with torch.no_grad():
        loss, _ = linear_cross_entropy(h, w, t, chunk_rows=8)
    assert_close_rounding(loss, _reference(h, w, t)[0], terms=50, depth=2, scale=_logit_size(h, w))
    assert loss.grad_fn is None
    loss, correct = linear_cross_entropy(h, w, torch.full_like(t, -100))
    loss.backward()
    assert loss.item() == 0.0 and int(correct) == 0
    assert torch.count_nonzero(h.grad) == 0 and torch.count_nonzero(w.grad) == 0


@pytest.mark.numerics
def test_autocast_falls_back_to_the_plain_computation():
    h, w, t = _data()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        loss, correct = linear_cross_entropy(h, w, t)
    assert loss.dtype == torch.float32
    # bfloat16 products of 16 terms of size about 1 (randn * randn): bfloat16 rounding.
    assert_close_rounding(loss, _reference(h, w, t)[0], terms=16, scale=1.0, dtype=torch.bfloat16)


@pytest.mark.numerics
def test_clm_objective_equals_the_heads_unfused_loss_and_gradients():
    """The objective (fused) and model(..., labels=...) (logits + F.cross_entropy) agree on a
    tied GPT-2, padding included."""
    from lmlab.models.model import LanguageModel
    from lmlab.models.presets import family_config
    from lmlab.objectives import SpecialTokens, build_objective

    torch.manual_seed(0)
    config = family_config("gpt2", vocab_size=97, hidden_size=32, num_hidden_layers=2,
                            num_attention_heads=4, intermediate_size=64,
                            max_position_embeddings=64, hidden_dropout_prob=0.0,
                            attention_probs_dropout_prob=0.0)
    model = LanguageModel(config, heads=("clm",))
    special = SpecialTokens(vocab_size=97, pad_id=0, cls_id=1, sep_id=1, bos_id=1, eos_id=1)
    objective = build_objective("clm", special)
    ids = torch.randint(2, 97, (3, 12))
    mask = torch.ones_like(ids)
    mask[2, 7:] = 0
    batch = objective.corrupt({"input_ids": ids, "attention_mask": mask},
                              torch.Generator().manual_seed(0))
    result = objective.compute_loss(model, batch)
    result.loss.backward()
    fused = {n: p.grad.clone() for n, p in model.named_parameters()}
    model.zero_grad()
    out = model(input_ids=ids, attention_mask=mask, labels=batch["labels"])
    out.loss.backward()
    # The same model; only the loss's sums (97 words, 28 rows) run in another order, and the
    # gradients go back through 2 layers of sums of up to 64 terms.
    assert_close_rounding(result.loss, out.loss, terms=97, depth=2,
                          scale=float(out.logits.detach().abs().max()))
    assert result.num_predictions == 11 + 11 + 6
    # Scale: the largest gradient, not each tensor's own (the key bias's true gradient is 0, so
    # its computed value is only the rounding left over from cancelling terms).
    size = max(float(p.grad.abs().max()) for p in model.parameters())
    for name, parameter in model.named_parameters():
        assert_close_rounding(fused[name], parameter.grad, terms=97, depth=3, scale=size, msg=name)
    logits = out.logits[:, :-1]
    targets = batch["labels"][:, 1:]
    keep = targets != -100
    accuracy = float(((logits.argmax(-1) == targets) & keep).sum()) / int(keep.sum())
    assert result.metrics["clm_accuracy"] == pytest.approx(accuracy)
