"""One configuration for lmlab's recurrent language models, AWD-LSTM and ELMo (docs/recurrent.md).

Torch-free (``lmlab pretrain --help`` lists the sizes). ``hidden_size``, ``num_hidden_layers``,
``extra`` and ``hidden_dropout_prob`` mean what they mean in a TransformerConfig.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

from lmlab.utils.checks import check_at_least, check_choice
from lmlab.utils.errors import LmlabError

FAMILIES = ("awd-lstm", "elmo")
#: the objectives each family trains with (checked before any work)
OBJECTIVES = {"awd-lstm": ("clm",), "elmo": ("bilm",)}
#: the key of a saved model's config.json that marks lmlab's recurrent format
FORMAT_KEY = "lmlab_recurrent"
#: character ids: 0 padding, 1-256 the UTF-8 bytes, then begin-of-word, end-of-word,
#: begin-of-continuation (a "##" word piece) and special-token markers
NUM_CHARS = 261
ELMO_PAPER_FILTERS = ((1, 32), (2, 32), (3, 64), (4, 128), (5, 256), (6, 512), (7, 1024))
#: ELMo's highway initialisations (docs/recurrent.md): AllenNLP's Highway (gate bias 1, torch's
#: default Linear init) and bilm-tf's (weights N(0, 1/width), carry probability sigmoid(2))
HIGHWAY_INITS = ("allennlp", "bilm-tf")
ELMO_CLIPS = {"cell_clip": 3.0, "proj_clip": 3.0}  # bilm-tf's and AllenNLP's options file


@dataclass
class RecurrentConfig:
    """Hyperparameters of an AWD-LSTM or ELMo model."""

    family: str = "awd-lstm"
    vocab_size: int = 30522
    embedding_size: int = 400          # AWD-LSTM word vectors / ELMo char-CNN output before projection
    lstm_size: int = 1150              # cells of each LSTM (ELMo: before the projection)
    num_layers: int = 3
    output_size: int | None = None     # AWD-LSTM: the last layer's width (None = embedding_size)
    tie_word_embeddings: bool = True   # AWD-LSTM: decoder shares the embedding matrix
    # AWD-LSTM regularisation (fastai ULMFiT defaults)
    embed_p: float = 0.02              # embedding dropout: whole words
    input_p: float = 0.25              # locked dropout on the embeddings' output
    hidden_p: float = 0.15             # locked dropout between LSTM layers
    weight_p: float = 0.2              # DropConnect on the hidden-to-hidden matrices
    output_p: float = 0.1              # locked dropout on the last layer's output
    # ELMo
    projection_size: int = 512
    char_embedding_size: int = 16
    char_filters: tuple[tuple[int, int], ...] = ELMO_PAPER_FILTERS
    num_highway: int = 2
    max_chars: int = 50
    dropout: float = 0.1               # ELMo: dropout between layers
    # ELMo's LSTM clipping (bilm-tf's and AllenNLP's 3.0, in every ELMo preset); None, as in a
    # folder saved before these fields: no clipping, torch's fused kernel
    cell_clip: float | None = None     # the memory cell clamped to [-cell_clip, cell_clip]
    proj_clip: float | None = None     # the projected output clamped likewise
    highway_init: str = "allennlp"     # ELMo's highway start: "allennlp" or "bilm-tf"
    # what the rest of lmlab reads
    pad_token_id: int | None = 0
    max_position_embeddings: int = 100_000  # no position table: only the longest input taken
    # AWD-LSTM's embeddings start uniform(-r, r); the paper's 0.1 suits SGD at lr 30, not AdamW
    # (docs/recurrent.md)
    initializer_range: float = 1.0
    extra: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.char_filters = tuple((int(w), int(n)) for w, n in self.char_filters)
        self.validate()

    # -- what Transformer-side code reads ---------------------------------------------------------
    position_offset = 0
    position_embedding = "none"
    is_encoder_decoder = False
    type_vocab_size = 1  # no segment ids: lmlab drops token_type_ids for such models

    @property
    def hidden_size(self) -> int:
        """Width of the vectors heads and feature extraction read (every hidden state)."""
        if self.family == "elmo":
            return 2 * self.projection_size
        return self.last_size

    @property
    def num_hidden_layers(self) -> int:
        return self.num_layers

    @property
    def hidden_dropout_prob(self) -> float:
        """The task heads' dropout before the classifier (ULMFiT's head: 0.1)."""
        return float(self.extra.get("classifier_dropout", 0.1))

    @property
    def last_size(self) -> int:
        """AWD-LSTM: the last LSTM layer's width."""
        return self.output_size if self.output_size is not None else self.embedding_size

    def layer_sizes(self) -> list[tuple[int, int]]:
        """AWD-LSTM: (input, hidden) of each LSTM layer."""
        sizes = []
        for layer in range(self.num_layers):
            inp = self.embedding_size if layer == 0 else self.lstm_size
            out = self.last_size if layer == self.num_layers - 1 else self.lstm_size
            sizes.append((inp, out))
        return sizes

    # -- checks ----------------------------------------------------------------------------------
    def validate(self) -> None:
        """Refuse sizes that cannot build, with the fix (before any weight is made)."""
        check_choice(self.family, FAMILIES, "family", "recurrent family")
        for name in ("vocab_size", "embedding_size", "lstm_size", "num_layers", "projection_size",
                     "char_embedding_size", "max_chars"):
            check_at_least(getattr(self, name), 1, name)
        check_choice(self.highway_init, HIGHWAY_INITS, "highway_init", "highway initialisation")
        for name in ("cell_clip", "proj_clip"):
            value = getattr(self, name)
            if value is not None and not float(value) > 0:
                raise LmlabError(f"{name} {value} is not positive",
                                 f"use e.g. {name}=3.0 (ELMo's), or null for no clipping")
        for name in ("embed_p", "input_p", "hidden_p", "weight_p", "output_p", "dropout"):
            if not 0.0 <= float(getattr(self, name)) < 1.0:
                raise LmlabError(f"{name} {getattr(self, name)} is not a dropout probability",
                                 f"use 0 <= {name} < 1")
        if self.family == "awd-lstm" and self.tie_word_embeddings \
                and self.last_size != self.embedding_size:
            raise LmlabError(f"tied weights need the last LSTM layer as wide as the embeddings "
                             f"(output_size {self.last_size} != embedding_size "
                             f"{self.embedding_size})", "set output_size to the embedding size "
                             "(or leave it unset), or tie_word_embeddings=False")
        if self.family == "elmo":
            if self.num_layers < 1 or not self.char_filters:
                raise LmlabError("ELMo needs at least one LSTM layer and one character filter",
                                 "set num_layers >= 1 and char_filters, e.g. [[1, 32], [2, 64]]")
            widest = max(w for w, _ in self.char_filters)
            if widest > self.max_chars:
                raise LmlabError(f"a character filter of width {widest} is wider than "
                                 f"max_chars {self.max_chars}", "raise max_chars or narrow it")

    # -- persistence -----------------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        values = dataclasses.asdict(self)
        values["char_filters"] = [list(pair) for pair in self.char_filters]
        return values

    @classmethod
    def from_dict(cls, values: dict[str, Any]) -> RecurrentConfig:
        from lmlab.models.config import config_fields

        return cls(**config_fields(cls, values, "recurrent config"))

    # -- cost ------------------------------------------------------------------------------------
    @property
    def flop_counting(self) -> str:
        """What the FLOP count covers, for the cost report's and the estimate's notes."""
        parts = "every LSTM gate product"
        if self.family == "elmo":
            parts += ", the character convolutions, highways and projections"
        return parts + "; the same at any sequence length"

    def num_parameters(self, include_embeddings: bool = True) -> int:
        """Parameter count from the shapes, tied matrices once; ``include_embeddings=False``
        leaves out the vocabulary-sized matrices. An LSTM layer of ``h`` cells on ``i`` inputs
        holds ``W_ih`` (4h, i), ``W_hh`` (4h, h) and two 4h biases (ELMo's: ``W_hr`` (p, c) too)."""
        vocab = 0
        if self.family == "elmo":
            p, c = self.projection_size, self.lstm_size
            chars = NUM_CHARS * self.char_embedding_size
            conv = sum(n * (w * self.char_embedding_size + 1) for w, n in self.char_filters)
            width = sum(n for _, n in self.char_filters)
            highway = self.num_highway * 2 * (width * width + width)
            project = width * p + p
            lstm = 2 * self.num_layers * (4 * c * (p + p) + 8 * c + p * c)
            body = chars + conv + highway + project + lstm
            vocab = self.vocab_size * (p + 1)  # the softmax both directions share, with bias
        else:
            body = sum(4 * h * (i + h) + 8 * h for i, h in self.layer_sizes())
            vocab = self.vocab_size * self.embedding_size + self.vocab_size  # + softmax bias
            vocab += 0 if self.tie_word_embeddings else self.vocab_size * self.last_size
        return body + (vocab if include_embeddings else 0)

    def flop_parts(self, training: bool = True, head: str = "clm",
                   sparse_prediction_fraction: float | None = None) -> dict[str, float]:
        """Matmul FLOPs per token by component (2 per multiply-add; training = 3 x forward), as
        :mod:`lmlab.cost.flops` counts Transformers; the conventions are in docs/cost.md.
        ``head``: ``"clm"``/``"bilm"`` counts the LM softmax, ``"none"`` none."""
        if head not in ("clm", "bilm", "none"):
            raise LmlabError(f"the {self.family} model has no {head!r} head to count",
                             "use head 'clm' (its language-model softmax) or 'none'")
        fraction = 1.0 if sparse_prediction_fraction is None else float(sparse_prediction_fraction)
        lm = head != "none"
        if self.family == "elmo":
            p, c, d = self.projection_size, self.lstm_size, self.char_embedding_size
            width = sum(n for _, n in self.char_filters)
            parts = {
                "character convolutions": sum(2.0 * w * d * n * (self.max_chars - w + 1)
                                              for w, n in self.char_filters),
                "highway layers": self.num_highway * 2.0 * width * 2 * width,
                "token projection": 2.0 * width * p,
                "LSTM gates": 2 * self.num_layers * 2.0 * 4 * c * (p + p),
                "LSTM projections": 2 * self.num_layers * 2.0 * c * p,
                "softmax": 2 * 2.0 * p * self.vocab_size * fraction if lm else 0.0,
            }
        else:
            parts = {
                "LSTM gates": sum(2.0 * 4 * h * (i + h) for i, h in self.layer_sizes()),
                "softmax": 2.0 * self.last_size * self.vocab_size * fraction if lm else 0.0,
            }
        scale = 3.0 if training else 1.0
        return {name: scale * value for name, value in parts.items()}

    def flops_per_token(self, seq_len: int = 0, training: bool = True, head: str = "clm",
                        sparse_prediction_fraction: float | None = None, **_: Any) -> float:
        """All FLOPs per token (:meth:`flop_parts` summed; ``seq_len`` changes nothing)."""
        return sum(self.flop_parts(training, head, sparse_prediction_fraction).values())


