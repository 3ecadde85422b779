"""Hugging Face folders: config.json + model.safetensors (single or sharded), both ways.

Tensors stream one at a time into the model (peak memory: one model plus one tensor); every
mismatch is reported in one error; pickled weights load only with ``allow_pickle=True``.
"""

from __future__ import annotations

import warnings
from contextlib import ExitStack
from dataclasses import replace
from pathlib import Path
from typing import Any

import torch

from lmlab.formats.safetensors_io import SafetensorsFile
from lmlab.models.config import TransformerConfig
from lmlab.models.core.positions import rotary_rows_from_pairs, rotary_rows_to_pairs
from lmlab.models.families import (
    TASK_CLASS_SUFFIX,
    TOKEN_LAYOUTS,
    FamilySpec,
    Rule,
    expand_rules,
    get_family,
)
from lmlab.utils.checks import refuse_adapted_checkpoint
from lmlab.utils.errors import LmlabError
from lmlab.utils.io import atomic_path, atomic_write_json, read_json

WEIGHT_FILES = ("model.safetensors", "model.safetensors.index.json")
PICKLE_FILES = ("pytorch_model.bin", "pytorch_model.bin.index.json", "model.pt")
#: the fix of every refusal to write a model transformers cannot build
OWN_FORMAT = "save it in lmlab's own format (lmlab.interop.native.save_model does when this refuses)"


# -- reading ------------------------------------------------------------------------------------
def read_hf_config(path: str | Path) -> dict[str, Any]:
    config_file = Path(path) / "config.json"
    if not config_file.exists():
        raise LmlabError(f"{path} has no config.json",
                         "point at a Hugging Face model folder (config.json + model.safetensors) "
                         "or an lmlab run directory")
    return read_json(config_file)


def load_config(path: str | Path, tensors: CheckpointTensors | None = None
                ) -> tuple[TransformerConfig, FamilySpec, dict[str, Any]]:
    """The lmlab config, the family mapping and the raw config.json of a folder (its sizes
    checked against the ``tensors``' embedding table when given)."""
    hf = read_hf_config(path)
    model_type = hf.get("model_type")
    if not model_type:
        raise LmlabError(f"{Path(path) / 'config.json'} has no model_type",
                         "add the model_type field (e.g. \"bert\") to config.json")
    family = get_family(model_type)
    if tensors is not None:
        check_embedding_table(Path(path), hf, family, tensors)
    config = family.config_from_hf(hf)
    if config.tie_word_embeddings and tensors is not None and "lm_head.weight" in tensors \
            and "shared.weight" in tensors \
            and not torch.equal(tensors.get("lm_head.weight"), tensors.get("shared.weight")):
        # transformers 5 writes tie_word_embeddings true for every (m)T5 and leaves a head saved
        # with values of its own untied (a T5 v1.1 or mT5 it loaded and saved again): so do we
        config.tie_word_embeddings = False
    return config, family, hf


def check_embedding_table(path: Path, hf: dict[str, Any], family: FamilySpec,
                          tensors: CheckpointTensors) -> None:
    """Refuse a config.json whose vocabulary or width contradicts the token embedding table,
    before the config's own checks would report a confusing consequence."""
    values = family.read(family.hf_names, hf, f"this {family.model_type} config.json",
                         **family.hf_defaults)
    keys = set(tensors.keys())
    prefix = checkpoint_prefix(family, any(k.startswith(f"{family.base_prefix}.") for k in keys))
    table = next((prefix + name for rule in family.base_rules(family.config())
                  if rule.ours_names[0].endswith("word_embeddings.weight")
                  for name in (rule.theirs, *rule.aliases) if prefix + name in keys), None)
    if table is None:  # load_weights names what is missing
        return
    found = tensors.shape(table)
    width = "embedding_size" if values.get("embedding_size") else "hidden_size"
    expected = (values.get("vocab_size"), values.get(width))
    if len(found) == 2 and found != expected:
        raise LmlabError(f"{path / 'config.json'} says vocab_size {expected[0]} and {width} "
                         f"{expected[1]}, but the weights' {table} is {found[0]} x {found[1]} "
                         f"(expected {expected[0]} x {expected[1]})",
                         f"use the config.json saved with these weights ({width} {found[1]}, "
                         f"vocab_size {found[0]})")


