"""Task heads: sequence classification (single, pair, regression), token classification,
extractive QA (and XLNet's beam QA) and multiple choice, each in its family's Hugging Face layout
(:data:`lmlab.models.families.TASK_LAYOUTS`) so logits equal transformers'; or, with
``config.extra["pooling"]`` ``"mean"``/``"concat"``, lmlab's own sentence pooling.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import torch
from torch import nn
from torch.nn import functional as F

from lmlab.models.config import TransformerConfig
from lmlab.models.core.activations import activation
from lmlab.models.core.feedforward import FeedForward
from lmlab.models.core.norms import make_norm
from lmlab.models.families import KNOWN_FAMILIES, get_family
from lmlab.models.heads import token_cross_entropy
from lmlab.models.image_head import IMAGE_CLASSIFICATION
from lmlab.models.pooling import concat_pool, masked_mean
from lmlab.utils.checks import check_choice
from lmlab.utils.errors import LmlabError

SEQUENCE_CLASSIFICATION = "sequence-classification"
TOKEN_CLASSIFICATION = "token-classification"
QUESTION_ANSWERING = "question-answering"
MULTIPLE_CHOICE = "multiple-choice"
TASK_HEADS = (SEQUENCE_CLASSIFICATION, TOKEN_CLASSIFICATION, QUESTION_ANSWERING, MULTIPLE_CHOICE)
POOLINGS = ("family", "cls", "mean", "concat")
#: what "family" pooling means for the recurrent families: ULMFiT's concat pooling for an
#: AWD-LSTM, the mean over tokens for ELMo (Peters et al. pool the scalar mix per task)
RECURRENT_POOLING = {"awd-lstm": "concat", "elmo": "mean"}
#: layouts [CLS] -> dense -> act -> out_proj, and their activation (DeBERTa's: pooler_hidden_act)
DENSE_LAYOUTS = {"dense-tanh": "tanh", "dense-gelu": "gelu", "context-pooler": "gelu"}

# task type (lmlab.tasks) -> head name
HEAD_FOR_TASK = {
    "classification": SEQUENCE_CLASSIFICATION,
    "pair-classification": SEQUENCE_CLASSIFICATION,
    "regression": SEQUENCE_CLASSIFICATION,
    "tagging": TOKEN_CLASSIFICATION,
    "qa": QUESTION_ANSWERING,
    "multiple-choice": MULTIPLE_CHOICE,
    "image-classification": IMAGE_CLASSIFICATION,
}


def num_labels(config: TransformerConfig) -> int:
    """Output width of a classification head (``config.extra["num_labels"]``, default 2)."""
    return int(config.extra.get("num_labels", 2))


def _dropout(config: TransformerConfig, *keys: str) -> nn.Dropout:
    """Dropout before the classifier: the first of ``keys`` set in extra, else hidden dropout."""
    for key in keys:
        if config.extra.get(key) is not None:
            return nn.Dropout(float(config.extra[key]))
    return nn.Dropout(config.hidden_dropout_prob)


class _PooledHead(nn.Module):
    """Shared machinery: reads the pooled vector or the hidden states, family layout."""

    takes_hidden = True  # LanguageModel.run_head passes hidden states and pooled=...
    takes_attention_mask = True
    loss_takes_attention_mask = True
    needs_pooler = True

    def __init__(self, config: TransformerConfig, outputs: int, head: str):
        super().__init__()
        self.family = config.family
        self.pooling = check_choice(config.extra.get("pooling", "family"), POOLINGS, "pooling",
                                    "pooling")
        style = self.pooling
        if config.family in RECURRENT_POOLING:  # no [CLS] token, no family head layout
            if style == "cls":
                raise LmlabError(f"a {config.family} model has no [CLS] token to pool",
                                 "use pooling 'mean' or 'concat' (ULMFiT's [last, max, mean])")
            style = RECURRENT_POOLING[config.family] if style == "family" else style
        if style in ("family", "cls"):  # the family's layout; the pooled [CLS] if it has none
            style = get_family(config.family).task_heads.get(head, "pooler")
        self.style = style
        # BERT's Table 5 "+ BiLSTM": a randomly initialised BiLSTM over the hidden states,
        # trained with the head; its two directions' states (H/2 each) are pooled as the model's
        self.bilstm = bilstm_layer(config, style)
        if config.extra.get("classifier_hidden") and style not in ("concat", "mean"):
            raise LmlabError(f"a hidden classifier layer (ULMFiT's) reads a pooled vector; this "
                             f"head's layout is {style!r}", "use --pooling concat or mean, or "
                             "drop --head-hidden")
        h = config.hidden_size
        if style in DENSE_LAYOUTS:  # classifier.dense -> act -> out_proj
            self.dense = nn.Linear(h, h)
            # RoFormer's head applies the model's own activation where ELECTRA's is fixed GELU
            self.act = activation(config.extra.get("classifier_act", DENSE_LAYOUTS[style]))
            self.out_proj = nn.Linear(h, outputs)
            self.dropout = _dropout(config, "classifier_dropout")
        elif style in ("summary", "summary-last"):  # the first / last real token (XLNet's)
            self.summary = nn.Linear(h, h)
            self.act = activation(config.extra.get("summary_activation", "gelu"))
            self.classifier = nn.Linear(h, outputs)
            self.dropout = _dropout(config, "summary_last_dropout")
        elif style == "last-token":  # GPT's: no transform, no dropout, a bias-free score
            self.score = nn.Linear(h, outputs, bias=False)
        elif style == "pre-classifier":
            self.pre_classifier = nn.Linear(h, h)
            self.act = nn.ReLU()
            self.classifier = nn.Linear(h, outputs)
            self.dropout = _dropout(config, "seq_classif_dropout")
        else:
            width = 3 * h if style == "concat" else h
            self.dropout = _dropout(config, "classifier_dropout", "classifier_dropout_prob")
            hidden = config.extra.get("classifier_hidden")
            if hidden:  # ULMFiT's head, its dropouts inside
                self.classifier = batchnorm_classifier(
                    width, int(hidden), outputs,
                    float(config.extra.get("classifier_input_dropout", 0.4)), self.dropout.p)
                self.dropout = nn.Identity()
            else:
                self.classifier = nn.Linear(width, outputs)

    def represent(self, hidden: torch.Tensor, pooled: torch.Tensor | None,
                  attention_mask: torch.Tensor | None) -> torch.Tensor:
        """The sentence vector the final linear layer reads (after the family's transform)."""
        style = self.style
        if self.bilstm is not None:
            hidden = run_bilstm(self.bilstm, hidden, attention_mask)
        if style == "pooler":
            if pooled is None:
                raise LmlabError("this head reads the pooled [CLS] vector but the model has no "
                                 "pooler", "add the head with add_task_head(), which adds one")
            return self.dropout(pooled)
        if style == "mean":
            return self.dropout(masked_mean(hidden, attention_mask))
        if style == "concat":
            return self.dropout(concat_pool(hidden, attention_mask))
        if style == "last-token":
            return hidden[torch.arange(hidden.shape[0], device=hidden.device),
                          last_real_token(attention_mask, hidden.shape[1])]  # (B, H)
        if style == "summary-last":
            last = hidden[torch.arange(hidden.shape[0], device=hidden.device),
                          last_real_token(attention_mask, hidden.shape[1])]  # (B, H)
            return self.dropout(self.act(self.summary(last)))
        first = hidden[:, 0]  # (B, H): [CLS] / <s>
        if style in DENSE_LAYOUTS:
            return self.dropout(self.act(self.dense(self.dropout(first))))
        if style == "summary":
            return self.dropout(self.act(self.summary(first)))
        return self.dropout(self.act(self.pre_classifier(first)))  # pre-classifier

    def forward(self, hidden: torch.Tensor, pooled: torch.Tensor | None = None,
                attention_mask: torch.Tensor | None = None) -> torch.Tensor:
        """Logits (B, outputs)."""
        vector = self.represent(hidden, pooled, attention_mask)
        if self.style == "last-token":
            return self.score(vector)
        return self.out_proj(vector) if self.style in DENSE_LAYOUTS \
            else self.classifier(vector)


def bilstm_layer(config: TransformerConfig, style: str) -> nn.LSTM | None:
    """The BiLSTM ``config.extra["classifier_bilstm"]`` asks for (H/2 units per direction, so
    the pooled width stays H), or None; it reads every token, so the head must pool them."""
    if not config.extra.get("classifier_bilstm"):
        return None
    if style not in ("concat", "mean"):
        raise LmlabError(f"a BiLSTM on top reads every token; this head's layout is {style!r}",
                         "use pooling 'mean' or 'concat'")
    if config.hidden_size % 2:
        raise LmlabError(f"a BiLSTM on top splits the hidden size {config.hidden_size} over "
                         "two directions", "use an even hidden size")
    return nn.LSTM(config.hidden_size, config.hidden_size // 2, batch_first=True,
                   bidirectional=True)


def run_bilstm(lstm: nn.LSTM, hidden: torch.Tensor,
               attention_mask: torch.Tensor | None) -> torch.Tensor:
    """(B, T, H) the BiLSTM's states over each row's real tokens (right padding: packed, so
    the backward direction starts at the last real token); zeros at padding."""
    if attention_mask is None:
        return lstm(hidden)[0]
    lengths = attention_mask.ne(0).sum(-1)  # (B,)
    positions = torch.arange(hidden.shape[1], device=hidden.device)
    if not torch.equal(attention_mask.ne(0), positions < lengths[:, None]):
        raise LmlabError("a BiLSTM on top needs right-padded batches",
                         "pad on the right (the tokenizer's padding_side)")
    packed = nn.utils.rnn.pack_padded_sequence(hidden, lengths.clamp(min=1).cpu(),
                                               batch_first=True, enforce_sorted=False)
    out = nn.utils.rnn.pad_packed_sequence(lstm(packed)[0], batch_first=True,
                                           total_length=hidden.shape[1])[0]
    return out  # (B, T, H)


def batchnorm_classifier(width: int, hidden: int, outputs: int, input_dropout: float,
                         dropout: float) -> nn.Sequential:
    """ULMFiT's classifier (fastai's ``PoolingLinearClassifier``: two ``LinBnDrop`` blocks):
    batch norm, dropout, a bias-free linear layer to ``hidden`` units (the paper's 50), ReLU,
    then batch norm, dropout and a bias-free linear layer to ``outputs``."""
    return nn.Sequential(nn.BatchNorm1d(width), nn.Dropout(input_dropout),
                         nn.Linear(width, hidden, bias=False), nn.ReLU(),
                         nn.BatchNorm1d(hidden), nn.Dropout(dropout),
                         nn.Linear(hidden, outputs, bias=False))


def last_real_token(attention_mask: torch.Tensor | None, length: int) -> torch.Tensor | int:
    """Index (B,) of each row's rightmost token the mask keeps (right or left padding); the
    last position without a mask. transformers finds the rightmost id that is not
    ``pad_token_id``: the same wherever the padding is masked."""
    if attention_mask is None:
        return length - 1
    positions = torch.arange(length, device=attention_mask.device)  # (T,)
    return (positions * attention_mask.ne(0)).argmax(-1)  # (B,)


def default_global_tokens(config: TransformerConfig, head: str | None,
                          input_ids: torch.Tensor | None) -> torch.Tensor | None:
    """The ``global_attention_mask`` (.., T) a windowed family's task class sets when given none
    (FamilySpec.global_tokens; Longformer's): ``"first"`` the <s> token, ``"before-sep"`` the
    question before the first separator, ``"after-sep"`` the tokens after the first two; None
    when the head has no such rule."""
    windowed = getattr(config, "attention_window", None)  # a recurrent config has none
    rule = get_family(config.family).global_tokens.get(head) \
        if windowed and config.family in KNOWN_FAMILIES and head else None
    if rule is None or input_ids is None:
        return None
    glob = torch.zeros_like(input_ids)
    if rule == "first":
        glob[..., 0] = 1
        return glob
    sep = config.extra.get("sep_token_id", config.eos_token_id)
    counts = (input_ids == sep).sum(-1)
    if not bool((counts == 3).all()):
        side = rule.removesuffix("-sep")
        raise LmlabError(f"the {head} head makes the tokens {side} the first separator ({sep}) "
                         f"global, which needs exactly three per sequence; found "
                         f"{sorted(set(counts.flatten().tolist()))}",
                         "pass global_attention_mask yourself, or encode question and "
                         "context as <s> q </s></s> c </s>")
    positions = torch.arange(input_ids.shape[-1], device=input_ids.device)  # (T,)
    first = (input_ids == sep).int().argmax(-1, keepdim=True)  # (.., 1)
    keep = positions < first if rule == "before-sep" else positions > first + 1
    return keep.to(input_ids.dtype)


class SequenceClassificationHead(_PooledHead):
    """Sentence or sentence-pair classification; regression (MSE) when ``num_labels == 1``."""

    def __init__(self, config: TransformerConfig):
        super().__init__(config, num_labels(config), SEQUENCE_CLASSIFICATION)
        self.num_labels = num_labels(config)

    def loss(self, logits: torch.Tensor, labels: torch.Tensor,
             attention_mask: torch.Tensor | None = None) -> torch.Tensor:
        if self.num_labels == 1:
            return F.mse_loss(logits.float().squeeze(-1), labels.float().reshape(-1))
        return F.cross_entropy(logits.float(), labels.reshape(-1))


class MultipleChoiceHead(_PooledHead):
    """Multiple choice: scores each of the (B*C) flattened sequences; (B, C) given ``num_choices``."""

    def __init__(self, config: TransformerConfig):
        super().__init__(config, 1, MULTIPLE_CHOICE)

    def forward(self, hidden: torch.Tensor, pooled: torch.Tensor | None = None,
                attention_mask: torch.Tensor | None = None,
                num_choices: int | None = None) -> torch.Tensor:
        scores = super().forward(hidden, pooled, attention_mask)  # (B*C, 1)
        if num_choices is None:
            return scores.squeeze(-1)  # (B*C,)
        return scores.view(-1, num_choices)  # (B, C)

    @staticmethod
    def loss(logits: torch.Tensor, labels: torch.Tensor,
             attention_mask: torch.Tensor | None = None) -> torch.Tensor:
        return F.cross_entropy(logits.float(), labels.reshape(-1))


class TokenClassificationHead(nn.Module):
    """One label distribution per token; labels -100 (padding, continuation sub-tokens) are
    ignored by the loss."""

    def __init__(self, config: TransformerConfig):
        super().__init__()
        self.dropout = _dropout(config, "classifier_dropout", "classifier_dropout_prob")
        self.classifier = nn.Linear(config.hidden_size, num_labels(config))

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.classifier(self.dropout(hidden))  # (B, T, num_labels)

    loss = staticmethod(token_cross_entropy)


class SpanTransform(nn.Module):
    """BigBird's ``qa_classifier`` before its ``qa_outputs``: dropout, the core feed-forward
    block (its intermediate and output maps) and the residual norm, as in a layer."""

    def __init__(self, config: TransformerConfig):
        super().__init__()
        self.dropout = nn.Dropout(config.hidden_dropout_prob)
        self.feed_forward = FeedForward(config)
        self.norm = make_norm(config.norm_type, config.hidden_size, config.norm_eps)

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.norm(hidden + self.dropout(self.feed_forward(self.dropout(hidden))))


class QuestionAnsweringHead(nn.Module):
    """``qa_outputs``: (B, T, H) -> (B, T, 2); ``[..., 0]`` start, ``[..., 1]`` end logits.
    In BigBird's layout (``span-ffn``) a :class:`SpanTransform` comes first and the question's
    tokens after [CLS] are pushed down by 1e6 (``question_mask``, :func:`question_mask`)."""

    head_inputs = ("question_mask",)

    def __init__(self, config: TransformerConfig):
        super().__init__()
        layout = get_family(config.family).task_heads.get(QUESTION_ANSWERING) \
            if config.family in KNOWN_FAMILIES else None
        self.masks_question = layout == "span-ffn"
        self.transform = SpanTransform(config) if self.masks_question else None
        self.qa_outputs = nn.Linear(config.hidden_size, 2)

    def forward(self, hidden: torch.Tensor, question_mask: torch.Tensor | None = None
                ) -> torch.Tensor:
        logits = self.qa_outputs(hidden if self.transform is None else self.transform(hidden))
        if question_mask is None or not self.masks_question:
            return logits  # (B, T, 2)
        question = question_mask.clone()
        question[:, 0] = 0  # [CLS] stays a candidate (the no-answer span)
        return logits - question[..., None].to(logits.dtype) * 1e6

    @staticmethod
    def loss(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        """Mean of start and end cross-entropies; ``labels`` (B, 2) = start and end positions
        (positions outside the window are clamped and ignored, as in Hugging Face)."""
        length = logits.shape[1]
        labels = labels.reshape(-1, 2).clamp(0, length)
        start = F.cross_entropy(logits[..., 0].float(), labels[:, 0], ignore_index=length)
        end = F.cross_entropy(logits[..., 1].float(), labels[:, 1], ignore_index=length)
        return (start + end) / 2


class BeamSpans(NamedTuple):
    """XLNetForQuestionAnswering's inference outputs, named as there (the "log_probs" are
    softmax probabilities, as there): the top k starts (B, k), the top k' ends of each (B,
    k' * k; end e of start s at e * k + s) and the answerability logit (B,)."""

    start_top_log_probs: torch.Tensor
    start_top_index: torch.Tensor
    end_top_log_probs: torch.Tensor
    end_top_index: torch.Tensor
    cls_logits: torch.Tensor


class BeamQuestionAnsweringHead(nn.Module):
    """XLNet's SQuAD head (transformers' XLNetForQuestionAnswering): start logits; end logits
    given a start's state; answerability from a start and the <cls> state. Inference keeps
    ``extra['start_n_top']`` starts and ``end_n_top`` ends of each (:class:`BeamSpans`); the
    loss conditions the ends on the labelled start. ``p_mask`` (B, T): 1 = never in an answer
    (padding always); ``cls_index`` (B,): default each row's last real token."""

    takes_attention_mask = True
    loss_reads_hidden = True
    head_inputs = ("p_mask", "cls_index")

    def __init__(self, config: TransformerConfig):
        super().__init__()
        h = config.hidden_size
        self.start_n_top = int(config.extra.get("start_n_top", 5))
        self.end_n_top = int(config.extra.get("end_n_top", 5))
        self.start = nn.Linear(h, 1)
        self.end_hidden, self.end_norm = nn.Linear(2 * h, h), nn.LayerNorm(h, eps=config.norm_eps)
        self.end = nn.Linear(h, 1)
        self.answer_hidden, self.answer = nn.Linear(2 * h, h), nn.Linear(h, 1, bias=False)

    @staticmethod
    def _masked(logits: torch.Tensor, p_mask: torch.Tensor | None) -> torch.Tensor:
        if p_mask is None:
            return logits
        p_mask = p_mask.to(logits.dtype)
        return logits * (1 - p_mask) - (65500 if logits.dtype == torch.float16 else 1e30) * p_mask

    def _inputs(self, hidden: torch.Tensor, attention_mask: torch.Tensor | None,
                p_mask: torch.Tensor | None, cls_index: torch.Tensor | None):
        """(p_mask with the padding, cls_index (B,))."""
        if attention_mask is not None:
            pad = attention_mask.eq(0).to(hidden.dtype)
            p_mask = pad if p_mask is None else torch.maximum(p_mask.to(hidden.dtype), pad)
        if cls_index is None:
            cls_index = last_real_token(attention_mask, hidden.shape[1])
        return p_mask, torch.as_tensor(cls_index, device=hidden.device).reshape(-1).expand(
            hidden.shape[0])

    def end_logits(self, hidden: torch.Tensor, start_states: torch.Tensor,
                   p_mask: torch.Tensor | None) -> torch.Tensor:
        """(..., T) end logits of states (..., T, H) beside their start's states."""
        x = self.end_norm(torch.tanh(self.end_hidden(torch.cat([hidden, start_states], -1))))
        return self._masked(self.end(x).squeeze(-1), p_mask)

    def answer_logits(self, hidden: torch.Tensor, start_states: torch.Tensor,
                      cls_index: torch.Tensor) -> torch.Tensor:
        """(B,) whether the question has no answer, from a start's state (B, H) and <cls>."""
        cls = hidden[torch.arange(hidden.shape[0], device=hidden.device), cls_index]  # (B, H)
        return self.answer(torch.tanh(self.answer_hidden(torch.cat([start_states, cls], -1))))\
            .squeeze(-1)

    def forward(self, hidden: torch.Tensor, attention_mask: torch.Tensor | None = None,
                p_mask: torch.Tensor | None = None, cls_index: torch.Tensor | None = None
                ) -> BeamSpans:
        batch, length, width = hidden.shape
        if max(self.start_n_top, self.end_n_top) > length:
            raise LmlabError(f"the beam keeps {self.start_n_top} starts and {self.end_n_top} "
                             f"ends of {length} tokens", "set extra['start_n_top'] and "
                             "extra['end_n_top'] to at most the sequence length")
        p_mask, cls_index = self._inputs(hidden, attention_mask, p_mask, cls_index)
        start_probs = torch.softmax(self._masked(self.start(hidden).squeeze(-1), p_mask), -1)
        start_top, start_index = start_probs.topk(self.start_n_top, -1)  # (B, k)
        starts = hidden.gather(1, start_index[..., None].expand(-1, -1, width))  # (B, k, H)
        starts = starts[:, None].expand(-1, length, -1, -1)  # (B, T, k, H)
        ends = self.end_logits(hidden[:, :, None].expand_as(starts), starts,
                               None if p_mask is None else p_mask[..., None])  # (B, T, k)
        end_top, end_index = torch.softmax(ends, 1).topk(self.end_n_top, 1)  # (B, k', k)
        weighted = torch.einsum("blh,bl->bh", hidden, start_probs)  # the expected start
        return BeamSpans(start_top, start_index, end_top.reshape(batch, -1),
                         end_index.reshape(batch, -1),
                         self.answer_logits(hidden, weighted, cls_index))

    def loss(self, hidden: torch.Tensor, labels: torch.Tensor,
             attention_mask: torch.Tensor | None = None, p_mask: torch.Tensor | None = None,
             cls_index: torch.Tensor | None = None) -> torch.Tensor:
        """``labels`` (B, 2) start and end, or (B, 3) with is_impossible: the mean of the start
        and end cross-entropies (ends given the labelled start), plus half the answerability's
        binary cross-entropy."""
        if labels.dim() != 2 or labels.shape[1] not in (2, 3):
            raise LmlabError(f"beam QA labels have shape {tuple(labels.shape)}",
                             "give (batch, 2) start and end, or (batch, 3) with is_impossible")
        p_mask, cls_index = self._inputs(hidden, attention_mask, p_mask, cls_index)
        start, end = labels[:, 0].long(), labels[:, 1].long()
        rows = torch.arange(hidden.shape[0], device=hidden.device)
        start_states = hidden[rows, start]  # (B, H)
        start_logits = self._masked(self.start(hidden).squeeze(-1), p_mask)
        end_logits = self.end_logits(hidden, start_states[:, None].expand_as(hidden), p_mask)
        loss = (F.cross_entropy(start_logits.float(), start)
                + F.cross_entropy(end_logits.float(), end)) / 2
        if labels.shape[1] == 3:
            answer = self.answer_logits(hidden, start_states, cls_index)
            loss = loss + 0.5 * F.binary_cross_entropy_with_logits(answer.float(),
                                                                    labels[:, 2].float())
        return loss


def question_mask(config: TransformerConfig, input_ids: torch.Tensor | None,
                  question_lengths: torch.Tensor | None = None,
                  length: int | None = None) -> torch.Tensor | None:
    """(B, T) 1 on each row's question, as BigBird's QA class finds it: ``question_lengths``
    (B, 1) tokens, else [CLS] up to the first separator (``extra['sep_token_id']``); None
    when there is nothing to find it by. Its token types default to 1 - this mask."""
    if question_lengths is None:
        if input_ids is None:
            return None
        sep = config.extra.get("sep_token_id", config.eos_token_id)
        question_lengths = (input_ids == sep).int().argmax(-1) + 1  # (B,)
    length = input_ids.shape[-1] if input_ids is not None else length
    positions = torch.arange(length, device=question_lengths.device)  # (T,)
    return (positions < question_lengths.reshape(-1, 1)).long()  # (B, T)


def keeps_pooler(config: TransformerConfig, head: str) -> bool:
    """Whether ``head``'s transformers class holds the pooler it does not read
    (FamilySpec.keeps_pooler), so lmlab builds one too."""
    return config.family in KNOWN_FAMILIES and head in get_family(config.family).keeps_pooler


def add_task_head(model, head: str, num_labels_: int | None = None,
                  id2label: dict[int, str] | None = None, pooling: str | None = None,
                  problem_type: str | None = None) -> nn.Module:
    """Add a task head to ``model``, replacing one of the same name whose width or pooling
    differs; ``config.extra`` records what it predicts, for the saved checkpoint."""
    check_choice(head, (*TASK_HEADS, IMAGE_CLASSIFICATION), "head", "task head")
    extra = model.config.extra
    if num_labels_ is not None:
        if head in model.heads and int(extra.get("num_labels", 2)) != num_labels_:
            del model.heads[head]
        extra["num_labels"] = int(num_labels_)
    if id2label is not None:
        extra["id2label"] = {int(k): str(v) for k, v in id2label.items()}
    if pooling is not None:
        check_choice(pooling, POOLINGS, "pooling", "pooling")
        if head in model.heads and extra.get("pooling", "family") != pooling:
            del model.heads[head]
        extra["pooling"] = pooling
    if problem_type is not None:
        extra["problem_type"] = problem_type
    return model.add_head(head)


def task_logits(model, head: str, batch: dict[str, Any]) -> torch.Tensor:
    """Run the stack and one task head on a batch (multiple choice: (B, C, T) in, (B, C) out;
    a model with ``forward_gives_task_logits``, a feature run, is called as it is; an image
    batch's ``pixel_values`` go to an image model's head; a QA head that masks the question,
    BigBird's, reads the batch's ``question_lengths`` or finds the first separator)."""
    if "pixel_values" in batch:
        return model(pixel_values=batch["pixel_values"], heads=[head]).logits
    input_ids = batch["input_ids"]
    num_choices = None
    flat = {k: batch[k] for k in ("input_ids", "attention_mask", "token_type_ids")
            if batch.get(k) is not None}
    if getattr(model, "forward_gives_task_logits", False):
        if head != SEQUENCE_CLASSIFICATION:
            raise LmlabError(f"a feature-based run has no {head!r} head",
                             f"use it for {SEQUENCE_CLASSIFICATION}")
        return model(**flat)
    if head == MULTIPLE_CHOICE:
        if input_ids.dim() != 3:
            raise LmlabError(f"multiple-choice input_ids must be (B, C, T), got "
                             f"{tuple(input_ids.shape)}", "encode one sequence per choice")
        num_choices = input_ids.shape[1]
        flat = {k: v.reshape(-1, v.shape[-1]) for k, v in flat.items()}  # (B*C, T)
    glob = batch.get("global_attention_mask")
    if glob is None:
        glob = default_global_tokens(model.config, head, input_ids)
    if glob is not None:
        flat["global_attention_mask"] = glob.reshape(-1, glob.shape[-1])
    question = None
    if getattr(model.heads[head] if head in model.heads else None, "masks_question", False):
        question = question_mask(model.config, input_ids, batch.get("question_lengths"))
        if question is not None and "token_type_ids" not in flat:  # BigBird's QA class's types
            flat["token_type_ids"] = 1 - question
    out = model(**flat, heads=[])
    kwargs = {"num_choices": num_choices} if num_choices is not None else {}
    return model.run_head(head, out.last_hidden_state, out.pooler_output,
                          flat.get("attention_mask"), inputs={"question_mask": question},
                          **kwargs)
