"""A Hugging Face ``datasets`` dataset (``--sources hf:NAME[:FIELD]``): a document per row.
``NAME`` is a ``save_to_disk`` folder or anything ``datasets.load_dataset(NAME, split=...)``
accepts; needs the optional ``datasets`` package (``pip install lmlab[datasets]``)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

from lmlab.text.corpus import Document
from lmlab.text.sentences import record_sentences
from lmlab.text.sources.base import Source
from lmlab.utils.errors import LmlabError

INSTALL_HINT = "pip install lmlab[datasets]"


def _import_datasets():
    try:
        import datasets
    except ModuleNotFoundError:
        raise LmlabError("the `datasets` package is not installed (needed for hf: sources)",
                         INSTALL_HINT) from None
    return datasets


class HuggingFaceSource(Source):
    description = "a Hugging Face datasets dataset, a document per row"
    install_hint = INSTALL_HINT

    def __init__(self, dataset: str, field: str = "text", split: str = "train"):
        self.dataset = dataset
        self.field = field
        self.split = split
        self.name = f"hf:{dataset}" + (f":{field}" if field != "text" else "")

    def files(self) -> list[Path]:
        path = Path(self.dataset).expanduser()
        if path.exists():
            return sorted(p for p in path.rglob("*") if p.is_file()) if path.is_dir() else [path]
        return []

    def is_available(self) -> bool:
        try:
            _import_datasets()
        except LmlabError:
            return False
        return True

    def fingerprint(self) -> dict:
        return {**super().fingerprint(), "split": self.split, "field": self.field}

    def load(self):
        datasets = _import_datasets()
        path = Path(self.dataset).expanduser()
        if path.is_dir() and (path / "dataset_info.json").exists():
            data = datasets.load_from_disk(str(path))
            if isinstance(data, datasets.DatasetDict):
                data = data[self.split]
            return data
        return datasets.load_dataset(self.dataset, split=self.split)

    def iter_documents(self) -> Iterator[Document]:
        data = self.load()
        if self.field not in data.column_names:
            raise LmlabError(f"dataset {self.dataset!r} has no column {self.field!r} "
                             f"(columns: {', '.join(data.column_names)})",
                             f"name the text column: hf:{self.dataset}:COLUMN")
        for number, row in enumerate(data):
            value = row[self.field]
            sentences = record_sentences(value)
            if sentences:
                yield Document(f"{self.name}/{number}", self.name, sentences)
