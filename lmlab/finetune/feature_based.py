"""Feature-based fine-tuning (Peters et al. 2018; the BERT paper's feature-based comparison):
the encoder is frozen and runs once; a :class:`FeatureHead` (one layer, a fixed combination or
a learned scalar mix, then a linear classifier) trains on its per-layer sentence vectors. A
finished run is one :class:`FeatureClassifier` (the encoder's folder plus the head's file).
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from lmlab.cost.precision import precision_autocast
from lmlab.finetune import data as fdata
from lmlab.finetune.train import RunOptions
from lmlab.interop.folders import FEATURE_HEAD_CONFIG
from lmlab.models.pooling import ScalarMix
from lmlab.objectives.base import ObjectiveResult
from lmlab.utils.checks import check_choice
from lmlab.utils.errors import LmlabError

if TYPE_CHECKING:
    from lmlab.finetune.recipes import Recipe
    from lmlab.finetune.train import TaskRun
    from lmlab.tasks.types import Task

SENTENCE_TASKS = ("classification", "pair-classification", "regression")
FEATURE_HEAD_WEIGHTS = "feature_head.safetensors"


# -- the head: a scalar mix (or one layer) over frozen layers, then a linear classifier ----------
class FeatureHead(nn.Module):
    """A chosen layer, a fixed combination of layers (a :data:`lmlab.models.pooling.STRATEGIES`
    name) or a learned scalar mix of pre-pooled per-layer vectors (N, L+1, H), then dropout and
    a linear classifier. Pooling is linear, so the frozen encoder runs once."""

    def __init__(self, num_layers: int, hidden: int, outputs: int, layer: int | str | None,
                 dropout: float = 0.1):
        from lmlab.models.pooling import combine_layers

        super().__init__()
        self.layer = layer
        self.hidden = hidden  # the width of one layer's vector
        self.mix = ScalarMix(num_layers) if layer is None else None
        width = hidden
        if isinstance(layer, str):  # a strategy's width: apply it to one dummy row
            width = combine_layers(torch.zeros(num_layers, 1, hidden).unbind(0), layer).shape[-1]
        self.dropout = nn.Dropout(dropout)
        self.classifier = nn.Linear(width, outputs)

    def combine(self, features: torch.Tensor) -> torch.Tensor:
        """(N, L+1, H) per-layer vectors -> (N, D), the classifier's input."""
        from lmlab.models.pooling import combine_layers

        if self.mix is not None:
            return self.mix(features)
        if isinstance(self.layer, str):
            return combine_layers(features.unbind(1), self.layer)
        return features[:, self.layer]

    def forward(self, features: torch.Tensor) -> torch.Tensor:
        return self.classifier(self.dropout(self.combine(features)))


# -- the frozen encoder's features -----------------------------------------------------------------
def pooled_layer_states(model: nn.Module, batch: dict[str, torch.Tensor],
                        pooling: str) -> torch.Tensor:
    """Sentence vectors of every hidden state (embeddings + each layer): (B, L+1, H) in fp32.
    ``pooling`` ``mean`` (over real tokens) or ``cls`` (first token)."""
    from lmlab.models.pooling import masked_mean

    out = model(input_ids=batch["input_ids"], attention_mask=batch.get("attention_mask"),
                token_type_ids=batch.get("token_type_ids"), heads=[],
                output_hidden_states=True)
    states = torch.stack(out.hidden_states, dim=1).float()  # (B, L+1, T, H)
    if pooling == "cls":
        return states[:, :, 0]  # (B, L+1, H)
    mask = batch.get("attention_mask")
    if mask is None:
        return states.mean(2)
    mask = mask[:, None, :].expand(-1, states.shape[1], -1)  # (B, L+1, T)
    pooled = masked_mean(states.flatten(0, 1), mask.flatten(0, 1))  # (B*(L+1), H)
    return pooled.view(states.shape[0], states.shape[1], -1)  # (B, L+1, H)


def feature_pooling(rec: Recipe) -> str:
    """The sentence pooling of the feature recipe ``rec``: ``cls`` or ``mean``."""
    return "cls" if rec.pooling in ("cls", "family") else "mean"


