"""``lmlab vectors train`` as one call: word2vec or GloVe on a corpus, written to a file, with
an optional run folder (resume, budget, cost)."""

from __future__ import annotations

from dataclasses import fields
from pathlib import Path
from typing import Any

from lmlab.training.loop_run import LoopRun, writes
from lmlab.utils.checks import check_choice, check_output_file
from lmlab.utils.durations import parse_duration
from lmlab.utils.errors import LmlabError
from lmlab.vectors import glove, word2vec
from lmlab.vectors.keyed import WordVectors, format_for, save_vectors
from lmlab.vectors.loop import loop_hparams
from lmlab.vectors.sentences import sentences_from

METHODS = ("skipgram", "cbow", "glove")
# the settings lmlab vectors train takes; each method reads those its config has
SETTINGS = ("dim", "window", "min_count", "max_vocab", "epochs", "negative", "sample", "alpha",
            "min_alpha", "x_max", "workers", "seed")


def vectors_config(method: str, **settings: Any) -> word2vec.Word2VecConfig | glove.GloveConfig:
    """The validated config of ``method`` from ``settings`` (None: the method's default; a
    setting the method lacks is ignored; GloVe's ``alpha`` is its AdaGrad learning rate)."""
    check_choice(method, METHODS, "--method", "method")
    if method == "glove":
        settings["learning_rate"] = settings.pop("alpha", None)  # GloVe's own alpha is f's power
        kind, fixed = glove.GloveConfig, {}
    else:
        kind, fixed = word2vec.Word2VecConfig, {"architecture": method}
    names = {field.name for field in fields(kind)}
    config = kind(**fixed, **{k: v for k, v in settings.items() if v is not None and k in names})
    config.validate()
    return config


def train_vectors_file(method: str, corpus: list[str], out: str, settings: dict[str, Any],
                       split: str = "train", format: str | None = None,
                       run_dir: str | None = None, budget: str | None = None,
                       checkpoint_every: str = "1m", overwrite: bool = False) -> WordVectors:
    """Train ``method`` vectors on ``corpus`` (an lmlab corpus folder or text files), write
    them to ``out`` (``format``, else from its suffix) and print what the run did. Every input
    is checked before any work; ``run_dir`` resumes a killed run, ``budget`` ends one."""
    config = vectors_config(method, **settings)
    budget_seconds = parse_duration(budget) if budget is not None else None
    checkpoint_seconds = parse_duration(checkpoint_every)
    check_output_file(out, overwrite or writes(run_dir, "vectors", out), "--out")
    fmt = format or format_for(out)
    sentences = sentences_from(corpus, split)
    files = [Path(c) for c in corpus if Path(c).is_file()]
    if files and all(f.stat().st_size == 0 for f in files):
        raise LmlabError(f"the corpus file{'s' if len(files) > 1 else ''} "
                         f"{', '.join(map(str, files))} {'are' if len(files) > 1 else 'is'} "
                         "empty", "give text with one sentence per line")
    run = LoopRun(run_dir, loop_hparams(config), speed={"workers": config.workers},
                  budget_seconds=budget_seconds, checkpoint_seconds=checkpoint_seconds,
                  overwrite=overwrite, what=f"{method} run", option="--run",
                  outputs={"vectors": str(Path(out).resolve())})
    if method == "glove":
        vectors, summary = glove.train_glove(sentences, config, run=run)
        print(f"GloVe: {summary.vocabulary} words, {summary.corpus_words} corpus words, "
              f"{summary.entries} non-zero co-occurrences; loss per entry "
              f"{_losses(summary.epoch_loss, 4)}; counted in {summary.count_seconds:.1f} s, "
              f"trained in {summary.train_seconds:.1f} s")
    else:
        vectors, summary = word2vec.train_word2vec(sentences, config, run=run)
        print(f"word2vec {method}: {summary.vocabulary} words, {summary.corpus_words} corpus "
              f"words x {config.epochs} epochs; loss per example "
              f"{_losses(summary.epoch_loss, 3)}; {summary.words_per_second:,.0f} words/s")
    save_vectors(vectors, out, fmt, overwrite=True)  # out was checked before any work
    if summary.stop_reason == "budget":
        print(f"stopped by the --budget of {budget}: a larger one on the same --run "
              "continues the run")
    print(f"cost of this session: {summary.cost['tokens']:,} "
          f"{'entries' if method == 'glove' else 'words'}, {summary.cost['flops']:.3g} FLOPs, "
          f"{summary.cost['wall_seconds']:.1f} s" + (f" ({run_dir}/cost.md)" if run_dir else ""))
    print(f"wrote {vectors} to {out} ({fmt})")
    return vectors


def _losses(epoch_loss: list[float], digits: int) -> str:
    """The first and the last epoch's loss (none when a budget ended the first epoch)."""
    if not epoch_loss:
        return "no epoch finished"
    return f"{epoch_loss[0]:.{digits}f} -> {epoch_loss[-1]:.{digits}f}"
