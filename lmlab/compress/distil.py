"""Distillation: a shallower student learns from a teacher, on a corpus or on a task.

Task-agnostic (DistilBERT): :func:`make_student` keeps some of the teacher's layers
(:func:`spread_layers`) and :func:`distil` trains it on token shards with the triple loss of
:class:`~lmlab.objectives.distillation.Distillation`, as a pretraining run. Task-specific
(Hinton et al. 2015): :class:`TaskDistillation`, the ``distil=`` option of fine-tuning, mixes the
teacher's soft targets (computed once per example) into the label loss. See docs/distillation.md.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from lmlab.finetune.data import TaskStream
from lmlab.utils.checks import check_at_least, check_positive
from lmlab.utils.errors import LmlabError

if TYPE_CHECKING:
    from lmlab.models.config import TransformerConfig
    from lmlab.models.model import LanguageModel
    from lmlab.tasks.types import Task
    from lmlab.tokenization.tokenizer import Tokenizer
    from lmlab.training.pretrain import PretrainConfig
    from lmlab.training.trainer import TrainResult

__all__ = ["DistilSettings", "TaskDistillation", "TaskDistillationObjective",
           "TeacherLogitStream", "choose_layers", "distil", "make_student", "spread_layers",
           "teacher_config"]


# -- the student ----------------------------------------------------------------------------------
def spread_layers(teacher_depth: int, student_depth: int) -> tuple[int, ...]:
    """``student_depth`` teacher layers spread evenly from the first to the last, as DistilBERT
    chose them: ``round(i * (L - 1) / (N - 1))`` (half up), which gives 0, 2, 4, 7, 9, 11 for
    6 of 12 and 0, 3, 5 for 3 of 6; one layer is the first."""
    if student_depth == 1:
        return (0,)
    step = (teacher_depth - 1) / (student_depth - 1)
    return tuple(int(i * step + 0.5) for i in range(student_depth))


def choose_layers(teacher_depth: int, student_layers: int | None = None,
                  layers: tuple[int, ...] | list[int] | None = None) -> tuple[int, ...]:
    """The teacher layers the student is made of: ``layers`` as given (checked), else
    :func:`spread_layers` of ``student_layers`` (default: half the teacher's, DistilBERT's
    ratio). A student deeper than its teacher, or a layer the teacher lacks, is refused."""
    if layers is not None:
        layers = tuple(int(i) for i in layers)
        if student_layers is not None and student_layers != len(layers):
            raise LmlabError(f"--student-layers {student_layers} but --layers names "
                             f"{len(layers)} layers", "give one of the two")
        student_layers = len(layers)
    if student_layers is None:
        student_layers = max(1, teacher_depth // 2)
    if int(student_layers) < 1:
        raise LmlabError(f"--student-layers {student_layers} must be at least 1",
                         f"use e.g. {max(1, teacher_depth // 2)} (half the teacher's layers)")
    if student_layers > teacher_depth:
        raise LmlabError(f"the student ({student_layers} layers) is deeper than its teacher "
                         f"({teacher_depth} layers): its layers are copied from the teacher's",
                         f"use --student-layers between 1 and {teacher_depth} (DistilBERT: "
                         f"half, {max(1, teacher_depth // 2)})")
    if layers is None:
        return spread_layers(teacher_depth, int(student_layers))
    bad = [i for i in layers if not 0 <= i < teacher_depth]
    if bad:
        raise LmlabError(f"--layers {','.join(map(str, layers))} names layer(s) "
                         f"{','.join(map(str, bad))} the {teacher_depth}-layer teacher lacks",
                         f"use layer numbers 0 to {teacher_depth - 1}")
    if list(layers) != sorted(set(layers)):
        raise LmlabError(f"--layers {','.join(map(str, layers))} must be distinct and "
                         "increasing", "list each teacher layer once, in order, e.g. 0,2,5")
    return layers


def teacher_config(source: str | Path) -> TransformerConfig:
    """The teacher's architecture, read from its config alone (no weights), to check a
    distillation before any work; decoders and encoder-decoders are refused."""
    from lmlab.interop.hf import load_config
    from lmlab.interop.native import is_native_folder, read_native_config
    from lmlab.utils.catalog import resolve_model_dir

    folder = resolve_model_dir(source)
    if folder.suffix == ".gguf":
        raise LmlabError(f"{source} is a GGUF file; distillation follows DistilBERT's "
                         "masked-LM recipe for encoders", "give an encoder's folder as --teacher")
    if folder.is_dir() and not (folder / "config.json").is_file():
        raise LmlabError(f"{folder} holds no model (no config.json)",
                         "give a model folder, an lmlab run directory or a short name (minilm)")
    config = read_native_config(folder)[0] if is_native_folder(folder) else load_config(folder)[0]
    if config.causal or config.is_encoder_decoder:
        raise LmlabError(f"{source} is a {config.family} decoder or encoder-decoder; this "
                         "distillation is DistilBERT's masked-LM recipe for encoders",
                         "give an encoder (BERT, RoBERTa, MiniLM, ...) as --teacher")
    if config.share_layers:
        raise LmlabError(f"{source} shares one layer across its depth (ALBERT): there are no "
                         "separate layers to copy", "give a teacher with its own layers")
    return config


def make_student(teacher: LanguageModel, layers: tuple[int, ...] | list[int]) -> LanguageModel:
    """A new model of ``len(layers)`` layers whose layer ``j`` is a copy of the teacher's layer
    ``layers[j]``; embeddings, final norm, pooler and heads are copies of the teacher's (the
    student owns its tensors: training it leaves the teacher unchanged)."""
    from lmlab.models.model import LanguageModel

    config = teacher.config
    layers = choose_layers(config.num_hidden_layers, layers=tuple(layers))
    student_config = dataclasses.replace(config, num_hidden_layers=len(layers),
                                         extra=_student_extra(config.extra, layers))
    student = LanguageModel(student_config, heads=list(teacher.heads.keys()),
                            with_pooler=teacher.pooler is not None)
    state = teacher.state_dict()
    copied = {}
    for key in student.state_dict():
        name = key  # "transformer.layers.J.rest" is the teacher's "transformer.layers.I.rest"
        if key.startswith("transformer.layers."):
            _, _, index, rest = key.split(".", 3)
            name = f"transformer.layers.{layers[int(index)]}.{rest}"
        copied[key] = state[name].detach().clone()
    student.load_state_dict(copied, strict=True)
    student.tie_weights()
    student.train()
    return student


def _student_extra(extra: dict[str, Any], layers: tuple[int, ...]) -> dict[str, Any]:
    """The teacher's ``config.extra`` with its per-layer records (pruned heads' counts and
    indices, low-rank factorised modules: :mod:`lmlab.compress.heads`, :mod:`~.lowrank`)
    renumbered for the student, whose layer ``j`` is the teacher's ``layers[j]``."""
    from lmlab.models.variants import HEAD_COUNTS_KEY, LOW_RANK_KEY, PRUNED_KEY

    extra = dict(extra)
    if extra.get(HEAD_COUNTS_KEY):
        extra[HEAD_COUNTS_KEY] = [extra[HEAD_COUNTS_KEY][i] for i in layers]
    if extra.get(PRUNED_KEY):
        pruned = {int(k): v for k, v in extra[PRUNED_KEY].items()}
        extra[PRUNED_KEY] = {str(j): pruned[i] for j, i in enumerate(layers) if i in pruned}
    if extra.get(LOW_RANK_KEY):
        student_of = {i: j for j, i in enumerate(layers)}
        renamed = {}
        for name, rank in extra[LOW_RANK_KEY].items():
            if name.startswith("transformer.layers."):
                _, _, index, rest = name.split(".", 3)
                if int(index) not in student_of:
                    continue  # a layer the student does not keep
                name = f"transformer.layers.{student_of[int(index)]}.{rest}"
            renamed[name] = rank
        extra[LOW_RANK_KEY] = renamed
    return extra


