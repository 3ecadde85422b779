"""Attention probabilities per layer and head, merged into words, and what heads attend to:
:func:`attention_maps` gives one text's maps for looking at (:mod:`lmlab.analysis.attention_view`
draws them), :func:`head_statistics` measures Clark et al.'s (2019) habits of every head over a
sample of text. Encoders and decoders give one self-attention map per layer; encoder-decoders the
encoder's, and for a target text the decoder's and its cross-attention (docs/attention.md).
"""

from __future__ import annotations

import io
import itertools
import unicodedata
import warnings
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np
import torch

from lmlab.analysis.report import pyplot, save_png, write_files
from lmlab.generation.generate import is_encoder_decoder
from lmlab.models.inputs import input_limit, model_inputs
from lmlab.utils.errors import LmlabError

# name -> what it measures (per layer x head, averaged over the real query tokens of a sample)
STATISTICS: dict[str, str] = {
    "cls": "attention to the first token ([CLS], <s>; a decoder's first token)",
    "sep": "attention to separator tokens ([SEP], </s>) after the first token",
    "punct": "attention to punctuation tokens",
    "prev": "attention to the previous token",
    "next": "attention to the next token",
    "self": "attention to the same token",
    "entropy": "entropy of the attention distribution (nats)",
}


# ---------------------------------------------------------------------------------- model side
def model_kind(model: Any) -> str:
    """``"encoder"``, ``"decoder"`` or ``"encoder-decoder"``."""
    if is_encoder_decoder(model):
        return "encoder-decoder"
    return "decoder" if model.config.causal else "encoder"


@torch.inference_mode()
def model_attentions(model: Any, input_ids: torch.Tensor,
                     attention_mask: torch.Tensor | None = None,
                     token_type_ids: torch.Tensor | None = None,
                     decoder_input_ids: torch.Tensor | None = None,
                     decoder_attention_mask: torch.Tensor | None = None
                     ) -> dict[str, torch.Tensor]:
    """Attention probabilities of one batch, float32 on the CPU, each (L, B, nh, Tq, Tk), under
    ``"encoder"`` (self-attention of an encoder or an encoder-decoder's encoder), ``"decoder"``
    (a decoder's, or with ``decoder_input_ids`` an encoder-decoder's) and ``"cross"``. Rows of
    padding queries hold whatever the padded computation gives; read real rows only.
    """
    model.eval()
    inputs = {"input_ids": input_ids, "attention_mask": attention_mask}
    if token_type_ids is not None:
        inputs["token_type_ids"] = token_type_ids
    device = next(model.parameters()).device
    inputs = {k: v.to(device) for k, v in inputs.items() if v is not None}

    def stacked(maps) -> torch.Tensor:
        return torch.stack([m.float().cpu() for m in maps])  # (L, B, nh, Tq, Tk)

    if not is_encoder_decoder(model):
        out = model(**inputs, output_attentions=True, heads=[])
        return {"decoder" if model.config.causal else "encoder": stacked(out.attentions)}
    inputs.pop("token_type_ids", None)
    if decoder_input_ids is None:
        encoded = model.encode(inputs["input_ids"], inputs.get("attention_mask"),
                               output_attentions=True)
        return {"encoder": stacked(encoded.attentions)}
    out = model(**inputs, decoder_input_ids=decoder_input_ids.to(device),
                decoder_attention_mask=(decoder_attention_mask.to(device)
                                        if decoder_attention_mask is not None else None),
                output_attentions=True, heads=[])
    return {"encoder": stacked(out.encoder_attentions), "decoder": stacked(out.attentions),
            "cross": stacked(out.cross_attentions)}


