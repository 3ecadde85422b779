"""Per-family mapping tables between lmlab's names and Hugging Face's.

A family module ``lmlab/interop/families/<model_type>.py`` defines ``FAMILY = FamilySpec(...)``;
:func:`get_family` imports it on first use and adds the fine-tuning task heads
(:func:`lmlab.interop.task_heads.with_task_heads`), so adding a family means adding one module
and what a lookup returns never depends on what was imported before.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from lmlab.models.config import TransformerConfig
from lmlab.utils.errors import LmlabError

KNOWN_FAMILIES = ("bert", "roberta", "albert", "electra", "distilbert", "gpt2", "llama")


@dataclass(frozen=True)
class Rule:
    """One checkpoint tensor and the lmlab parameter(s) it becomes.

    ``ours`` and ``theirs`` may contain ``{i}`` (the layer index). ``transpose``: theirs is
    stored (in, out) as GPT-2's Conv1D does. ``split``: theirs is ours' tensors concatenated
    along that dim (GPT-2's fused c_attn). ``aliases``: older names accepted when loading.
    ``optional``: the checkpoint may omit it (e.g. a decoder weight tied to the embeddings).
    """

    ours: str | tuple[str, ...]
    theirs: str
    transpose: bool = False
    split: int | None = None
    aliases: tuple[str, ...] = ()
    optional: bool = False

    @property
    def ours_names(self) -> tuple[str, ...]:
        return (self.ours,) if isinstance(self.ours, str) else self.ours


@dataclass
class FamilySpec:
    """Everything needed to map one Hugging Face ``model_type`` to lmlab and back.

    Attributes:
        model_type: the ``model_type`` of config.json.
        base_prefix: the name under which task classes nest the bare model (``"bert"``).
        config_from_hf / config_to_hf: translate config.json <-> :class:`TransformerConfig`.
        base_rules: weight rules of the bare stack, names relative to ``base_prefix``.
        pooler_rules: rules of the pooler (relative to ``base_prefix``), if the family has one.
        head_rules: per lmlab head name, rules with absolute checkpoint names.
        architectures: HF class name -> lmlab heads, primary first (``()`` = bare encoder).
    """

    model_type: str
    base_prefix: str
    config_from_hf: Callable[[dict[str, Any]], TransformerConfig]
    config_to_hf: Callable[[TransformerConfig], dict[str, Any]]
    base_rules: Callable[[TransformerConfig], list[Rule]]
    head_rules: dict[str, Callable[[TransformerConfig], list[Rule]]] = field(default_factory=dict)
    pooler_rules: list[Rule] = field(default_factory=list)
    architectures: dict[str, tuple[str, ...]] = field(default_factory=dict)

    def architecture_for(self, heads: tuple[str, ...]) -> str:
        """The HF class name whose heads are exactly ``heads`` (bare model when none match)."""
        for name, arch_heads in self.architectures.items():
            if tuple(arch_heads) == tuple(heads):
                return name
        for name, arch_heads in self.architectures.items():
            if heads and arch_heads and arch_heads[0] == heads[0]:
                return name
        return next(name for name, arch_heads in self.architectures.items() if not arch_heads)


_FAMILIES: dict[str, FamilySpec] = {}


def register_family(spec: FamilySpec) -> FamilySpec:
    """Make ``spec`` the mapping :func:`get_family` returns for its ``model_type`` (as given:
    add task heads with :func:`lmlab.interop.task_heads.with_task_heads` first if wanted)."""
    _FAMILIES[spec.model_type] = spec
    return spec


def get_family(model_type: str) -> FamilySpec:
    """The mapping of a ``model_type``: ``lmlab.interop.families.<model_type>``'s ``FAMILY``
    with the task heads (``...ForSequenceClassification`` etc.) added, built on first use."""
    if model_type not in _FAMILIES:
        from lmlab.interop.task_heads import with_task_heads

        try:
            module = importlib.import_module(f"{__name__}.{model_type}")
        except ModuleNotFoundError as error:
            if error.name != f"{__name__}.{model_type}":
                raise
            raise LmlabError(
                f"lmlab cannot read checkpoints of model_type {model_type!r}",
                f"supported model types: {', '.join(KNOWN_FAMILIES)}",
            ) from None
        register_family(with_task_heads(module.FAMILY))
    return _FAMILIES[model_type]


def pick(values: dict[str, Any], *names: str, default: Any = None) -> Any:
    """First present key among ``names`` (HF configs rename fields across versions)."""
    for name in names:
        if name in values and values[name] is not None:
            return values[name]
    return default
