"""Checkpoint names of the task heads (``...ForSequenceClassification`` etc.) for the encoder
families.

The family modules describe the bare stack and the pretraining heads;
:func:`~lmlab.interop.families.get_family` passes each family through :func:`with_task_heads`,
which returns the spec with, for BERT, RoBERTa, ALBERT, ELECTRA and DistilBERT:

- head rules for ``sequence-classification``, ``token-classification``,
  ``question-answering`` and ``multiple-choice`` (Hugging Face names, see
  :mod:`lmlab.finetune.heads` for the layouts);
- the four ``<Family>For<Task>`` architectures, so a saved model's config.json names the class
  transformers' ``AutoModelFor...`` expects and loading such a folder builds the right head;
- ``num_labels`` / ``id2label`` / ``label2id`` / ``problem_type`` carried between config.json and
  ``TransformerConfig.extra``;
- RoBERTa's pooler becomes optional in checkpoints: ``RobertaForSequenceClassification`` has
  none (its head reads ``<s>`` directly) while ``RobertaForMultipleChoice`` has one.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from typing import Any

from lmlab.interop.families import FamilySpec, Rule
from lmlab.models.config import TransformerConfig

FAMILY_CLASS_PREFIX = {"bert": "Bert", "roberta": "Roberta", "albert": "Albert",
                       "electra": "Electra", "distilbert": "DistilBert"}
TASK_CLASS_SUFFIX = {"sequence-classification": "ForSequenceClassification",
                     "token-classification": "ForTokenClassification",
                     "question-answering": "ForQuestionAnswering",
                     "multiple-choice": "ForMultipleChoice"}
_CARRIED = ("problem_type", "pooling", "summary_activation", "classifier_dropout",
            "summary_last_dropout", "word_labels")


def _linear(ours: str, theirs: str) -> list[Rule]:
    return [Rule(f"{ours}.{p}", f"{theirs}.{p}") for p in ("weight", "bias")]


def _pooled_rules(head: str, family: str, mc: bool) -> Callable[[TransformerConfig], list[Rule]]:
    """Rules of a sequence-classification or multiple-choice head (layout by family/pooling)."""

    def rules(config: TransformerConfig) -> list[Rule]:
        pooling = config.extra.get("pooling", "family")
        base = f"heads.{head}"
        if pooling in ("mean", "concat"):
            return _linear(f"{base}.classifier", "classifier")
        if family in ("roberta", "electra") and not mc:
            return (_linear(f"{base}.dense", "classifier.dense")
                    + _linear(f"{base}.out_proj", "classifier.out_proj"))
        if family == "electra" and mc:
            return (_linear(f"{base}.summary", "sequence_summary.summary")
                    + _linear(f"{base}.classifier", "classifier"))
        if family == "distilbert":
            return (_linear(f"{base}.pre_classifier", "pre_classifier")
                    + _linear(f"{base}.classifier", "classifier"))
        return _linear(f"{base}.classifier", "classifier")

    return rules


def _with_label_config(spec: FamilySpec) -> tuple[Callable, Callable]:
    """The family's config.json translators, also carrying label names and task settings
    between config.json and ``TransformerConfig.extra``."""
    from_hf, to_hf = spec.config_from_hf, spec.config_to_hf

    def config_from_hf(hf: dict[str, Any]) -> TransformerConfig:
        config = from_hf(hf)
        id2label = hf.get("id2label")
        if isinstance(id2label, dict) and id2label:
            config.extra["id2label"] = {int(k): str(v) for k, v in id2label.items()}
            config.extra["num_labels"] = len(id2label)
        if hf.get("num_labels") is not None:
            config.extra["num_labels"] = int(hf["num_labels"])
        for key in _CARRIED:
            if hf.get(key) is not None:
                config.extra[key] = hf[key]
        if hf.get("lmlab_pooling"):
            config.extra["pooling"] = hf["lmlab_pooling"]
        return config

    def config_to_hf(config: TransformerConfig) -> dict[str, Any]:
        hf = to_hf(config)
        extra = config.extra
        if "num_labels" in extra:
            count = int(extra["num_labels"])
            id2label = extra.get("id2label") or {i: f"LABEL_{i}" for i in range(count)}
            id2label = {int(k): str(v) for k, v in id2label.items()}
            hf["id2label"] = {str(k): v for k, v in sorted(id2label.items())}
            hf["label2id"] = {v: k for k, v in sorted(id2label.items())}
        for key in ("problem_type", "summary_activation", "classifier_dropout", "word_labels"):
            if extra.get(key) is not None:
                hf[key] = extra[key]
        if extra.get("pooling") not in (None, "family"):
            hf["lmlab_pooling"] = extra["pooling"]
        return hf

    return config_from_hf, config_to_hf


def with_task_heads(spec: FamilySpec) -> FamilySpec:
    """``spec`` plus the task heads' rules, architectures and label settings, as a new spec
    (the family module's own is left unchanged); families without task heads come back as is."""
    prefix = FAMILY_CLASS_PREFIX.get(spec.model_type)
    if prefix is None:
        return spec
    model_type = spec.model_type
    head_rules = dict(spec.head_rules)
    head_rules["sequence-classification"] = _pooled_rules(
        "sequence-classification", model_type, mc=False)
    head_rules["multiple-choice"] = _pooled_rules("multiple-choice", model_type, mc=True)
    head_rules["token-classification"] = lambda config: _linear(
        "heads.token-classification.classifier", "classifier")
    head_rules["question-answering"] = lambda config: _linear(
        "heads.question-answering.qa_outputs", "qa_outputs")
    architectures = dict(spec.architectures)
    for head, suffix in TASK_CLASS_SUFFIX.items():
        architectures[prefix + suffix] = (head,)
    pooler_rules = list(spec.pooler_rules)
    if model_type == "roberta":
        pooler_rules = [replace(rule, optional=True) for rule in pooler_rules]
    config_from_hf, config_to_hf = _with_label_config(spec)
    return replace(spec, head_rules=head_rules, architectures=architectures,
                   pooler_rules=pooler_rules, config_from_hf=config_from_hf,
                   config_to_hf=config_to_hf)