# ------------------------------------------------------------------------------- words, merging
@dataclass
class Segment:
    """The tokens of one side of the input (the source text, or the decoder's target) and the
    word units they form: ``groups[u]`` lists the token positions of unit ``u``."""

    tokens: list[str]
    special: list[bool]
    groups: list[list[int]]
    words: list[str]

    @classmethod
    def from_encoding(cls, batch: Any, texts: Sequence[str], prefix: Sequence[str] = ()
                      ) -> Segment:
        """The tokens of a one-row, unpadded tokenizer batch (``texts``: the text and its
        pair, for the words' spellings), after ``prefix`` special tokens (a decoder's start
        token)."""
        word_ids, sequence_ids = batch.word_ids(0), batch.sequence_ids(0)
        offsets = batch["offset_mapping"][0].tolist()
        specials = batch["special_tokens_mask"][0].tolist()
        tokens = [*prefix, *batch.tokens(0)]
        special = [True] * len(prefix) + [bool(flag) for flag in specials]
        groups: list[list[int]] = [[i] for i in range(len(prefix))]
        keys: list[Any] = [None] * len(prefix)
        for p in range(len(specials)):  # consecutive pieces of one word form one unit
            key = (sequence_ids[p], word_ids[p]) if word_ids[p] is not None and not specials[p] \
                else None
            if key is not None and keys and keys[-1] == key:
                groups[-1].append(p + len(prefix))
            else:
                groups.append([p + len(prefix)])
                keys.append(key)
        words = []
        for group, key in zip(groups, keys):
            if key is None:
                words.append(tokens[group[0]])
            else:
                start = offsets[group[0] - len(prefix)][0]
                end = offsets[group[-1] - len(prefix)][1]
                words.append(texts[key[0] or 0][start:end].strip() or tokens[group[0]])
        return cls(tokens=tokens, special=special, groups=groups, words=words)

    def as_words(self) -> Segment:
        """The segment with one unit per word (each unit its own group)."""
        special = [all(self.special[p] for p in g) for g in self.groups]
        return Segment(tokens=list(self.words), special=special,
                       groups=[[u] for u in range(len(self.words))], words=list(self.words))


def merge_to_words(maps: torch.Tensor, query_groups: Sequence[Sequence[int]],
                   key_groups: Sequence[Sequence[int]]) -> torch.Tensor:
    """Word-level maps (..., Wq, Wk) from token-level maps (..., Tq, Tk): the columns of a
    word's pieces summed (attention *to* the word), the rows of its pieces averaged (attention
    *from* the word), as Clark et al. (2019) did; rows that summed to 1 still do."""
    tq, tk = maps.shape[-2:]
    to_words = maps.new_zeros(tk, len(key_groups))  # (Tk, Wk): 1 where piece -> word
    for word, pieces in enumerate(key_groups):
        to_words[list(pieces), word] = 1.0
    from_words = maps.new_zeros(len(query_groups), tq)  # (Wq, Tq): 1/n over the word's pieces
    for word, pieces in enumerate(query_groups):
        from_words[word, list(pieces)] = 1.0 / len(pieces)
    return from_words @ maps @ to_words  # (..., Wq, Wk)


# ---------------------------------------------------------------------------------- one text
@dataclass
class AttentionMaps:
    """One text's attention maps, every layer and head: ``attentions`` (L, H, T, T) the source's
    self-attention; with a target (encoder-decoders) ``decoder_attentions`` (Ld, H, U, U) and
    ``cross_attentions`` (Ld, H, U, T) over the decoder's start token and the target's tokens.
    """

    kind: str
    source: Segment
    attentions: torch.Tensor
    target: Segment | None = None
    decoder_attentions: torch.Tensor | None = None
    cross_attentions: torch.Tensor | None = None
    # side ("text", "target") -> (tokens it had, tokens kept) where it was cut to fit
    truncated_from: dict[str, tuple[int, int]] = field(default_factory=dict)
    level: str = "token"

    @property
    def tokens(self) -> list[str]:
        return self.source.tokens

    @property
    def target_tokens(self) -> list[str] | None:
        return self.target.tokens if self.target is not None else None

    @property
    def num_layers(self) -> int:
        return self.attentions.shape[0]

    @property
    def num_heads(self) -> int:
        return self.attentions.shape[1]

    def views(self) -> list[tuple[str, list[str], list[str], torch.Tensor]]:
        """(name, query labels, key labels, maps (L, H, Q, K)) of every attention there is."""
        self_name = {"decoder": "decoder"}.get(self.kind, "encoder")
        views = [(self_name, self.source.tokens, self.source.tokens, self.attentions)]
        if self.target is not None and self.decoder_attentions is not None:
            views.append(("decoder", self.target.tokens, self.target.tokens,
                          self.decoder_attentions))
            views.append(("cross", self.target.tokens, self.source.tokens,
                          self.cross_attentions))
        return views

    def words(self) -> AttentionMaps:
        """The same maps between words (see :func:`merge_to_words`)."""
        if self.level == "word":
            return self
        src = self.source.groups
        merged = replace(self, source=self.source.as_words(), level="word",
                         attentions=merge_to_words(self.attentions, src, src))
        if self.target is not None and self.decoder_attentions is not None:
            tgt = self.target.groups
            merged.target = self.target.as_words()
            merged.decoder_attentions = merge_to_words(self.decoder_attentions, tgt, tgt)
            merged.cross_attentions = merge_to_words(self.cross_attentions, tgt, src)
        return merged

    def truncation_notes(self) -> list[str]:
        """One sentence per side that was cut to fit the model."""
        return [f"the {side} has {length} tokens, more than the model takes: it was cut to "
                f"{kept}" for side, (length, kept) in self.truncated_from.items()]