# -- task-agnostic distillation on a corpus -------------------------------------------------------
@dataclass
class DistilSettings:
    """What makes a distillation run beyond a pretraining run's settings: the teacher, the
    student's layers and the loss (DistilBERT's defaults: T = 2, weights 5 / 2 / 1)."""

    teacher: str
    student_layers: int | None = None
    layers: tuple[int, ...] | None = None
    temperature: float = 2.0
    alpha_ce: float = 5.0
    alpha_mlm: float = 2.0
    alpha_cos: float = 1.0
    restrict_ce_to_mask: bool = False

    def objective_args(self) -> dict[str, Any]:
        """The :class:`~lmlab.objectives.distillation.Distillation` arguments (recorded in the
        run's config.json as ``objective_args``; resuming compares them)."""
        return {"teacher": str(self.teacher), "temperature": float(self.temperature),
                "alpha_ce": float(self.alpha_ce), "alpha_mlm": float(self.alpha_mlm),
                "alpha_cos": float(self.alpha_cos),
                "restrict_ce_to_mask": bool(self.restrict_ce_to_mask)}

    def validate(self) -> tuple[TransformerConfig, tuple[int, ...]]:
        """Check the teacher (it exists, is an encoder with its own layers), the loss weights
        and the layers, reading the teacher's config only; returns it and the layers."""
        if not self.teacher:
            raise LmlabError("no teacher given", "pass --teacher MODEL (a folder, a run "
                             "directory or a short name such as minilm)")
        check_positive(self.temperature, "--temperature", "use 2.0 (DistilBERT's)")
        weights = {"--alpha-ce": self.alpha_ce, "--alpha-mlm": self.alpha_mlm,
                   "--alpha-cos": self.alpha_cos}
        for option, value in weights.items():
            check_at_least(value, 0, option, "use DistilBERT's 5, 2, 1")
        if not any(float(value) > 0 for value in weights.values()):
            raise LmlabError("--alpha-ce, --alpha-mlm and --alpha-cos are all 0: nothing to "
                             "learn", "give at least one a positive weight (DistilBERT: 5, 2, 1)")
        config = teacher_config(self.teacher)
        return config, choose_layers(config.num_hidden_layers, self.student_layers, self.layers)


