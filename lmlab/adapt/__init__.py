"""Parameter-efficient fine-tuning: train a few parameters (LoRA, adapters, BitFit, prompt or
prefix tuning, one module each) and the task head on top of a frozen base model; save and load
them as a small adapter folder. docs/adaptation.md tells the story.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn

from lmlab.adapt.adapters import AdapterSettings, apply_adapters
from lmlab.adapt.bitfit import train_biases
from lmlab.adapt.fingerprint import base_fingerprint
from lmlab.adapt.lora import LoraSettings, apply_lora, merge_lora
from lmlab.adapt.prompts import VirtualTokenSettings, apply_prefix_tuning, apply_prompt_tuning
from lmlab.interop.folders import ADAPTER_CONFIG, load_model
from lmlab.utils.checks import check_choice, check_names
from lmlab.utils.errors import LmlabError
from lmlab.utils.io import atomic_path, atomic_write_json, read_json

METHODS = ("lora", "adapter", "bitfit", "prompt", "prefix")
SETTINGS = {"lora": LoraSettings, "adapter": AdapterSettings, "bitfit": None,
            "prompt": VirtualTokenSettings, "prefix": VirtualTokenSettings}
#: each method's surgery: ``(model, settings) -> names of base parameters that train too``
#: (what it adds trains, with the task heads; BitFit adds nothing and trains the biases)
SURGERY = {"lora": apply_lora, "adapter": apply_adapters, "bitfit": train_biases,
           "prompt": apply_prompt_tuning, "prefix": apply_prefix_tuning}
ADAPTER_WEIGHTS = "adapter.safetensors"
FORMAT = "lmlab-adapter"
#: config.extra entries a task head needs to be rebuilt (width, labels, sentence vector)
HEAD_EXTRA = ("num_labels", "id2label", "pooling", "problem_type", "word_labels")


@dataclass
class Adaptation:
    """What :func:`apply_method` did to a model (kept as ``model.adaptation``)."""

    method: str
    options: dict[str, Any]
    base_fingerprint: str
    trainable: list[str] = field(default_factory=list)  # parameter names that train

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def method_settings(method: str, options: dict[str, Any]):
    """The method's settings object from ``options`` (unknown names refused), checked."""
    check_choice(method, METHODS, "--method", "fine-tuning method")
    kind = SETTINGS[method]
    if kind is None:
        if options:
            raise LmlabError(f"bitfit takes no options, got {sorted(options)}",
                             "drop the options")
        return None
    check_names(sorted(options), sorted(kind.__dataclass_fields__), method, f"{method} option")
    values = {k: (tuple(v) if isinstance(v, list) else v) for k, v in options.items()}
    settings = kind(**values)
    settings.check()
    return settings


def method_record(method: str, options: dict[str, Any] | None) -> dict[str, Any]:
    """The method and its full, checked options as JSON values (a run's settings)."""
    settings = method_settings(method, dict(options or {}))
    values = asdict(settings) if settings is not None else {}
    return {"name": method, **{k: list(v) if isinstance(v, tuple) else v
                               for k, v in values.items()}}


def apply_method(model: nn.Module, method: str, **options: Any) -> Adaptation:
    """Apply a parameter-efficient method to ``model`` in place: add its modules, freeze all
    else but the task heads. Returns the record (also ``model.adaptation``).

    Example:
        >>> from lmlab.models import LanguageModel, TransformerConfig
        >>> model = LanguageModel(TransformerConfig(num_hidden_layers=2, hidden_size=64,
        ...                       num_attention_heads=4, intermediate_size=128))
        >>> record = apply_method(model, "lora", r=4, alpha=8)
        >>> len(record.trainable)  # lora_A and lora_B of q_proj and v_proj in 2 layers
        8
    """
    if getattr(model, "adaptation", None) is not None:
        raise LmlabError(f"the model already has a {model.adaptation.method} adaptation",
                         "apply one method to a fresh base model")
    settings = method_settings(method, options)
    fingerprint = base_fingerprint(model)
    before = {name for name, _ in model.named_parameters()}
    also = SURGERY[method](model, settings)
    added = [name for name, _ in model.named_parameters() if name not in before]
    train = set(added) | set(_head_parameters(model)) | set(also)
    for name, parameter in model.named_parameters():
        parameter.requires_grad_(name in train)
    record = Adaptation(method, asdict(settings) if settings is not None else {}, fingerprint,
                        sorted(train))
    model.adaptation = record
    return record


