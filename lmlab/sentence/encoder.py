"""Sentence vectors from an lmlab encoder: the mean of its last hidden states over real tokens
(Sentence-BERT's pooling). :class:`SentenceEncoder` reads and writes the sentence-transformers
settings, so it encodes as ``SentenceTransformer.encode`` does; :class:`ConcatenatedEncoder` is
quick-thought's ``[f(s); g(s)]``. docs/sentence-encoders.md tells the story.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
from torch import nn

from lmlab.objectives.base import sentence_vectors
from lmlab.utils.errors import LmlabError
from lmlab.utils.io import read_json

DEFAULT_MAX_LENGTH = 256  # sentence-transformers' max_seq_length for MiniLM-sized encoders


def embed_batch(model: nn.Module, batch: dict[str, torch.Tensor],
                normalize: bool = False) -> torch.Tensor:
    """Mean-pooled (optionally unit-length) sentence vectors (B, H) of a batch, with gradients."""
    vectors = sentence_vectors(model, batch)
    return nn.functional.normalize(vectors, dim=-1) if normalize else vectors


def _sentence_transformers_settings(folder: Path) -> tuple[int | None, bool]:
    """(max_seq_length or None, normalize) recorded in a sentence-transformers folder."""
    config, modules = folder / "sentence_bert_config.json", folder / "modules.json"
    max_length = read_json(config).get("max_seq_length") if config.is_file() else None
    module_types = [str(m.get("type", "")) for m in read_json(modules)] if modules.is_file() else []
    return max_length, any(kind.endswith(".Normalize") for kind in module_types)


class SentenceEncoder:
    """A bi-encoder: ``model`` (an lmlab encoder) + ``tokenizer``, mean pooling, optional
    normalisation, inputs cut to ``max_length`` tokens."""

    def __init__(self, model: nn.Module, tokenizer: Any, max_length: int = DEFAULT_MAX_LENGTH,
                 normalize: bool = False):
        from lmlab.models.inputs import input_limit

        self.model = model
        self.tokenizer = tokenizer
        self.max_length = int(input_limit(model, tokenizer, max_length) or max_length)
        self.normalize = bool(normalize)

    @classmethod
    def load(cls, path: str | Path, max_length: int | None = None,
             normalize: bool | None = None) -> SentenceEncoder:
        """An encoder from a model folder (or a catalog name such as ``minilm``), with the
        folder's sentence-transformers settings unless given."""
        from lmlab.load import load_model_and_tokenizer
        from lmlab.utils.catalog import resolve_model_dir

        folder = Path(resolve_model_dir(path))
        model, tokenizer = load_model_and_tokenizer(str(folder))
        if getattr(model.config, "is_encoder_decoder", False):
            raise LmlabError(f"{path} is an encoder-decoder", "give an encoder (BERT-like) folder")
        recorded_length, recorded_normalize = _sentence_transformers_settings(folder)
        if max_length is None and recorded_length is None:  # a plain model folder: the
            from lmlab.models.inputs import max_input_length  # default, if it fits

            max_length = min(DEFAULT_MAX_LENGTH,
                             max_input_length(model, tokenizer) or DEFAULT_MAX_LENGTH)
        return cls(model, tokenizer, max_length or recorded_length,
                   recorded_normalize if normalize is None else normalize)

    def tokenize(self, texts: Sequence[str]) -> dict[str, torch.Tensor]:
        """The padded model inputs of ``texts``, each cut to ``max_length`` tokens."""
        encoded = self.tokenizer(list(texts), padding=True, truncation=True,
                                 max_length=self.max_length, return_tensors="pt")
        return {key: encoded[key] for key in ("input_ids", "attention_mask", "token_type_ids")
                if key in encoded}

    @torch.no_grad()
    def encode(self, texts: Sequence[str], batch_size: int = 64,
               show_progress: bool = False) -> torch.Tensor:
        """(N, H) float32 vectors of ``texts`` in their order (batched by length)."""
        from lmlab.utils.progress import progress

        texts = [str(t) for t in texts]
        if not texts:
            raise LmlabError("no texts to encode", "give at least one sentence")
        self.model.eval()
        device = next(self.model.parameters()).device
        order = sorted(range(len(texts)), key=lambda i: len(texts[i]))
        out = torch.empty(len(texts), self.model.config.hidden_size)
        starts = range(0, len(order), batch_size)
        for start in progress(starts, desc="encoding", unit="batch") if show_progress else starts:
            indices = order[start:start + batch_size]
            batch = {k: v.to(device) for k, v in self.tokenize([texts[i] for i in indices]).items()}
            out[indices] = embed_batch(self.model, batch, self.normalize).float().cpu()
        return out

    def save(self, folder: str | Path) -> Path:
        """Write the model, the tokenizer and the sentence-transformers files."""
        from lmlab.interop.native import save_model

        folder, _ = save_model(self.model, Path(folder))
        self.tokenizer.save_pretrained(folder)
        write_sentence_transformers_files(folder, self.model.config.hidden_size,
                                          self.max_length, self.normalize)
        return folder