def distil(settings: DistilSettings, config: PretrainConfig) -> TrainResult:
    """Distil ``settings.teacher`` into a student of its chosen layers on ``config``'s shards.

    ``config`` is a :class:`~lmlab.training.pretrain.PretrainConfig` whose model (the teacher's
    layers) and objective (``distil``) are set here; everything is checked before any work and
    rerunning resumes exactly. The run folder is a pretraining run's (docs/distillation.md).
    """
    from lmlab.objectives.distillation import Distillation, check_teacher
    from lmlab.objectives.special_tokens import SpecialTokens
    from lmlab.training.pretrain import (
        ModelSettings,
        ObjectiveSettings,
        load_init,
        start_run,
        train_on_shards,
    )
    from lmlab.utils.catalog import resolve_short_name

    teacher_cfg, layers = settings.validate()
    config = dataclasses.replace(
        config, model=ModelSettings(init=str(settings.teacher)),
        objective=ObjectiveSettings("distil", settings.objective_args()))

    def load_teacher(tokenizer: Tokenizer) -> LanguageModel:
        """The teacher, checked against the run: its positions, its vocabulary and what the
        loss needs of it (an MLM head for the soft targets), before the run folder is touched
        (--overwrite removes the run there; the student is of the teacher's shape)."""
        seq_len = config.training.seq_len
        if seq_len > teacher_cfg.max_position_embeddings:
            raise LmlabError(f"--seq-len {seq_len} exceeds the teacher's "
                             f"{teacher_cfg.max_position_embeddings} positions",
                             f"use --seq-len {teacher_cfg.max_position_embeddings} or less")
        if len(tokenizer) != teacher_cfg.vocab_size:
            raise LmlabError(f"the shards' tokenizer has {len(tokenizer)} tokens, the teacher "
                             f"{teacher_cfg.vocab_size}", "tokenize the corpus with the "
                             "teacher's tokenizer: lmlab data tokenize --tokenizer TEACHER ...")
        teacher = load_init(resolve_short_name(settings.teacher), len(tokenizer))
        check_teacher(teacher, teacher, settings.alpha_ce, settings.alpha_cos)
        return teacher

    tokenizer, tokenizer_dir, record, teacher = start_run(
        config, {"student_layers": list(layers)}, load_teacher, what="distillation run")
    student = make_student(teacher, layers)
    objective = Distillation(SpecialTokens.from_tokenizer(tokenizer), teacher=teacher,
                             **{k: v for k, v in settings.objective_args().items()
                                if k != "teacher"})
    objective.prepare(student)
    print(f"lmlab distil: student of teacher layers {list(layers)} "
          f"({student.num_parameters():,} parameters; teacher {teacher.num_parameters():,})",
          flush=True)
    return train_on_shards(config, student, objective, record, tokenizer_dir)


# -- task-specific distillation ---------------------------------------------------------------------
# task types whose logits have a soft-target form (QA's start/end over positions has not)
TASK_TYPES = ("classification", "pair-classification", "multiple-choice", "regression",
              "tagging")