def _head_parameters(model: nn.Module) -> list[str]:
    """The task heads' own parameters (pretrained heads stay frozen with the base)."""
    from lmlab.models.task_heads import TASK_HEADS

    table = model.get_input_embeddings().weight
    return [name for name, p in model.named_parameters()
            if name.split(".")[:2][-1] in TASK_HEADS and name.startswith("heads.")
            and p is not table]


def trainable_parameters(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters() if p.requires_grad)


def merge(model: nn.Module) -> nn.Module:
    """A plain model with a LoRA (or BitFit) adaptation folded into the base weights, outputs
    unchanged; adapters and virtual tokens add computation no weight holds: refused."""
    record = _record(model)
    if record.method == "lora":
        merge_lora(model)
    elif record.method != "bitfit":
        raise LmlabError(f"a {record.method} adaptation cannot be merged into the base weights "
                         "(it adds computation, not a weight change)",
                         "merge LoRA or BitFit; load this one with load_adapter on its base")
    for parameter in model.parameters():
        parameter.requires_grad_(True)
    model.adaptation = None
    return model


def _record(model: nn.Module) -> Adaptation:
    record = getattr(model, "adaptation", None)
    if record is None:
        raise LmlabError("the model has no parameter-efficient adaptation",
                         "apply one first (apply_method) or load one (load_adapter)")
    return record


# -- lmlab's adapter file ------------------------------------------------------------------------
def save_adapter(model: nn.Module, folder: str | Path, base_model: str | Path | None = None,
                 overwrite: bool = False) -> Path:
    """Write the trained tensors (and a pooler the base lacks) and ``adapter.json``."""
    record = _record(model)
    folder = check_adapter_folder(folder, ADAPTER_CONFIG, overwrite, "an adapter")
    params = dict(model.named_parameters())
    pooler = [] if _base_has_pooler(base_model) else _pooler_parameters(model)
    tensors = {name: params[name] for name in record.trainable + pooler}
    extra = {k: model.config.extra[k] for k in HEAD_EXTRA if k in model.config.extra}
    config = {"format": FORMAT, "version": 1, **record.to_dict(),
              "family": model.config.family,
              "base_model": _base_name(base_model),
              "heads": list(model.heads), "head_settings": extra,
              "dtype": str(next(iter(tensors.values())).dtype).removeprefix("torch.")}
    config.pop("trainable")
    return write_adapter_folder(folder, tensors, ADAPTER_WEIGHTS, config, ADAPTER_CONFIG)


def check_adapter_folder(folder: str | Path, config_name: str, overwrite: bool,
                         what: str) -> Path:
    """``folder``, refused when it holds an adapter already and ``overwrite`` is off."""
    folder = Path(folder)
    if (folder / config_name).exists() and not overwrite:
        raise LmlabError(f"{folder} already holds {what}",
                         "choose another folder, or pass overwrite=True (--overwrite)")
    return folder


def write_adapter_folder(folder: Path, tensors: dict[str, torch.Tensor], weights_name: str,
                         config: dict[str, Any], config_name: str) -> Path:
    """Write ``tensors`` (safetensors, on the CPU) and ``config`` (JSON) into ``folder``."""
    from safetensors.torch import save_file

    folder.mkdir(parents=True, exist_ok=True)
    with atomic_path(folder / weights_name) as tmp:
        save_file({k: v.detach().contiguous().cpu() for k, v in tensors.items()}, str(tmp),
                  metadata={"format": "pt"})
    atomic_write_json(folder / config_name, config)
    return folder


def base_model(base: str | Path | nn.Module | None, named: str | None, where: str) -> nn.Module:
    """The base an adapter applies to: ``base`` (a model or a folder), else the one its config
    names (``named``); ``where`` names the adapter's config file in the refusal."""
    if base is None:
        base = named
        if not base:
            raise LmlabError(f"{where} names no base model",
                             "pass base=... (the model folder the adapter was trained on)")
    return base if isinstance(base, nn.Module) else load_model(base)


def _base_name(base_model: str | Path | None) -> str | None:
    """A folder as an absolute path; a short name such as ``minilm`` as given."""
    if base_model is None:
        return None
    path = Path(base_model)
    return str(path.resolve()) if path.exists() else str(base_model)


def is_adapter_folder(path: str | Path) -> bool:
    return (Path(path) / ADAPTER_CONFIG).is_file()


