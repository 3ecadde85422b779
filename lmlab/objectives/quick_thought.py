"""Quick-thought (Logeswaran & Lee 2018): encoders ``f`` (the model) and ``g`` (held here)
embed a batch of consecutive sentences; each sentence picks its true neighbours by
``f(s_i) . g(s_j)`` (docs/sentence-encoders.md)."""

from __future__ import annotations

import copy

import torch
from torch import nn

from lmlab.objectives.base import ObjectiveResult, sentence_vectors
from lmlab.utils.errors import LmlabError


def neighbour_targets(document: torch.Tensor) -> torch.Tensor:
    """(B,) document of each consecutive row -> (B, B) bool: ``[i, j]`` true when ``j`` is
    ``i - 1`` or ``i + 1`` in the same document."""
    size = document.shape[0]
    index = torch.arange(size, device=document.device)
    adjacent = (index[:, None] - index[None, :]).abs() == 1  # (B, B)
    return adjacent & (document[:, None] == document[None, :])


def quick_thought_loss(f_vectors: torch.Tensor, g_vectors: torch.Tensor,
                       targets: torch.Tensor) -> tuple[torch.Tensor, int]:
    """(mean -log p(neighbour), neighbour count) from (B, H) vectors of f and g and the (B, B)
    target mask; a sentence is never its own candidate."""
    scores = f_vectors @ g_vectors.T  # (B, B)
    eye = torch.eye(scores.shape[0], dtype=torch.bool, device=scores.device)
    log_probs = scores.float().masked_fill(eye, float("-inf")).log_softmax(-1)
    count = int(targets.sum())
    if count == 0:
        return scores.sum() * 0.0, 0
    return -log_probs[targets].mean(), count


class QuickThought(nn.Module):
    """The quick-thought loss; ``context_encoder`` is ``g`` (default: a copy of the model)."""

    name = "quick-thought"
    flops_head = "none"
    reports_perplexity = False
    predicted_fraction = None

    def __init__(self, context_encoder: nn.Module | None = None):
        super().__init__()
        self.context_encoder = context_encoder

    def prepare(self, model: nn.Module) -> None:
        """Make ``g`` a copy of ``model`` when none was given (separate weights)."""
        if self.context_encoder is None:
            self.context_encoder = copy.deepcopy(model)

    def compute_loss(self, model: nn.Module, batch: dict[str, torch.Tensor]) -> ObjectiveResult:
        if "document" not in batch:
            raise LmlabError("the batch has no 'document' for quick-thought",
                             "build batches with lmlab.sentence.data.ContiguousStream")
        if self.context_encoder is None:
            raise LmlabError("quick-thought has no context encoder g",
                             "call objective.prepare(model) before training")
        targets = neighbour_targets(batch["document"])
        f_vectors = sentence_vectors(model, batch)
        g_vectors = sentence_vectors(self.context_encoder, batch)
        loss, count = quick_thought_loss(f_vectors, g_vectors, targets)
        metrics = {"loss": float(loss.detach())}
        has = targets.any(-1)
        if bool(has.any()):
            with torch.no_grad():  # the best-scored candidate is a true neighbour
                scores = f_vectors @ g_vectors.T
                scores.fill_diagonal_(float("-inf"))
                best = scores.argmax(-1)
                hit = targets[torch.arange(len(best), device=best.device), best]
                metrics["accuracy"] = float(hit[has].float().mean())
        return ObjectiveResult(loss, metrics, count)
