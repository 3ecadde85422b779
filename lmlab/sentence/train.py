"""Training a sentence encoder on the one Trainer: Sentence-BERT's objectives on pairs,
skip-thought and quick-thought on a corpus's sentence order. The run's ``model/`` is a
sentence-transformers folder (quick-thought's ``g`` goes to ``context_model/``).
"""

from __future__ import annotations

import tempfile
from dataclasses import replace
from pathlib import Path
from typing import Any

from lmlab.utils.errors import LmlabError

OBJECTIVES = {
    "mnrl": "pairs",           # contrastive, in-batch negatives (SBERT / MultipleNegativesRanking)
    "softmax": "pairs",        # SBERT's classification objective softmax(W[u; v; |u-v|])
    "cosine": "pairs",         # SBERT's regression objective: MSE of cos(u, v) to the score
    "triplet": "pairs",        # SBERT's triplet objective: max(|a-p| - |a-n| + margin, 0)
    "skip-thought": "corpus",  # Kiros et al. 2015
    "quick-thought": "corpus",  # Logeswaran & Lee 2018
}
EVAL_EXAMPLES = 256


def _streams(objective: str, tok: Any, cfg: Any, data: str | Path, max_length: int,
             max_sentences: int | None) -> tuple[Any, list[dict[str, Any]], dict[str, Any]]:
    """(train stream, eval batches, data record) of ``objective`` (every check made here)."""
    from lmlab.sentence import data as sd
    from lmlab.sentence.pairs import pair_file, read_pairs
    from lmlab.utils.io import sha256_file

    if OBJECTIVES[objective] == "pairs":
        train_file = pair_file(data, "train")
        pairs = read_pairs(train_file)
        positives_only, triplets = objective == "mnrl", objective == "triplet"
        if objective == "cosine":
            _check_scores(pairs, train_file)
        stream = sd.PairStream(pairs, tok, cfg.batch_size, max_length, cfg.seed, positives_only,
                               triplets)
        dev_file = pair_file(data, "dev")
        eval_batches = []
        if dev_file != train_file and dev_file.is_file():
            dev = sd.PairStream(read_pairs(dev_file)[:EVAL_EXAMPLES], tok, cfg.batch_size,
                                max_length, cfg.seed, positives_only, triplets)
            eval_batches = [dev.make_batch(b) for b in dev.epoch_batches(0)]
        return stream, eval_batches, {"pairs": str(train_file),
                                      "pairs_sha256": sha256_file(train_file)}
    documents = sd.corpus_documents(data, "train", max_sentences)
    kind = sd.TripleStream if objective == "skip-thought" else sd.ContiguousStream
    stream = kind(documents, tok, cfg.batch_size, max_length, cfg.seed)
    eval_batches = []
    if (Path(data) / "validation.jsonl").is_file():
        held = sd.corpus_documents(data, "validation", EVAL_EXAMPLES)
        try:
            dev = kind(held, tok, cfg.batch_size, max_length, cfg.seed)
            eval_batches = [dev.make_batch(b) for b in dev.epoch_batches(0)]
        except LmlabError:  # a validation split too small to evaluate on: none
            eval_batches = []
    return stream, eval_batches, {"corpus": str(data), "max_sentences": max_sentences,
                                  "train_sha256": sha256_file(Path(data) / "train.jsonl")}


def _check_scores(pairs: list[Any], path: Path) -> None:
    """The regression objective's targets: a pair's score, else a label of 0 or 1."""
    for number, pair in enumerate(pairs, 1):
        if pair.score is None and pair.label > 1:
            raise LmlabError(f"{path}: pair {number} has label {pair.label} and no score: the "
                             "cosine objective regresses cos(u, v) on a score in [-1, 1]",
                             "give each pair a `score` (or labels 0 and 1 only)")


def build_objective(objective: str, model: Any, tok: Any, normalize: bool, scale: float,
                    num_labels: int, embedding_dim: int, decoder_hidden: int,
                    margin: float = 5.0, distance: str = "euclidean") -> Any:
    """The objective module named ``objective`` for ``model``."""
    from lmlab.sentence import objectives as so

    hidden = model.config.hidden_size
    if objective == "mnrl":
        return so.MultipleNegativesRanking(scale, normalize)
    if objective == "softmax":
        return so.PairClassification(hidden, num_labels, normalize)
    if objective == "cosine":
        return so.CosineRegression(normalize)
    if objective == "triplet":
        return so.Triplet(margin, distance, normalize)
    if objective == "skip-thought":
        from lmlab.objectives.skip_thought import SkipThought

        return SkipThought(len(tok), hidden, embedding_dim, decoder_hidden)
    from lmlab.objectives.quick_thought import QuickThought

    return QuickThought()


