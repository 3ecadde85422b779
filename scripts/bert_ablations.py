"""BERT's ablations (Devlin et al. 2019) and Zhang & Bowman's data curve, at a 2-core scale.

One experiment per subcommand; every model is pretrained here on the same corpus (the default:
every installed source less the built-in tasks' dev/test texts), WordPiece vocabulary and
token budget (steps x batch x sequence length), then fine-tuned on the built-in tasks:

* ``size`` (Table 6): models of several layers x hidden sizes; held-out masked-LM perplexity (at
  15% masking) and fine-tuned dev accuracy per size.
* ``masking`` (Table 8): the [MASK]/same/random split of the chosen 15%: 80/10/10, 100/0/0,
  80/0/20, 80/20/0, 0/20/80, 0/0/100; fine-tuned and feature-based (frozen, the last four
  layers concatenated, as the paper's NER rows) dev accuracy.
* ``objectives`` (Table 5): MLM + NSP, MLM alone (no NSP), a left-to-right causal LM of the
  same size (no NSP), and that LM with a randomly initialised BiLSTM on top while fine-tuning.
* ``data-curve`` (Zhang & Bowman 2018): dev accuracy against the classifier's training
  examples, the pretrained model against the same architecture from random weights.

    python scripts/bert_ablations.py size --out docs/ablations/size
    python scripts/bert_ablations.py masking --out docs/ablations/masking
    python scripts/bert_ablations.py objectives --out docs/ablations/objectives
    python scripts/bert_ablations.py data-curve --out docs/ablations/data-curve

Every stage (corpus, tokens, each pretraining, each fine-tuning run) is cached under ``--work``
(lmlab.demo.stages: a finished stage is reused, an interrupted pretraining resumes). Writes
``NAME.json`` (every run, the host, the settings and the recorded seconds), ``NAME.md`` (median
and spread over seeds) and ``NAME.png`` into ``--out``; docs/ablations.md gives the budgets.
"""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path
from typing import Any

from lmlab.data.build import build_corpus
from lmlab.data.shards import build_shards
from lmlab.demo.analysis import masked_lm_score
from lmlab.demo.stages import StageLog, StageRunner
from lmlab.finetune.results import summarize_seeds
from lmlab.load import load_model_and_tokenizer
from lmlab.tasks import load_builtin_task
from lmlab.tasks.sampling import sample_examples
from lmlab.tokenization.tokenizer import Tokenizer
from lmlab.training.pretrain import PretrainConfig, pretrain
from lmlab.utils.checks import check_at_least
from lmlab.utils.errors import LmlabError
from lmlab.utils.host import describe_host

# Table 8's rows as (MASK, SAME, RND) in %, the paper's column order; the objective's
# ``replacement`` is (mask, random, keep)
MASKING_ROWS = ("80/10/10", "100/0/0", "80/0/20", "80/20/0", "0/20/80", "0/0/100")
ALL_TRAIN = -1  # data-curve's "all": the whole training split
OBJECTIVE_ROWS = ("mlm+nsp", "mlm", "ltr", "ltr+bilstm", "mlm@40")
PAIR_PROBE_BATCHES = 16  # of 64 segment pairs: their mean length sets a pair row's batch
TOKEN_TOLERANCE = 0.03  # a row whose pretraining read more than 3% off the budget is flagged
OBJECTIVE_NAMES = {"mlm+nsp": "BERT (MLM + NSP)", "mlm": "no NSP (MLM only)",
                   "ltr": "left-to-right LM, no NSP", "ltr+bilstm": "left-to-right + BiLSTM",
                   "mlm@40": "MLM only, 40% masked"}
# not a row of the paper's: MLM at the demo's 40% masking, 2.7x the predictions per token of
# 15%, the check on why left-to-right wins at this budget (docs/ablations.md)
DENSE_MASKING = {"mlm@40": 0.4}


def replacement(row: str) -> tuple[float, float, float]:
    """``"MASK/SAME/RND"`` in % -> the objective's (mask, random, keep) probabilities."""
    try:
        mask, same, rnd = (int(v) for v in row.split("/"))
    except ValueError:
        raise LmlabError(f"masking row {row!r} is not MASK/SAME/RND",
                         "write percentages, e.g. 80/10/10") from None
    if min(mask, same, rnd) < 0 or mask + same + rnd != 100:
        raise LmlabError(f"masking row {row!r} does not sum to 100",
                         "write percentages summing to 100, e.g. 80/10/10")
    return mask / 100, rnd / 100, same / 100