@torch.no_grad()
def task_features(task: Task, split: str, model: nn.Module, tokenizer: Any, rec: Recipe,
                  precision: str = "fp32", encoded: list | None = None) -> torch.Tensor:
    """Per-layer sentence vectors (N, L+1, H) on the CPU of one split of ``task``, as
    :func:`train_feature_based` computes them (``rec``'s max length and pooling, the encoder
    where its weights are); ``encoded``: the split's examples already encoded."""
    if encoded is None:
        encoded = fdata.encode_examples(task, task.split(split), tokenizer, rec.max_length,
                                        split=split)
    model.eval()
    device = next(model.parameters()).device
    order: list[int] = []
    chunks = []
    for indices, batch in fdata.eval_batches(encoded, 64, fdata.pad_id_of(tokenizer)):
        batch = {k: v.to(device) for k, v in batch.items()}
        with precision_autocast(precision, device.type):
            chunks.append(pooled_layer_states(model, batch, feature_pooling(rec)).cpu())
        order += indices
    pooled = torch.cat(chunks)  # (N, L+1, H) in batch order
    features = torch.empty_like(pooled)
    features[torch.tensor(order)] = pooled  # back in example order
    return features


# -- the head's training on the Trainer: stream and objective --------------------------------------
class FeatureStream(fdata.TaskStream):
    """Training batches of frozen features, ``{"features": (B, L+1, H), "labels": (B,)}``: a
    :class:`~lmlab.finetune.data.TaskStream` (shuffled epochs, exact resume position) without
    length grouping."""

    def __init__(self, features: torch.Tensor, labels: torch.Tensor, batch_size: int,
                 seed: int = 0):
        super().__init__(features, batch_size, pad_id=0, seed=seed, group_by_length=False)
        self.labels = labels

    def make_batch(self, indices: list[int]) -> dict[str, torch.Tensor]:
        rows = torch.tensor(indices)
        return {"features": self.features[rows], "labels": self.labels[rows]}


class FeatureObjective(nn.Module):
    """A :class:`FeatureHead`'s loss on a :class:`FeatureStream` batch: cross-entropy, or MSE
    for regression. The head runs in fp32 even in a bf16 run, as a saved
    :class:`FeatureClassifier` runs it, so training and inference see the same numbers."""

    name = "feature-head"
    flops_head = "none"
    reports_perplexity = False
    predicted_fraction = None

    def __init__(self, regression: bool):
        super().__init__()
        self.regression = regression

    def prepare(self, model: nn.Module) -> None:
        """Nothing to add (the head is built complete); any other model is refused."""
        if not isinstance(model, FeatureHead):
            raise LmlabError(f"the feature objective trains a FeatureHead, not a "
                             f"{type(model).__name__}", "build a FeatureHead over the features")

    def compute_loss(self, model: nn.Module, batch: dict[str, torch.Tensor]) -> ObjectiveResult:
        features, labels = batch["features"], batch["labels"]
        with torch.autocast(features.device.type, enabled=False):
            logits = model(features.float())  # (B, outputs)
        if self.regression:
            loss = nn.functional.mse_loss(logits.squeeze(-1), labels.float())
            metrics = {"loss": float(loss.detach())}
        else:
            loss = nn.functional.cross_entropy(logits, labels)
            metrics = {"loss": float(loss.detach()),
                       "accuracy": float((logits.argmax(-1) == labels).float().mean())}
        return ObjectiveResult(loss=loss, metrics=metrics, num_predictions=int(labels.shape[0]))


