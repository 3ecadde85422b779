"""Knowledge distillation of a masked LM: DistilBERT's triple loss (Sanh et al. 2019), soft
targets + MLM + hidden-state cosine, with a frozen teacher the caller loads (never optimised or
checkpointed). docs/distillation.md explains each term."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from lmlab.cost.flops import flops_per_token
from lmlab.objectives.base import Objective, ObjectiveResult, accuracy, require_labels, stack_inputs
from lmlab.objectives.masking import IGNORE_INDEX
from lmlab.objectives.mlm import MaskedLM
from lmlab.objectives.special_tokens import SpecialTokens
from lmlab.utils.checks import check_at_least, check_positive
from lmlab.utils.errors import LmlabError

__all__ = ["Distillation", "hidden_cosine_loss", "soft_target_loss"]


def soft_target_loss(student_logits: torch.Tensor, teacher_logits: torch.Tensor,
                     temperature: float) -> torch.Tensor:
    """``T^2 * KL(softmax(t / T) || softmax(s / T))`` averaged over rows (N, C) -> scalar
    (DistilBERT's ``KLDivLoss(reduction="batchmean")``), in float32: a bf16 softmax over 30k
    classes loses the small probabilities the soft targets carry."""
    if student_logits.shape != teacher_logits.shape:
        raise LmlabError(f"student logits {tuple(student_logits.shape)} and teacher logits "
                         f"{tuple(teacher_logits.shape)} differ in shape",
                         "give teacher and student the same vocabulary (or label set)")
    rows = student_logits.reshape(-1, student_logits.shape[-1]).float()  # (N, C)
    targets = teacher_logits.reshape(-1, teacher_logits.shape[-1]).float()  # (N, C)
    if rows.shape[0] == 0:
        return student_logits.sum() * 0.0
    log_student = F.log_softmax(rows / temperature, dim=-1)
    log_teacher = F.log_softmax(targets / temperature, dim=-1)
    kl = (log_teacher.exp() * (log_teacher - log_student)).sum(-1)  # (N,)
    return kl.mean() * temperature ** 2


def hidden_cosine_loss(student_hidden: torch.Tensor, teacher_hidden: torch.Tensor,
                       attention_mask: torch.Tensor | None = None) -> torch.Tensor:
    """``mean(1 - cos(h_s, h_t))`` over the real tokens of hidden states (B, T, H) -> scalar
    (``torch.nn.CosineEmbeddingLoss`` with target 1 on the selected rows)."""
    if student_hidden.shape != teacher_hidden.shape:
        raise LmlabError(f"student hidden states {tuple(student_hidden.shape)} and teacher "
                         f"hidden states {tuple(teacher_hidden.shape)} differ in shape",
                         "the cosine loss needs a student as wide as its teacher (one made "
                         "from the teacher's layers), or pass alpha_cos=0")
    if attention_mask is not None:
        keep = attention_mask.bool()  # (B, T)
        student_hidden, teacher_hidden = student_hidden[keep], teacher_hidden[keep]  # (N, H)
    cosine = F.cosine_similarity(student_hidden.float(), teacher_hidden.float(), dim=-1,
                                 eps=1e-8)
    if cosine.numel() == 0:
        return student_hidden.sum() * 0.0
    return (1.0 - cosine).mean()


class Distillation(MaskedLM):
    """DistilBERT's objective with ``teacher``, a loaded encoder of the student's vocabulary;
    beyond MaskedLM's arguments: ``temperature``, the terms' weights ``alpha_ce``,
    ``alpha_mlm``, ``alpha_cos`` and ``restrict_ce_to_mask`` (docs/distillation.md)."""

    name = "distil"
    head_names = ("mlm",)
    salt = 7
    reports_perplexity = False  # a weighted sum of three losses, not a per-token LM loss
    shares_forward_pass = False  # it also runs the teacher
    shown = (*MaskedLM.shown, "temperature", "alpha_ce", "alpha_mlm", "alpha_cos",
             "restrict_ce_to_mask")

    def __init__(self, special: SpecialTokens, teacher: nn.Module | None = None,
                 temperature: float = 2.0, alpha_ce: float = 5.0, alpha_mlm: float = 2.0,
                 alpha_cos: float = 1.0, restrict_ce_to_mask: bool = False,
                 mask_prob: float = 0.15,
                 replacement: tuple[float, float, float] = (0.8, 0.1, 0.1),
                 masking: str = "dynamic", dupe_factor: int = 10, seed: int = 0,
                 max_predictions: int | None = None, weight: float = 1.0):
        super().__init__(special, mask_prob, replacement, masking, dupe_factor, seed,
                         max_predictions, sparse=True, weight=weight)
        if teacher is None or (isinstance(teacher, str) and not teacher):
            raise LmlabError("distillation needs a teacher",
                             "use `lmlab distil --teacher MODEL --student-layers N ...`, or "
                             "pass teacher=<a loaded model>")
        if not isinstance(teacher, nn.Module):
            raise LmlabError(f"the distil objective takes a loaded teacher model, not "
                             f"{teacher!r}", "load it first (lmlab.from_pretrained(path)) and "
                             "pass the model; `lmlab distil --teacher PATH` loads it for you")
        check_positive(temperature, "temperature")
        alphas = {"alpha_ce": alpha_ce, "alpha_mlm": alpha_mlm, "alpha_cos": alpha_cos}
        for key, value in alphas.items():
            check_at_least(value, 0, key)
        if not any(float(v) > 0 for v in alphas.values()):
            raise LmlabError("alpha_ce, alpha_mlm and alpha_cos are all 0: nothing to learn",
                             "give at least one a positive weight (DistilBERT: 5, 2, 1)")
        self.temperature = float(temperature)
        self.alpha_ce, self.alpha_mlm, self.alpha_cos = (float(alpha_ce), float(alpha_mlm),
                                                         float(alpha_cos))
        self.restrict_ce_to_mask = bool(restrict_ce_to_mask)
        # kept outside the module tree: no parameters, state_dict entries or optimiser slots
        object.__setattr__(self, "teacher", teacher)

    @property
    def flops_head(self) -> str:
        """The student's MLM head is in the FLOP count when a loss term runs it."""
        return "mlm" if self.alpha_ce > 0 or self.alpha_mlm > 0 else "none"

    @property
    def predicted_fraction(self) -> float | None:
        """Passes of the student's MLM head per token, for the cost report: the soft targets'
        positions plus the masked ones again unless the MLM loss reuses those logits
        (DistilBERT's settings: ``1 + mask_prob``)."""
        ce = self.alpha_ce > 0
        passes = (self.mask_prob if self.restrict_ce_to_mask else 1.0) if ce else 0.0
        if self.alpha_mlm > 0 and not (ce and self.restrict_ce_to_mask):
            passes += self.mask_prob
        return passes or None

    # -- set-up -------------------------------------------------------------------------------
    def prepare(self, model: nn.Module) -> None:
        """Check the teacher fits the student, freeze it, and add the student's "mlm" head
        (idempotent)."""
        teacher = self.teacher
        check_teacher(teacher, model, self.alpha_ce, self.alpha_cos)
        teacher.eval()
        teacher.requires_grad_(False)
        model.add_head("mlm")
        teacher.to(next(model.parameters()).device)

    def _apply(self, fn, recurse: bool = True):
        """``objective.to(device)`` (the Trainer's) moves the teacher too."""
        self.teacher._apply(fn, recurse)
        return super()._apply(fn, recurse)

    def train(self, mode: bool = True):
        """The teacher stays in eval mode (no dropout) whatever the objective's mode."""
        super().train(mode)
        self.teacher.eval()
        return self

    # -- loss ---------------------------------------------------------------------------------
    def compute_loss(self, model: nn.Module, batch: dict[str, torch.Tensor]) -> ObjectiveResult:
        labels = require_labels(batch, self.name)
        masked = labels != IGNORE_INDEX  # (B, T)
        attention = batch.get("attention_mask")
        real = attention.bool() if attention is not None else torch.ones_like(masked)  # (B, T)
        count = int(masked.sum())
        out = model(**stack_inputs(model, batch), heads=[])
        with torch.no_grad():
            teacher_out = self.teacher(**stack_inputs(self.teacher, batch), heads=[])
        hidden, teacher_hidden = out.last_hidden_state, teacher_out.last_hidden_state
        zero = hidden.sum() * 0.0
        metrics: dict[str, float] = {}
        loss = zero
        if self.alpha_ce > 0:
            positions = masked if self.restrict_ce_to_mask else real
            student_logits = model.run_head("mlm", hidden, None, positions=positions)  # (N, V)
            with torch.no_grad():
                teacher_logits = self.teacher.run_head("mlm", teacher_hidden, None,
                                                       positions=positions)  # (N, V)
            ce = soft_target_loss(student_logits, teacher_logits, self.temperature)
            loss = loss + self.alpha_ce * ce
            metrics["ce_loss"] = float(ce.detach())
        if self.alpha_mlm > 0:
            logits = (student_logits if self.alpha_ce > 0 and self.restrict_ce_to_mask
                      else model.run_head("mlm", hidden, None, positions=masked))  # (M, V)
            targets = labels[masked]  # (M,)
            mlm = model.heads["mlm"].loss(logits, targets) if count else zero
            loss = loss + self.alpha_mlm * mlm
            metrics["mlm_loss"] = float(mlm.detach())
            if count:
                metrics["mlm_accuracy"] = accuracy(logits, targets)
        if self.alpha_cos > 0:
            cos = hidden_cosine_loss(hidden, teacher_hidden, real)
            loss = loss + self.alpha_cos * cos
            metrics["cos_loss"] = float(cos.detach())
        return ObjectiveResult(loss * self.weight, metrics, int(real.sum()))

    def side_flops(self, tokens: int, seq_len: int) -> dict[str, float]:
        """The frozen teacher's forward FLOPs for a step of ``tokens`` tokens at ``seq_len``
        (its stack, and its MLM head where the soft targets are read), which the Trainer's cost
        report lists apart from the student's training FLOPs."""
        head = "mlm" if self.alpha_ce > 0 else "none"
        fraction = self.mask_prob if self.alpha_ce > 0 and self.restrict_ce_to_mask else None
        per_token = flops_per_token(self.teacher.config, seq_len, training=False, head=head,
                                    sparse_prediction_fraction=fraction)
        return {"teacher forward": tokens * per_token}

    losses = Objective.losses  # refused: it also runs the teacher


def check_teacher(teacher: nn.Module, student: nn.Module, alpha_ce: float,
                  alpha_cos: float) -> None:
    """Refuse a teacher the losses cannot use: another vocabulary, no MLM head while the soft
    targets are on, another width while the cosine term is on, or a decoder."""
    t, s = teacher.config, student.config
    if getattr(t, "causal", False) or getattr(t, "is_encoder_decoder", False):
        raise LmlabError(f"the teacher is a {t.family} decoder/encoder-decoder; this "
                         "distillation is DistilBERT's masked-LM recipe for encoders",
                         "give an encoder (BERT, RoBERTa, MiniLM, ...) as --teacher")
    if t.vocab_size != s.vocab_size:
        raise LmlabError(f"the teacher has {t.vocab_size} tokens, the student {s.vocab_size}",
                         "make the student from the teacher (lmlab distil) or use the "
                         "teacher's tokenizer")
    if alpha_ce > 0 and "mlm" not in getattr(teacher, "heads", {}):
        raise LmlabError("the teacher has no masked-LM head, so it gives no soft targets over "
                         "the vocabulary (alpha_ce > 0)",
                         "pass --alpha-ce 0 (learn from its hidden states and the MLM loss), "
                         "or give a teacher with an MLM head (a *ForMaskedLM checkpoint or a "
                         "run of `lmlab pretrain --objective mlm`)")
    if alpha_cos > 0 and t.hidden_size != s.hidden_size:
        raise LmlabError(f"the teacher's hidden size is {t.hidden_size}, the student's "
                         f"{s.hidden_size}: the cosine loss compares them",
                         "make the student from the teacher's layers (same width), or pass "
                         "--alpha-cos 0")