class CheckpointTensors:
    """Lazy access to a checkpoint's tensors by name, over one or several files."""

    def __init__(self, path: str | Path, allow_pickle: bool = False):
        self.path = Path(path)
        self._stack = ExitStack()
        self._where: dict[str, Any] = {}
        self._pickled: dict[str, torch.Tensor] = {}
        index = self.path / "model.safetensors.index.json"
        single = self.path / "model.safetensors"
        if single.exists():
            self._open_safetensors([single])
        elif index.exists():
            files = self._shards(index)
            missing = [str(f) for f in files if not f.exists()]
            if missing:
                raise LmlabError(f"the shard index names files that are missing: {missing}",
                                 "copy every model-XXXXX-of-YYYYY.safetensors file of the checkpoint")
            self._open_safetensors(files)
        else:
            self._open_pickle(allow_pickle)

    def _shards(self, index: Path) -> list[Path]:
        """The files a shard index names (``weight_map``'s values)."""
        return sorted({self.path / name for name in read_json(index)["weight_map"].values()})

    def _open_safetensors(self, files: list[Path]) -> None:
        for file in files:
            reader = SafetensorsFile(file)  # plain reads, no memory map
            self._stack.callback(reader.close)
            for name in reader.keys():
                self._where[name] = reader

    def _open_pickle(self, allow_pickle: bool) -> None:
        found = [self.path / name for name in PICKLE_FILES if (self.path / name).exists()]
        if not found:
            raise LmlabError(f"{self.path} holds no weights (looked for {', '.join(WEIGHT_FILES)})",
                             "save the model with save_pretrained (safetensors)")
        if not allow_pickle:
            raise LmlabError(
                f"{found[0]} is a pickled checkpoint; unpickling can run arbitrary code",
                "convert it to safetensors, or pass allow_pickle=True (--allow-pickle) if you "
                "trust its source",
            )
        files = self._shards(found[0]) if found[0].name.endswith(".index.json") else [found[0]]
        for file in files:
            self._pickled.update(torch.load(file, map_location="cpu", weights_only=False))

    def keys(self) -> list[str]:
        return list(self._where) + list(self._pickled)

    def __contains__(self, name: str) -> bool:
        return name in self._where or name in self._pickled

    def shape(self, name: str) -> tuple[int, ...]:
        """A tensor's shape, read from the file's header (nothing is loaded)."""
        if name in self._pickled:
            return tuple(self._pickled[name].shape)
        return self._where[name].shape(name)

    def get(self, name: str) -> torch.Tensor:
        if name in self._pickled:
            return self._pickled.pop(name)  # drop our reference as soon as it is used
        return self._where[name].get_tensor(name)

    def close(self) -> None:
        self._stack.close()
        self._pickled.clear()


def layer_counts(model) -> tuple[int, int]:
    """Layer modules of ``model``'s stacks: (layers, 0), or (encoder, decoder) layers."""
    if hasattr(model, "transformer"):
        return len(model.transformer.layers), 0
    return len(model.encoder.layers), len(model.decoder.layers)


def checkpoint_prefix(family: FamilySpec, with_heads: bool) -> str:
    """What precedes the bare model's tensor names in a checkpoint (``"bert."`` in a
    ``BertFor...`` class, nothing in ``BertModel`` or in T5's classes)."""
    return f"{family.base_prefix}." if family.base_prefix and with_heads else ""


def model_rules(family: FamilySpec, model, prefix: str) -> list[Rule]:
    """All rules for ``model`` (its stack, pooler and heads), with base names under ``prefix``."""
    config = model.config
    layers = layer_counts(model)
    base = list(family.base_rules(config))
    if model.pooler is not None:
        base += family.pooler_rules
    rules = [replace(r, theirs=prefix + r.theirs, aliases=tuple(prefix + a for a in r.aliases))
             for r in expand_rules(base, *layers)]
    for head in model.heads:
        if head in family.head_rules:
            rules += list(expand_rules(family.head_rules[head](config), *layers))
    return rules


def _swap_heads_and_parts(tensor: torch.Tensor, head_dim: int, parts: int, to_ours: bool
                          ) -> torch.Tensor:
    """Rows grouped per head, each head's ``parts`` in turn, <-> grouped per part."""
    heads = tensor.shape[0] // (parts * head_dim)
    shape = (heads, parts) if to_ours else (parts, heads)
    return tensor.reshape(*shape, head_dim, *tensor.shape[1:]).transpose(0, 1).reshape(tensor.shape)


