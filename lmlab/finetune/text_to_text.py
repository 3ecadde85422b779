"""Text-to-text training and prediction for encoder-decoders (T5's formulation: every task is
an input text and a target text) on the one Trainer: :func:`encode_pairs` (too long a target is
refused, not cut), :class:`PairStream`, :class:`TextToTextObjective` (teacher-forced token
cross-entropy), :func:`train_text_to_text`, and :func:`predict_texts` (greedy or beam search).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import torch
from torch import nn

from lmlab.finetune.data import Feature, TaskStream, collate, pad_id_of
from lmlab.tasks.types import TextPair
from lmlab.utils.errors import LmlabError


def encode_source(text: str, tokenizer: Any, max_length: int) -> list[int]:
    """A source's ids, cut to ``max_length`` tokens keeping its end-of-sequence token last."""
    ids = tokenizer.encode(text)
    if len(ids) <= max_length:
        return ids
    eos = tokenizer.eos_token_id
    return ids[:max_length - 1] + [eos] if eos is not None and ids[-1] == eos \
        else ids[:max_length]


def encode_pairs(pairs: Sequence[TextPair], tokenizer: Any, max_source_length: int,
                 max_target_length: int) -> list[Feature]:
    """Features with the source ids as ``input_ids`` and the target ids (end-of-sequence
    included) as ``label``. Sources longer than ``max_source_length`` are cut (their
    end-of-sequence token kept); a target longer than ``max_target_length`` is refused, with
    the count."""
    if not pairs:
        raise LmlabError("no (source, target) pairs to encode", "give a non-empty split")
    features, too_long = [], []
    for index, pair in enumerate(pairs):
        source = encode_source(pair.input_text, tokenizer, max_source_length)
        target = tokenizer.encode(pair.target)
        if len(target) > max_target_length:
            too_long.append(len(target))
            continue
        features.append(Feature(source, None, target, example_index=index))
    if too_long:
        raise LmlabError(
            f"{len(too_long)} of {len(pairs)} targets are longer than max_target_length="
            f"{max_target_length} tokens (the longest has {max(too_long)})",
            f"raise --max-target-length to {max(too_long)} (within the model's positions) or "
            "drop the long examples")
    return features


def collate_pairs(features: Sequence[Feature], pad_id: int) -> dict[str, torch.Tensor]:
    """Right-padded ``input_ids``/``attention_mask`` (B, S) and ``labels`` (B, T), -100 after
    each target (:func:`lmlab.objectives.seq2seq.pad_pairs`)."""
    from lmlab.objectives.seq2seq import pad_pairs

    return pad_pairs([f.input_ids for f in features], [f.label for f in features], pad_id)


class PairStream(TaskStream):
    """Endless training batches of (source, target) features, length-grouped by source."""

    def make_batch(self, indices: list[int]) -> dict[str, Any]:
        return collate_pairs([self.features[i] for i in indices], self.pad_id)


class TextToTextObjective(nn.Module):
    """Teacher-forced cross-entropy on the target tokens (the model shifts ``labels`` right
    behind its decoder start token); its mean is weighted by target tokens across
    micro-batches."""

    name = "text-to-text"
    flops_head = "clm"
    predicted_fraction = None  # every target token is predicted
    reports_perplexity = True

    def prepare(self, model: nn.Module) -> None:
        from lmlab.models.seq2seq import require_encoder_decoder

        require_encoder_decoder(model, "text-to-text training")
        model.add_head("seq2seq-lm")

    def compute_loss(self, model: nn.Module, batch: dict[str, torch.Tensor]):
        from lmlab.objectives.seq2seq import seq2seq_loss

        return seq2seq_loss(model, batch)