@dataclass
class TaskDistillation:
    """The ``distil=`` option of :func:`lmlab.finetune.finetune`: fine-tune with a teacher.

    The loss is ``alpha * T^2 * KL(softmax(z_t / T) || softmax(z_s / T)) + (1 - alpha) *
    label loss`` (Hinton et al. 2015); for regression the soft term is the squared error to the
    teacher's prediction. ``teacher`` is a model fine-tuned on the same task (same labels, same
    order); its logits are computed once per training example, before training.
    """

    teacher: str
    alpha: float = 0.5
    temperature: float = 2.0

    def __post_init__(self) -> None:
        self._model: LanguageModel | None = None
        self._tokenizer: Any = None
        self.flops = 0.0  # the teacher's forward FLOPs, set by teacher_logits

    def to_dict(self) -> dict[str, Any]:
        """What the fine-tuning run records (``hparams.distil``; resuming compares it)."""
        return {"teacher": str(self.teacher), "alpha": float(self.alpha),
                "temperature": float(self.temperature)}

    def check(self, task: Task, student: str | Path | None = None) -> None:
        """Before any work: the weights, the task type, a teacher (loaded here, once) with
        this task's head and labels, and the same tokenizer as the ``student`` source."""
        from lmlab.finetune.runner import (
            check_head_matches,
            load_model,
            load_tokenizer,
            parse_model_source,
        )

        if not 0.0 <= float(self.alpha) <= 1.0:
            raise LmlabError(f"--distil-alpha {self.alpha} is not in [0, 1]",
                             "use 0.5 (half soft targets, half labels)")
        check_positive(self.temperature, "--temperature", "use 2.0")
        if task.type not in TASK_TYPES:
            raise LmlabError(f"task-specific distillation does not support {task.type} tasks "
                             f"({task.name})", f"use a {', '.join(TASK_TYPES)} task")
        if self._model is None:
            self._model, self._tokenizer = load_model(self.teacher)[:2]
        if student is not None:
            own = load_tokenizer(parse_model_source(student)[0])
            if own.fingerprint() != self._tokenizer.fingerprint():
                raise LmlabError(f"the teacher {self.teacher} and the student {student} have "
                                 "different tokenizers, so the teacher's logits would be of "
                                 "other token sequences", "distil into a student made from "
                                 "the teacher (lmlab distil) or one with its vocabulary")
        checked = check_head_matches(self._model, task)
        if list(checked.labels) != list(task.labels):
            raise LmlabError(f"the teacher's labels are in another order than the task's "
                             f"({list(checked.labels)[:4]}... vs {list(task.labels)[:4]}...)",
                             "give a teacher fine-tuned on this task's files")

    def teacher_logits(self, task: Task, features: list[Any], pad_id: int,
                       device: torch.device, precision: str = "fp32",
                       batch_size: int = 64) -> list[torch.Tensor]:
        """The teacher's logits for each feature (float32, on the CPU): (C,) per example,
        (T_i, C) per tagged sequence. ``self.flops`` is then what computing them cost
        (forward FLOPs of the teacher's stack, :func:`lmlab.cost.flops.flops_per_token`; its
        small task head is not counted, as the student's is not)."""
        from lmlab.cost.precision import precision_autocast
        from lmlab.finetune import data as fdata
        from lmlab.models.task_heads import HEAD_FOR_TASK, task_logits

        if self._model is None:
            self.check(task)
        from lmlab.cost.flops import flops_per_token

        teacher = self._model.to(device).eval()
        head = HEAD_FOR_TASK[task.type]
        logits: list[torch.Tensor] = [torch.empty(0)] * len(features)
        self.flops = 0.0  # the teacher's forward FLOPs (real tokens at each batch's length)
        with torch.no_grad():
            for indices, batch in fdata.eval_batches(features, batch_size, pad_id):
                batch = {k: v.to(device) for k, v in batch.items() if k != "labels"}
                length = batch["input_ids"].shape[-1]
                self.flops += int(batch["attention_mask"].sum()) * flops_per_token(
                    teacher.config, length, training=False, head="none")
                with precision_autocast(precision, device.type):
                    out = task_logits(teacher, head, batch).float().cpu()
                for row, index in enumerate(indices):
                    length = len(features[index].input_ids)
                    logits[index] = out[row, :length] if task.type == "tagging" else out[row]
        teacher.to("cpu")
        return logits

    def attach(self, task: Task, features: list[Any], stream: Any, objective: nn.Module,
               pad_id: int, device: torch.device, precision: str = "fp32"
               ) -> tuple[Any, nn.Module]:
        """The stream whose batches carry ``teacher_logits`` and the objective that reads
        them, in place of fine-tuning's ``stream`` and ``objective``."""
        logits = self.teacher_logits(task, features, pad_id, device, precision)
        return (TeacherLogitStream.wrap(stream, logits),
                TaskDistillationObjective(objective, self.alpha, self.temperature,
                                          teacher_flops=self.flops))