def write_sentence_transformers_files(folder: Path, hidden: int, max_length: int,
                                      normalize: bool) -> None:
    """The files that make ``folder`` a sentence-transformers model with mean pooling."""
    from lmlab.utils.io import atomic_write_json

    modules = [{"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
               {"idx": 1, "name": "1", "path": "1_Pooling",
                "type": "sentence_transformers.models.Pooling"}]
    if normalize:
        modules.append({"idx": 2, "name": "2", "path": "2_Normalize",
                        "type": "sentence_transformers.models.Normalize"})
    atomic_write_json(folder / "modules.json", modules)
    atomic_write_json(folder / "sentence_bert_config.json",
                      {"max_seq_length": int(max_length), "do_lower_case": False})
    (folder / "1_Pooling").mkdir(exist_ok=True)
    atomic_write_json(folder / "1_Pooling" / "config.json",
                      {"word_embedding_dimension": int(hidden), "pooling_mode_cls_token": False,
                       "pooling_mode_mean_tokens": True, "pooling_mode_max_tokens": False,
                       "pooling_mode_mean_sqrt_len_tokens": False})
    if normalize:
        (folder / "2_Normalize").mkdir(exist_ok=True)


class ConcatenatedEncoder:
    """Sentence vectors ``[e_1(s); e_2(s); ...]`` (N, H_1 + H_2 + ...) of parts that share one
    tokenizer (quick-thought's ``f`` and ``g``), each with its own settings."""

    def __init__(self, parts: Sequence[SentenceEncoder], names: Sequence[str] | None = None):
        names = [str(n) for n in names] if names is not None else [
            f"encoder {i + 1}" for i in range(len(parts))]
        check_concatenable([p.tokenizer for p in parts], names)
        self.parts = list(parts)

    @classmethod
    def load(cls, paths: Sequence[str | Path], max_length: int | None = None,
             normalize: bool | None = None) -> ConcatenatedEncoder:
        """The parts from model folders, every tokenizer checked before any weights are read."""
        from lmlab.tokenization.tokenizer import Tokenizer
        from lmlab.utils.catalog import resolve_model_dir

        folders = [Path(resolve_model_dir(p)) for p in paths]
        check_concatenable([Tokenizer.from_pretrained(f) for f in folders],
                           [str(p) for p in paths], folders)
        return cls([SentenceEncoder.load(f, max_length, normalize) for f in folders],
                   [str(p) for p in paths])

    @property
    def dimension(self) -> int:
        """H_1 + H_2 + ...: the width of one vector."""
        return sum(int(p.model.config.hidden_size) for p in self.parts)

    def encode(self, texts: Sequence[str], batch_size: int = 64,
               show_progress: bool = False) -> torch.Tensor:
        """(N, dimension) float32: the parts' vectors, concatenated in order."""
        return torch.cat([p.encode(texts, batch_size, show_progress) for p in self.parts], dim=-1)


def check_concatenable(tokenizers: Sequence[Any], names: Sequence[str],
                       folders: Sequence[Path] | None = None) -> None:
    """Refuse fewer than two parts, one folder twice, or parts on different tokenizers."""
    if len(tokenizers) < 2:
        raise LmlabError(f"{len(tokenizers)} encoder(s) to concatenate",
                         "give two or more, e.g. a quick-thought run's model/ and context_model/")
    if folders is not None and len({f.resolve() for f in folders}) < len(folders):
        raise LmlabError(f"{' and '.join(names)} are one model folder: its vectors would be "
                         "concatenated with themselves",
                         "name the second encoder's own folder, e.g. RUN/context_model of a "
                         "quick-thought run")
    first = tokenizers[0].fingerprint()
    for name, tokenizer in zip(names[1:], tokenizers[1:]):
        if tokenizer.fingerprint() != first:
            sizes = (f"{len(tokenizer):,} pieces against {len(tokenizers[0]):,}"
                     if len(tokenizer) != len(tokenizers[0]) else
                     f"{len(tokenizer):,} pieces each, but not the same pieces or settings")
            raise LmlabError(
                f"{name} has another tokenizer than {names[0]} ({sizes}): the two were not "
                "trained together",
                "concatenate encoders that share one tokenizer, e.g. a quick-thought run's "
                "model/ and context_model/")