def train_text_to_text(model: nn.Module, tokenizer: Any, train: Sequence[TextPair],
                       dev: Sequence[TextPair], cfg: Any, out_dir: str | Path,
                       max_source_length: int = 256, max_target_length: int = 256,
                       eval_examples: int = 512, record: Any = None):
    """Train ``model`` on ``train`` under the :class:`TrainingConfig` ``cfg`` (its
    ``batch_size``, ``lr``, schedule, stop rules, precision), evaluating the loss on up to
    ``eval_examples`` dev pairs; writes ``out_dir/model`` (with the tokenizer) and the run's
    metrics, checkpoints and cost report. Returns the :class:`TrainResult`."""
    import tempfile

    from lmlab.finetune.train import TaskPlan, train_task

    objective = TextToTextObjective()
    objective.prepare(model)
    pad = pad_id_of(tokenizer)
    features = encode_pairs(train, tokenizer, max_source_length, max_target_length)
    plan = TaskPlan(None, None, PairStream(features, cfg.batch_size, pad, seed=cfg.seed),
                    replace(cfg))
    dev_features = encode_pairs(list(dev)[:eval_examples], tokenizer, max_source_length,
                                max_target_length) if dev else []
    eval_batches = [collate_pairs(dev_features[i:i + cfg.batch_size], pad)
                    for i in range(0, len(dev_features), cfg.batch_size)]
    with tempfile.TemporaryDirectory() as folder:
        tokenizer.save_pretrained(folder)
        return train_task(plan, model, objective, out_dir, save_model=True,
                          eval_batches=eval_batches, record=record, tokenizer_dir=folder).result


@torch.no_grad()
def predict_texts(model: nn.Module, tokenizer: Any, sources: Sequence[str], num_beams: int = 1,
                  num_return_sequences: int = 1, max_new_tokens: int = 128,
                  batch_size: int = 32, length_penalty: float = 1.0,
                  show_progress: bool = False) -> list[list[str]]:
    """For each source, its ``num_return_sequences`` best outputs (best first) as text.
    Sources longer than the model's positions are cut (end-of-sequence kept) and
    ``max_new_tokens`` is capped at what its decoder positions hold."""
    from lmlab.generation.generate import generate
    from lmlab.utils.progress import progress

    if num_return_sequences > num_beams:
        raise LmlabError(f"num_return_sequences={num_return_sequences} > num_beams={num_beams}",
                         "ask for at most as many hypotheses as beams")
    limit = getattr(model, "max_length", None)
    if limit is not None:
        max_new_tokens = min(max_new_tokens, limit - 1)  # position 0: the start token
    model.eval()
    pad = pad_id_of(tokenizer)
    device = next(model.parameters()).device
    order = sorted(range(len(sources)), key=lambda i: len(sources[i]))  # little padding
    results: list[list[str]] = [[] for _ in sources]
    starts = range(0, len(order), batch_size)
    for start in progress(starts, desc="decoding", unit="batch") if show_progress else starts:
        indices = order[start:start + batch_size]
        encoded = [encode_source(sources[i], tokenizer, limit or 1 << 30) for i in indices]
        batch = {k: v.to(device) for k, v in collate([Feature(row, None) for row in encoded],
                                                      pad).items()}  # (B, S), right-padded
        out = generate(model, batch["input_ids"], batch["attention_mask"], max_new_tokens=max_new_tokens, num_beams=num_beams,
                       num_return_sequences=num_return_sequences,
                       length_penalty=length_penalty, eos_token_id=tokenizer.eos_token_id,
                       pad_token_id=pad)
        texts = tokenizer.batch_decode(out[:, 1:].tolist(), skip_special_tokens=True)
        for k, index in enumerate(indices):
            results[index] = texts[k * num_return_sequences:(k + 1) * num_return_sequences]
    return results


