"""Count a real model's FLOPs with ``torch.utils.flop_counter`` to check the analytic formulas.

:func:`measure_flops` runs one pass of any module under ``FlopCounterMode``, which counts
matmuls and convolutions but not the CPU fused attention kernel (run models with eager
attention when comparing) nor oneDNN's/cuDNN's fused LSTM (turned off while counting); see
docs/cost.md ("FLOP conventions").
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Mapping
from typing import Any

from lmlab.cost.flops import flops_per_token


def _default_loss(outputs: Any):
    loss = getattr(outputs, "loss", None)
    if loss is None and isinstance(outputs, Mapping):
        loss = outputs.get("loss")
    if loss is None:  # a bare tensor or a tuple whose first item is the logits/hidden states
        first = outputs[0] if isinstance(outputs, tuple | list) else outputs
        loss = first.float().sum()
    return loss


def measure_flops(model, inputs: Mapping[str, Any], training: bool = True,
                  loss_fn: Callable[[Any], Any] | None = None) -> tuple[int, dict[str, int]]:
    """(total FLOPs, FLOPs per aten operator) of one pass of ``model(**inputs)`` as
    ``FlopCounterMode`` counts them; ``training`` also runs ``loss_fn(outputs).backward()``
    (default loss: ``outputs.loss``, else the sum of the first output)."""
    import torch
    from torch.utils.flop_counter import FlopCounterMode

    counter = FlopCounterMode(display=False)
    # the fused LSTM kernels are opaque to the counter; restoring oneDNN's flags re-sets its
    # TF32 switch, which warns on a build without Intel GPU support
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="TF32 acceleration on top of oneDNN")
        with torch.backends.mkldnn.flags(enabled=False), \
                torch.backends.cudnn.flags(enabled=False), counter:
            if training:
                outputs = model(**inputs)
                (loss_fn or _default_loss)(outputs).backward()
            else:
                with torch.no_grad():
                    model(**inputs)
    by_op = {str(op): int(n) for op, n in counter.get_flop_counts().get("Global", {}).items()}
    return int(counter.get_total_flops()), by_op


def compare_with_analytic(model, inputs: Mapping[str, Any], config, seq_len: int,
                          tokens: int, training: bool = True, head: str = "mlm",
                          sparse_prediction_fraction: float | None = None,
                          loss_fn: Callable[[Any], Any] | None = None) -> dict[str, float]:
    """Measured and analytic FLOPs per token of one pass over ``tokens`` tokens, and their
    ``ratio`` (measured / analytic)."""
    total, _ = measure_flops(model, inputs, training=training, loss_fn=loss_fn)
    measured = total / tokens
    analytic = flops_per_token(config, seq_len, training=training, head=head,
                               sparse_prediction_fraction=sparse_prediction_fraction)
    return {"measured": measured, "analytic": analytic, "ratio": measured / analytic}
