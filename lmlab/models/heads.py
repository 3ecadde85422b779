"""Heads: what sits on top of the Transformer stack for an objective or a task.

Every head has a name (``"mlm"``, ``"nsp"``, ``"sop"``, ``"rtd"``, ``"clm"`` here; the task heads
of :mod:`lmlab.models.task_heads` and SpanBERT's ``"sbo"`` elsewhere) so objectives and checkpoints
can ask for them by name. A head maps the stack's output to logits and knows its own loss; a
head that reads the pooled [CLS] vector says so with the class attribute ``needs_pooler``.

:data:`HEADS` lists every head as ``"module:Class"``, imported on first lookup, so loading a
checkpoint never depends on which modules the caller happened to import first.
"""

from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F

from lmlab.models.config import TransformerConfig
from lmlab.models.core.activations import activation
from lmlab.models.core.norms import make_norm
from lmlab.utils.errors import LmlabError
from lmlab.utils.lazy import resolve_entry

IGNORE_INDEX = -100
DEFAULT_SBO_POSITIONS = 32  # SpanBERT's relative-position table for the boundary head

#: head name -> "module:Class" (the class itself once imported). A head defined elsewhere is
#: added with ``HEADS[name] = "module:Class"``.
HEADS: dict[str, str | type[nn.Module]] = {
    "mlm": f"{__name__}:MaskedLMHead",
    "nsp": f"{__name__}:NextSentenceHead",
    "sop": f"{__name__}:SentenceOrderHead",
    "rtd": f"{__name__}:ReplacedTokenDetectionHead",
    "clm": f"{__name__}:CausalLMHead",
    "sequence-classification": "lmlab.models.task_heads:SequenceClassificationHead",
    "token-classification": "lmlab.models.task_heads:TokenClassificationHead",
    "question-answering": "lmlab.models.task_heads:QuestionAnsweringHead",
    "multiple-choice": "lmlab.models.task_heads:MultipleChoiceHead",
    "sbo": f"{__name__}:SpanBoundaryHead",
    "seq2seq-lm": "lmlab.models.seq2seq:Seq2SeqLMHead",
}


def available_heads() -> list[str]:
    """Every head name :func:`build_head` accepts (without importing their modules)."""
    return sorted(HEADS)


def head_class(name: str) -> type[nn.Module]:
    """The class of head ``name`` (built as ``cls(config)``), importing its module on first
    use."""
    if name not in HEADS:
        raise LmlabError(f"unknown head {name!r}",
                         f"available heads: {', '.join(available_heads())}")
    return resolve_entry(HEADS, name)


def needs_pooler(name: str) -> bool:
    """Whether head ``name`` reads the pooled [CLS] vector (class attribute, default False)."""
    return bool(getattr(head_class(name), "needs_pooler", False))


def build_head(name: str, config: TransformerConfig) -> nn.Module:
    """A fresh head ``name`` for a model of ``config``."""
    return head_class(name)(config)


class Pooler(nn.Module):
    """BERT's pooler: ``tanh(W h_[CLS] + b)``, the sentence vector NSP/SOP and classifiers read."""

    def __init__(self, config: TransformerConfig):
        super().__init__()
        self.dense = nn.Linear(config.hidden_size, config.hidden_size)

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        return torch.tanh(self.dense(hidden[:, 0]))


