"""PEFT's adapter folders (``adapter_config.json`` + ``adapter_model.safetensors``), read and
written: LoRA (plain or rsLoRA), prompt and prefix tuning, with a task head as
``modules_to_save``; anything else is refused by name before a tensor is read. Keys map through
the family's weight rules; GPT-2's fused ``c_attn`` is split and joined exactly. The story, and
what is refused, is in docs/adaptation.md ("PEFT folders")."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from torch import nn

from lmlab.adapt import apply_method, base_model, check_adapter_folder, write_adapter_folder
from lmlab.adapt.lora import PROJECTIONS, lora_layers
from lmlab.utils.errors import LmlabError
from lmlab.utils.io import read_json

PEFT_CONFIG = "adapter_config.json"
PEFT_WEIGHTS = "adapter_model.safetensors"
KEY_PREFIX = "base_model.model."
#: a prompt-learning PeftModel holds the transformers model itself as ``base_model``: its
#: modules_to_save (the task head) are saved under ``base_model.<module>``
PROMPT_KEY_PREFIX = "base_model."
#: PEFT's peft_type -> lmlab method
PEFT_METHODS = {"LORA": "lora", "PROMPT_TUNING": "prompt", "PREFIX_TUNING": "prefix"}
#: lmlab head -> PEFT task_type (no head: FEATURE_EXTRACTION)
TASK_TYPES = {"sequence-classification": "SEQ_CLS", "token-classification": "TOKEN_CLS",
              "question-answering": "QUESTION_ANS", "clm": "CAUSAL_LM"}
PEFT_VERSION = "0.21.2"  # the version whose format this follows


def _family(model: nn.Module):
    from lmlab.models.families import get_family

    return get_family(model.config.family)


def _rules(model: nn.Module, with_prefix: bool):
    from lmlab.interop.hf import checkpoint_prefix, model_rules

    family = _family(model)
    return model_rules(family, model, checkpoint_prefix(family, with_prefix))


def linear_paths(model: nn.Module, with_prefix: bool) -> dict[str, tuple[str, int, int]]:
    """lmlab linear module -> (transformers module path, its part, number of parts); parts > 1
    for a fused checkpoint tensor (GPT-2's c_attn)."""
    paths = {}
    for rule in _rules(model, with_prefix):
        if not rule.theirs.endswith(".weight"):
            continue
        names = rule.ours_names
        for part, ours in enumerate(names):
            paths[ours.removesuffix(".weight")] = (rule.theirs.removesuffix(".weight"), part,
                                                   len(names))
    return paths


# -- writing ---------------------------------------------------------------------------------------
def save_peft(model: nn.Module, folder: str | Path, base_model: str | Path | None = None,
              overwrite: bool = False) -> Path:
    """Write ``model``'s LoRA, prompt or prefix adaptation (and its task head) as a folder
    ``peft.PeftModel.from_pretrained`` loads on the transformers model."""
    record = getattr(model, "adaptation", None)
    if record is None or record.method not in PEFT_METHODS.values():
        raise LmlabError(f"PEFT has no format for a {record.method if record else 'plain'} "
                         "model here", "save LoRA, prompt or prefix adaptations as PEFT "
                         "folders; others with lmlab.adapt.save_adapter")
    folder = check_adapter_folder(folder, PEFT_CONFIG, overwrite, "a PEFT adapter")
    heads = list(model.heads)
    task_type = TASK_TYPES.get(heads[0], None) if heads else "FEATURE_EXTRACTION"
    if task_type is None:
        raise LmlabError(f"PEFT has no task type for lmlab's {heads[0]!r} head",
                         f"use one of the heads {', '.join(TASK_TYPES)} or none")
    pooling = model.config.extra.get("pooling")
    if task_type == "SEQ_CLS" and pooling in ("mean", "concat"):
        raise LmlabError(f"the sequence-classification head pools by {pooling!r}, which the "
                         "transformers class PEFT wraps does not (it reads the first token)",
                         "train the head with the family's pooling to save it for PEFT, or "
                         "save it with lmlab.adapt.save_adapter")
    if task_type == "SEQ_CLS" and record.method == "prompt":
        raise LmlabError(_PROMPT_CLS_PROBLEM, _PROMPT_CLS_FIX)
    config: dict[str, Any] = {
        "peft_type": {v: k for k, v in PEFT_METHODS.items()}[record.method],
        "task_type": task_type, "inference_mode": True, "peft_version": PEFT_VERSION,
        "base_model_name_or_path": str(base_model) if base_model is not None else None,
        "revision": None}
    if record.method == "lora":
        tensors, lora_config = _lora_tensors(model, record.options)
        config.update(lora_config)
    else:
        tensors, prompt_config = _prompt_tensors(model, record.method)
        config.update(prompt_config)
    head_tensors, modules = _head_tensors(
        model, KEY_PREFIX if record.method == "lora" else PROMPT_KEY_PREFIX)
    tensors.update(head_tensors)
    config["modules_to_save"] = modules or None
    return write_adapter_folder(folder, tensors, PEFT_WEIGHTS, config, PEFT_CONFIG)


def _lora_tensors(model: nn.Module, options: dict[str, Any]
                  ) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    paths = linear_paths(model, bool(model.heads))
    layers = lora_layers(model)
    fused: dict[str, list[nn.Linear | None]] = {}
    widths: dict[str, list[int]] = {}
    modules = dict(model.named_modules())
    for name, linear in layers.items():
        theirs, part, parts = paths[name]
        if theirs not in fused:
            fused[theirs] = [None] * parts
            siblings = [n for n, (t, _, _) in sorted(paths.items(), key=lambda i: i[1][1])
                        if t == theirs]
            widths[theirs] = [modules[n].out_features for n in siblings]
        fused[theirs][part] = linear
    updates = {theirs: _combine(parts, widths[theirs]) for theirs, parts in fused.items()}
    rank = max(a.shape[0] for a, _ in updates.values())
    scaling = next(iter(layers.values())).lora_scaling
    rslora = bool(options.get("rslora"))
    tensors = {}
    for theirs, (a, b) in updates.items():
        pad = rank - a.shape[0]  # zero rows of A and columns of B add nothing
        a = torch.cat([a, a.new_zeros(pad, a.shape[1])])
        b = torch.cat([b, b.new_zeros(b.shape[0], pad)], dim=1)
        tensors[f"{KEY_PREFIX}{theirs}.lora_A.weight"] = a
        tensors[f"{KEY_PREFIX}{theirs}.lora_B.weight"] = b
    family = _family(model)
    base = f"{family.base_prefix}." if family.base_prefix else ""
    transposed = {r.theirs.removesuffix(".weight") for r in _rules(model, bool(model.heads))
                  if r.transpose}
    alpha = scaling * (rank ** 0.5 if rslora else rank)
    return tensors, {
        "r": rank, "lora_alpha": alpha, "lora_dropout": float(options.get("dropout", 0.0)),
        "use_rslora": rslora, "target_modules": sorted(t.removeprefix(base) for t in updates),
        "fan_in_fan_out": any(t in transposed for t in updates), "bias": "none",
        "use_dora": False, "init_lora_weights": True, "rank_pattern": {}, "alpha_pattern": {},
        "layers_to_transform": None, "layers_pattern": None}


def _combine(parts: list[nn.Linear | None], widths: list[int]
             ) -> tuple[torch.Tensor, torch.Tensor]:
    """One (A, B) for a checkpoint tensor made of ``parts`` (None: a part without LoRA)."""
    present = [p for p in parts if p is not None]
    a_list = [p.lora_A.weight.detach() for p in present]
    if all(torch.equal(a_list[0], a) for a in a_list[1:]):
        b_rows = [p.lora_B.weight.detach() if p is not None
                  else a_list[0].new_zeros(w, a_list[0].shape[0]) for p, w in zip(parts, widths)]
        return a_list[0], torch.cat(b_rows)  # (r, in), (out, r)
    a = torch.cat(a_list)  # (k*r, in): block-diagonal update
    b = a.new_zeros(sum(widths), a.shape[0])
    row, col = 0, 0
    for part, width in zip(parts, widths):
        if part is not None:
            r = part.lora_A.weight.shape[0]
            b[row:row + width, col:col + r] = part.lora_B.weight.detach()
            col += r
        row += width
    return a, b


def _prompt_tensors(model: nn.Module, method: str
                    ) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    transformer, config = model.transformer, model.config
    if method == "prompt":
        weight = transformer.prompt_embeddings.weight
        extra = {"token_dim": config.hidden_size, "num_attention_heads":
                 config.num_attention_heads, "prompt_tuning_init": "RANDOM"}
    else:
        weight = transformer.prefix_key_values.weight
        extra = {"token_dim": config.num_key_value_heads * config.head_dim,
                 "num_attention_heads": config.num_key_value_heads,
                 "encoder_hidden_size": config.hidden_size, "prefix_projection": False}
    return {"prompt_embeddings": weight}, {
        "num_virtual_tokens": weight.shape[0], "num_layers": config.num_hidden_layers,
        "num_transformer_submodules": 1, **extra}


def _head_names(model: nn.Module) -> dict[str, str]:
    """transformers name -> lmlab name of the task heads' own tensors (PEFT's
    modules_to_save), for writing and reading alike."""
    from lmlab.adapt import _head_parameters

    own = set(_head_parameters(model))
    return {rule.theirs: rule.ours_names[0] for rule in _rules(model, bool(model.heads))
            if len(rule.ours_names) == 1 and rule.ours_names[0] in own}


def _head_tensors(model: nn.Module, prefix: str) -> tuple[dict[str, torch.Tensor], list[str]]:
    """The task heads' tensors under their transformers names, and their top modules."""
    params, names = dict(model.named_parameters()), _head_names(model)
    return ({prefix + theirs: params[ours] for theirs, ours in names.items()},
            list(dict.fromkeys(theirs.split(".")[0] for theirs in names)))


# -- reading ---------------------------------------------------------------------------------------
_PROMPT_CLS_PROBLEM = ("a prompt-tuned sequence classifier reads its sentence vector at the first "
                       "real token in lmlab and at the first virtual token in PEFT: the same "
                       "weights classify differently")
_PROMPT_CLS_FIX = ("use prefix tuning or LoRA for a sequence classifier that moves between "
                   "lmlab and PEFT")


def read_peft_config(folder: str | Path) -> dict[str, Any]:
    """A PEFT ``adapter_config.json``, its method checked (unsupported ones refused)."""
    folder = Path(folder)
    if not (folder / PEFT_CONFIG).is_file() or not (folder / PEFT_WEIGHTS).is_file():
        raise LmlabError(f"{folder} is not a PEFT adapter folder (needs {PEFT_CONFIG} and "
                         f"{PEFT_WEIGHTS})", "save the adapter with PeftModel.save_pretrained "
                         "(safetensors, the default)")
    config = read_json(folder / PEFT_CONFIG)
    kind = config.get("peft_type")
    if kind not in PEFT_METHODS:
        raise LmlabError(f"{folder} holds a PEFT {kind} adapter, which lmlab does not read",
                         f"lmlab reads {', '.join(PEFT_METHODS)} adapters; merge this one in "
                         "peft (merge_and_unload) and load the merged model")
    refused = []
    if kind == "LORA":
        for key, off in (("use_dora", False), ("lora_bias", False), ("bias", "none"),
                         ("target_parameters", None), ("layer_replication", None),
                         ("rank_pattern", {}), ("alpha_pattern", {}), ("use_qalora", False),
                         ("trainable_token_indices", None)):
            if config.get(key, off) not in (off, None, {}, False) and config.get(key) != off:
                refused.append(f"{key}={config[key]!r}")
    elif kind == "PREFIX_TUNING" and config.get("prefix_projection"):
        refused.append("prefix_projection=true")
    elif kind == "PROMPT_TUNING" and config.get("task_type") == "SEQ_CLS":
        raise LmlabError(f"{folder}: {_PROMPT_CLS_PROBLEM}", _PROMPT_CLS_FIX)
    if config.get("num_transformer_submodules", 1) not in (1, None):
        refused.append(f"num_transformer_submodules={config['num_transformer_submodules']}")
    if refused:
        raise LmlabError(f"{folder}: PEFT {kind} options lmlab does not support: "
                         f"{', '.join(refused)}", "train the adapter without them (plain LoRA "
                         "with one rank and alpha, prefix tuning without projection)")
    return config


def load_peft(folder: str | Path, base: str | Path | nn.Module | None = None) -> nn.Module:
    """``base`` (a model, a folder, or None: ``base_model_name_or_path``) with the PEFT adapter
    in ``folder`` applied."""
    from safetensors.torch import load_file

    config = read_peft_config(folder)
    model = base_model(base, config.get("base_model_name_or_path"),
                       str(Path(folder) / PEFT_CONFIG))
    tensors = load_file(str(Path(folder) / PEFT_WEIGHTS))
    family = _family(model)
    with_prefix = bool(family.base_prefix) and any(
        k.startswith(f"{KEY_PREFIX}{family.base_prefix}.") for k in tensors)
    method = PEFT_METHODS[config["peft_type"]]
    head_prefix = KEY_PREFIX if method == "lora" else PROMPT_KEY_PREFIX
    _read_heads(model, tensors, config, head_prefix)
    if method == "lora":
        used = _load_lora(model, tensors, config, with_prefix, str(folder))
    else:
        used = _load_virtual_tokens(model, tensors, config, method, str(folder))
    used |= _load_head_tensors(model, tensors, head_prefix)
    left = sorted(set(tensors) - used)
    if left:  # e.g. modules_to_save that are no task head lmlab has: never dropped silently
        raise LmlabError(f"{folder}: tensors lmlab has no place for on this "
                         f"{model.config.family} model: {left[:5]}",
                         "save the adapter with only the method's tensors and a task head "
                         "(modules_to_save: the classifier)")
    return model.eval()


def _read_heads(model: nn.Module, tensors: dict[str, torch.Tensor], config: dict[str, Any],
                prefix: str) -> None:
    """Give ``model`` the task head whose tensors the file holds (PEFT's modules_to_save)."""
    from lmlab.models.task_heads import add_task_head

    head = {v: k for k, v in TASK_TYPES.items()}.get(config.get("task_type"))
    if head is None or head == "clm" or head in model.heads:
        return
    family = _family(model)
    layout = family.task_heads.get(head)
    if layout is None:
        return
    from lmlab.models.families import TASK_LAYOUTS

    last = list(TASK_LAYOUTS[layout].values())[-1]
    weight = tensors.get(f"{prefix}{last}.weight")
    if weight is not None:
        add_task_head(model, head, int(weight.shape[0]))


def _load_lora(model: nn.Module, tensors: dict[str, torch.Tensor], config: dict[str, Any],
               with_prefix: bool, where: str) -> None:
    paths = linear_paths(model, with_prefix)
    by_theirs: dict[str, list[str | None]] = {}
    for ours, (theirs, part, parts) in paths.items():
        by_theirs.setdefault(theirs, [None] * parts)[part] = ours
    found = sorted({k.removeprefix(KEY_PREFIX).rsplit(".lora_", 1)[0] for k in tensors
                    if ".lora_A." in k or ".lora_B." in k})
    unknown = [t for t in found if t not in by_theirs]
    ours_found = {t: by_theirs.get(t, []) for t in found}
    names = {o.rsplit(".", 1)[-1] for t in found for o in ours_found[t] if o}
    not_projection = sorted(n for n in names if n not in PROJECTIONS)
    if unknown or not_projection or not found:
        raise LmlabError(f"{where}: LoRA on modules lmlab cannot map onto this "
                         f"{model.config.family} model: {(unknown or not_projection)[:5] or 'none'}",
                         "load it on the base model it was trained on; lmlab adapts the "
                         "attention and feed-forward projections")
    ranks = {tensors[f"{KEY_PREFIX}{t}.lora_A.weight"].shape[0] for t in found}
    if len(ranks) != 1:
        raise LmlabError(f"{where}: LoRA modules of different ranks {sorted(ranks)}",
                         "use one rank for every module")
    r = ranks.pop()
    alpha = float(config.get("lora_alpha", 8))
    apply_method(model, "lora", r=r, alpha=alpha, dropout=float(config.get("lora_dropout", 0.0)),
                 targets=tuple(sorted(names)), rslora=bool(config.get("use_rslora", False)))
    modules = dict(model.named_modules())
    used = set()
    with torch.no_grad():
        for theirs in found:
            a = tensors[f"{KEY_PREFIX}{theirs}.lora_A.weight"]
            b = tensors[f"{KEY_PREFIX}{theirs}.lora_B.weight"]
            parts = by_theirs[theirs]
            widths = [modules[o].out_features for o in parts]
            if a.shape[1] != modules[parts[0]].in_features or b.shape[0] != sum(widths):
                raise LmlabError(f"{where}: {theirs}'s LoRA is {tuple(b.shape)} x "
                                 f"{tuple(a.shape)}, the model's layer is {sum(widths)} x "
                                 f"{modules[parts[0]].in_features}",
                                 "load it on the base model it was trained on")
            for ours, rows in zip(parts, b.split(widths)):
                modules[ours].lora_A.weight.copy_(a)
                modules[ours].lora_B.weight.copy_(rows)
            used |= {f"{KEY_PREFIX}{theirs}.lora_A.weight", f"{KEY_PREFIX}{theirs}.lora_B.weight"}
    return used


def _load_virtual_tokens(model: nn.Module, tensors: dict[str, torch.Tensor],
                         config: dict[str, Any], method: str, where: str) -> set[str]:
    weight = tensors.get("prompt_embeddings")
    if weight is None:
        raise LmlabError(f"{where} has no prompt_embeddings tensor", "re-save it with peft")
    apply_method(model, method, num_virtual_tokens=int(weight.shape[0]))
    target = (model.transformer.prompt_embeddings if method == "prompt"
              else model.transformer.prefix_key_values).weight
    if target.shape != weight.shape:
        raise LmlabError(f"{where}: its virtual tokens are {tuple(weight.shape)}, this "
                         f"{model.config.family} model needs {tuple(target.shape)}",
                         "load it on the base model it was trained on")
    with torch.no_grad():
        target.copy_(weight)
    return {"prompt_embeddings"}


def _load_head_tensors(model: nn.Module, tensors: dict[str, torch.Tensor],
                       prefix: str) -> set[str]:
    """Copy the task head's tensors (modules_to_save under ``prefix``); returns their keys."""
    params = dict(model.named_parameters())
    found = {prefix + theirs: ours for theirs, ours in _head_names(model).items()
             if prefix + theirs in tensors}
    with torch.no_grad():
        for key, ours in found.items():
            params[ours].copy_(tensors[key])
    return set(found)
