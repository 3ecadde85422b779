"""Count a real model's FLOPs with ``torch.utils.flop_counter`` to check the analytic formulas.

:func:`measure_flops` runs one forward (and backward) pass of any ``torch.nn.Module`` under
``FlopCounterMode`` and returns the FLOPs it counted. It is model-agnostic: the tests point it
at reference models today and can point it at lmlab's own models the same way.

What ``FlopCounterMode`` counts: matmuls (``mm``, ``addmm``, ``bmm``, ``baddbmm``),
convolutions and the *CUDA* fused attention kernels. It does not count elementwise work
(norms, activations, softmax) nor, in torch 2.13, the CPU fused attention
(``_scaled_dot_product_flash_attention_for_cpu``). SDPA with dropout in training falls back
to plain ``bmm`` on CPU and is counted; without dropout (eval) it is not. Run models with their
eager ("math") attention on CPU when comparing, or the attention scores may be missed.

LSTMs: oneDNN's (CPU) and cuDNN's (GPU) fused LSTM kernels are single operators the counter has
no formula for, so :func:`measure_flops` turns both libraries off while it counts; torch then
runs ``nn.LSTM`` as its per-step matmuls (the same products), which are counted.
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
    """FLOPs of one pass of ``model(**inputs)``, as counted by ``FlopCounterMode``.

    Args:
        model: any module; called as ``model(**inputs)``.
        inputs: keyword arguments of the forward call (e.g. ``input_ids``, ``labels``).
        training: also run ``loss.backward()`` inside the counter.
        loss_fn: turns the outputs into a scalar; default: ``outputs.loss``, else the sum of
            the first output.

    Returns:
        (total FLOPs, FLOPs per aten operator name).
    """
    import torch
    from torch.utils.flop_counter import FlopCounterMode

    counter = FlopCounterMode(display=False)
    # the fused LSTM kernels are opaque to the counter (module docstring); restoring oneDNN's
    # flags re-sets its TF32 switch, which warns on a build without Intel GPU support
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
    """Measured vs analytic FLOPs per token for one pass over ``tokens`` tokens.

    Returns a dict with ``measured``, ``analytic`` (FLOPs per token) and ``ratio``
    (measured / analytic).
    """
    total, _ = measure_flops(model, inputs, training=training, loss_fn=loss_fn)
    measured = total / tokens
    analytic = flops_per_token(config, seq_len, training=training, head=head,
                               sparse_prediction_fraction=sparse_prediction_fraction)
    return {"measured": measured, "analytic": analytic, "ratio": measured / analytic}
