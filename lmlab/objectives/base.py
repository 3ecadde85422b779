"""The Objective interface: ``prepare(model)`` adds heads, ``corrupt(batch, rng)`` makes inputs
and targets at collate time, ``compute_loss(model, batch)`` runs the model; objectives that
implement :meth:`Objective.losses` can share one forward pass (docs/objectives.md)."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import torch
from torch import nn

from lmlab.models.inputs import model_inputs
from lmlab.models.pooling import masked_mean
from lmlab.objectives.masking import row_rng
from lmlab.objectives.special_tokens import SpecialTokens
from lmlab.utils.errors import LmlabError

__all__ = ["Objective", "ObjectiveResult", "SpecialTokens"]

SEED_MOD = 2**63 - 1


@dataclass
class ObjectiveResult:
    """A loss to back-propagate, metrics to log (floats), and how many predictions the loss
    averaged over (masked tokens for MLM; examples for NSP/SOP), for token-weighted averages."""

    loss: torch.Tensor
    metrics: dict[str, float] = field(default_factory=dict)
    num_predictions: int = 0


class Objective(nn.Module):
    """Base class of pretraining objectives. Its class attributes tell the Trainer, the data
    stream and the cost report what the objective needs, so nothing branches on its name
    (docs/objectives.md, "What an objective declares")."""

    name: str = ""
    head_names: tuple[str, ...] = ()
    example_format: str = "packed"
    corrupts_tokens: bool = False
    salt: int = 0
    flops_head: str = "none"
    reports_perplexity: bool = False
    cls_sep_packing: bool = True
    shares_forward_pass: bool = True
    shown: tuple[str, ...] = ()  # the settings its repr shows beside its name, heads and format

    def __init__(self, special: SpecialTokens, weight: float = 1.0):
        super().__init__()
        if not isinstance(special, SpecialTokens):
            raise LmlabError(f"expected SpecialTokens, got {type(special).__name__}",
                             "build it with SpecialTokens.from_tokenizer(tokenizer)")
        self.special = special
        self.weight = float(weight)

    @property
    def predicted_fraction(self) -> float | None:
        """Share of the positions that pay the vocabulary projection when the objective predicts
        sparsely (masked LM: its masking rate), for honest FLOP counts; None = every position."""
        return None

    # -- set-up -----------------------------------------------------------------------------
    def prepare(self, model: nn.Module) -> None:
        """Add the heads this objective needs to ``model`` (idempotent)."""
        for head in self.head_names:
            model.add_head(head)

    def data_epoch(self, epoch: int) -> int:
        """The epoch number that decides the data's randomness (static masking: ``epoch %
        dupe_factor``, so the corpus is seen as ``dupe_factor`` fixed corruptions)."""
        return epoch

    def external_parameters(self, model: nn.Module) -> list[nn.Parameter]:
        """This objective's parameters that are not already the model's (to add to the
        optimiser without duplicates; ELECTRA shares its embeddings with the model)."""
        seen = {id(p) for p in model.parameters()}
        return [p for p in self.parameters() if id(p) not in seen]  # parameters() is deduplicated

    # -- corruption (collate time, CPU) -------------------------------------------------------
    def corrupt(self, batch: dict[str, torch.Tensor],
                rng: torch.Generator) -> dict[str, torch.Tensor]:
        """Model inputs and targets from a batch of token ids (identity by default)."""
        return dict(batch)

    def row_generators(self, batch: dict[str, torch.Tensor], rng: torch.Generator,
                       static: bool = False, seed: int = 0,
                       dupe_factor: int = 1) -> list[np.random.Generator]:
        """One numpy generator per row: from ``rng`` (dynamic), or from (seed, the row's
        ``example_id``, ``epoch % dupe_factor``) so an example's corruption repeats (static)."""
        rows = batch["input_ids"].shape[0]
        if not static:
            seeds = torch.randint(0, SEED_MOD, (rows,), generator=rng, dtype=torch.int64)
            return [row_rng(int(s), self.salt) for s in seeds]
        if "example_id" not in batch or "epoch" not in batch:
            raise LmlabError("static masking needs 'example_id' and 'epoch' in the batch",
                             "build batches with lmlab.data.pretraining.PretrainingStream, or "
                             "use masking='dynamic'")
        ids = batch["example_id"].tolist()
        epochs = batch["epoch"].tolist()
        return [row_rng(seed % SEED_MOD, int(i) % SEED_MOD, int(e) % dupe_factor, self.salt)
                for i, e in zip(ids, epochs)]

    # -- loss ------------------------------------------------------------------------------------
    def compute_loss(self, model: nn.Module, batch: dict[str, torch.Tensor]) -> ObjectiveResult:
        """Run the stack once (no head) and compute this objective's loss from it."""
        out = model(**stack_inputs(model, batch), heads=[])
        result = self.losses(model, batch, out.last_hidden_state, out.pooler_output)
        return ObjectiveResult(result.loss * self.weight, result.metrics, result.num_predictions)

    def losses(self, model: nn.Module, batch: dict[str, torch.Tensor], hidden: torch.Tensor,
               pooled: torch.Tensor | None) -> ObjectiveResult:
        """The loss from the stack's last hidden state (B, T, H) and pooled vector (B, H)."""
        if not self.shares_forward_pass:
            raise LmlabError(f"the {self.name!r} objective runs its own forward passes (a "
                             "generator's or a teacher's), so it cannot share one with others",
                             f"train {self.name!r} on its own")
        raise NotImplementedError(f"{type(self).__name__} does not define losses()")

    def extra_repr(self) -> str:
        fields = {"name": self.name, "heads": self.head_names, "format": self.example_format}
        fields.update((key, getattr(self, key)) for key in self.shown)
        return ", ".join(f"{key}={value!r}" for key, value in fields.items())


def stack_inputs(model: nn.Module, batch: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """:func:`~lmlab.models.inputs.model_inputs` of a pretraining batch, refused without token
    ids; segment ids are dropped for a model with at most one segment type (RoBERTa: an id of
    1 would index past its table)."""
    if "input_ids" not in batch:
        raise LmlabError("the batch has no 'input_ids'",
                         "build batches with PretrainingStream or pass token ids as 'input_ids'")
    inputs = model_inputs(model, batch)
    if getattr(getattr(model, "config", None), "type_vocab_size", 2) <= 1:
        inputs.pop("token_type_ids", None)
    return inputs


def sentence_vectors(model: nn.Module, batch: dict[str, torch.Tensor]) -> torch.Tensor:
    """Mean-pooled sentence vectors (B, H) of a padded batch, with gradients: one forward pass
    of ``model``'s stack, no head (the sentence-order objectives' encoder output)."""
    out = model(**stack_inputs(model, batch), heads=[])
    return masked_mean(out.last_hidden_state, batch["attention_mask"])


def require_labels(batch: dict[str, torch.Tensor], name: str) -> torch.Tensor:
    """The batch's ``labels``; an error naming the fix when ``corrupt`` did not run."""
    if "labels" not in batch:
        raise LmlabError(f"the batch has no 'labels' for the {name!r} objective",
                         "corrupt batches with objective.corrupt (PretrainingStream does)")
    return batch["labels"]


def accuracy(logits: torch.Tensor, targets: torch.Tensor) -> float:
    """Share of rows whose argmax is the target (no gradient)."""
    with torch.no_grad():
        return float((logits.argmax(-1) == targets).float().mean())