def train_feature_based(task: Task, model: nn.Module, tokenizer: Any, rec: Recipe, seed: int,
                        out_dir: str | Path, run: RunOptions = RunOptions(), *,
                        features: dict[str, torch.Tensor] | None = None) -> TaskRun:
    """Train a feature head on the frozen ``model`` for the sentence task ``task`` with recipe
    ``rec`` into ``out_dir`` (resumed exactly; other settings there are refused before the
    encoder's one pass over train and dev, which is outside the Trainer's budget). The report
    adds ``cost`` and ``encode_seconds`` of that pass and ``scalar_mix`` (softmaxed layer
    weights); ``save`` writes a :class:`FeatureClassifier` folder. ``features`` (``{split:
    (N, L+1, H)}`` from :func:`task_features`, same recipe) skip the encoder for those splits."""
    from dataclasses import replace

    from lmlab.finetune.train import plan_task, train_task
    from lmlab.training.distributed import process_device
    from lmlab.training.run_dir import check_resumable, run_config
    from lmlab.training.trainer import seed_everything

    layer = _check_feature_run(task, model, rec)
    head_rec = replace(rec, schedule="constant", warmup_fraction=0.0, clip_norm=None)
    plan = plan_task(task, tokenizer, head_rec, seed, run)  # the train split, encoded
    encoded = {"train": plan.features, "dev": fdata.encode_examples(
        task, task.split("dev"), tokenizer, rec.max_length, split="dev")}
    regression = task.type == "regression"
    outputs = 1 if regression else len(task.labels)
    record = _feature_record(task, model, tokenizer, rec, layer, outputs, plan.features)
    check_resumable(out_dir, run_config(plan.config, record))  # before the encoder's pass
    encoder_device = process_device(run.device)  # --device cuda without a GPU: refused here
    for name in list(model.heads):
        del model.heads[name]
    for parameter in model.parameters():
        parameter.requires_grad_(False)
    model.to(encoder_device)

    def features_of(split: str, encoded_split: list | None = None) -> torch.Tensor:
        if features is not None and split in features:
            return features[split]
        return task_features(task, split, model, tokenizer, rec, run.precision,
                             encoded_split)  # (N, L+1, H)

    x, cost, encode_seconds = _encoder_pass(model, encoded, features_of, features, rec, run,
                                            out_dir)
    y = torch.tensor([f.label for f in encoded["train"]],
                     dtype=torch.float if regression else torch.long)
    seed_everything(seed)  # the head's initial weights
    head = FeatureHead(model.config.num_hidden_layers + 1, model.config.hidden_size, outputs,
                       layer)

    @torch.no_grad()
    def predict_vectors(vectors: torch.Tensor) -> list[Any]:
        head.eval()  # no dropout: scoring consumes no training RNG
        weight = head.classifier.weight
        logits = head(vectors.to(weight.device, weight.dtype)).cpu()
        if regression:
            return [float(v) for v in logits.reshape(-1)]
        return [task.labels[int(i)] for i in logits.argmax(-1)]

    done = train_task(plan, head, FeatureObjective(regression), out_dir, record=record,
                      stream=FeatureStream(x["train"], y, rec.batch_size, seed),
                      evaluate_dev=lambda: task.evaluate("dev", predict_vectors(x["dev"])))
    mix = torch.softmax(head.mix.weights.detach(), 0).tolist() if head.mix is not None else None

    def predictor(split: str) -> list[Any]:
        return predict_vectors(x["dev"] if split == "dev" else features_of(split))

    def saver(path: Path) -> None:
        # the encoder, its tokenizer and the head: the folder loads on its own (lmlab evaluate,
        # lmlab.from_pretrained, pipelines), wherever the base model was
        FeatureClassifier(model, head, feature_pooling(rec), list(task.labels),
                          rec.max_length).save_pretrained(path)
        tokenizer.save_pretrained(path)

    done.predict, done.save = predictor, saver
    done.extra.update(cost=cost, encode_seconds=encode_seconds, scalar_mix=mix)
    return done


