"""Output projection and cross-entropy fused, in chunks of rows: the logits never exist whole;
each chunk gives its loss terms and gradients at once (Liger-Kernel's fused linear
cross-entropy). Under autocast it computes the ordinary way (docs/decoders.md)."""

from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F

from lmlab.models.heads import IGNORE_INDEX

DEFAULT_CHUNK_ROWS = 1024


class _ChunkedLinearCrossEntropy(torch.autograd.Function):
    """Mean cross-entropy of ``hidden @ weight.T`` against ``targets``; see the module doc."""

    @staticmethod
    def forward(ctx, hidden: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
                targets: torch.Tensor, chunk_rows: int, grad_enabled: bool
                ) -> tuple[torch.Tensor, torch.Tensor]:
        rows = hidden.shape[0]
        valid = targets != IGNORE_INDEX  # (N,)
        count = int(valid.sum())
        scale = 1.0 / max(count, 1)
        # (grad mode is always off inside forward: whether to prepare gradients is passed in)
        want_hidden = grad_enabled and ctx.needs_input_grad[0]
        want_weight = grad_enabled and ctx.needs_input_grad[1]
        want_bias = grad_enabled and bias is not None and ctx.needs_input_grad[2]
        need_grad = want_hidden or want_weight or want_bias
        grad_hidden = torch.empty_like(hidden) if want_hidden else None
        grad_weight = torch.zeros_like(weight) if want_weight else None
        grad_bias = torch.zeros_like(bias) if want_bias else None
        total = hidden.new_zeros((), dtype=torch.float32)
        correct = torch.zeros((), dtype=torch.long, device=hidden.device)
        for start in range(0, rows, chunk_rows):
            end = min(start + chunk_rows, rows)
            h = hidden[start:end]  # (c, H)
            t = targets[start:end]  # (c,)
            keep = valid[start:end]
            safe = t.clamp(min=0)
            logits = h @ weight.t() if bias is None else torch.addmm(bias, h, weight.t())  # (c, V)
            # few passes over the (c, V) block: max (with argmax), subtract, exp, sum, scale
            top, best = logits.max(dim=-1)  # (c,), (c,)
            correct += ((best == t) & keep).sum()
            picked = logits.gather(1, safe[:, None]).squeeze(1)  # (c,)
            exp = logits.sub_(top[:, None]).exp_()  # in place: exp(logits - max)
            sums = exp.sum(dim=-1)  # (c,)
            lse = top + sums.log()
            total += ((lse - picked) * keep).sum()
            if not need_grad:
                continue
            # d(mean loss)/d(logits) = (softmax - one_hot) / count, zero at ignored rows
            grad = exp.mul_((keep.to(exp.dtype) * scale / sums)[:, None])  # softmax / count
            grad[torch.arange(end - start, device=grad.device), safe] -= keep.to(exp.dtype) * scale
            if grad_hidden is not None:
                grad_hidden[start:end] = grad @ weight  # (c, H)
            if grad_weight is not None:
                grad_weight.addmm_(grad.t(), h)  # (V, H)
            if grad_bias is not None:
                grad_bias += grad.sum(dim=0)  # (V,)
        grads = (grad_hidden, grad_weight, grad_bias)
        ctx.save_for_backward(*(g for g in grads if g is not None))
        ctx.has = tuple(g is not None for g in grads)
        ctx.mark_non_differentiable(correct)
        return total * scale, correct

    @staticmethod
    def backward(ctx, grad_output: torch.Tensor, _grad_correct: torch.Tensor):
        saved = list(ctx.saved_tensors)
        grad_hidden = saved.pop(0) * grad_output if ctx.has[0] else None
        grad_weight = saved.pop(0) * grad_output if ctx.has[1] else None
        grad_bias = saved.pop(0) * grad_output if ctx.has[2] else None
        return grad_hidden, grad_weight, grad_bias, None, None, None


def linear_cross_entropy(hidden: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor,
                         chunk_rows: int = DEFAULT_CHUNK_ROWS, bias: torch.Tensor | None = None
                         ) -> tuple[torch.Tensor, torch.Tensor]:
    """(mean cross-entropy over the non-ignored rows, 0 if none; 0-d int64 count of rows whose
    argmax is the target) of the logits ``hidden @ weight.T + bias``, never all materialised.
    ``hidden`` (N, H), ``weight`` (V, H), ``targets`` (N,) with -100 ignored, ``bias`` (V,) or
    None; memory ~ ``chunk_rows`` x V floats."""
    fused = (hidden.dtype == torch.float32 and weight.dtype == torch.float32
             and not torch.is_autocast_enabled(hidden.device.type)
             and type(weight) in (torch.Tensor, torch.nn.Parameter)
             and (bias is None or bias.dtype == torch.float32))
    if not fused:
        logits = F.linear(hidden, weight, bias)
        with torch.no_grad():
            correct = ((logits.argmax(dim=-1) == targets) & (targets != IGNORE_INDEX)).sum()
        if not bool((targets != IGNORE_INDEX).any()):
            return logits.sum() * 0.0, correct
        return F.cross_entropy(logits.float(), targets, ignore_index=IGNORE_INDEX), correct
    return _ChunkedLinearCrossEntropy.apply(hidden, weight, bias, targets, chunk_rows,
                                            torch.is_grad_enabled())


def projected_cross_entropy(states: torch.Tensor, projection: nn.Linear, targets: torch.Tensor
                            ) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`linear_cross_entropy` of ``projection`` over the rows of ``states`` (B, T, H)
    whose target (B, T) is not -100: ignored positions are never projected."""
    keep = targets.reshape(-1) != IGNORE_INDEX  # (B*T,)
    return linear_cross_entropy(states.reshape(-1, states.shape[-1])[keep], projection.weight,
                                targets.reshape(-1)[keep], bias=projection.bias)
