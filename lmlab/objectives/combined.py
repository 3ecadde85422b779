"""Several objectives on one forward pass (BERT's MLM + NSP, ALBERT's MLM + SOP): the
corruptions run in order, the stack once, and the weighted losses are summed, as BERT did."""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn

from lmlab.objectives.base import Objective, ObjectiveResult
from lmlab.utils.errors import LmlabError


class CombinedObjective(Objective):
    """Objectives sharing one forward pass; built by ``build_objective("mlm,sop", ...)``."""

    def __init__(self, components: Sequence[Objective]):
        components = list(components)
        if len(components) < 2:
            raise LmlabError("a combined objective needs at least two components",
                             "build a single objective directly")
        super().__init__(components[0].special)
        names = [c.name for c in components]
        if any(type(c).losses is Objective.losses or not c.shares_forward_pass
               for c in components):
            raise LmlabError(f"objectives {names} cannot share a forward pass",
                             "train ELECTRA ('rtd') and decoder objectives on their own")
        corrupting = [c.name for c in components if c.corrupts_tokens]
        if len(corrupting) > 1:
            raise LmlabError(f"objectives {corrupting} both corrupt the input tokens",
                             "combine one masking objective (mlm, wwm or span) with nsp or sop")
        pair_modes = [c.pair_mode for c in components if getattr(c, "pair_mode", "")]
        if len(pair_modes) > 1:
            raise LmlabError(f"objectives {pair_modes} both classify segment pairs",
                             "use nsp (BERT) or sop (ALBERT), not both")
        self.components = nn.ModuleList(components)
        self.name = ",".join(names)
        self.head_names = tuple(dict.fromkeys(h for c in components for h in c.head_names))
        self.example_format = ("segment_pairs" if any(c.example_format == "segment_pairs"
                                                      for c in components) else "packed")
        self.corrupts_tokens = bool(corrupting)
        self.pair_mode = pair_modes[0] if pair_modes else ""
        self.flops_head = next((c.flops_head for c in components if c.flops_head != "none"),
                               "none")
        self.reports_perplexity = False  # the loss is a sum of the components' losses
        self.cls_sep_packing = all(c.cls_sep_packing for c in components)

    @property
    def predicted_fraction(self) -> float | None:
        return next((c.predicted_fraction for c in self.components
                     if c.predicted_fraction is not None), None)

    def prepare(self, model: nn.Module) -> None:
        for component in self.components:
            component.prepare(model)

    def data_epoch(self, epoch: int) -> int:
        """The masking component's data epoch (static masking repeats every dupe_factor)."""
        return next((c.data_epoch(epoch) for c in self.components if c.corrupts_tokens), epoch)

    def corrupt(self, batch: dict[str, torch.Tensor],
                rng: torch.Generator) -> dict[str, torch.Tensor]:
        for component in self.components:
            batch = component.corrupt(batch, rng)
        return batch

    def losses(self, model: nn.Module, batch: dict[str, torch.Tensor], hidden: torch.Tensor,
               pooled: torch.Tensor | None) -> ObjectiveResult:
        total, metrics, predictions = None, {}, 0
        for component in self.components:
            result = component.losses(model, batch, hidden, pooled)
            weighted = result.loss * component.weight
            total = weighted if total is None else total + weighted
            metrics.update(result.metrics)
            if component.corrupts_tokens or not predictions:
                predictions = result.num_predictions
        metrics["loss"] = float(total.detach())
        return ObjectiveResult(total, metrics, predictions)