def _to_ours(rule: Rule, tensor: torch.Tensor, head_dim: int) -> list[torch.Tensor]:
    if rule.head_axes:  # (H, nh, hd) -> (H, nh * hd)
        tensor = tensor.flatten(1)
    if rule.transpose:
        tensor = tensor.t()
    if rule.rotary_pairs:
        tensor = rotary_rows_from_pairs(tensor, head_dim)
    if rule.per_head:  # (nh, parts, hd, ...) -> (parts, nh, hd, ...)
        tensor = _swap_heads_and_parts(tensor, head_dim, len(rule.ours_names), to_ours=True)
    if rule.split is not None:
        return list(tensor.chunk(len(rule.ours_names), dim=rule.split))
    return [tensor]


def load_weights(model, tensors: CheckpointTensors, family: FamilySpec,
                 strict_heads: bool = True) -> list[str]:
    """Copy a checkpoint into ``model`` in place; returns heads that got fresh weights. One
    LmlabError lists every missing, unexpected and mis-shaped tensor."""
    keys = set(tensors.keys())
    prefix = checkpoint_prefix(family, any(k.startswith(f"{family.base_prefix}.") for k in keys))
    params = _targets(model)
    missing, mismatched, fresh_heads = [], [], []
    consumed: set[str] = set()
    head_param_names = {name for name, _ in model.named_parameters(remove_duplicate=False)
                        if name.startswith("heads.")}
    head_rules_present: dict[str, bool] = {}

    for rule in model_rules(family, model, prefix):
        name = next((n for n in (rule.theirs, *rule.aliases) if n in keys), None)
        head = rule.ours_names[0].split(".")[1] if rule.ours_names[0].startswith("heads.") else None
        if name is None:
            # a decoder tied to the embeddings is left out of the file: the head is not fresh
            if head is not None and not (rule.optional and _is_tied(model, rule.ours_names[0])):
                head_rules_present.setdefault(head, False)
            if not rule.optional and head is None:
                missing.append(rule.theirs)
            continue
        if head is not None:
            head_rules_present[head] = True
        consumed.update(n for n in (rule.theirs, *rule.aliases) if n in keys)
        for ours, value in zip(rule.ours_names,
                               _to_ours(rule, tensors.get(name), model.config.head_dim)):
            target = params.get(ours)
            if target is None:
                raise LmlabError(f"internal mapping error: lmlab has no parameter {ours}")
            if tuple(target.shape) != tuple(value.shape):
                mismatched.append(f"{name}: checkpoint {tuple(value.shape)}, "
                                  f"model {tuple(target.shape)}")
                continue
            with torch.no_grad():
                target.copy_(value)
            head_param_names.discard(ours)

    for head, present in head_rules_present.items():
        if not present:
            fresh_heads.append(head)
        elif any(n.startswith(f"heads.{head}.") for n in head_param_names) and strict_heads:
            leftover = [n for n in head_param_names if n.startswith(f"heads.{head}.")
                        and not _is_tied(model, n)]
            missing.extend(f"({head} head) {n}" for n in leftover)

    # tensors of heads the checkpoint has but the caller did not ask for (head="sop" on an
    # AlbertForPreTraining checkpoint): left out on purpose, not unexpected
    for other, make_rules in family.head_rules.items():
        if other not in model.heads:
            for rule in expand_rules(make_rules(model.config), *layer_counts(model)):
                consumed.update(n for n in (rule.theirs, *rule.aliases) if n in keys)
    if family.fixed_tensors is not None:
        consumed.update(n for name in family.fixed_tensors(model.config)
                        for n in (name, f"{family.base_prefix}.{name}") if n in keys)
    unexpected = sorted(k for k in keys - consumed if not _ignorable(k))
    problems = [f"{kind} tensors: {sep.join(names[:20])}"
                + (f" (+{len(names) - 20} more)" if len(names) > 20 else "")
                for kind, names, sep in (("missing", missing, ", "), ("unexpected", unexpected, ", "),
                                         ("mis-shaped", mismatched, "; ")) if names]
    if problems:
        raise LmlabError(
            f"the checkpoint in {tensors.path} does not match its config.json "
            f"({family.model_type}): " + " | ".join(problems),
            "check that config.json belongs to these weights (sizes, vocabulary) and that the "
            "files are complete",
        )
    return fresh_heads


def _targets(model) -> dict[str, torch.Tensor]:
    """Parameters and buffers by name (DistilBERT's stored sinusoids fill a buffer)."""
    targets = dict(model.named_buffers(remove_duplicate=False))
    targets.update(model.named_parameters(remove_duplicate=False))
    return targets