def _encode(tokenizer: Any, texts: list[str], limit: int | None) -> tuple[Any, int]:
    """The one-row batch of ``texts`` (a text and its pair) cut to ``limit`` tokens, and the
    number of tokens they have uncut."""
    batch = tokenizer(*texts, truncation=limit is not None, max_length=limit,
                      return_tensors="pt", return_offsets_mapping=True,
                      return_special_tokens_mask=True)
    return batch, len(tokenizer(*texts)["input_ids"])


def _decoder_start(model: Any, tokenizer: Any) -> tuple[int, str]:
    start = model.config.extra.get("decoder_start_token_id")
    if start is None:
        from lmlab.models.seq2seq import decoder_start_token

        start = decoder_start_token(model.config.family, tokenizer)
    return int(start), tokenizer.convert_ids_to_tokens(int(start)) or f"<{start}>"


def check_inputs(model: Any, pair: str | None = None, target: str | None = None) -> None:
    """Refuse a pair for a decoder-only model and a target for anything but an
    encoder-decoder."""
    kind = model_kind(model)
    if pair is not None and kind == "decoder":
        raise LmlabError("a text pair was given, but a decoder-only model reads one text",
                         "drop --pair (pairs are for encoders such as BERT and encoder-"
                         "decoders)")
    if target is not None and kind != "encoder-decoder":
        raise LmlabError(f"a target text was given, but this {model.config.family} {kind} has "
                         "no decoder reading a source", "drop --target (it is for encoder-"
                         "decoders: t5, bart, marian)")


def attention_maps(model: Any, tokenizer: Any, text: str, pair: str | None = None,
                   target: str | None = None, max_length: int | None = None) -> AttentionMaps:
    """Every layer's and head's attention over ``text`` (and ``pair``; with ``target``, an
    encoder-decoder's decoder and cross-attention too). A text longer than ``max_length``
    (default: the model's limit) is cut to fit with a :class:`UserWarning`, recorded in
    ``truncated_from``.

    Example:
        >>> maps = attention_maps(model, tokenizer, "The vase broke.")
        >>> maps.attentions.shape  # (layers, heads, tokens, tokens)
        >>> maps.words().attentions  # the same between words
    """
    if not text.strip():
        raise LmlabError("the text is empty", "give a sentence to look at")
    check_inputs(model, pair, target)
    limit = input_limit(model, tokenizer, max_length)
    texts = [text] if pair is None else [text, pair]
    truncated: dict[str, tuple[int, int]] = {}
    batch, length = _encode(tokenizer, texts, limit)
    if limit is not None and length > limit:
        truncated["text"] = (length, limit)
    source = Segment.from_encoding(batch, texts)
    decoder_ids = target_segment = None
    if target is not None:
        start, start_token = _decoder_start(model, tokenizer)
        target_limit = limit - 1 if limit is not None else None  # room for the start token
        target_batch, length = _encode(tokenizer, [target], target_limit)
        if limit is not None and length > target_limit:  # with the start token, as read
            truncated["target"] = (length + 1, limit)
        ids = target_batch["input_ids"][0].tolist()
        target_segment = Segment.from_encoding(target_batch, [target], prefix=[start_token])
        decoder_ids = torch.tensor([[start, *ids]])
    inputs = model_inputs(model, batch)
    maps = model_attentions(model, inputs["input_ids"], inputs.get("attention_mask"),
                            inputs.get("token_type_ids"), decoder_input_ids=decoder_ids)
    kind = model_kind(model)
    result = AttentionMaps(kind=kind, source=source, truncated_from=truncated,
                           attentions=maps["decoder" if kind == "decoder" else "encoder"][:, 0])
    if "cross" in maps:
        result.target = target_segment
        result.decoder_attentions = maps["decoder"][:, 0]
        result.cross_attentions = maps["cross"][:, 0]
    for note in result.truncation_notes():
        warnings.warn(note, UserWarning, stacklevel=2)
    return result


