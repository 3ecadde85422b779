"""Sentence-BERT's training objectives for a bi-encoder: in-batch contrastive ranking, pair
classification ``softmax(W [u; v; |u - v|])``, cosine-similarity regression and the triplet
loss, on batches laid out column after column (:func:`lmlab.sentence.data.collate_columns`), as
Trainer objectives."""

from __future__ import annotations

import torch
from torch import nn

from lmlab.objectives.base import ObjectiveResult
from lmlab.sentence.encoder import embed_batch
from lmlab.utils.checks import check_choice
from lmlab.utils.errors import LmlabError


def mnrl_loss(anchors: torch.Tensor, candidates: torch.Tensor, scale: float = 20.0,
              groups: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """(loss, logits (B, N)): anchor ``i``'s positive is candidate ``i`` (then hard negatives);
    ``groups`` (N,) masks other candidates of the positive's group (a second copy of it)."""
    batch = anchors.shape[0]
    if candidates.shape[0] < 2:
        raise LmlabError("in-batch negatives need at least two pairs in a batch (got one)",
                         "use a batch size of at least 2 (SBERT used 16 or more)")
    cosines = nn.functional.normalize(anchors, dim=-1) @ nn.functional.normalize(
        candidates, dim=-1).T  # (B, N)
    logits = cosines * scale
    targets = torch.arange(batch, device=anchors.device)
    if groups is not None:
        same = groups[:batch, None] == groups[None, :]  # (B, N)
        same[targets, targets] = False
        logits = logits.masked_fill(same, float("-inf"))
    return nn.functional.cross_entropy(logits, targets), logits


class _BiEncoderObjective(nn.Module):
    """What the Trainer reads of an objective, for a sentence-level loss."""

    name = ""
    flops_head = "none"
    reports_perplexity = False
    predicted_fraction = None

    def __init__(self, normalize: bool = False):
        super().__init__()
        self.normalize = bool(normalize)

    def prepare(self, model: nn.Module) -> None:
        """Nothing to add to the model: the loss reads its pooled hidden states."""

    def columns(self, model: nn.Module, batch: dict[str, torch.Tensor]) -> list[torch.Tensor]:
        """The batch's sentence vectors, one (B, H) tensor per column."""
        vectors = embed_batch(model, batch, self.normalize)  # (C * B, H)
        rows = batch["labels"].shape[0]
        if rows == 0 or vectors.shape[0] % rows:
            raise LmlabError(f"a batch of {vectors.shape[0]} sentences is not whole columns of "
                             f"{rows} pairs", "build batches with lmlab.sentence.data.PairStream")
        return list(vectors.split(rows))


class MultipleNegativesRanking(_BiEncoderObjective):
    """Contrastive loss with in-batch negatives (sentence-transformers'
    ``MultipleNegativesRankingLoss``)."""

    name = "mnrl"

    def __init__(self, scale: float = 20.0, normalize: bool = False):
        super().__init__(normalize)
        if not scale > 0:
            raise LmlabError(f"scale {scale} is not positive", "use e.g. 20 (SBERT's default)")
        self.scale = float(scale)

    def compute_loss(self, model: nn.Module, batch: dict[str, torch.Tensor]) -> ObjectiveResult:
        rows = batch["labels"].shape[0]
        if rows < 2:
            raise LmlabError("in-batch negatives need at least two pairs in a batch (got one)",
                             "use a batch size of at least 2 (SBERT used 16 or more)")
        anchors, *candidates = self.columns(model, batch)
        groups = batch.get("groups")
        if groups is not None:
            groups = groups[rows:]  # the candidates' groups (the anchors' are not compared)
        loss, logits = mnrl_loss(anchors, torch.cat(candidates), self.scale, groups)
        with torch.no_grad():
            accuracy = float((logits.argmax(-1) == torch.arange(rows, device=logits.device))
                             .float().mean())
        return ObjectiveResult(loss, {"loss": float(loss.detach()), "accuracy": accuracy}, rows)


class PairClassification(_BiEncoderObjective):
    """SBERT's classification objective: ``softmax(W [u; v; |u - v|])``, cross-entropy."""

    name = "softmax"

    def __init__(self, hidden: int, num_labels: int = 2, normalize: bool = False):
        super().__init__(normalize)
        if num_labels < 2:
            raise LmlabError(f"{num_labels} label(s)", "a classifier needs at least 2 labels")
        self.classifier = nn.Linear(3 * hidden, num_labels)

    def logits(self, u: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        """(B, H), (B, H) -> (B, num_labels)."""
        return self.classifier(torch.cat([u, v, (u - v).abs()], dim=-1).to(
            self.classifier.weight.dtype))

    def compute_loss(self, model: nn.Module, batch: dict[str, torch.Tensor]) -> ObjectiveResult:
        columns = self.columns(model, batch)
        if len(columns) != 2:
            raise LmlabError(f"the classification objective reads pairs, got {len(columns)} "
                             "columns", "give sentence1 and sentence2 only")
        labels = batch["labels"]
        if int(labels.max()) >= self.classifier.out_features or int(labels.min()) < 0:
            raise LmlabError(f"label {int(labels.max())} is outside the classifier's "
                             f"{self.classifier.out_features} labels",
                             "give --num-labels as the number of classes")
        logits = self.logits(*columns)
        loss = nn.functional.cross_entropy(logits, labels)
        accuracy = float((logits.argmax(-1) == labels).float().mean())
        return ObjectiveResult(loss, {"loss": float(loss.detach()), "accuracy": accuracy},
                               int(labels.shape[0]))


class CosineRegression(_BiEncoderObjective):
    """SBERT's regression objective: mean squared error between ``cos(u, v)`` and the pair's
    score (sentence-transformers' ``CosineSimilarityLoss``)."""

    name = "cosine"

    def compute_loss(self, model: nn.Module, batch: dict[str, torch.Tensor]) -> ObjectiveResult:
        columns = self.columns(model, batch)
        if len(columns) != 2:
            raise LmlabError(f"the regression objective reads pairs, got {len(columns)} "
                             "columns", "give sentence1 and sentence2 only")
        u, v = columns
        cosines = nn.functional.cosine_similarity(u, v)  # (B,)
        loss = nn.functional.mse_loss(cosines, batch["scores"].to(cosines.dtype))
        return ObjectiveResult(loss, {"loss": float(loss.detach())}, int(u.shape[0]))


DISTANCES = {
    "euclidean": lambda a, b: torch.linalg.vector_norm(a - b, dim=-1),
    "cosine": lambda a, b: 1 - nn.functional.cosine_similarity(a, b),
    "manhattan": lambda a, b: (a - b).abs().sum(-1),
}


class Triplet(_BiEncoderObjective):
    """SBERT's triplet objective ``max(d(a, p) - d(a, n) + margin, 0)``, Euclidean distance and
    margin 5 by default (sentence-transformers' ``TripletLoss``)."""

    name = "triplet"

    def __init__(self, margin: float = 5.0, distance: str = "euclidean",
                 normalize: bool = False):
        super().__init__(normalize)
        check_choice(distance, DISTANCES, "--distance", "triplet distance")
        if not margin >= 0:
            raise LmlabError(f"margin {margin} is negative", "use e.g. 5 (SBERT's default)")
        self.margin, self.distance = float(margin), distance

    def compute_loss(self, model: nn.Module, batch: dict[str, torch.Tensor]) -> ObjectiveResult:
        columns = self.columns(model, batch)
        if len(columns) != 3:
            raise LmlabError(f"the triplet objective reads (anchor, positive, negative), got "
                             f"{len(columns)} columns",
                             "build batches with PairStream(..., triplets=True)")
        anchor, positive, negative = columns
        measure = DISTANCES[self.distance]
        closer, farther = measure(anchor, positive), measure(anchor, negative)  # (B,), (B,)
        loss = nn.functional.relu(closer - farther + self.margin).mean()
        accuracy = float((closer < farther).float().mean())
        return ObjectiveResult(loss, {"loss": float(loss.detach()), "accuracy": accuracy},
                               int(anchor.shape[0]))