def _check_feature_run(task: Task, model: nn.Module, rec: Recipe) -> int | str | None:
    """Refuse what the feature recipe cannot train; returns the layer (negative ones counted
    from the top), a strategy name or None (a scalar mix)."""
    if task.type not in SENTENCE_TASKS:
        raise LmlabError(f"the feature recipe handles sentence tasks, not {task.type}",
                         "use --recipe bert or ulmfit for this task")
    if getattr(model.config, "family", None) == "awd-lstm":  # its layers differ in width
        widths = [model.config.embedding_size] + [out for _, out in model.config.layer_sizes()]
        if len(set(widths)) > 1:
            raise LmlabError(f"the feature recipe stacks every hidden state, and this AWD-LSTM's "
                             f"differ in width ({', '.join(map(str, widths))})",
                             "fine-tune it with --recipe ulmfit, or use ELMo for features")
    layers = model.config.num_hidden_layers + 1
    layer = rec.layer if rec.layer is None or isinstance(rec.layer, str) or rec.layer >= 0 \
        else layers + rec.layer
    if isinstance(layer, str):
        from lmlab.models.pooling import STRATEGIES
        from lmlab.utils.checks import check_names

        check_names([layer], list(STRATEGIES), "layer", "feature strategy")
    elif layer is not None and not 0 <= layer < layers:
        raise LmlabError(f"layer {rec.layer} does not exist: the encoder gives {layers} hidden "
                         f"states", f"use 0 (embeddings) to {layers - 1}, -1 (last) or no layer "
                         "(a scalar mix of all)")
    return layer


def _feature_record(task: Task, model: nn.Module, tokenizer: Any, rec: Recipe,
                    layer: int | str | None, outputs: int, train: list) -> Any:
    """The run's record: a run folder with other settings, another encoder (its config and
    weights' checksum) or other training data is refused."""
    from lmlab.training.run_dir import RunRecord
    from lmlab.utils.io import stable_hash

    checksum = sum(float(p.detach().double().sum()) for p in model.parameters())  # the weights
    return RunRecord(
        hparams={"task": task.name, "recipe": rec.to_dict(),
                 "encoder": stable_hash([model.config.to_dict(), checksum]),
                 "train_data": stable_hash([(f.input_ids, f.label) for f in train])},
        model={"kind": "feature_head", "layers": model.config.num_hidden_layers + 1,
               "hidden": model.config.hidden_size, "outputs": outputs, "layer": layer,
               "pooling": feature_pooling(rec), "encoder_family": model.config.family},
        objective={"spec": FeatureObjective.name, "heads": []},
        data={"tokenizer_fingerprint": tokenizer.fingerprint()})


def _encoder_pass(model: nn.Module, encoded: dict[str, list], features_of: Any,
                  given: dict[str, torch.Tensor] | None, rec: Recipe, run: RunOptions,
                  out_dir: str | Path) -> tuple[dict[str, torch.Tensor], dict[str, Any], float]:
    """The train and dev features, what computing them cost (written as ``cost.json``/
    ``cost.md`` before the Trainer's report.md, which shows it) and how long it took."""
    from lmlab.cost.report import CostTracker

    started = time.perf_counter()
    device = next(model.parameters()).device
    tracker = CostTracker(model.config, rec.max_length, precision=run.precision,
                          device=device.type, head="none", training=False).start()
    x = {split: features_of(split, encoded[split]) for split in ("train", "dev")}
    for split in [s for s in ("train", "dev") if given is None or s not in given]:
        for feature in encoded[split]:  # each pass at its own length (features handed in
            tracker.add_tokens(len(feature.input_ids), seq_len=len(feature.input_ids))  # were
            # paid for by whoever computed them)
    tracker.stop()
    encode_seconds = time.perf_counter() - started
    cost = tracker.report()  # the recipe's cost is the encoder's pass; the head's is tiny
    if int(os.environ.get("RANK", 0)) == 0:
        cost.write(out_dir)
    return x, cost.to_dict(), encode_seconds


