"""Objectives by name, and ``build_objective("mlm,sop", special, **hparams)``. Names map to
factories or lazy ``"module:attribute"`` strings, so listing them never imports torch."""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

from lmlab.objectives.special_tokens import SpecialTokens
from lmlab.utils.checks import check_choice, check_names
from lmlab.utils.errors import LmlabError
from lmlab.utils.lazy import resolve_entry

_REGISTRY: dict[str, Callable[..., Any] | str] = {
    "mlm": "lmlab.objectives.mlm:MaskedLM",
    "wwm": "lmlab.objectives.mlm:WholeWordMaskedLM",
    "span": "lmlab.objectives.span:SpanMaskedLM",
    "nsp": "lmlab.objectives.sentence_pairs:NextSentencePrediction",
    "sop": "lmlab.objectives.sentence_pairs:SentenceOrderPrediction",
    "rtd": "lmlab.objectives.electra:ReplacedTokenDetection",
    "clm": "lmlab.objectives.causal:CausalLM",
    "prefix-lm": "lmlab.objectives.causal:PrefixLM",
    "plm": "lmlab.objectives.permutation:PermutationLM",
    "t5": "lmlab.objectives.seq2seq:T5SpanCorruption",
    "bart": "lmlab.objectives.seq2seq:BartDenoising",
    "distil": "lmlab.objectives.distillation:Distillation",
    "bilm": "lmlab.objectives.bilm:BidirectionalLM",
    "canine-c": "lmlab.objectives.characters:AutoregressiveCharacters",
}
_ALIASES = {"electra": "rtd", "spanbert": "span", "sbo": "span", "whole-word": "wwm",
            "span-corruption": "t5", "denoising": "bart",
            "permutation": "plm", "xlnet": "plm"}


def register_objective(name: str, factory: Callable[..., Any] | str) -> None:
    """Make ``name`` (no commas or spaces) buildable by :func:`build_objective`; ``factory``
    is ``factory(special, **hparams) -> Objective`` (an Objective subclass works) or a
    ``"module:attribute"`` string naming one, imported on first use."""
    if not name or "," in name or name != name.strip():
        raise LmlabError(f"objective name {name!r} is not valid",
                         "use a short name without commas or spaces, e.g. 'clm'")
    _REGISTRY[name] = factory


def available_objectives() -> list[str]:
    """Names :func:`build_objective` accepts (without importing the objectives' modules)."""
    return sorted(_REGISTRY)


def check_objective_spec(spec: str) -> list[str]:
    """The canonical names in ``spec`` (``"mlm,sop"``), checked against the registry without
    building (or importing) anything, so a typo is refused before any work starts."""
    names = [part.strip() for part in str(spec).split(",") if part.strip()]
    if not names:
        raise LmlabError(f"empty objective spec {spec!r}", "name one, e.g. 'mlm' or 'mlm,sop'")
    canonical = [_ALIASES.get(name, name) for name in names]
    check_names(canonical, available_objectives(), f"objective spec {spec!r}", "objective")
    if len(set(canonical)) != len(canonical):
        raise LmlabError(f"objective spec {spec!r} names an objective twice", "list each once")
    return canonical


def get_factory(name: str) -> Callable[..., Any]:
    """The factory registered under ``name`` (resolving lazy ``module:attribute`` strings)."""
    name = check_choice(_ALIASES.get(name, name), available_objectives(), "objective",
                        "objective")
    return resolve_entry(_REGISTRY, name)


def _accepted(factory: Callable[..., Any]) -> tuple[set[str], bool]:
    """Keyword names a factory takes, and whether it takes ``**kwargs``."""
    parameters = inspect.signature(factory).parameters.values()
    names = {p.name for p in parameters if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)}
    return names - {"self", "special"}, any(p.kind is p.VAR_KEYWORD for p in parameters)


def build_objective(spec: str, tokenizer_info: SpecialTokens, **hparams: Any) -> Any:
    """Build the objective named by ``spec`` (``"mlm"``, or ``"mlm,sop"``: a CombinedObjective).
    Each hyperparameter goes to every component that accepts it, ``"name.key"`` to that one
    only; one no component accepts is an error, so a typo never trains silently."""
    if not isinstance(tokenizer_info, SpecialTokens):
        raise LmlabError(f"tokenizer_info must be SpecialTokens, not {type(tokenizer_info).__name__}",
                         "build it with SpecialTokens.from_tokenizer(tokenizer)")
    names = check_objective_spec(spec)
    used: set[str] = set()
    components = []
    for canonical in names:
        factory = get_factory(canonical)
        accepted, var = _accepted(factory)
        kwargs: dict[str, Any] = {}
        for key, value in hparams.items():
            prefix, dot, short = key.partition(".")
            if dot:
                if _ALIASES.get(prefix, prefix) == canonical:
                    kwargs[short] = value
                    used.add(key)
            elif key in accepted or var:
                kwargs[key] = value
                used.add(key)
        components.append(factory(tokenizer_info, **kwargs))
    unused = sorted(set(hparams) - used)
    if unused:
        raise LmlabError(f"hyperparameters {unused} are not used by objective(s) {names}",
                         "check the spelling; see docs/objectives.md for each objective's "
                         "parameters")
    if len(components) == 1:
        return components[0]
    from lmlab.objectives.combined import CombinedObjective

    return CombinedObjective(components)
