"""The Objective interface: a batch transform (corruption) + the heads it needs + a loss.

An objective is a ``torch.nn.Module`` so it can own parameters (ELECTRA's generator) that the
trainer optimises and checkpoints with the model. The life cycle:

1. ``objective.prepare(model)`` adds the heads it needs (and builds a generator, ...), before
   the optimiser is made;
2. ``objective.corrupt(batch, rng)`` runs at collate time on CPU: token ids -> model inputs and
   targets (``labels`` with -100 where nothing is predicted, pair labels, ...);
3. ``objective.compute_loss(model, batch)`` runs the model once and returns an
   :class:`ObjectiveResult`.

Objectives compose (:class:`~lmlab.objectives.combined.CombinedObjective`): the stack runs once
and each component computes its loss from the shared hidden states via :meth:`Objective.losses`.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import torch
from torch import nn

from lmlab.objectives.masking import row_rng
from lmlab.objectives.special_tokens import SpecialTokens
from lmlab.utils.errors import LmlabError

__all__ = ["MODEL_INPUTS", "Objective", "ObjectiveResult", "SpecialTokens"]

MODEL_INPUTS = ("input_ids", "attention_mask", "token_type_ids")
_SEED_MOD = 2**63 - 1


@dataclass
class ObjectiveResult:
    """A loss to back-propagate, metrics to log (floats), and how many predictions the loss
    averaged over (masked tokens for MLM; examples for NSP/SOP), for token-weighted averages."""

    loss: torch.Tensor
    metrics: dict[str, float] = field(default_factory=dict)
    num_predictions: int = 0


class Objective(nn.Module):
    """Base class of pretraining objectives (see the module docstring for the life cycle).

    Class attributes:
        name: the registry name (``"mlm"``, ``"sop"``, ...).
        head_names: heads the model needs (added by :meth:`prepare`).
        example_format: ``"packed"`` (contiguous token windows) or ``"segment_pairs"`` (A/B
            segment pairs with a pair label, for NSP/SOP).
        corrupts_tokens: whether :meth:`corrupt` rewrites ``input_ids`` (at most one component
            of a combination may).
        salt: mixed into the per-row random seeds so components draw independent numbers.
        flops_head: the vocabulary head the cost report's FLOP count includes (``"mlm"``,
            ``"clm"`` or ``"none"``).
        reports_perplexity: the evaluation loss is a mean per-token LM loss, so its exp is a
            perplexity (not so for sums of losses or sentence-level losses).
        cls_sep_packing: the data pipeline wraps each packed example in ``[CLS] ... [SEP]`` and
            separates documents with ``[SEP]`` (encoders, BERT); False packs bare windows with the
            end-of-text token between documents (decoders, GPT-2).
        shares_forward_pass: the loss comes from the stack's hidden states alone
            (:meth:`losses`), so the objective can be combined with others on one forward pass
            (not ELECTRA, whose discriminator reads the generator's replaced tokens).
    """

    name: str = ""
    head_names: tuple[str, ...] = ()
    example_format: str = "packed"
    corrupts_tokens: bool = False
    salt: int = 0
    flops_head: str = "none"
    reports_perplexity: bool = False
    cls_sep_packing: bool = True
    shares_forward_pass: bool = True

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
        """The epoch number that decides the data's randomness (segment pairs, static masks).

        Dynamic objectives return ``epoch``; static masking returns ``epoch % dupe_factor`` so
        the corpus is seen as ``dupe_factor`` fixed corruptions, as BERT's pre-generated data.
        """
        return epoch

    def external_parameters(self, model: nn.Module) -> list[nn.Parameter]:
        """This objective's parameters that are not already the model's (to add to the
        optimiser without duplicates; ELECTRA shares its embeddings with the model)."""
        seen = {id(p) for p in model.parameters()}
        result, own = [], set()
        for parameter in self.parameters():
            if id(parameter) not in seen and id(parameter) not in own:
                own.add(id(parameter))
                result.append(parameter)
        return result

    # -- corruption (collate time, CPU) -------------------------------------------------------
    def corrupt(self, batch: dict[str, torch.Tensor],
                rng: torch.Generator) -> dict[str, torch.Tensor]:
        """Model inputs and targets from a batch of token ids (identity by default)."""
        return dict(batch)

    def row_generators(self, batch: dict[str, torch.Tensor], rng: torch.Generator,
                       static: bool = False, seed: int = 0,
                       dupe_factor: int = 1) -> list[np.random.Generator]:
        """One numpy generator per row.

        Dynamic: seeded from ``rng`` (fresh corruption every time the batch is made). Static:
        seeded from (seed, the row's ``example_id``, ``epoch % dupe_factor``), so an example gets
        the same corruption in every epoch with the same remainder, wherever it lands.
        """
        rows = batch["input_ids"].shape[0]
        if not static:
            seeds = torch.randint(0, _SEED_MOD, (rows,), generator=rng, dtype=torch.int64)
            return [row_rng(int(s), self.salt) for s in seeds]
        if "example_id" not in batch or "epoch" not in batch:
            raise LmlabError("static masking needs 'example_id' and 'epoch' in the batch",
                             "build batches with lmlab.data.pretraining.PretrainingStream, or "
                             "use masking='dynamic'")
        ids = batch["example_id"].tolist()
        epochs = batch["epoch"].tolist()
        return [row_rng(seed % _SEED_MOD, int(i) % _SEED_MOD, int(e) % dupe_factor, self.salt)
                for i, e in zip(ids, epochs)]

    # -- loss ------------------------------------------------------------------------------------
    def compute_loss(self, model: nn.Module, batch: dict[str, torch.Tensor]) -> ObjectiveResult:
        """Run the stack once (no head) and compute this objective's loss from it."""
        out = model(**model_inputs(batch, model), heads=[])
        result = self.losses(model, batch, out.last_hidden_state, out.pooler_output)
        return ObjectiveResult(result.loss * self.weight, result.metrics, result.num_predictions)

    def losses(self, model: nn.Module, batch: dict[str, torch.Tensor], hidden: torch.Tensor,
               pooled: torch.Tensor | None) -> ObjectiveResult:
        """The loss from the stack's last hidden state (B, T, H) and pooled vector (B, H)."""
        raise NotImplementedError(f"{type(self).__name__} does not define losses()")

    def extra_repr(self) -> str:
        return f"name={self.name!r}, heads={self.head_names}, format={self.example_format!r}"


def model_inputs(batch: dict[str, torch.Tensor],
                 model: nn.Module | None = None) -> dict[str, torch.Tensor]:
    """The keys of ``batch`` the model's forward takes.

    Segment ids are dropped for a model with at most one segment type (RoBERTa has
    ``type_vocab_size=1``; an id of 1 would index past its table).
    """
    if "input_ids" not in batch:
        raise LmlabError("the batch has no 'input_ids'",
                         "build batches with PretrainingStream or pass token ids as 'input_ids'")
    inputs = {key: batch[key] for key in MODEL_INPUTS if key in batch}
    config = getattr(model, "config", None)
    if config is not None and getattr(config, "type_vocab_size", 2) <= 1:
        inputs.pop("token_type_ids", None)
    return inputs