def train_sentence_encoder(objective: str, data: str | Path, out: str | Path, cfg: Any,
                           init: str | Path | None = None, size: str = "tiny",
                           tokenizer: str | Path | None = None, max_length: int = 128,
                           max_sentences: int | None = None, scale: float = 20.0,
                           num_labels: int | None = None, embedding_dim: int = 128,
                           decoder_hidden: int = 256, margin: float = 5.0,
                           distance: str = "euclidean", overwrite: bool = False) -> Any:
    """Train a sentence encoder with ``objective`` on ``data`` (pairs for ``mnrl``, ``softmax``,
    ``cosine`` and ``triplet``, a corpus for the others) under ``cfg``; returns the Trainer's
    result."""
    from lmlab.sentence.encoder import (
        DEFAULT_MAX_LENGTH,
        _sentence_transformers_settings,
        write_sentence_transformers_files,
    )
    from lmlab.tokenization.tokenizer import Tokenizer
    from lmlab.training.distributed import process_device
    from lmlab.training.run_dir import RunRecord, prepare_run_folder, run_config
    from lmlab.training.trainer import Trainer, seed_everything
    from lmlab.utils.catalog import resolve_model_dir
    from lmlab.utils.checks import check_choice

    check_choice(objective, OBJECTIVES, "--objective", "sentence objective")
    if objective == "triplet":
        from lmlab.sentence.objectives import Triplet

        Triplet(margin, distance)  # a bad margin or distance: refused before any work
    if max_length < 4:
        raise LmlabError(f"max_length {max_length}", "use at least 4 tokens")
    process_device(cfg.device)  # a GPU that is not there: refused before the run folder is touched
    tok = Tokenizer.from_pretrained(resolve_model_dir(init if init is not None
                                                      else tokenizer or "minilm"))
    stream, eval_batches, data_record = _streams(objective, tok, cfg, data, max_length,
                                                 max_sentences)
    if objective == "softmax":
        labels = sorted({p.label for p in stream.pairs})
        num_labels = num_labels or max(labels) + 1
        if labels[-1] >= num_labels:
            raise LmlabError(f"the pairs have label {labels[-1]}, beyond {num_labels} labels",
                             "raise --num-labels or fix the labels")
        num_labels = max(num_labels, 2)
    normalize, saved_length = False, max_length
    if init is not None:
        recorded_length, normalize = _sentence_transformers_settings(resolve_model_dir(init))
        saved_length = recorded_length or DEFAULT_MAX_LENGTH
    record = RunRecord(
        hparams={"sentence_objective": objective, "init": str(init) if init else None,
                 "size": None if init else size, "max_length": max_length, "scale": scale,
                 "num_labels": num_labels, "normalize": normalize,
                 "embedding_dim": embedding_dim if objective == "skip-thought" else None,
                 "decoder_hidden": decoder_hidden if objective == "skip-thought" else None,
                 **({"margin": margin, "distance": distance} if objective == "triplet" else {})},
        data={**data_record, "tokenizer_fingerprint": tok.fingerprint()},
        objective={"spec": objective, "heads": []})
    cfg = replace(cfg, seq_len=max_length)
    out = Path(out)
    prepare_run_folder(out, overwrite, run_config(cfg, record), what="sentence-encoder run")
    seed_everything(cfg.seed)
    model = _build_model(init, size, tok)
    record.model = model.config.to_dict()
    module = build_objective(objective, model, tok, normalize, scale, num_labels or 2,
                             embedding_dim, decoder_hidden, margin, distance)
    with tempfile.TemporaryDirectory() as folder:
        tok.save_pretrained(folder)
        trainer = Trainer(model, module, stream, cfg, out, eval_batches=eval_batches,
                          record=record, tokenizer_dir=folder, measure_peak=False,
                          track_cost=OBJECTIVES[objective] == "pairs")
        result = trainer.train()
    limit = min(saved_length, model.config.max_position_embeddings)
    write_sentence_transformers_files(out / "model", model.config.hidden_size, limit, normalize)
    if objective == "quick-thought":
        from lmlab.sentence.encoder import SentenceEncoder

        SentenceEncoder(module.context_encoder, tok, limit, normalize).save(out / "context_model")
    return result


def _build_model(init: str | Path | None, size: str, tok: Any) -> Any:
    """The encoder: ``init``'s weights, or a fresh lmlab BERT of preset ``size``."""
    from lmlab.load import from_pretrained
    from lmlab.models.model import LanguageModel
    from lmlab.models.presets import preset

    if init is not None:
        model = from_pretrained(init)
        if model.config.is_encoder_decoder or model.config.causal:
            raise LmlabError(f"{init} is not an encoder", "--init a BERT-like folder (minilm)")
        model.train()
        return model
    config = preset("bert", size, vocab_size=len(tok), pad_token_id=tok.pad_token_id or 0)
    return LanguageModel(config, with_pooler=False)