class MaskedLMHead(nn.Module):
    """Masked-LM head: ``dense -> act -> norm -> decoder`` to the vocabulary.

    The transform narrows to the embedding width E for factorised families (ALBERT, ELECTRA's
    generator), so the decoder can share the input embedding matrix. With ``positions`` the
    vocabulary projection runs only at those rows (sparse prediction, as in cramming): at a 15%
    masking rate that removes most of the head's FLOPs.
    """

    def __init__(self, config: TransformerConfig):
        super().__init__()
        width = config.input_embedding_size
        self.dense = nn.Linear(config.hidden_size, width)
        self.act = activation(config.extra.get("mlm_head_act", config.hidden_act))
        self.norm = make_norm(config.norm_type, width, config.norm_eps)
        self.decoder = nn.Linear(width, config.vocab_size)

    def forward(self, hidden: torch.Tensor, positions: torch.Tensor | None = None) -> torch.Tensor:
        """Logits (B, T, V), or (N, V) for the ``positions`` boolean mask (B, T)."""
        if positions is not None:
            hidden = hidden[positions]  # (N, H): only the predicted positions
        return self.decoder(self.norm(self.act(self.dense(hidden))))

    @staticmethod
    def loss(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        """Cross-entropy over positions whose label is not -100 (labels already selected when
        the logits are sparse)."""
        return F.cross_entropy(logits.reshape(-1, logits.shape[-1]).float(), labels.reshape(-1),
                               ignore_index=IGNORE_INDEX)


class _SentencePairHead(nn.Module):
    """Binary classifier over the pooled [CLS] vector (NSP or SOP)."""

    needs_pooler = True

    def __init__(self, config: TransformerConfig):
        super().__init__()
        self.classifier = nn.Linear(config.hidden_size, 2)

    def forward(self, pooled: torch.Tensor) -> torch.Tensor:
        return self.classifier(pooled)

    @staticmethod
    def loss(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        return F.cross_entropy(logits.float(), labels.reshape(-1))


class NextSentenceHead(_SentencePairHead):
    """Next-sentence prediction (BERT): label 0 = B follows A, 1 = B is random."""


class SentenceOrderHead(_SentencePairHead):
    """Sentence-order prediction (ALBERT): label 0 = A, B in order, 1 = swapped."""


class ReplacedTokenDetectionHead(nn.Module):
    """ELECTRA's discriminator head: per-token logit that the token was replaced."""

    loss_takes_attention_mask = True  # the loss counts real tokens only

    def __init__(self, config: TransformerConfig):
        super().__init__()
        self.dense = nn.Linear(config.hidden_size, config.hidden_size)
        self.act = activation(config.hidden_act)
        self.dense_prediction = nn.Linear(config.hidden_size, 1)

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.dense_prediction(self.act(self.dense(hidden))).squeeze(-1)  # (B, T)

    @staticmethod
    def loss(logits: torch.Tensor, labels: torch.Tensor,
             attention_mask: torch.Tensor | None = None) -> torch.Tensor:
        """Binary cross-entropy over real (non-padding) tokens; labels 1 = replaced."""
        if attention_mask is not None:
            keep = attention_mask.bool()
            logits, labels = logits[keep], labels[keep]
        return F.binary_cross_entropy_with_logits(logits.float(), labels.float())


class CausalLMHead(nn.Module):
    """Next-token prediction: a bias-free projection to the vocabulary (tied in GPT-2)."""

    def __init__(self, config: TransformerConfig):
        super().__init__()
        self.decoder = nn.Linear(config.hidden_size, config.vocab_size, bias=False)

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.decoder(hidden)

    @staticmethod
    def loss(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        """Position t predicts label t+1 (labels are the input ids; -100 ignored).

        The labels are shifted, not the logits: slicing (B, T, V) logits would copy the largest
        tensor of the step."""
        targets = F.pad(labels[:, 1:], (0, 1), value=IGNORE_INDEX)  # (B, T): next token or -100
        return F.cross_entropy(logits.reshape(-1, logits.shape[-1]).float(), targets.reshape(-1),
                               ignore_index=IGNORE_INDEX)


class SpanBoundaryHead(nn.Module):
    """Predicts a masked token from the span's boundary hidden states and its offset.

    ``config.extra["sbo_max_positions"]`` (default 32) sizes the relative-position table;
    offsets beyond it share the last row.
    """

    def __init__(self, config: TransformerConfig):
        super().__init__()
        hidden, width = config.hidden_size, config.input_embedding_size
        self.max_positions = int(config.extra.get("sbo_max_positions", DEFAULT_SBO_POSITIONS))
        self.position_embeddings = nn.Embedding(self.max_positions, hidden)
        act = config.extra.get("sbo_act", "gelu")
        self.dense1 = nn.Linear(3 * hidden, hidden)
        self.act1 = activation(act)
        self.norm1 = make_norm(config.norm_type, hidden, config.norm_eps)
        self.dense2 = nn.Linear(hidden, width)
        self.act2 = activation(act)
        self.norm2 = make_norm(config.norm_type, width, config.norm_eps)
        self.decoder = nn.Linear(width, config.vocab_size)

    def forward(self, hidden: torch.Tensor, positions: torch.Tensor, left: torch.Tensor,
                right: torch.Tensor, offset: torch.Tensor) -> torch.Tensor:
        """Logits (N, V) for the N ``positions`` (B, T bool); ``left``/``right``/``offset``
        (B, T) give each masked token's boundary positions and offset inside its span."""
        rows, _ = positions.nonzero(as_tuple=True)  # (N,)
        x_left = hidden[rows, left[positions]]  # (N, H)
        x_right = hidden[rows, right[positions]]  # (N, H)
        pos = self.position_embeddings(offset[positions].clamp(0, self.max_positions - 1))
        h0 = torch.cat([x_left, x_right, pos], dim=-1)  # (N, 3H)
        h1 = self.norm1(self.act1(self.dense1(h0)))
        y = self.norm2(self.act2(self.dense2(h1)))
        return self.decoder(y)

    loss = staticmethod(MaskedLMHead.loss)