def parse_size(text: str) -> tuple[int, int]:
    """``"4x256"`` -> (layers, hidden)."""
    try:
        layers, hidden = (int(v) for v in text.lower().split("x"))
    except ValueError:
        raise LmlabError(f"model size {text!r} is not LAYERSxHIDDEN",
                         "write e.g. 4x256") from None
    if layers < 1 or hidden < 64 or hidden % 64:
        raise LmlabError(f"model size {text!r}: layers >= 1, hidden a multiple of 64",
                         "write e.g. 2x128, 4x256 (one head per 64 units)")
    return layers, hidden


def shape(layers: int, hidden: int) -> dict[str, Any]:
    """BERT's shape rules: a head per 64 units, a feed-forward of 4H; no dropout (the demo's
    recipe for short pretraining)."""
    return {"num_hidden_layers": layers, "hidden_size": hidden,
            "num_attention_heads": hidden // 64, "intermediate_size": 4 * hidden,
            "hidden_dropout_prob": 0.0, "attention_probs_dropout_prob": 0.0}


class Experiment:
    """The shared stages: corpus, tokens, pretraining runs and fine-tuning runs."""

    def __init__(self, args: argparse.Namespace):
        self.args = args
        self.log = StageLog()
        self.stages = StageRunner(args.work, log=self.log)
        self.seeds = [int(s) for s in args.seeds.split(",") if s.strip()]
        self.tasks = [self._task(name) for name in args.tasks.split(",")]
        self.tokens = self._tokens()
        self.flagged: list[str] = []

    def _task(self, name: str):
        from dataclasses import replace

        task = load_builtin_task(name, "cpu")
        if self.args.max_eval_examples:
            task = replace(task, splits={**task.splits, **{
                split: sample_examples(task.split(split), self.args.max_eval_examples)
                for split in ("dev", "test")}})
        return task

    def _tokens(self) -> Path:
        args = self.args
        sources = args.sources.split(",") if args.sources else None

        def corpus(folder: Path) -> dict[str, Any]:
            manifest = build_corpus(sources, folder / "corpus", max_documents=args.max_documents,
                                    validation_fraction=args.validation_fraction)
            return {"words": manifest["total_words"]}

        corpus_folder, words = self.stages.run(
            "corpus", {"sources": sources, "max_documents": args.max_documents,
                       "validation": args.validation_fraction}, corpus)

        def tokens(folder: Path) -> dict[str, Any]:
            tokenizer = Tokenizer.train(corpus_folder / "corpus", kind="wordpiece",
                                        vocab_size=args.vocab_size, show_progress=False)
            tokenizer.save_pretrained(folder / "tokenizer")
            build_shards(tokenizer, corpus_folder / "corpus", folder / "shards",
                         show_progress=False)
            return {"vocab_size": len(tokenizer)}

        folder, _ = self.stages.run("tokens", {"corpus": words, "vocab": args.vocab_size}, tokens)
        return folder

    def budget(self) -> dict[str, Any]:
        a = self.args
        return {"pretrain_steps": a.steps, "batch_size": a.batch_size, "seq_len": a.seq_len,
                "pretrain_tokens": a.steps * a.batch_size * a.seq_len, "lr": a.lr,
                "warmup_fraction": a.warmup_fraction, "finetune_epochs": a.finetune_epochs,
                "seeds": self.seeds}

    def batch_for(self, objective: str) -> int:
        """The batch (examples) that holds ``batch_size x seq_len`` tokens on average.

        Packed windows hold ``seq_len`` each. BERT fills a segment pair to the target length
        only within a document (a pair ends where its document does), and the default
        corpus's documents are short (median 24 pieces), so a pair objective's batch grows
        until it reads as many tokens per update as the packed rows: equal steps, equal tokens.
        """
        from lmlab.data.pretraining import PretrainingStream
        from lmlab.objectives.registry import build_objective
        from lmlab.objectives.special_tokens import SpecialTokens

        a = self.args
        special = SpecialTokens.from_tokenizer(
            Tokenizer.from_pretrained(self.tokens / "tokenizer"))
        probe = build_objective(objective, special)
        if getattr(probe, "example_format", "packed") != "segment_pairs":
            return a.batch_size
        stream = PretrainingStream(self.tokens / "shards", objective=probe, batch_size=64,
                                   seq_len=a.seq_len, seed=0)
        tokens = examples = 0
        for _, batch in zip(range(PAIR_PROBE_BATCHES), stream):
            tokens += int(batch["attention_mask"].sum())
            examples += int(batch["attention_mask"].shape[0])
        return max(a.batch_size, round(a.batch_size * a.seq_len * examples / tokens))

    def pretrain(self, name: str, model_args: dict[str, Any], objective: str = "mlm",
                 objective_args: dict[str, Any] | None = None) -> dict[str, Any]:
        """One model pretrained on the shared tokens; returns its folder and eval loss."""
        a = self.args
        # the budget is tokens: every row stops at the same count (a pair objective's larger
        # batch, batch_for, keeps its steps near --steps too)
        settings = {"family": a.family, "size": "base", "model_args": model_args,
                    "objective": objective, "objective_args": objective_args or {},
                    "seq_len": a.seq_len, "batch_size": self.batch_for(objective), "lr": a.lr,
                    "warmup_fraction": a.warmup_fraction, "schedule": "linear",
                    "max_tokens": self.budget()["pretrain_tokens"], "seed": 0}

        def train(folder: Path) -> dict[str, Any]:
            every = max(a.steps // 4, 1)
            result = pretrain(PretrainConfig.from_sections(
                None, out=folder / "run", shards=self.tokens / "shards",
                tokenizer=str(self.tokens / "tokenizer"), threads=a.threads, precision="fp32",
                eval_every=every, eval_batches=4, save_every=every, progress=False,
                **settings))
            return {"steps": result.step, "tokens": result.tokens,
                    "batch_size": settings["batch_size"],
                    "eval_loss": (result.last_eval or {}).get("eval_loss")}

        folder, info = self.stages.run(f"pretrain-{name}", {"tokens": self.tokens.name,
                                                            **settings}, train, resumable=True)
        print(f"pretrained {name}: {info}", flush=True)
        return {**info, "model": folder / "run" / "model", "stage": folder.name}

    def finetune(self, model: dict[str, Any], task, seed: int, random_init: bool = False,
                 feature: bool = False, max_train: int | None = None) -> dict[str, Any]:
        """One fine-tuning run (or, ``feature``, a head on the frozen last four layers)."""
        a = self.args
        settings: dict[str, Any] = (
            {"recipe": "feature", "layer": "concat_last_four"} if feature else
            {"recipe": "bert", "epochs": a.finetune_epochs, "lr": a.finetune_lr,
             "batch_size": 32, "pooling": "mean", "min_updates": a.min_updates})
        # max_train: that many examples, ALL_TRAIN the whole split, None --max-train-examples
        settings["max_train_examples"] = (None if max_train == ALL_TRAIN else
                                          max_train or a.max_train_examples or None)

        def work(folder: Path) -> dict[str, Any]:
            from lmlab.finetune.runner import finetune

            result = finetune(task, model["model"], folder / "run", seed=seed,
                              random_init=random_init, save_model=False, show_progress=False,
                              precision="fp32", **settings)
            return {k: result.get(k) for k in ("dev", "test", "best_epoch", "train_seconds")}

        kind = "random" if random_init else "feature" if feature else "finetuned"
        return self.stages.run(f"finetune-{task.name}-{kind}-seed{seed}", {
            "model": model["stage"], "random": random_init, "task": task.name, "seed": seed,
            "max_eval": a.max_eval_examples, **settings}, work)[1]

    def scores(self, model: dict[str, Any], **options: Any) -> dict[str, dict[str, Any]]:
        """Per task, the median and spread of dev and test accuracy over the seeds."""
        out = {}
        for task in self.tasks:
            runs = [self.finetune(model, task, seed, **options) for seed in self.seeds]
            metric = task.metrics[0]
            out[task.name] = {split: summarize_seeds(runs, split)[metric]
                              for split in ("dev", "test")}
        return out

    def write(self, name: str, rows: list[dict[str, Any]], table: str, plot) -> None:
        from lmlab.analysis.report import write_files

        host = describe_host(self.args.threads)
        budget = {**self.budget(), "recorded_seconds": round(self.log.recorded_seconds(), 1)}
        self.flagged = flag_tokens(rows, budget["pretrain_tokens"])
        head = (f"Host: {host}. Budget: {budget['pretrain_tokens']:,} pretraining tokens per "
                f"model ({budget['pretrain_steps']} steps x {budget['batch_size']} x "
                f"{budget['seq_len']}; lr {budget['lr']:g}, {budget['warmup_fraction']:.0%} "
                f"warmup, linear decay), fine-tuning {budget['finetune_epochs']} epochs, seeds "
                f"{self.args.seeds}; {budget['recorded_seconds'] / 60:.1f} min recorded.\n\n")
        if self.flagged:
            head += (f"**Not comparable:** {', '.join(self.flagged)} read more than "
                     f"{TOKEN_TOLERANCE:.0%} away from the budget's tokens.\n\n")
            print(f"warning: {head.split(chr(10))[-3]}", file=sys.stderr)
        write_files(self.args.out, {f"{name}.json": {"host": host, "budget": budget,
                                                     "settings": vars(self.args), "rows": rows},
                                    f"{name}.md": head + table,
                                    f"{name}.png": plot})
        print(head + table, end="")


def flag_tokens(rows: list[dict[str, Any]], budget: int) -> list[str]:
    """The rows whose pretraining tokens (each run's own count) are more than
    ``TOKEN_TOLERANCE`` off ``budget``; each row gets ``tokens_ok``."""
    for row in rows:
        row["tokens_ok"] = abs(row["tokens"] - budget) <= TOKEN_TOLERANCE * budget
    return [row["name"] for row in rows if not row["tokens_ok"]]


def read(model: dict[str, Any]) -> dict[str, Any]:
    """What a pretraining run reported reading: tokens, optimizer steps, batch (examples)."""
    return {"tokens": model["tokens"], "steps": model["steps"],
            "batch": model.get("batch_size")}


def cell(summary: dict[str, Any]) -> str:
    """Median (spread) in %."""
    text = f"{100 * summary['median']:.1f}"
    return text if summary["n"] == 1 else f"{text} ({100 * summary['spread']:.1f})"


def task_table(rows: list[dict[str, Any]], label: str, extra: tuple[str, ...] = (),
               kinds: tuple[str, ...] = ("finetuned",)) -> str:
    """One row per experiment row: the ``extra`` columns, then dev accuracy per task and kind."""
    tasks = list(rows[0][kinds[0]])
    heads = [f"{t} dev ({k})" if len(kinds) > 1 else f"{t} dev" for k in kinds for t in tasks]
    lines = [f"| {label} | {' | '.join([*extra, *heads])} |",
             "|---|" + "---:|" * (len(extra) + len(heads))]
    for row in rows:
        cells = [f"{row[e]:,}" if isinstance(row[e], int) else str(row[e]) for e in extra]
        cells += [cell(row[k][t]["dev"]) for k in kinds for t in tasks]
        lines.append(f"| {row['name']} | {' | '.join(cells)} |")
    return "\n".join(lines) + "\n\nDev accuracy in %, median (spread = max - min) over seeds.\n"


def bar_plot(rows: list[dict[str, Any]], kinds: tuple[str, ...], title: str):
    def draw(path: Path) -> None:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        tasks = list(rows[0][kinds[0]])
        fig, axes = plt.subplots(1, len(tasks), figsize=(5 * len(tasks), 3.5), squeeze=False)
        width = 0.8 / len(kinds)
        for ax, task in zip(axes[0], tasks):
            for k, kind in enumerate(kinds):
                values = [100 * r[kind][task]["dev"]["median"] for r in rows]
                spread = [100 * r[kind][task]["dev"]["spread"] for r in rows]
                ax.bar([i + k * width for i in range(len(rows))], values, width, yerr=spread,
                       label=kind)
            ax.set_xticks([i + width * (len(kinds) - 1) / 2 for i in range(len(rows))],
                          [r["name"] for r in rows], rotation=30, ha="right", fontsize=8)
            ax.set_title(task)
            ax.set_ylabel("dev accuracy (%)")
            if len(kinds) > 1:
                ax.legend(fontsize=8)
        fig.suptitle(title)
        fig.tight_layout()
        fig.savefig(path, dpi=120)
        plt.close(fig)

    return draw


def run_size(exp: Experiment) -> None:
    """Table 6: pretrain each size, score held-out MLM perplexity, fine-tune."""
    rows = []
    for text in exp.args.sizes.split(","):
        layers, hidden = parse_size(text)
        model = exp.pretrain(f"mlm-{layers}x{hidden}", shape(layers, hidden))
        score = masked_lm_score(model["model"], exp.tokens / "shards", seq_len=exp.args.seq_len,
                                batches=exp.args.eval_batches)
        params = sum(p.numel() for p in load_model_and_tokenizer(model["model"])[0].parameters())
        rows.append({"name": f"L={layers}, H={hidden}, A={hidden // 64}", "layers": layers,
                     "hidden": hidden, "params": params, **read(model), "mlm_loss": score["loss"],
                     "ppl": round(math.exp(score["loss"]), 2), "finetuned": exp.scores(model)})
    table = task_table(rows, "model", ("params", "tokens", "steps", "ppl"))
    table += "\nppl: held-out masked-LM perplexity at 15% masking (validation split).\n"

    def draw(path: Path) -> None:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        fig, (left, right) = plt.subplots(1, 2, figsize=(10, 3.5))
        params = [r["params"] for r in rows]
        left.plot(params, [r["ppl"] for r in rows], "o-")
        left.set(xscale="log", xlabel="parameters", ylabel="held-out MLM perplexity")
        for task in rows[0]["finetuned"]:
            med = [100 * r["finetuned"][task]["dev"]["median"] for r in rows]
            err = [100 * r["finetuned"][task]["dev"]["spread"] / 2 for r in rows]
            right.errorbar(params, med, yerr=err, marker="o", label=task, capsize=3)
        right.set(xscale="log", xlabel="parameters", ylabel="dev accuracy (%)")
        right.legend(fontsize=8)
        fig.suptitle("BERT Table 6: model size")
        fig.tight_layout()
        fig.savefig(path, dpi=120)
        plt.close(fig)

    exp.write("size", rows, table, draw)


def run_masking(exp: Experiment) -> None:
    """Table 8: one model per replacement split, fine-tuned and feature-based."""
    model_args = shape(exp.args.layers, exp.args.hidden)
    rows = []
    for row in exp.args.rows.split(","):
        mask, rnd, keep = replacement(row)
        model = exp.pretrain(f"masking-{row.replace('/', '-')}", model_args, "mlm",
                             {"mask_prob": 0.15, "replacement": [mask, rnd, keep]})
        # held out, the same for every row: 15% chosen, every one masked (context alone)
        score = masked_lm_score(model["model"], exp.tokens / "shards", seq_len=exp.args.seq_len,
                                batches=exp.args.eval_batches, replacement=(1.0, 0.0, 0.0))
        rows.append({"name": row, "replacement": [mask, rnd, keep], **read(model),
                     "held-out loss": f"{score['loss']:.2f}",
                     "held-out accuracy": f"{100 * score['accuracy']:.1f}",
                     "finetuned": exp.scores(model), "feature": exp.scores(model, feature=True)})
    table = task_table(rows, "MASK/SAME/RND",
                       ("tokens", "held-out loss", "held-out accuracy"),
                       kinds=("finetuned", "feature"))
    table += ("\nheld-out loss and accuracy (%): masked-LM prediction of 15% of the validation "
              "split's tokens, every one replaced by [MASK] (context alone, the same test for "
              "every row). feature: the frozen model's last four layers concatenated "
              "(mean-pooled), a linear head trained (the `feature` recipe).\n")
    exp.write("masking", rows, table,
              bar_plot(rows, ("finetuned", "feature"), "BERT Table 8: masking strategies"))


def run_objectives(exp: Experiment) -> None:
    """Table 5: MLM + NSP, MLM only, left-to-right, left-to-right + BiLSTM."""
    model_args = shape(exp.args.layers, exp.args.hidden)
    rows = []
    for name in exp.args.rows.split(","):
        if name not in OBJECTIVE_ROWS:
            raise LmlabError(f"unknown row {name!r}", f"use {', '.join(OBJECTIVE_ROWS)}")
        ltr = name.startswith("ltr")
        stage = "mlm-nsp" if name == "mlm+nsp" else f"mlm-{exp.args.layers}x{exp.args.hidden}"
        if name in DENSE_MASKING:
            model = exp.pretrain(f"{stage}-masked{round(100 * DENSE_MASKING[name])}", model_args,
                                 "mlm", {"mask_prob": DENSE_MASKING[name]})
        else:
            model = exp.pretrain("ltr" if ltr else stage,
                                 {**model_args, "causal": True} if ltr else model_args,
                                 "clm" if ltr else name.replace("+", ","))
        # held out: the masked rows at 15% on the same packed validation windows (size's
        # figure); the causal model's next-token loss is another quantity
        loss = model["eval_loss"] if ltr else masked_lm_score(
            model["model"], exp.tokens / "shards", seq_len=exp.args.seq_len,
            batches=exp.args.eval_batches)["loss"]
        if name == "ltr+bilstm":
            model = with_bilstm(exp, model)
        rows.append({"name": OBJECTIVE_NAMES[name], **read(model),
                     "held-out loss": f"{loss:.2f} ({'next token' if ltr else 'MLM'})",
                     "finetuned": exp.scores(model)})
    table = task_table(rows, "pretraining", ("tokens", "steps", "batch", "held-out loss"))
    table += ("\nThe left-to-right model is the same stack with causal attention, pretrained "
              "with next-token prediction on the same tokens (it stays causal when fine-tuned);"
              " + BiLSTM: a randomly initialised BiLSTM (H/2 units each way) on its states, "
              "trained with the classifier. tokens, steps, batch: what each pretraining run "
              "reported (segment pairs end with their document, so the NSP row's batch holds "
              "more, shorter examples); held-out MLM loss at 15% masking on the validation "
              "split's packed windows.\n")
    exp.write("objectives", rows, table,
              bar_plot(rows, ("finetuned",), "BERT Table 5: pretraining tasks"))


def with_bilstm(exp: Experiment, model: dict[str, Any]) -> dict[str, Any]:
    """The pretrained model's folder with ``classifier_bilstm`` set (its task head grows one)."""
    def work(folder: Path) -> dict[str, Any]:
        from lmlab.interop.native import save_pretrained

        loaded, tokenizer = load_model_and_tokenizer(model["model"])
        loaded.config.extra["classifier_bilstm"] = True
        save_pretrained(loaded, folder / "model")
        tokenizer.save_pretrained(folder / "model")
        return {}

    folder, _ = exp.stages.run("bilstm", {"model": model["stage"]}, work)
    return {**model, "model": folder / "model", "stage": folder.name}


def run_data_curve(exp: Experiment) -> None:
    """Zhang & Bowman: dev accuracy by training examples, pretrained and random init."""
    # the objectives experiment's MLM-only model (one stage, shared)
    model = exp.pretrain(f"mlm-{exp.args.layers}x{exp.args.hidden}",
                         shape(exp.args.layers, exp.args.hidden))
    rows = []
    for count in exp.args.train_sizes.split(","):
        limit = ALL_TRAIN if count == "all" else int(count)
        rows.append({"name": count, "examples": None if limit == ALL_TRAIN else limit,
                     **read(model),
                     "pretrained": exp.scores(model, max_train=limit),
                     "random": exp.scores(model, max_train=limit, random_init=True)})
    table = task_table(rows, "training examples", kinds=("pretrained", "random"))

    def draw(path: Path) -> None:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        tasks = list(rows[0]["pretrained"])
        fig, axes = plt.subplots(1, len(tasks), figsize=(5 * len(tasks), 3.5), squeeze=False)
        for ax, task in zip(axes[0], tasks):
            full = len(next(t for t in exp.tasks if t.name == task).split("train"))
            sizes = [r["examples"] or full for r in rows]
            for kind in ("pretrained", "random"):
                med = [100 * r[kind][task]["dev"]["median"] for r in rows]
                err = [100 * r[kind][task]["dev"]["spread"] / 2 for r in rows]
                ax.errorbar(sizes, med, yerr=err, marker="o", capsize=3, label=kind)
            ax.set(xscale="log", xlabel="training examples", ylabel="dev accuracy (%)",
                   title=task)
            ax.legend(fontsize=8)
        fig.suptitle("Zhang & Bowman: classifier training data")
        fig.tight_layout()
        fig.savefig(path, dpi=120)
        plt.close(fig)

    exp.write("data-curve", rows, table, draw)


EXPERIMENTS = {"size": run_size, "masking": run_masking, "objectives": run_objectives,
               "data-curve": run_data_curve}
DEFAULT_ROWS = {"masking": ",".join(MASKING_ROWS), "objectives": ",".join(OBJECTIVE_ROWS)}


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("experiment", choices=list(EXPERIMENTS))
    p.add_argument("--out", required=True, help="folder for NAME.json, NAME.md, NAME.png")
    p.add_argument("--work", default="runs/bert-ablations", help="stage cache folder")
    p.add_argument("--sources", help="corpus sources (default: every installed one)")
    p.add_argument("--max-documents", type=int, help="per source (quick runs)")
    p.add_argument("--validation-fraction", type=float, default=0.02,
                   help="of the corpus, held out (size: its masked-LM perplexity)")
    p.add_argument("--vocab-size", type=int, default=8192)
    p.add_argument("--family", default="roformer",
                   help="BERT with rotary positions (the demo's choice: it learns in minutes)")
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--hidden", type=int, default=128)
    p.add_argument("--sizes", default="1x128,2x128,4x128,4x256", help="size: LAYERSxHIDDEN,...")
    p.add_argument("--rows", help="masking: MASK/SAME/RND,...; objectives: "
                   f"{','.join(OBJECTIVE_ROWS)}")
    p.add_argument("--train-sizes", default="50,200,1000,all", help="data-curve: examples")
    p.add_argument("--steps", type=int, default=1600)
    p.add_argument("--batch-size", type=int, default=8)
    p.add_argument("--seq-len", type=int, default=128)
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--warmup-fraction", type=float, default=0.06)
    p.add_argument("--eval-batches", type=int, default=16, help="size: held-out MLM batches")
    p.add_argument("--tasks", default="fortunes-topic,wordnet-supersense")
    p.add_argument("--seeds", default="0,1,2")
    p.add_argument("--finetune-epochs", type=int, default=3)
    p.add_argument("--finetune-lr", type=float, default=3e-4)
    p.add_argument("--min-updates", type=int, default=0,
                   help="fine-tune at least this many updates (small training sets)")
    p.add_argument("--max-train-examples", type=int, default=1000,
                   help="a stratified sample of each task's training split (0: all)")
    p.add_argument("--max-eval-examples", type=int, default=500,
                   help="a stratified sample of dev and of test (0: all)")
    p.add_argument("--threads", type=int, default=2)
    args = p.parse_args(argv)
    args.rows = args.rows or DEFAULT_ROWS.get(args.experiment, "")
    for name in ("vocab_size", "layers", "hidden", "steps", "batch_size", "seq_len",
                 "eval_batches", "finetune_epochs", "threads", "max_documents"):
        check_at_least(getattr(args, name), 1, f"--{name.replace('_', '-')}")
    if not 0 <= args.warmup_fraction < 1:
        raise LmlabError(f"--warmup-fraction {args.warmup_fraction} is outside [0, 1)",
                         "give a fraction of the pretraining, e.g. 0.06")
    for name in ("max_train_examples", "max_eval_examples"):
        check_at_least(getattr(args, name), 0, f"--{name.replace('_', '-')}")
    if args.experiment == "size":
        [parse_size(s) for s in args.sizes.split(",")]
    if args.experiment == "masking":
        [replacement(r) for r in args.rows.split(",")]
    if args.experiment == "objectives":
        unknown = set(args.rows.split(",")) - set(OBJECTIVE_ROWS)
        if unknown:
            raise LmlabError(f"unknown rows {', '.join(sorted(unknown))}",
                             f"use {', '.join(OBJECTIVE_ROWS)}")
    if args.experiment == "data-curve":
        for count in args.train_sizes.split(","):
            if count != "all" and not (count.isdigit() and int(count) > 0):
                raise LmlabError(f"--train-sizes {count!r} is not a count",
                                 "write counts or 'all', e.g. 50,200,1000,all")
    return args


def main(argv: list[str] | None = None) -> int:
    try:
        args = parse_args(argv)
        exp = Experiment(args)
        EXPERIMENTS[args.experiment](exp)
    except LmlabError as error:
        print(f"error: {error.problem}\nfix: {error.fix}", file=sys.stderr)
        return 2
    return 3 if exp.flagged else 0


if __name__ == "__main__":
    sys.exit(main())
