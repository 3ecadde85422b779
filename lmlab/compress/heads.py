"""Attention-head importance (Michel et al. 2019) and head pruning that removes the heads' weights.

A head's importance is the expected absolute gradient of the loss with respect to a gate on its
output (a forward pre-hook on ``o_proj``), normalised per layer; pruning slices the heads' rows
out of q/k/v and their columns out of ``o_proj``, and records the layout in the config
(:mod:`lmlab.models.variants` rebuilds it on loading). See docs/pruning.md.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping
from contextlib import contextmanager
from typing import Any

import torch
from torch import nn

from lmlab.models.variants import HEAD_COUNTS_KEY, PRUNED_KEY, _resize
from lmlab.utils.errors import LmlabError


# -- the model's attention layers -------------------------------------------------------------
def attention_modules(model: nn.Module) -> list[nn.Module]:
    """The self-attention module of every layer of ``model`` (a LanguageModel), refusing the
    layouts where a head cannot be removed on its own."""
    transformer = getattr(model, "transformer", None)
    if transformer is None:
        raise LmlabError("head pruning works on a single-stack model (an encoder or a decoder); "
                         f"this is a {type(model).__name__}",
                         "load an encoder (BERT, RoBERTa, MiniLM) or a decoder (GPT-2, Llama)")
    config = model.config
    if config.share_layers:
        raise LmlabError("this model shares one layer's weights across all layers (ALBERT): a "
                         "head cannot be removed from one layer alone",
                         "prune a model without shared layers")
    if config.position_embedding == "relative":
        raise LmlabError("T5's relative position bias has one column per head",
                         "prune a model with learned, sinusoidal or rotary positions")
    layers = [layer.attention for layer in transformer.layers]
    if any(not isinstance(a.q_proj, nn.Linear) or not isinstance(a.o_proj, nn.Linear)
           for a in layers):
        raise LmlabError("the attention maps are factorised (low rank): heads cannot be "
                         "sliced out of them", "prune heads first, then factorise")
    grouped = [i for i, a in enumerate(layers) if a.num_kv_heads != a.num_heads]
    if grouped:
        raise LmlabError(f"layers {grouped[:5]} use grouped-query attention (several query heads "
                         "share a key/value head): a query head cannot be removed on its own",
                         "prune a model with multi-head attention (num_key_value_heads == "
                         "num_attention_heads)")
    return layers


def heads_per_layer(model: nn.Module) -> list[int]:
    """The number of attention heads each layer has now."""
    return [attention.num_heads for attention in attention_modules(model)]


def original_heads(model: nn.Module) -> list[list[int]]:
    """For each layer, the original indices of the heads it still has (in their order), from
    ``extra["pruned_heads"]``."""
    pruned = _pruned_record(model.config)
    result = []
    for index, count in enumerate(heads_per_layer(model)):
        removed = set(pruned.get(index, []))
        result.append([h for h in range(count + len(removed)) if h not in removed])
    return result


def _pruned_record(config) -> dict[int, list[int]]:
    """``extra["pruned_heads"]`` with int keys (JSON turns them into strings)."""
    return {int(k): [int(h) for h in v] for k, v in config.extra.get(PRUNED_KEY, {}).items()}


def prune_heads(model: nn.Module, heads: Mapping[int, Iterable[int]]) -> nn.Module:
    """Remove heads from ``model`` in place: ``heads`` maps a layer to the indices (in its
    current numbering, 0 .. heads_per_layer - 1) of the heads to remove. Returns ``model``.

    Every check runs before any weight changes; removing every head of a layer is refused
    (the layer's attention would be its output bias alone).
    """
    layers = attention_modules(model)
    plan: dict[int, list[int]] = {}
    for layer, indices in heads.items():
        indices = sorted({int(h) for h in indices})
        if not 0 <= int(layer) < len(layers):
            raise LmlabError(f"layer {layer} does not exist (the model has {len(layers)} layers)",
                             f"use layers 0 to {len(layers) - 1}")
        count = layers[int(layer)].num_heads
        bad = [h for h in indices if not 0 <= h < count]
        if bad:
            raise LmlabError(f"layer {layer} has {count} heads; no head {bad[0]}",
                             f"use head indices 0 to {count - 1}")
        if len(indices) == count:
            raise LmlabError(f"pruning every head of layer {layer} ({count} of {count}) would "
                             "leave that layer's attention empty",
                             "keep at least one head in every layer (to drop a whole layer, "
                             "remove the layer instead)")
        if indices:
            plan[int(layer)] = indices
    originals = original_heads(model)
    record = _pruned_record(model.config)
    for layer, indices in plan.items():
        keep = [h for h in range(layers[layer].num_heads) if h not in indices]
        record[layer] = sorted(record.get(layer, []) + [originals[layer][h] for h in indices])
        _resize(layers[layer], keep)
    _write_counts(model.config, [a.num_heads for a in layers], record)
    return model


def _write_counts(config, counts: list[int], record: dict[int, list[int]]) -> None:
    """Record the head layout in ``config``: one count for all layers when they agree (what
    every format can read), a per-layer list otherwise."""
    config.extra[PRUNED_KEY] = {str(k): v for k, v in sorted(record.items()) if v}
    if len(set(counts)) == 1:
        config.extra.pop(HEAD_COUNTS_KEY, None)
        config.num_attention_heads = config.num_key_value_heads = counts[0]
    else:
        config.extra[HEAD_COUNTS_KEY] = list(counts)


# -- gates and importance ---------------------------------------------------------------------
@contextmanager
def head_gates(model: nn.Module, gates: list[torch.Tensor] | None = None
               ) -> Iterator[list[torch.Tensor]]:
    """Multiply each head's context by its gate while the block runs.

    ``gates`` (one (heads,) tensor per layer; default: ones that require grad) are yielded, so
    ``gates[i].grad`` after a backward pass is dL/d xi for layer ``i``. A gate of 0 removes a
    head's contribution exactly as :func:`prune_heads` does.
    """
    layers = attention_modules(model)
    device = next(model.parameters()).device
    if gates is None:
        gates = [torch.ones(a.num_heads, device=device, requires_grad=True) for a in layers]
    if [len(g) for g in gates] != [a.num_heads for a in layers]:
        raise LmlabError(f"gates of sizes {[len(g) for g in gates]} for layers of "
                         f"{[a.num_heads for a in layers]} heads", "give one gate per head")

    def gate_hook(gate: torch.Tensor, head_dim: int) -> Callable:
        def hook(module: nn.Module, args: tuple) -> tuple:
            context = args[0]  # (B, T, nh*hd), or (N, nh*hd) when padding is skipped
            shape = context.shape
            heads = context.view(*shape[:-1], -1, head_dim)  # (..., nh, hd)
            return ((heads * gate.to(context.dtype)[:, None]).reshape(shape), *args[1:])
        return hook

    handles = [a.o_proj.register_forward_pre_hook(gate_hook(g, a.head_dim))
               for a, g in zip(layers, gates)]
    try:
        yield gates
    finally:
        for handle in handles:
            handle.remove()


def head_importance(model: nn.Module, batches: Iterable[Any],
                    loss_fn: Callable[[nn.Module, Any], torch.Tensor],
                    normalize: bool = True) -> list[torch.Tensor]:
    """Michel et al.'s importance of every head: sum over ``batches`` of |dL/d xi_h| at xi = 1.

    Args:
        batches: what ``loss_fn`` takes (e.g. task batches from :func:`task_batches`).
        loss_fn: ``(model, batch) -> scalar loss``.
        normalize: divide each layer's scores by their L2 norm (Michel et al., section 4.2),
            which makes scores of different layers comparable for a global ranking.

    Returns one (heads,) float tensor per layer. The model's weights get no gradient (their
    ``requires_grad`` is restored afterwards); dropout is off.
    """
    was_training = model.training
    model.eval()
    flags = [(p, p.requires_grad) for p in model.parameters()]
    for parameter, _ in flags:
        parameter.requires_grad_(False)
    totals: list[torch.Tensor] | None = None
    seen = 0
    try:
        with head_gates(model) as gates:
            totals = [torch.zeros_like(g, dtype=torch.float32) for g in gates]
            for batch in batches:
                loss = loss_fn(model, batch)
                grads = torch.autograd.grad(loss, gates)
                for total, grad in zip(totals, grads):
                    total += grad.detach().abs().float()
                seen += 1
    finally:
        for parameter, flag in flags:
            parameter.requires_grad_(flag)
        model.train(was_training)
    if not seen:
        raise LmlabError("no batch to measure head importance on", "give at least one example")
    if normalize:
        totals = [t / t.norm().clamp_min(1e-20) for t in totals]
    return [t.cpu() for t in totals]


def heads_to_prune(importance: list[torch.Tensor], count: int) -> dict[int, list[int]]:
    """The ``count`` least important heads over all layers, never the last head of a layer."""
    candidates = sorted((float(score), layer, head) for layer, scores in enumerate(importance)
                        for head, score in enumerate(scores))
    left = [len(scores) for scores in importance]
    chosen: dict[int, list[int]] = {}
    for _, layer, head in candidates:
        if count == 0:
            break
        if left[layer] > 1:
            chosen.setdefault(layer, []).append(head)
            left[layer] -= 1
            count -= 1
    return chosen


def iterative_head_pruning(model: nn.Module, importance_fn: Callable[[nn.Module], list],
                           evaluate_fn: Callable[[nn.Module], float], step_fraction: float = 0.1,
                           max_fraction: float = 0.9, recompute: bool = True,
                           on_step: Callable[[dict[str, Any]], None] | None = None
                           ) -> list[dict[str, Any]]:
    """Michel et al.'s iterative pruning: remove the least important ``step_fraction`` of the
    original heads, evaluate, repeat until ``max_fraction`` is removed (or one head per layer is
    left). Importance is recomputed on the pruned model after each step (``recompute``).

    Returns one row per step (step 0 = the unpruned model): heads removed, fraction removed,
    the metric, parameters, and the per-layer head counts. ``model`` is pruned in place.
    """
    from lmlab.models.model import count_parameters

    if not 0 < step_fraction <= 1 or not 0 < max_fraction < 1:
        raise LmlabError(f"step fraction {step_fraction} and maximum fraction {max_fraction} "
                         "must be in (0, 1]", "e.g. --step 0.1 --max 0.9")
    total = sum(heads_per_layer(model))
    per_step = max(1, round(step_fraction * total))
    target = min(int(max_fraction * total + 1e-9), total - len(heads_per_layer(model)))

    def row(removed: int) -> dict[str, Any]:
        result = {"heads_removed": removed, "fraction_removed": removed / total,
                  "metric": float(evaluate_fn(model)), "parameters": count_parameters(model),
                  "heads_per_layer": heads_per_layer(model)}
        if on_step is not None:
            on_step(result)
        return result

    rows = [row(0)]
    importance = None
    removed = 0
    while removed < target:
        if importance is None or recompute:
            importance = importance_fn(model)
        plan = heads_to_prune(importance, min(per_step, target - removed))
        if not plan:
            break
        prune_heads(model, plan)
        if not recompute:  # keep the surviving heads' scores, in their new numbering
            importance = [torch.tensor([float(s) for h, s in enumerate(scores)
                                        if h not in plan.get(layer, [])])
                          for layer, scores in enumerate(importance)]
        removed += sum(len(v) for v in plan.values())
        rows.append(row(removed))
    return rows


# -- tasks ------------------------------------------------------------------------------------
def task_batches(task, tokenizer, split: str, max_examples: int | None = None,
                 batch_size: int = 32, max_length: int = 128) -> list[dict]:
    """Padded batches (with labels) of ``split`` of a task, at most ``max_examples`` examples
    (a stratified sample), for :func:`head_importance`."""
    from lmlab.finetune import data as fdata
    from lmlab.tasks.sampling import sample_examples

    examples = task.split(split)
    if max_examples and len(examples) > max_examples:
        examples = sample_examples(examples, max_examples)
    features = fdata.encode_examples(task, examples, tokenizer, max_length, split=split)
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    return [batch for _, batch in fdata.eval_batches(features, batch_size, pad_id)]


def task_loss(task) -> Callable[[nn.Module, dict], torch.Tensor]:
    """``(model, batch) -> loss`` of the task's head (its fine-tuning loss)."""
    from lmlab.finetune.objective import TaskObjective

    objective = TaskObjective(task.type, max(len(task.labels), 1))

    def loss(model: nn.Module, batch: dict) -> torch.Tensor:
        device = next(model.parameters()).device
        batch = {k: v.to(device) if isinstance(v, torch.Tensor) else v for k, v in batch.items()}
        return objective.compute_loss(model, batch).loss
    return loss