# -- named sizes ---------------------------------------------------------------------------------
SIZES: dict[str, dict[str, dict[str, Any]]] = {
    "awd-lstm": {
        "paper": {},  # ULMFiT: 400-d embeddings, 3 x 1150 cells
        "small": {"embedding_size": 256, "lstm_size": 768},
        "mini": {"embedding_size": 128, "lstm_size": 384},
        "tiny": {"embedding_size": 32, "lstm_size": 64},
    },
    "elmo": {
        "paper": {"projection_size": 512, "lstm_size": 4096, "num_layers": 2, **ELMO_CLIPS},
        "small": {"projection_size": 256, "lstm_size": 1024, "num_layers": 2, **ELMO_CLIPS,
                  "char_filters": ((1, 32), (2, 32), (3, 64), (4, 128), (5, 256))},
        "mini": {"projection_size": 128, "lstm_size": 512, "num_layers": 2, **ELMO_CLIPS,
                 "char_filters": ((1, 32), (2, 32), (3, 64), (4, 128))},
        "tiny": {"projection_size": 16, "lstm_size": 32, "num_layers": 2, **ELMO_CLIPS,
                 "char_embedding_size": 8, "char_filters": ((1, 8), (2, 8), (3, 16)),
                 "max_chars": 20},
    },
}


def recurrent_preset(family: str, size: str, **overrides: Any) -> RecurrentConfig:
    """The config of a named size of ``family`` with field overrides (``vocab_size``, ...)."""
    check_choice(family, SIZES, "family", "recurrent family")
    if size not in SIZES[family]:
        raise LmlabError(f"no {family} preset named {size!r}",
                         f"{family} sizes: {', '.join(SIZES[family])}")
    values = {"family": family, **SIZES[family][size], **overrides}
    return RecurrentConfig.from_dict(values)


def check_family_objective(family: str, spec: str) -> None:
    """Refuse, before any work, an objective the family does not train with (``bilm`` on a
    Transformer too)."""
    names = [part.strip() for part in str(spec).split(",") if part.strip()]
    if family in OBJECTIVES:
        allowed = OBJECTIVES[family]
        wrong = [name for name in names if name not in allowed]
        if wrong:
            raise LmlabError(f"--family {family} trains with --objective {', '.join(allowed)}, "
                             f"not {', '.join(wrong)}", f"use --objective {allowed[0]}")
    elif "bilm" in names:
        raise LmlabError(f"the bilm objective trains ELMo's two LSTM directions; a {family} "
                         "model has none", "use --family elmo (clm or mlm for a Transformer)")