# ------------------------------------------------------------------------------ head statistics
def is_punctuation(token: str) -> bool:
    """A token made of punctuation only (word-piece / byte-level markers ignored)."""
    core = token.removeprefix("##").lstrip("Ġ▁ ")
    return bool(core) and all(unicodedata.category(ch).startswith("P") for ch in core)


@dataclass
class HeadStatistics:
    """Clark et al.'s statistics, each (L, H): see :data:`STATISTICS`. Every real query token of
    the sample counts once (padding excluded); ``texts``/``tokens`` say how many there were."""

    values: dict[str, np.ndarray]
    texts: int
    tokens: int
    truncated: int = 0
    sample: str = ""
    attention: str = "self-attention"

    @property
    def num_layers(self) -> int:
        return next(iter(self.values.values())).shape[0]

    @property
    def num_heads(self) -> int:
        return next(iter(self.values.values())).shape[1]

    def top(self, name: str, k: int = 3, lowest: bool = False) -> list[tuple[int, int, float]]:
        """The ``k`` (layer, head, value) with the highest (``lowest``: lowest) ``name``;
        layers and heads count from 0."""
        grid = self.values[name]
        order = np.argsort(grid, axis=None, kind="stable")
        order = order if lowest else order[::-1]
        return [(int(i // grid.shape[1]), int(i % grid.shape[1]), float(grid.flat[i]))
                for i in order[:k]]

    def to_json(self) -> dict[str, Any]:
        return {"sample": self.sample, "attention": self.attention, "texts": self.texts,
                "tokens": self.tokens, "truncated": self.truncated,
                "statistics": STATISTICS, "layers": self.num_layers, "heads": self.num_heads,
                "values": {name: np.round(grid, 6).tolist() for name, grid in self.values.items()}}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> HeadStatistics:
        return cls(values={k: np.asarray(v, dtype=np.float64) for k, v in data["values"].items()},
                   texts=data["texts"], tokens=data["tokens"], truncated=data["truncated"],
                   sample=data["sample"], attention=data["attention"])

    def to_csv(self) -> str:
        """One row per layer x head: ``layer``, ``head`` and every statistic."""
        layer, head = np.indices((self.num_layers, self.num_heads)).reshape(2, -1)
        table = np.column_stack([layer, head, *(grid.ravel() for grid in self.values.values())])
        buffer = io.StringIO()
        np.savetxt(buffer, table, fmt=["%d", "%d"] + ["%.6f"] * len(self.values), delimiter=",",
                   header=",".join(["layer", "head", *self.values]), comments="")
        return buffer.getvalue()

    def to_markdown(self, k: int = 3) -> str:
        """A summary table: per statistic, its mean over heads and the top heads."""
        lines = [f"Head statistics over {self.texts} texts ({self.tokens} query tokens; "
                 f"{self.sample}), {self.attention}. Layer.head, counted from 0.", "",
                 "| statistic | mean over heads | highest heads | lowest heads |",
                 "|---|---|---|---|"]
        for name, grid in self.values.items():
            high = ", ".join(f"{layer}.{h} ({v:.2f})" for layer, h, v in self.top(name, k))
            low = ", ".join(f"{layer}.{h} ({v:.2f})" for layer, h, v in self.top(name, k, lowest=True))
            lines.append(f"| {name}: {STATISTICS[name]} | {grid.mean():.3f} | {high} | {low} |")
        return "\n".join(lines) + "\n"

    def plot(self, path: str | Path, title: str = "") -> Path:
        """Heat maps (layers x heads), one panel per statistic, as a PNG."""
        plt = pyplot()
        names = list(self.values)
        columns = 4
        rows = -(-len(names) // columns)
        width = max(3.0, 0.28 * self.num_heads + 1.2)
        height = max(2.2, 0.28 * self.num_layers + 1.0)
        fig, axes = plt.subplots(rows, columns, figsize=(width * columns, height * rows),
                                 squeeze=False)
        for ax, name in itertools.zip_longest(axes.flat, names):
            if name is None:
                ax.axis("off")
                continue
            image = ax.imshow(self.values[name], cmap="viridis", aspect="auto",
                              vmin=0.0, vmax=None if name == "entropy" else 1.0)
            ax.set_title(name, fontsize=10)
            ax.set_xlabel("head")
            ax.set_ylabel("layer")
            fig.colorbar(image, ax=ax, fraction=0.046, pad=0.04)
        fig.suptitle(title or f"attention head statistics ({self.texts} texts)", fontsize=11)
        fig.tight_layout()
        return save_png(fig, path, dpi=110)


def _token_flags(tokenizer: Any, ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(separator, punctuation) flags (B, T) of a batch of ids."""
    separators = [i for i in (tokenizer.sep_token_id, tokenizer.eos_token_id) if i is not None]
    special = set(tokenizer.all_special_ids)
    punct_ids = [i for i in ids.unique().tolist() if i not in special
                 and is_punctuation(tokenizer.convert_ids_to_tokens(i) or "")]
    sep = torch.isin(ids, torch.tensor(separators, dtype=ids.dtype))
    sep[:, 0] = False
    return sep, torch.isin(ids, torch.tensor(punct_ids, dtype=ids.dtype))


def batch_statistics(maps: torch.Tensor, mask: torch.Tensor, sep: torch.Tensor,
                     punct: torch.Tensor) -> dict[str, torch.Tensor]:
    """Per-statistic sums over the real query tokens of one batch, each (L, H), from maps
    (L, B, H, T, T), the real-token ``mask`` (B, T) and the key flags ``sep``/``punct`` (B, T)."""
    maps = maps.double()
    real = mask.bool()
    keys = real[None, :, None, None, :]  # (1, B, 1, 1, T): padding keys carry nothing
    maps = maps * keys
    zero = maps.new_zeros(maps.shape[:-2] + (1,))  # (L, B, H, 1)
    per_query = {
        "cls": maps[..., 0],
        "sep": (maps * sep[None, :, None, None, :]).sum(-1),
        "punct": (maps * punct[None, :, None, None, :]).sum(-1),
        # query i reads key i-1 (none for the first token) / key i+1 (none for the last)
        "prev": torch.cat([zero, torch.diagonal(maps, offset=-1, dim1=-2, dim2=-1)], -1),
        "next": torch.cat([torch.diagonal(maps, offset=1, dim1=-2, dim2=-1), zero], -1),
        "self": torch.diagonal(maps, dim1=-2, dim2=-1),
        "entropy": -(maps * torch.log(maps.clamp_min(1e-300))).sum(-1),
    }  # each (L, B, H, T)
    queries = real[None, :, None, :].double()  # (1, B, 1, T)
    return {name: (value * queries).sum(dim=(1, 3)) for name, value in per_query.items()}


def head_statistics(model: Any, tokenizer: Any, texts: Sequence[str],
                    pairs: Sequence[str] | None = None, batch_size: int = 16,
                    max_length: int | None = None, sample: str = "",
                    show_progress: bool = False) -> HeadStatistics:
    """Clark et al.'s head statistics (:data:`STATISTICS`) of the self-attention of an encoder
    or decoder (an encoder-decoder's encoder) over ``texts`` (and ``pairs``). Texts longer than
    ``max_length`` (default: the model's limit) are cut; ``truncated`` counts them.

    Example:
        >>> stats = head_statistics(model, tokenizer, default_sample(200))
        >>> stats.values["sep"]  # (layers, heads)
    """
    texts = list(texts)
    if not texts:
        raise LmlabError("no text to compute head statistics on",
                         "give at least one non-empty text")
    if pairs is not None:
        check_inputs(model, pair="")
        if len(pairs) != len(texts):
            raise LmlabError(f"{len(texts)} texts but {len(pairs)} pairs", "give one pair per text")
    limit = input_limit(model, tokenizer, max_length)
    sums: dict[str, torch.Tensor] = {}
    tokens = truncated = 0
    from lmlab.utils.progress import progress

    starts = range(0, len(texts), batch_size)
    for start in progress(starts, desc="head statistics", unit="batch") if show_progress \
            else starts:
        chunk = texts[start:start + batch_size]
        args = [chunk] if pairs is None else [chunk, list(pairs[start:start + batch_size])]
        if limit is not None:
            lengths = tokenizer(*args, return_length=True)["length"]
            truncated += sum(length > limit for length in lengths)
        # right padding: position 0 is every row's first token, as the statistics read it
        batch = tokenizer(*args, padding=True, truncation=limit is not None, max_length=limit,
                          padding_side="right", return_tensors="pt")
        inputs = model_inputs(model, batch)
        maps = next(iter(model_attentions(model, inputs["input_ids"],
                                          inputs.get("attention_mask"),
                                          inputs.get("token_type_ids")).values()))
        sep, punct = _token_flags(tokenizer, batch["input_ids"])
        mask = batch["attention_mask"]
        for name, value in batch_statistics(maps, mask, sep, punct).items():
            sums[name] = sums[name] + value if name in sums else value
        tokens += int(mask.sum())
    kind = model_kind(model)
    attention = {"encoder-decoder": "encoder self-attention", "decoder": "causal self-attention"
                 }.get(kind, "self-attention")
    return HeadStatistics(values={name: (value / tokens).numpy() for name, value in sums.items()},
                          texts=len(texts), tokens=tokens, truncated=truncated, sample=sample,
                          attention=attention)


def write_head_statistics(stats: HeadStatistics, out_dir: str | Path, title: str = ""
                          ) -> list[Path]:
    """``head_stats.json``, ``.csv``, ``.md`` and ``.png`` in ``out_dir``, each atomically."""
    return write_files(out_dir, {"head_stats.json": stats.to_json(),
                                 "head_stats.csv": stats.to_csv(),
                                 "head_stats.md": stats.to_markdown(),
                                 "head_stats.png": lambda path: stats.plot(path, title)})


# ------------------------------------------------------------------------------- text samples
def default_sample(n: int = 500) -> list[str]:
    """``n`` WordNet example sentences (always installed offline), spread evenly over the
    four parts of speech' data files in file order, duplicates dropped: the same sample on
    every machine."""
    from lmlab.analysis.neighbours import wordnet_sentences

    examples = list(dict.fromkeys(e for e in wordnet_sentences() if len(e.split()) >= 3))
    if n >= len(examples):
        return examples
    step = len(examples) / n
    return [examples[int(i * step)] for i in range(n)]


def text_sample(n: int, corpus: str | Path | None = None, text_file: str | Path | None = None
                ) -> tuple[list[str], str]:
    """(texts, description): the first ``n`` sentences of an lmlab corpus folder or the first
    ``n`` non-empty lines of a text file, else :func:`default_sample`."""
    if corpus is not None:
        from lmlab.analysis.neighbours import corpus_sentences

        texts = [s for s in itertools.islice(_non_empty(corpus_sentences(corpus)), n)]
        description = f"the first {len(texts)} sentences of the corpus {corpus}"
    elif text_file is not None:
        with open(text_file, encoding="utf-8") as handle:
            texts = list(itertools.islice(_non_empty(handle), n))
        description = f"the first {len(texts)} lines of {text_file}"
    else:
        texts = default_sample(n)
        description = f"{len(texts)} WordNet example sentences"
    if not texts:
        raise LmlabError(f"{corpus or text_file} holds no text",
                         "give a corpus folder or text file with at least one non-empty line")
    return texts, description


def _non_empty(lines: Iterable[str]) -> Iterable[str]:
    return (line.strip() for line in lines if line.strip())