# -- a finished feature-based run as one model ----------------------------------------------------
class FeatureClassifier(nn.Module):
    """A feature-based run as one model: the frozen ``encoder`` (no heads) gives per-layer
    sentence vectors, its :class:`FeatureHead` classifies them. It answers where a model with a
    ``sequence-classification`` head is expected (``heads``, ``num_labels``/``id2label`` in
    ``config.extra``, ``task_logits``), so evaluation, loading and pipelines take it as any run.
    """

    forward_gives_task_logits = True  # task_logits calls the model itself, not a head

    def __init__(self, encoder: nn.Module, head: FeatureHead, pooling: str,
                 labels: list[str], max_length: int = 128):
        from lmlab.models.task_heads import SEQUENCE_CLASSIFICATION

        super().__init__()
        if encoder.heads:
            raise LmlabError(f"the encoder of a feature classifier must have no heads, not "
                             f"{', '.join(encoder.heads)}", "delete them first")
        check_choice(pooling, ("mean", "cls"), "pooling", "feature pooling")
        self.encoder = encoder
        self.heads = nn.ModuleDict({SEQUENCE_CLASSIFICATION: head})
        self.pooling = pooling
        self.labels = list(labels)
        self.max_length = max_length
        outputs = head.classifier.out_features
        encoder.config.extra["num_labels"] = outputs
        if self.labels and outputs == len(self.labels):
            encoder.config.extra["id2label"] = dict(enumerate(self.labels))

    @property
    def config(self):
        return self.encoder.config

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None,
                token_type_ids: torch.Tensor | None = None) -> torch.Tensor:
        """Logits (B, num_labels): the head runs in fp32 on fp32 features, as in training."""
        batch = {"input_ids": input_ids, "attention_mask": attention_mask,
                 "token_type_ids": token_type_ids}
        features = pooled_layer_states(self.encoder, batch, self.pooling)  # (B, L+1, H)
        head = next(iter(self.heads.values()))
        with torch.autocast(features.device.type, enabled=False):
            return head(features.to(head.classifier.weight.dtype))

    def save_pretrained(self, path: str | Path) -> Path:
        """The encoder's folder (Hugging Face where its family maps it, else lmlab's own) plus
        the head's weights and settings."""
        from safetensors.torch import save_file

        from lmlab.interop.native import save_model
        from lmlab.utils.io import atomic_path, atomic_write_json

        path, _ = save_model(self.encoder, Path(path))
        head = next(iter(self.heads.values()))
        with atomic_path(path / FEATURE_HEAD_WEIGHTS) as tmp:
            save_file({k: v.detach().contiguous().cpu() for k, v in head.state_dict().items()},
                      str(tmp))
        layers = head.mix.weights.numel() if head.mix is not None else None
        atomic_write_json(path / FEATURE_HEAD_CONFIG, {
            "layers": layers or self.config.num_hidden_layers + 1,
            "hidden": head.hidden, "outputs": head.classifier.out_features,
            "layer": head.layer, "pooling": self.pooling, "labels": self.labels,
            "max_length": self.max_length})
        return path


def load_feature_classifier(path: str | Path, head: str | list[str] | None = None,
                            dtype: torch.dtype | None = None) -> FeatureClassifier:
    """Load a feature-based run's model folder (what :meth:`FeatureClassifier.save_pretrained`
    wrote) in eval mode; ``dtype`` casts the encoder only (the head is tiny and stays fp32)."""
    from safetensors.torch import load_file

    from lmlab.interop.folders import load_plain
    from lmlab.models.task_heads import SEQUENCE_CLASSIFICATION
    from lmlab.utils.io import read_json

    path = Path(path)
    asked = [head] if isinstance(head, str) else list(head or [])
    if any(name != SEQUENCE_CLASSIFICATION for name in asked):
        raise LmlabError(f"{path} is a feature-based run: its only head is "
                         f"{SEQUENCE_CLASSIFICATION!r}, not {', '.join(asked)}",
                         "use it for text classification (or regression), or fine-tune a "
                         "model with that head")
    if not (path / "config.json").exists():
        raise LmlabError(f"{path} is a feature-based run saved without its encoder (by an "
                         "older lmlab)", "fine-tune it again with `lmlab finetune --recipe "
                         "feature`: runs now keep the encoder beside the head")
    settings = read_json(path / FEATURE_HEAD_CONFIG)
    encoder = load_plain(path, head=[], dtype=dtype)  # a Transformer, or ELMo
    feature_head = FeatureHead(settings["layers"], settings["hidden"], settings["outputs"],
                               settings["layer"])
    feature_head.load_state_dict(load_file(str(path / FEATURE_HEAD_WEIGHTS)))
    model = FeatureClassifier(encoder, feature_head, settings["pooling"], settings["labels"],
                              settings.get("max_length", 128))
    return model.eval()