class TeacherLogitStream(TaskStream):
    """A :class:`~lmlab.finetune.data.TaskStream` whose batches also hold the teacher's logits
    of their examples (``teacher_logits``: (B, C), or (B, T, C) for tagging, zero-padded),
    computed once before training."""

    @classmethod
    def wrap(cls, stream: TaskStream, logits: list[torch.Tensor]) -> TeacherLogitStream:
        """``stream`` (its examples, batching and position) with ``logits`` added."""
        wrapped = cls(stream.features, stream.batch_size, stream.pad_id, stream.seed,
                      stream.group_by_length)
        wrapped.load_state_dict(stream.state_dict())
        wrapped.logits = logits
        return wrapped

    def make_batch(self, indices: list[int]) -> dict[str, Any]:
        # (C,) each -> (B, C); tagging: (T_i, C) each -> (B, T, C), zero-padded to the longest,
        # which is the batch's length (the logits cover each example's tokens)
        batch = super().make_batch(indices)
        batch["teacher_logits"] = nn.utils.rnn.pad_sequence([self.logits[i] for i in indices],
                                                            batch_first=True)
        return batch


class TaskDistillationObjective(nn.Module):
    """A fine-tuning objective (:class:`~lmlab.finetune.objective.TaskObjective`) with the
    teacher's soft targets mixed in: ``alpha * soft + (1 - alpha) * label loss``."""

    name = "task-distil"
    flops_head = "none"
    reports_perplexity = False
    predicted_fraction = None

    def __init__(self, base: nn.Module, alpha: float, temperature: float,
                 teacher_flops: float = 0.0):
        super().__init__()
        self.base = base
        self.teacher_flops = float(teacher_flops)  # computing the logits, before training
        self._flops_reported = False
        self.alpha = float(alpha)
        self.temperature = float(temperature)
        self.head = base.head
        self.head_names = base.head_names
        self.task_type = base.task_type

    def prepare(self, model: nn.Module) -> None:
        self.base.prepare(model)

    def side_flops(self, tokens: int, seq_len: int) -> dict[str, float]:
        """The teacher's forward FLOPs (its logits, computed once before training), given to
        the Trainer's cost report at the first step, apart from the student's FLOPs."""
        if self._flops_reported:
            return {}
        self._flops_reported = True
        return {"teacher forward": self.teacher_flops}

    def compute_loss(self, model: nn.Module, batch: dict[str, torch.Tensor]):
        from lmlab.models.task_heads import task_logits
        from lmlab.objectives.base import ObjectiveResult
        from lmlab.objectives.distillation import soft_target_loss

        if "teacher_logits" not in batch:
            raise LmlabError("the batch has no 'teacher_logits'",
                             "build it with TaskDistillation.attach (lmlab.compress.distil)")
        logits = task_logits(model, self.head, batch)
        labels, teacher = batch["labels"], batch["teacher_logits"]
        hard = model.heads[self.head].loss(logits, labels)
        count = int(labels.shape[0])
        if self.task_type == "regression":
            soft = torch.nn.functional.mse_loss(logits.float().reshape(-1),
                                                teacher.float().reshape(-1))
        elif self.task_type == "tagging":
            keep = labels != -100  # (B, T): one position per word
            count = int(keep.sum())
            soft = soft_target_loss(logits[keep], teacher[keep], self.temperature)
        else:
            soft = soft_target_loss(logits, teacher, self.temperature)
        loss = self.alpha * soft + (1.0 - self.alpha) * hard
        metrics = {"loss": float(loss.detach()), "soft_loss": float(soft.detach()),
                   "label_loss": float(hard.detach())}
        if self.task_type == "tagging" and count:
            metrics["accuracy"] = float((logits.argmax(-1)[keep] == labels[keep]).float().mean())
        elif self.task_type not in ("regression", "tagging"):
            metrics["accuracy"] = float((logits.argmax(-1) == labels).float().mean())
        return ObjectiveResult(loss=loss, metrics=metrics, num_predictions=max(count, 1))