def read_adapter_config(folder: str | Path) -> dict[str, Any]:
    folder = Path(folder)
    if not is_adapter_folder(folder):
        raise LmlabError(f"{folder} holds no {ADAPTER_CONFIG}",
                         "point at the model/ folder of a run fine-tuned with --method, or at "
                         "a folder written by save_adapter")
    config = read_json(folder / ADAPTER_CONFIG)
    if config.get("format") != FORMAT or config.get("method") not in METHODS:
        raise LmlabError(f"{folder / ADAPTER_CONFIG} is not an lmlab adapter config",
                         "re-save the adapter with lmlab (a PEFT folder loads with "
                         "lmlab.adapt.peft_format.load_peft)")
    return config


def load_adapter(folder: str | Path, base: str | Path | nn.Module | None = None) -> nn.Module:
    """``base`` (a model, a folder, or None: the one ``adapter.json`` names) with the adapter in
    ``folder`` applied; another base (by fingerprint) is refused before any tensor is read."""
    from safetensors.torch import load_file

    from lmlab.models.task_heads import add_task_head

    config = read_adapter_config(folder)
    model = base_model(base, config.get("base_model"), str(Path(folder) / ADAPTER_CONFIG))
    found = base_fingerprint(model)
    if found != config["base_fingerprint"]:
        raise LmlabError(
            f"the adapter in {folder} was trained on another base model (fingerprint "
            f"{config['base_fingerprint']} of a {config['family']} model; this "
            f"{model.config.family} model has {found}: other tensor names or shapes)",
            f"load it on the model it was trained on ({config.get('base_model')})")
    had_pooler = model.pooler is not None
    for name in [h for h in model.heads if h not in config["heads"]]:
        del model.heads[name]
    settings = config.get("head_settings", {})
    for head in config["heads"]:
        if head not in model.heads:
            add_task_head(model, head, settings.get("num_labels"), settings.get("id2label"),
                          settings.get("pooling"), settings.get("problem_type"))
    model.config.extra.update(settings)
    if "id2label" in settings:
        model.config.extra["id2label"] = {int(k): v for k, v in settings["id2label"].items()}
    record = apply_method(model, config["method"], **config["options"])
    tensors = load_file(str(Path(folder) / ADAPTER_WEIGHTS))
    pooler = set(_pooler_parameters(model))
    if had_pooler and not pooler & set(tensors):
        pooler = set()  # the base's own pooler
    _copy_into(model, tensors, set(record.trainable) | pooler, str(folder))
    return model.eval()


def _pooler_parameters(model: nn.Module) -> list[str]:
    """The pooler's parameters (saved with the adapter when the base checkpoint has none)."""
    return [name for name, _ in model.named_parameters() if name.startswith("pooler.")]


def _base_has_pooler(base_model: str | Path | None) -> bool:
    """Whether the base checkpoint holds a pooler (False when it cannot be told)."""
    if base_model is None:
        return False
    try:
        from lmlab.interop.hf import CheckpointTensors
        from lmlab.utils.catalog import resolve_model_dir

        reader = CheckpointTensors(resolve_model_dir(base_model))
    except (LmlabError, OSError, ValueError):
        return False
    try:
        names = reader.keys()
    finally:
        reader.close()
    return any(f".{name}".rfind(".pooler.") >= 0 for name in names)


def _copy_into(model: nn.Module, tensors: dict[str, torch.Tensor], expected: set[str],
               where: str) -> None:
    params = dict(model.named_parameters())
    missing = sorted(expected - set(tensors))
    unexpected = sorted(set(tensors) - expected)
    shapes = [f"{n}: file {tuple(t.shape)}, model {tuple(params[n].shape)}"
              for n, t in tensors.items() if n in params and params[n].shape != t.shape]
    if missing or unexpected or shapes:
        raise LmlabError(f"the adapter in {where} does not fit its method's parameters: "
                         f"missing {missing[:5]}, unexpected {unexpected[:5]}, "
                         f"mis-shaped {shapes[:5]}", "re-save the adapter; the file is "
                         "incomplete or belongs to other method options")
    with torch.no_grad():
        for name, tensor in tensors.items():
            params[name].copy_(tensor)


# -- fine-tuning recipes -------------------------------------------------------------------------
#: Each method's learning rate and head multiplier without ``--lr`` / ``--head-lr-multiplier``
#: (where they come from: docs/adaptation.md).
METHOD_DEFAULTS: dict[str, dict[str, float]] = {
    "lora": {"lr": 5e-4, "head_lr_multiplier": 2.0},
    "adapter": {"lr": 1e-3, "head_lr_multiplier": 1.0},
    "bitfit": {"lr": 1e-3, "head_lr_multiplier": 1.0},
    "prompt": {"lr": 3e-2, "head_lr_multiplier": 1 / 30},
    "prefix": {"lr": 1e-2, "head_lr_multiplier": 0.1},
}
