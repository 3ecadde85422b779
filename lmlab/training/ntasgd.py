"""AWD-LSTM's optimiser, NT-ASGD (Merity et al. 2017, Section 3): plain SGD until the validation
loss fails to improve on the best of all but the last ``nonmono`` evaluations, then averaged SGD
(the iterates averaged from that step on), whose average the model is evaluated and saved with.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch

NONMONO = 5  # Merity et al.'s non-monotone interval


class NTASGD(torch.optim.Optimizer):
    """SGD with weight decay; after :meth:`observe` triggers, ``state[p]["ax"]`` averages the
    iterates as torch's ``ASGD(t0=0, lambd=0)`` does, which Merity et al. switch to. The history and trigger step live in the first group (saved with the state)."""

    def __init__(self, params: Any, lr: float, weight_decay: float = 0.0,
                 nonmono: int = NONMONO):
        super().__init__(params, {"lr": lr, "weight_decay": weight_decay})
        first = self.param_groups[0]
        first.setdefault("nt_history", [])
        first.setdefault("nt_trigger_step", None)
        first.setdefault("nt_steps", 0)
        first.setdefault("nt_nonmono", int(nonmono))

    @property
    def triggered(self) -> bool:
        """Whether averaging has started."""
        return self.param_groups[0]["nt_trigger_step"] is not None

    def observe(self, val_loss: float) -> bool:
        """Record a validation loss; start averaging when it is worse than the best before the
        last ``nonmono`` ones (Merity et al.'s condition). Returns whether it triggered now."""
        first = self.param_groups[0]
        history, nonmono = first["nt_history"], first["nt_nonmono"]
        fire = (not self.triggered and len(history) > nonmono
                and val_loss > min(history[:-nonmono]))
        history.append(float(val_loss))
        if fire:
            first["nt_trigger_step"] = first["nt_steps"]
        return fire

    @torch.no_grad()
    def step(self, closure: Any = None) -> Any:
        loss = closure() if closure is not None else None
        first = self.param_groups[0]
        first["nt_steps"] += 1
        averaged = self.triggered
        # torch's ASGD (which Merity et al. switch to) averages with the previous step's mu:
        # the mean of the iterates from the second step after the switch on
        mu = 1.0 / max(1, first["nt_steps"] - (first["nt_trigger_step"] or 0) - 1)
        for group in self.param_groups:
            for p in group["params"]:
                if p.grad is None:
                    continue
                grad = p.grad
                if group["weight_decay"]:
                    grad = grad.add(p, alpha=group["weight_decay"])
                p.add_(grad, alpha=-group["lr"])
                if averaged:
                    state = self.state[p]
                    if "ax" not in state or mu == 1.0:
                        state["ax"] = p.detach().clone()
                    else:
                        state["ax"].add_(p.sub(state["ax"]).mul(mu))
        return loss

    @contextmanager
    def averaged(self) -> Iterator[None]:
        """The parameters hold their averages inside the block (nothing changes before the
        trigger); the iterates are put back after it."""
        swapped = []
        if self.triggered:
            with torch.no_grad():
                for group in self.param_groups:
                    for p in group["params"]:
                        if "ax" in self.state[p]:
                            swapped.append((p, p.detach().clone()))
                            p.copy_(self.state[p]["ax"])
        try:
            yield
        finally:
            with torch.no_grad():
                for p, iterate in swapped:
                    p.copy_(iterate)