def _token_tables(model) -> list[torch.Tensor]:
    """The token embedding tables a head or a second stack may share (source, target)."""
    tables = [model.get_input_embeddings()]
    if hasattr(model, "get_target_embeddings"):
        tables.append(model.get_target_embeddings())
    return [table.weight for table in tables if table is not None]  # a ViT has none


def _is_tied(model, name: str) -> bool:
    param = dict(model.named_parameters(remove_duplicate=False))[name]
    return any(param is table for table in _token_tables(model))


def _ignorable(name: str) -> bool:
    """Buffers some checkpoints carry that hold no learned values."""
    return name.endswith(("position_ids", "attn.bias", "attn.masked_bias", "rotary_emb.inv_freq"))


def saved_heads(family: FamilySpec, hf: dict[str, Any]) -> tuple[str, ...]:
    """The heads of the first class in config.json's ``architectures`` that lmlab maps."""
    return next((family.architectures[arch] for arch in hf.get("architectures") or []
                 if arch in family.architectures), ())


def load_pretrained(path: str | Path, head: str | list[str] | None = None,
                    allow_pickle: bool = False, dtype: torch.dtype | None = None):
    """A model from a Hugging Face folder. ``head``: None = the heads config.json's
    ``architectures`` names; a name or list = those heads (fresh weights where the checkpoint
    has none: ``model.fresh_heads``)."""
    from lmlab.models.classes import model_class

    path = Path(path)
    read_hf_config(path)  # a folder without config.json is refused before its weights are read
    tensors = CheckpointTensors(path, allow_pickle=allow_pickle)
    try:
        config, family, hf = load_config(path, tensors)
        if head is None:
            heads = saved_heads(family, hf)
        else:
            heads = (head,) if isinstance(head, str) else tuple(head)
        keys = tensors.keys()
        has_pooler = any(r.theirs in keys or f"{family.base_prefix}.{r.theirs}" in keys
                         for r in family.pooler_rules)
        model = model_class(config)(config, heads=heads, with_pooler=has_pooler or None)
        model.fresh_heads = load_weights(model, tensors, family)
    finally:
        tensors.close()
    model.tie_weights()
    pooling = hf.get("lmlab_pooling")
    if pooling in ("mean", "concat") and any(family.task_heads.get(h) not in (None, *TOKEN_LAYOUTS)
                                             for h in model.heads):
        warnings.warn(f"{path} is a transformers folder whose task head reads the "
                      f"{pooling} pooling (lmlab wrote these before 2026-11); lmlab loads it as "
                      "trained, but transformers would pool [CLS] instead. Re-save it: "
                      "lmlab.interop.native.save_model(lmlab.from_pretrained(path), new_folder)",
                      stacklevel=2)
    if dtype is not None:
        model = model.to(dtype)
    return model.eval()


# -- writing ------------------------------------------------------------------------------------
def save_pretrained(model, path: str | Path, architecture: str | None = None,
                    max_shard_bytes: int | None = None) -> Path:
    """Write ``model`` as a Hugging Face folder that transformers loads with identical outputs
    (tied weights once; ``max_shard_bytes``: ``model-0000k-of-0000n.safetensors`` + an index)."""
    refuse_adapted_checkpoint(model)
    path = Path(path)
    family = get_family(model.config.family)
    _refuse_head_layout(model.config, family)
    _refuse_task_heads(model, family)
    hf_config = family.config_to_hf(model.config)  # refuses a config transformers cannot express
    path.mkdir(parents=True, exist_ok=True)  # only once the config is known to be writable
    heads = tuple(model.heads.keys())
    architecture = architecture or family.architecture_for(
        heads, encoder_only=bool(family.encoder_class) and not model.config.is_encoder_decoder)
    prefix = checkpoint_prefix(family, bool(heads))
    params = _targets(model)
    tables = _token_tables(model)

    tensors: dict[str, torch.Tensor] = {}
    for rule in model_rules(family, model, prefix):
        values = [params[o] for o in rule.ours_names]
        if rule.optional and len(values) == 1 and any(values[0] is t for t in tables):
            continue  # a tied copy (a head, a second stack's table): transformers re-ties it
        tensor = torch.cat([v.detach() for v in values], dim=rule.split) if rule.split is not None \
            else values[0].detach()
        if rule.per_head:
            tensor = _swap_heads_and_parts(tensor, model.config.head_dim, len(values), False)
        if rule.rotary_pairs:
            tensor = rotary_rows_to_pairs(tensor, model.config.head_dim)
        if rule.transpose:
            tensor = tensor.t()
        if rule.head_axes:  # (H, nh * hd) -> (H, nh, hd)
            tensor = tensor.unflatten(1, (-1, model.config.head_dim))
        tensors[rule.theirs] = tensor.contiguous().cpu()
    if family.fixed_tensors is not None:
        tensors.update({prefix + name: value.contiguous().cpu()
                        for name, value in family.fixed_tensors(model.config).items()})

    hf_config["architectures"] = [architecture]
    hf_config["torch_dtype"] = str(next(model.parameters()).dtype).removeprefix("torch.")
    extra = getattr(model, "hf_config_extra", None)
    if extra:
        hf_config.update(extra)

    _save_shards(tensors, path, max_shard_bytes)
    atomic_write_json(path / "config.json", hf_config)
    return path