# -- task folders (lmlab seq2seq train / evaluate) ------------------------------------------------
def build_seq2seq_model(family: str, tokenizer: Any, size: str | None = None,
                        layers: int | None = None, hidden: int | None = None,
                        dropout: float = 0.1, label_smoothing: float = 0.0,
                        max_positions: int = 512):
    """A fresh encoder-decoder of ``family`` sized to ``tokenizer``: the preset ``size`` (the
    family's smallest by default), with ``layers`` per stack and ``hidden`` width (heads of 64
    dims, FFN 4x) when given."""
    from lmlab.models.families import get_family
    from lmlab.models.seq2seq import EncoderDecoderModel, decoder_start_token

    spec = get_family(family)
    size = _fresh_model_settings(family, size, layers, hidden)["size"]
    values: dict[str, Any] = dict(spec.sizes[size])
    if layers is not None:
        values.update(num_hidden_layers=layers, num_decoder_layers=layers)
    if hidden is not None:
        values.update(hidden_size=hidden, num_attention_heads=max(1, hidden // 64),
                      intermediate_size=4 * hidden)
        if family in ("t5", "mt5"):
            values["head_dim"] = 64
    pad, eos = tokenizer.pad_token_id, tokenizer.eos_token_id
    if pad is None or eos is None:
        raise LmlabError("the tokenizer needs a pad and an end-of-sequence token",
                         "use a tokenizer with a t5 or roberta template")
    start = decoder_start_token(family, tokenizer)
    extra = {**spec.defaults.get("extra", {}), **values.pop("extra", {}),
             "decoder_start_token_id": start, "label_smoothing": float(label_smoothing)}
    positions = {"bart": max_positions + 2, "marian": max_positions}.get(family)
    config = spec.config(**values, vocab_size=len(tokenizer), pad_token_id=pad,
                         eos_token_id=eos, bos_token_id=tokenizer.bos_token_id,
                         hidden_dropout_prob=dropout, attention_probs_dropout_prob=dropout,
                         extra=extra, **({"max_position_embeddings": positions}
                                         if positions else {}))
    return EncoderDecoderModel(config, heads=("seq2seq-lm",))


def train_on_task(data: str | Path, out: str | Path, cfg: Any, family: str = "marian",
                  size: str | None = None, layers: int | None = None,
                  hidden: int | None = None, init: str | Path | None = None,
                  tokenizer: str | Path | None = None, dropout: float = 0.1,
                  label_smoothing: float = 0.0, max_source_length: int = 256,
                  max_target_length: int = 256, overwrite: bool = False):
    """Train an encoder-decoder on a task folder (:func:`lmlab.tasks.inverse.write_task_data`):
    from ``init`` (a pretrained folder and its tokenizer) or a fresh ``family`` model. The
    integration and decompile tasks build a symbol tokenizer from the train split; a text task
    trained from scratch needs ``tokenizer``.

    Every setting is checked, and ``out`` prepared, before the model is built: a run already
    there continues only when its data, tokenizer, model settings and lengths are these
    (otherwise it is refused, naming the difference, unless ``overwrite``)."""
    from lmlab.interop.folders import load_model
    from lmlab.tasks.inverse import VERIFIED_TASKS, read_task_data
    from lmlab.tokenization.symbols import symbol_tokenizer
    from lmlab.tokenization.tokenizer import Tokenizer
    from lmlab.training.distributed import process_device
    from lmlab.training.run_dir import RunRecord, prepare_run_folder, run_config
    from lmlab.training.trainer import seed_everything

    process_device(cfg.device)  # a GPU that is not there: refused before any work
    task, splits = read_task_data(data)
    if init is not None:
        tok = Tokenizer.from_pretrained(init)
    elif tokenizer is not None:
        tok = Tokenizer.from_pretrained(tokenizer)
    elif task in VERIFIED_TASKS:  # the train split's symbols; others read as <unk>
        tok = symbol_tokenizer({s for p in splits["train"]
                                for text in (p.input_text, *p.references) for s in text.split()})
    else:
        raise LmlabError(f"the {task} task needs a tokenizer when trained from scratch",
                         "pass --tokenizer FOLDER (e.g. one trained with lmlab tokenizer "
                         "train --corpus DATA/corpus --kind unigram --extra-ids 100), or "
                         "--init a pretrained model")
    if init is None:
        model_settings = _fresh_model_settings(family, size, layers, hidden)
    else:
        model_settings = {"init": str(init)}
    record = RunRecord(
        hparams={"task": task, **model_settings, "dropout": dropout if init is None else None,
                 "label_smoothing": label_smoothing, "max_source_length": max_source_length,
                 "max_target_length": max_target_length},
        data={"task_data": str(data), "task_fingerprint": _folder_fingerprint(data),
              "tokenizer_fingerprint": tok.fingerprint()})
    prepare_run_folder(Path(out), overwrite, run_config(cfg, record))
    seed_everything(cfg.seed)  # a fresh model's weights follow the run's seed
    if init is not None:
        model = load_model(init, head="seq2seq-lm")
        if not getattr(model.config, "is_encoder_decoder", False):
            raise LmlabError(f"{init} is not an encoder-decoder", "--init a T5, BART or "
                             "Marian folder")
        model.config.extra["label_smoothing"] = float(label_smoothing)
        model.train()
    else:
        model = build_seq2seq_model(family, tok, model_settings["size"], layers, hidden,
                                    dropout, label_smoothing,
                                    max(max_source_length, max_target_length))
    record.model = model.config.to_dict()
    return train_text_to_text(model, tok, splits["train"], splits["dev"], cfg, out,
                              max_source_length, max_target_length, record=record)


def _fresh_model_settings(family: str, size: str | None, layers: int | None,
                          hidden: int | None) -> dict[str, Any]:
    """A fresh model's settings, checked (the family an encoder-decoder, the size known)."""
    from lmlab.models.families import get_family
    from lmlab.utils.checks import check_choice

    spec = get_family(family)
    if not {**spec.defaults, **spec.shape}.get("is_encoder_decoder"):  # T5's is a default
        raise LmlabError(f"{family} is not an encoder-decoder family", "use marian, bart, t5 or mt5")
    size = check_choice(size or next(iter(spec.sizes)), spec.sizes, "--size", f"{family} size")
    return {"family": family, "size": size, "layers": layers, "hidden": hidden}


def _folder_fingerprint(data: str | Path) -> str:
    """SHA-256 of a task folder's task.json and split files (what resuming compares)."""
    import hashlib

    digest = hashlib.sha256()
    for name in ("task.json", "train.jsonl", "dev.jsonl", "test.jsonl"):
        digest.update((Path(data) / name).read_bytes())
    return digest.hexdigest()


def evaluate_on_task(model_dir: str | Path, data: str | Path, split: str = "test",
                     beams: Sequence[int] = (1,), max_examples: int | None = None,
                     max_new_tokens: int = 128, out: str | Path | None = None,
                     batch_size: int = 32) -> dict[str, Any]:
    """Decode ``split`` with each beam size (every beam's hypotheses count for the verified
    tasks, the best one for the text tasks) and score it; written to ``out`` as JSON when given."""
    from lmlab.interop.folders import load_model
    from lmlab.tasks.inverse import VERIFIED_TASKS, read_task_data, score, task_info
    from lmlab.tokenization.tokenizer import Tokenizer
    from lmlab.utils.catalog import resolve_model_dir
    from lmlab.utils.io import atomic_write_json

    task, splits = read_task_data(data)
    info = task_info(data)
    pairs = splits[split][:max_examples] if max_examples else splits[split]
    model = load_model(model_dir, head="seq2seq-lm").eval()
    tok = Tokenizer.from_pretrained(resolve_model_dir(model_dir))
    results: dict[str, Any] = {"task": task, "split": split, "examples": len(pairs)}
    for beam in beams:
        returned = beam if task in VERIFIED_TASKS else 1
        hypotheses = predict_texts(model, tok, [p.input_text for p in pairs], num_beams=beam,
                                   num_return_sequences=returned,
                                   max_new_tokens=max_new_tokens, batch_size=batch_size,
                                   show_progress=True)
        results[f"beam {beam}"] = score(task, pairs, hypotheses, info=info)
    if out is not None:
        atomic_write_json(out, results)
    return results
