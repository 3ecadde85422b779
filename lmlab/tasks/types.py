"""The in-memory shape every task reader produces: a :class:`Task` holding :class:`Example` lists,
one representation for all task types (which fields each type uses: docs/tasks.md), so training
loops, baselines and metrics need no per-dataset code.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Any

from lmlab.utils.checks import check_choice
from lmlab.utils.errors import LmlabError

TASK_TYPES = ("classification", "pair-classification", "regression", "tagging", "qa",
              "multiple-choice", "image-classification")
SPLITS = ("train", "dev", "test")


@dataclass(slots=True)
class Example:
    """One example of any task type (unused fields stay None)."""

    id: str
    text: str | None = None
    text_pair: str | None = None
    label: Any = None
    tokens: list[str] | None = None
    tags: list[str] | None = None
    question: str | None = None
    context: str | None = None
    answers: list[dict[str, Any]] | None = None
    choices: list[str] | None = None
    image: Any = None  # image tasks: a uint8 array (H, W) or (H, W, C)
    extra: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict without the empty fields (shallow: lists are shared, not copied;
        ``dataclasses.asdict`` deep-copies and is 10x slower on 100k examples)."""
        values = {name: getattr(self, name) for name in _EXAMPLE_FIELDS}
        return {name: value for name, value in values.items() if value is not None and value != {}}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Example:
        return cls(**data)

    def eval_texts(self) -> list[str]:
        """The raw texts of this example (what must not leak into a pretraining corpus)."""
        parts = [self.text, self.text_pair, self.question, self.context]
        if self.tokens:
            parts.append(" ".join(self.tokens))
        if self.choices:
            parts.extend(self.choices)
        return [p for p in parts if p]


_EXAMPLE_FIELDS = tuple(f.name for f in fields(Example))


@dataclass
class Task:
    """A labelled downstream task: examples per split (``train``, ``dev``, ``test``), its type
    (:data:`TASK_TYPES`), labels (class names or tag set; empty for regression and qa), metric
    names for :func:`lmlab.metrics.compute_metrics` (the first selects models), the class binary
    F1 scores (``positive_label``) and a one-line description for ``lmlab tasks list``."""

    name: str
    type: str
    labels: list[str]
    metrics: list[str]
    splits: dict[str, list[Example]] = field(default_factory=dict)
    positive_label: str | None = None
    description: str = ""

    def __post_init__(self) -> None:
        check_choice(self.type, TASK_TYPES, f"task {self.name!r}", "type")

    def split(self, name: str) -> list[Example]:
        """The examples of one split; an unknown or empty split is an error (never silently 0)."""
        if name not in self.splits:
            raise LmlabError(f"task {self.name!r} has no split {name!r} "
                             f"(splits: {', '.join(self.splits) or 'none'})",
                             "pick one of the listed splits or give the file for it")
        examples = self.splits[name]
        if not examples:
            raise LmlabError(f"the {name} split of task {self.name!r} is empty",
                             f"give a {name} file with at least one example")
        return examples

    @property
    def is_pair(self) -> bool:
        """True when examples carry a second text (pair classification, STS-B-like regression)."""
        return self.type == "pair-classification" or any(
            e.text_pair is not None for examples in self.splits.values() for e in examples[:1])

    def label_index(self) -> dict[str, int]:
        """Label -> integer id (the order of ``labels``)."""
        return {label: i for i, label in enumerate(self.labels)}

    def references(self, split: str) -> list[Any]:
        """Gold values for the metrics of one split: labels, floats, tag lists or answer texts."""
        examples = self.split(split)
        if self.type == "tagging":
            return [e.tags for e in examples]
        if self.type == "qa":
            return [[a["text"] for a in (e.answers or [])] for e in examples]
        return [e.label for e in examples]

    def evaluate(self, split: str, predictions: list[Any]) -> dict[str, float]:
        """This task's metrics of ``predictions`` (same form as :meth:`references`)."""
        from lmlab.metrics import compute_metrics

        return compute_metrics(self.metrics, predictions, self.references(split),
                               positive_label=self.positive_label)

    def sizes(self) -> dict[str, int]:
        return {name: len(examples) for name, examples in self.splits.items()}

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "type": self.type, "labels": self.labels,
                "metrics": self.metrics, "positive_label": self.positive_label,
                "description": self.description,
                "splits": {k: [e.to_dict() for e in v] for k, v in self.splits.items()}}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Task:
        splits = {k: [Example.from_dict(e) for e in v] for k, v in data["splits"].items()}
        return cls(**{**data, "splits": splits})


@dataclass(frozen=True)
class TextPair:
    """One text-to-text example: input, reference outputs (training uses the first), the key
    that decides its split, and a tag results are broken down by (an expression's depth)."""

    input_text: str
    references: tuple[str, ...]
    key: str = ""
    tag: str = ""

    @property
    def target(self) -> str:
        """The reference the model is trained on."""
        return self.references[0]
