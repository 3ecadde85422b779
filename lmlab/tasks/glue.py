"""GLUE's nine tasks read from the benchmark's own TSV files (``glue_data/<TASK>/``), literally,
as the BERT/transformers processors read them; :data:`GLUE_FORMATS` says where each task's
fields and labels live (docs/tasks.md lists the layouts). Test files are read unlabelled.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from lmlab.metrics.glue import GLUE_TASKS
from lmlab.tasks.readers import check_labels, check_pair_texts, read_table
from lmlab.tasks.types import Task
from lmlab.utils.checks import check_choice
from lmlab.utils.errors import LmlabError

BINARY = ("0", "1")
NLI3 = ("contradiction", "entailment", "neutral")
NLI2 = ("entailment", "not_entailment")


@dataclass(frozen=True)
class GlueFormat:
    """Where a GLUE task's fields live in its TSV files."""

    key: str
    folder: str
    text: str
    text_pair: str | None
    label: str
    labels: tuple[str, ...]
    dev_file: str = "dev.tsv"
    test_file: str = "test.tsv"
    fieldnames: tuple[str, ...] | None = None  # for files without a header row (CoLA)
    regression: bool = False
    positive_label: str | None = None

    @property
    def task_type(self) -> str:
        """``regression`` (STS-B), ``pair-classification`` or ``classification``."""
        if self.regression:
            return "regression"
        return "pair-classification" if self.text_pair else "classification"


GLUE_FORMATS: dict[str, GlueFormat] = {
    f.key: f
    for f in (
        GlueFormat("cola", "CoLA", "sentence", None, "label", BINARY,
                   fieldnames=("source", "label", "mark", "sentence"), positive_label="1"),
        GlueFormat("sst2", "SST-2", "sentence", None, "label", BINARY, positive_label="1"),
        GlueFormat("mrpc", "MRPC", "#1 String", "#2 String", "Quality", BINARY,
                   positive_label="1"),
        GlueFormat("qqp", "QQP", "question1", "question2", "is_duplicate", BINARY,
                   positive_label="1"),
        GlueFormat("stsb", "STS-B", "sentence1", "sentence2", "score", (), regression=True),
        GlueFormat("mnli-m", "MNLI", "sentence1", "sentence2", "gold_label", NLI3,
                   dev_file="dev_matched.tsv", test_file="test_matched.tsv"),
        GlueFormat("mnli-mm", "MNLI", "sentence1", "sentence2", "gold_label", NLI3,
                   dev_file="dev_mismatched.tsv", test_file="test_mismatched.tsv"),
        GlueFormat("qnli", "QNLI", "question", "sentence", "label", NLI2),
        GlueFormat("rte", "RTE", "sentence1", "sentence2", "label", NLI2),
        GlueFormat("wnli", "WNLI", "sentence1", "sentence2", "label", BINARY, positive_label="1"),
    )
}
_ALIASES = {"sst-2": "sst2", "sts-b": "stsb", "mnli": "mnli-m", "mnli-matched": "mnli-m",
            "mnli-mismatched": "mnli-mm"}


def glue_key(name: str) -> str:
    """Canonical GLUE task key (``"SST-2"`` -> ``"sst2"``, ``"glue-rte"`` -> ``"rte"``)."""
    key = name.lower().removeprefix("glue-").removeprefix("glue/")
    return check_choice(_ALIASES.get(key, key), GLUE_FORMATS, "task", "GLUE task")


def _task_folder(data_dir: Path, spec: GlueFormat) -> Path:
    """``data_dir`` itself when it holds the task's files, else ``data_dir/<TASK folder>``."""
    for candidate in (data_dir, data_dir / spec.folder, data_dir / spec.folder.lower()):
        if (candidate / "train.tsv").is_file() or (candidate / spec.dev_file).is_file():
            return candidate
    raise LmlabError(f"no {spec.folder} files (train.tsv, {spec.dev_file}) under {data_dir}",
                     f"point at the GLUE data folder that holds {spec.folder}/ (as written by "
                     "the GLUE download script)")


def load_glue_task(name: str, data_dir: str | os.PathLike) -> Task:
    """A GLUE task from its TSV files; missing split files are skipped (test is unlabelled)."""
    spec = GLUE_FORMATS[glue_key(name)]
    folder = _task_folder(Path(data_dir), spec)
    files = {"train": "train.tsv", "dev": spec.dev_file, "test": spec.test_file}
    loaded = {}
    for split, file in files.items():
        path = folder / file
        if not path.is_file():
            continue
        if split == "test":  # header row, an index/id column, no label
            examples = read_table(path, spec.text, None, spec.text_pair, format="tsv",
                                  id_column="id" if spec.key == "qqp" else "index")
        else:
            examples = read_table(path, spec.text, spec.label, spec.text_pair, format="tsv",
                                  fieldnames=spec.fieldnames, regression=spec.regression,
                                  skip_short_rows=spec.key == "qqp")
            if not spec.regression:
                check_labels(examples, spec.labels, str(path))
        if spec.text_pair:
            check_pair_texts(examples, str(path))
        loaded[split] = examples
    if not loaded:
        raise LmlabError(f"no {spec.folder} split files found in {folder}",
                         f"expected {', '.join(files.values())}")
    return Task(name=f"glue-{spec.key}", type=spec.task_type, labels=list(spec.labels),
                metrics=list(GLUE_TASKS[spec.key].metrics), splits=loaded,
                positive_label=spec.positive_label,
                description=f"GLUE {GLUE_TASKS[spec.key].name} from {folder}")