def _refuse_head_layout(config: TransformerConfig, family: FamilySpec) -> None:
    """Refuse layouts transformers cannot build: low-rank maps, heads pruned unevenly, or to
    a count or width config.json cannot say."""
    if config.extra.get("attention_heads_per_layer"):
        raise LmlabError("the layers have different numbers of attention heads (heads were "
                         "pruned); transformers builds every layer with the same number",
                         f"{OWN_FORMAT}, or prune the same number of heads in every layer "
                         "of a family whose config.json has head_dim (Llama)")
    if config.extra.get("low_rank"):
        raise LmlabError("linear maps are factorised into two low-rank matrices "
                         "(lmlab.compress.lowrank); transformers has no such layer", OWN_FORMAT)
    if config.extra.get("pruned_heads") and config.hidden_size % config.num_attention_heads:
        raise LmlabError(f"{config.num_attention_heads} heads left in a hidden size of "
                         f"{config.hidden_size}: transformers refuses a head count that does not "
                         "divide the hidden size, even with head_dim",
                         f"{OWN_FORMAT}, or prune to a head count that divides it")
    names = set(family.hf_names.values())
    if "head_dim" not in names and config.head_dim * config.num_attention_heads != config.hidden_size:
        raise LmlabError(f"{config.num_attention_heads} heads of {config.head_dim} dimensions in a "
                         f"hidden size of {config.hidden_size}: {family.model_type}'s config.json "
                         "has no head width (transformers makes heads hidden / heads wide)",
                         OWN_FORMAT)


def _refuse_task_heads(model, family: FamilySpec) -> None:
    """Refuse task heads transformers would load as another model: a head of a family with no
    such class, a pooled head on lmlab's ``mean``/``concat`` pooling (those classes pool [CLS])."""
    pooling = model.config.extra.get("pooling", "family")
    for head in model.heads:
        if head not in TASK_CLASS_SUFFIX:
            continue
        name = f"{family.architecture_for(()).removesuffix('Model')}{TASK_CLASS_SUFFIX[head]}"
        if head not in family.task_heads:
            raise LmlabError(f"lmlab has no transformers class for a {family.display_name} "
                             f"{head} head (transformers' {name}, where it exists, is another "
                             "model)", OWN_FORMAT)
        if pooling in ("mean", "concat") and family.task_heads[head] not in TOKEN_LAYOUTS:
            raise LmlabError(f"the {head} head reads the {pooling} pooling of the tokens; "
                             f"transformers' {name} pools [CLS] and would load the folder as "
                             "another model", OWN_FORMAT)


def _save_shards(tensors: dict[str, torch.Tensor], path: Path,
                 max_shard_bytes: int | None) -> None:
    """``model.safetensors``, or with ``max_shard_bytes`` ``model-0000k-of-0000n.safetensors``
    files of at most that size (a larger tensor alone) and their index."""
    from safetensors.torch import save_file

    shards: list[dict[str, torch.Tensor]] = [{}]
    size = 0
    for name, tensor in tensors.items():
        nbytes = tensor.numel() * tensor.element_size()
        if max_shard_bytes is not None and shards[-1] and size + nbytes > max_shard_bytes:
            shards.append({})
            size = 0
        shards[-1][name] = tensor
        size += nbytes
    weight_map = {}
    for k, shard in enumerate(shards, 1):
        file_name = "model.safetensors" if max_shard_bytes is None \
            else f"model-{k:05d}-of-{len(shards):05d}.safetensors"
        with atomic_path(path / file_name) as tmp:
            save_file(shard, str(tmp), metadata={"format": "pt"})
        weight_map.update({name: file_name for name in shard})
    if max_shard_bytes is not None:
        total = sum(t.numel() * t.element_size() for t in tensors.values())
        atomic_write_json(path / "model.safetensors.index.json",
                          {"metadata": {"total_size": total}, "weight_map": weight_map})
