"""Heads: what sits on the stack for an objective or a task, by name (``"mlm"``, ``"clm"``, ...).
A head maps the stack's output to logits and knows its loss; ``needs_pooler`` marks one that
reads the pooled [CLS] vector. :data:`HEADS` names each as ``"module:Class"``, imported on use.
"""

from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F

from lmlab.models.config import TransformerConfig
from lmlab.models.core.activations import activation
from lmlab.models.core.norms import make_norm
from lmlab.utils.checks import check_choice
from lmlab.utils.lazy import resolve_entry

IGNORE_INDEX = -100
DEFAULT_SBO_POSITIONS = 32  # SpanBERT's relative-position table for the boundary head

#: head name -> "module:Class" (the class itself once imported). A head defined elsewhere is
#: added with ``HEADS[name] = "module:Class"``.
HEADS: dict[str, str | type[nn.Module]] = {
    "mlm": f"{__name__}:MaskedLMHead",
    "nsp": f"{__name__}:SentencePairHead",
    "sop": f"{__name__}:SentencePairHead",
    "rtd": f"{__name__}:ReplacedTokenDetectionHead",
    "clm": f"{__name__}:CausalLMHead",
    "plm": "lmlab.models.xlnet:PermutationLMHead",
    "sequence-classification": "lmlab.models.task_heads:SequenceClassificationHead",
    "token-classification": "lmlab.models.task_heads:TokenClassificationHead",
    "question-answering": "lmlab.models.task_heads:QuestionAnsweringHead",
    "question-answering-beam": "lmlab.models.task_heads:BeamQuestionAnsweringHead",
    "multiple-choice": "lmlab.models.task_heads:MultipleChoiceHead",
    "sbo": f"{__name__}:SpanBoundaryHead",
    "emd": "lmlab.models.mask_decoder:EnhancedMaskDecoderHead",
    "seq2seq-lm": "lmlab.models.seq2seq:Seq2SeqLMHead",
    "image-classification": "lmlab.models.image_head:ImageClassificationHead",
}


def token_cross_entropy(logits: torch.Tensor, labels: torch.Tensor,
                        label_smoothing: float = 0.0) -> torch.Tensor:
    """Cross-entropy of (..., V) ``logits`` in float32, positions labelled -100 ignored."""
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]).float(), labels.reshape(-1),
                           ignore_index=IGNORE_INDEX, label_smoothing=label_smoothing)


def available_heads() -> list[str]:
    """Every head name :func:`build_head` accepts (without importing their modules)."""
    return sorted(HEADS)


def head_class(name: str) -> type[nn.Module]:
    """The class of head ``name`` (built as ``cls(config)``), imported on first use."""
    check_choice(name, available_heads(), "head", "head")
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
    """Masked-LM head: ``dense -> act -> norm -> decoder``, narrowing to the embedding width E
    (so the decoder can share the embeddings); ``positions`` projects only those rows."""

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

    loss = staticmethod(token_cross_entropy)  # labels already selected when sparse


class SentencePairHead(nn.Module):
    """Binary classifier over the pooled [CLS] vector: next-sentence prediction (BERT: label
    0 = B follows A, 1 = B is random) or sentence order (ALBERT: 0 = A, B in order, 1 = swapped)."""

    needs_pooler = True

    def __init__(self, config: TransformerConfig):
        super().__init__()
        self.classifier = nn.Linear(config.hidden_size, 2)

    def forward(self, pooled: torch.Tensor) -> torch.Tensor:
        return self.classifier(pooled)

    @staticmethod
    def loss(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        return F.cross_entropy(logits.float(), labels.reshape(-1))


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
        """Position t predicts label t+1 (-100 ignored); the labels are shifted, not the
        logits, whose slice would copy the step's largest tensor."""
        targets = F.pad(labels[:, 1:], (0, 1), value=IGNORE_INDEX)  # (B, T): next token or -100
        return token_cross_entropy(logits, targets)


class SpanBoundaryHead(nn.Module):
    """SpanBERT's boundary head: a masked token from its span's boundary states and offset
    (``extra["sbo_max_positions"]`` rows, the last shared beyond)."""

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

    loss = staticmethod(token_cross_entropy)
