"""Shared plumbing for CLI modules: the parser, command groups, examples in every --help."""

from __future__ import annotations

import argparse
import textwrap
from collections.abc import Callable
from typing import Any

from lmlab.training.config import PRECISIONS

Handler = Callable[[argparse.Namespace], Any]

# What each command group is for (shown in ``lmlab --help`` and the group's own --help).
GROUP_HELP = {
    "compress": "make a model smaller: prune heads or weights (lottery tickets), factorise "
                "linear layers",
    "cost": "estimate and measure what training costs: FLOPs, MFU, time, energy, CO2, money",
    "data": "corpora and token shards: list the offline sources, build a corpus, tokenize it",
    "export": "write a model for another runtime: ONNX (onnxruntime), GGUF (llama.cpp)",
    "models": "offline pretrained checkpoints known by short name (minilm, smollm2)",
    "runs": "look at run directories written by `lmlab pretrain`",
    "sentence": "sentence encoders: WordNet pairs, Sentence-BERT / skip-thought / quick-thought "
                "training, Lee / WiC / gloss-retrieval evaluation",
    "tasks": "the built-in downstream tasks: list them, export their evaluation texts",
    "tokenizer": "train a WordPiece / BPE / Unigram tokenizer and encode text with it",
    "vectors": "static word vectors: evaluate (similarity, analogies), convert formats, align "
               "two spaces",
}


class HelpFormatter(argparse.RawDescriptionHelpFormatter):
    """Keeps epilog examples as written and never breaks a name at a hyphen
    (``small-generator-released`` stays one word in the option help)."""

    def _split_lines(self, text: str, width: int) -> list[str]:
        return textwrap.wrap(" ".join(text.split()), width, break_on_hyphens=False)

    def _get_help_string(self, action: argparse.Action) -> str:
        """The help, with the flag's default when it has one the help does not name."""
        help = action.help or ""
        if action.default in (None, False, [], "", argparse.SUPPRESS) or "default" in help:
            return help
        return f"{help} (default: %(default)s)"


class CommandRegistry:
    """Lets each CLI module add top-level commands (``lmlab pretrain``) or commands inside a
    group shared by several modules (``lmlab data build`` and ``lmlab data tokenize``).

    Every parser gets an "example:" section in its --help: a command shows the example it was
    given, a group the examples of its commands (collected as they are added, so the group's
    help cannot disagree with them).
    """

    def __init__(self, subparsers: argparse._SubParsersAction):
        self._subparsers = subparsers
        self._groups: dict[str, argparse._SubParsersAction] = {}
        self._group_parsers: dict[str, argparse.ArgumentParser] = {}
        self._group_examples: dict[str, list[str]] = {}

    def command(self, name: str, help: str, example: str, handler: Handler,
                group: str | None = None, description: str | None = None) -> argparse.ArgumentParser:
        """Add a command; ``example`` is shown under "example:" in its --help (and its group's).

        Returns the command's parser so the caller can add arguments.
        """
        parent = self._subparsers if group is None else self.group(group)
        parser = parent.add_parser(
            name, help=help, description=description or help,
            epilog=f"example:\n  {example}", formatter_class=HelpFormatter,
        )
        parser.set_defaults(handler=handler)
        if group is not None:
            self._add_group_example(group, example)
        return parser

    def group(self, name: str) -> argparse._SubParsersAction:
        """The sub-command set of group ``name`` (created on first use, described by
        :data:`GROUP_HELP`; its "example:" section lists the examples of its commands)."""
        if name not in self._groups:
            help = GROUP_HELP.get(name, f"{name} commands")
            parser = self._subparsers.add_parser(name, help=help, description=help,
                                                 formatter_class=HelpFormatter)
            parser.set_defaults(handler=lambda _args, p=parser: p.print_help())
            self._groups[name] = parser.add_subparsers(title="commands", metavar="COMMAND")
            self._group_parsers[name] = parser
            self._group_examples[name] = []
        return self._groups[name]

    def _add_group_example(self, group: str, example: str) -> None:
        examples = self._group_examples[group]
        if example not in examples:
            examples.append(example)
        self._group_parsers[group].epilog = "example:\n" + "\n".join(f"  {e}" for e in examples)


# -- flags declared once per concept ----------------------------------------------------------
MODEL_HELP = "model folder, lmlab run directory or short name (minilm)"
PRECISION_HELP = ("auto: bf16 where this host's measured bf16 matmul rate is at least 1.2x "
                  "fp32's (lmlab cost peak), else fp32")
AUTO_PRECISION_HELP = "default " + PRECISION_HELP  # a command whose default None means auto

#: the flags several commands take, each declared here once (a command may pass its own
#: default or help); add_flags names them by dest: ``batch_size`` is ``--batch-size``
FLAGS: dict[str, dict[str, Any]] = {
    "seed": {"type": int, "default": 0, "help": "random seed"},
    "lr": {"type": float, "help": "peak learning rate"},
    "batch_size": {"type": int, "help": "examples per optimizer step"},
    "max_length": {"type": int, "help": "tokens per sequence"},
    "epochs": {"type": int, "help": "passes over the training split"},
    "steps": {"type": int, "help": "optimizer steps"},
    "budget": {"help": "wall-clock training time limit, e.g. 90s, 5m, 1.5h"},
    "warmup": {"type": float, "help": "warmup fraction of the run"},
    "max_train_examples": {"type": int, "help": "use the first N training examples"},
    "min_updates": {"type": int, "help": "train at least N optimizer updates, adding epochs "
                    "on small data (default: the recipe's; bert 500, 0 = no minimum)"},
    "threads": {"type": int, "help": "torch intra-op threads"},
    "device": {"default": "auto", "help": "auto (a GPU when there is one), cpu, cuda or cuda:N"},
    "precision": {"default": "auto", "choices": PRECISIONS, "help": PRECISION_HELP},
    "json": {"action": "store_true", "help": "print JSON"},
    "tokenizer": {"help": "tokenizer folder (default: the one the shards record)"},
    "no_cost": {"action": "store_true", "help": "do not track FLOPs/energy/cost"},
    "activation_checkpointing": {"action": "store_true", "default": None,
                                 "help": "recompute each Transformer layer's activations in the "
                                 "backward pass: less memory, about a third more compute "
                                 "(docs/training.md)"},
    "calibrate": {"action": "store_true", "help": "few-shot: contextual calibration (subtract "
                  "each label's log-likelihood after the content-free text 'N/A'; Zhao et al. "
                  "2021)"},
}


def add_flags(p: argparse.ArgumentParser, *names: str, **defaults: Any) -> None:
    """The shared flags ``names`` as :data:`FLAGS` declares them, and those named in
    ``defaults`` with this command's default."""
    for name in (*names, *defaults):
        add_flag(p, name, **({"default": defaults[name]} if name in defaults else {}))


def add_flag(p: argparse.ArgumentParser, name: str, **own: Any) -> None:
    """One shared flag with this command's own settings (``help``, ``default``) over
    :data:`FLAGS`'."""
    p.add_argument("--" + name.replace("_", "-"), **{**FLAGS[name], **own})


def add_model(p: argparse.ArgumentParser, help: str | None = MODEL_HELP) -> None:
    """The positional MODEL a command reads."""
    p.add_argument("model", help=help)


def add_out(p: argparse.ArgumentParser, help: str | None = None, required: bool = True,
            overwrite: str | None = None, **kwargs: Any) -> None:
    """``--out`` (``help``: what is written there); with ``overwrite`` (its help),
    ``--overwrite`` right after it."""
    p.add_argument("--out", required=required, help=help, **kwargs)
    if overwrite is not None:
        add_overwrite(p, overwrite)


def add_overwrite(p: argparse.ArgumentParser, help: str) -> None:
    """``--overwrite``: write over what the command's output already holds (``help``: what)."""
    p.add_argument("--overwrite", action="store_true", help=help)


def add_training_flags(p: argparse.ArgumentParser) -> None:
    """The run flags `lmlab pretrain` and `lmlab distil` share (sequence and batch shape, the
    optimiser and schedule, how long, and the evaluation / checkpoint / log cadence): one list,
    each flag's dest the name of its ``PretrainConfig`` setting."""
    p.add_argument("--seq-len", type=int)
    p.add_argument("--seq-len-schedule", help="BERT's schedule: lengths with fractions of the "
                   "steps, e.g. 128:0.9,512:0.1 (--seq-len is its longest)")
    add_flag(p, "batch_size", help="global batch size (sequences per step)")
    p.add_argument("--batch-ramp", dest="batch_ramp_tokens", help="GPT-3's batch ramp: grow the "
                   "batch linearly from --batch-ramp-start tokens to the full batch over this "
                   "many training tokens (e.g. 4B)")
    p.add_argument("--batch-ramp-start", help="tokens in the ramp's first batch (default 32k, "
                   "GPT-3's)")
    p.add_argument("--mix", help="sample the shards' corpus sources with these weights, e.g. "
                   "kjv=0.3,wordnet=0.7 (summing to 1; a source left out is not sampled)")
    add_flags(p, "lr", seed=None)
    add_flag(p, "warmup", type=None, help="warmup: steps (e.g. 500) or a fraction (e.g. 0.06)")
    p.add_argument("--schedule", help="linear | cosine | constant | inverse_sqrt | triangular")
    p.add_argument("--weight-decay", type=float)
    p.add_argument("--clip-norm", type=float)
    p.add_argument("--steps", dest="max_steps", help="stop after this many optimizer steps")
    p.add_argument("--tokens", dest="max_tokens", help="stop after this many tokens (e.g. 5M)")
    p.add_argument("--budget", dest="budget_seconds",
                   help="stop after this wall-clock time (e.g. 10m, 1.5h)")
    p.add_argument("--grad-accum", type=int)
    p.add_argument("--eval-every", type=int, help="evaluate every N steps (and at the end)")
    p.add_argument("--eval-batches", type=int, help="validation batches (default 8)")
    p.add_argument("--save-every", type=int, help="checkpoint every N steps (and at the end)")
    p.add_argument("--keep-last", type=int)
    p.add_argument("--log-every", type=int)
    add_flag(p, "precision", default=None, help=AUTO_PRECISION_HELP)  # unless --config sets one
    add_flags(p, "threads", "tokenizer", "no_cost")
    add_flag(p, "device", default=None, help="auto | cpu | cuda")
    add_flag(p, "activation_checkpointing")


def settings_from(kind: type, args: argparse.Namespace, **given: Any) -> Any:
    """The dataclass ``kind`` from the flags named as its fields (a field with no flag keeps
    its default), ``given`` over them."""
    from dataclasses import fields

    values = {f.name: getattr(args, f.name) for f in fields(kind) if hasattr(args, f.name)}
    return kind(**{**values, **given})


def pretrain_config(args: argparse.Namespace, *own: str) -> Any:
    """The ``PretrainConfig`` of `lmlab pretrain` or `lmlab distil`: every flag is a setting
    but ``own`` (the command's other flags) and ``--config``'s file (its sections below them)."""
    from lmlab.training.config import load_config_file
    from lmlab.training.pretrain import PretrainConfig

    flags = {k: v for k, v in vars(args).items() if k not in ("config", "handler", "no_cost", *own)}
    sections = load_config_file(args.config) if getattr(args, "config", None) else {}
    if flags["precision"] is None and "precision" not in (sections.get("speed") or {}):
        flags["precision"] = "auto"  # the commands' default: the host's measured fastest path
    return PretrainConfig.from_sections(sections, track_cost=not args.no_cost, **flags)


def print_run_summary(result, prefix: str) -> None:
    """The end of a run on the Trainer (``lmlab pretrain``, ``lmlab distil``): why it stopped,
    steps, tokens, time, last loss, and the last evaluation, each line starting ``prefix``."""
    loss = f"{result.last_loss:.4f}" if result.last_loss is not None else "n/a"
    print(f"{prefix}: {result.stop_reason}: {result.step:,} steps, {result.tokens:,} tokens, "
          f"{result.elapsed:.1f} s, last loss {loss}")
    if result.last_eval:
        print(f"{prefix}: eval " + ", ".join(f"{k}={v:.4g}" for k, v in result.last_eval.items()))


def check_corpus(path: str | None, holds: str = "train.jsonl", also: str = "") -> None:
    """``--corpus`` (when given) is a folder of `lmlab data build` holding ``holds``."""
    from lmlab.utils.checks import check_folder

    if path is not None:
        check_folder(path, "--corpus", f"give a folder written by `lmlab data build --out "
                     f"DIR`{also}", holds=holds, what="corpus folder")


def print_few_shot(model: Any, tokenizer: Any, task: Any, shots: list[int],
                   splits: list[str] | tuple[str, ...], args: argparse.Namespace) -> None:
    """The few-shot scores of `lmlab evaluate --few-shot` and `lmlab lm-eval`: for each split,
    the accuracy against shots as a table, or (``--json``) one JSON line."""
    import json

    from lmlab.evaluation.lm import few_shot_evaluate, few_shot_report

    for split in splits:
        results = few_shot_evaluate(model, tokenizer, task, shots, split=split,
                                    max_examples=args.max_examples, seed=args.seed,
                                    show_progress=True, calibrate=args.calibrate)
        if args.json:
            print(json.dumps({"task": task.name, "split": split,
                              "results": {str(k): v for k, v in results.items()}}))
        else:
            print(few_shot_report(task, split, results))


def print_table(rows: list[list[str]] | list[tuple[str, ...]]) -> None:
    """Rows of cells (the first is the header) in left-aligned columns, two spaces apart."""
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    for row in rows:
        print("  ".join(cell.ljust(width) for cell, width in zip(row, widths)).rstrip())


def table_rows(rows: list[dict], columns: list[str] | None = None) -> list[list[str]]:
    """``rows`` (dicts) as :func:`print_table`'s cells under ``columns`` (default: the first
    row's keys)."""
    columns = columns or list(rows[0])
    return [columns] + [[str(row.get(c, "")) for c in columns] for row in rows]


def pretrain_choices() -> dict[str, str]:
    """The objectives, families and sizes ``lmlab pretrain`` accepts, as help text, read from
    their registries (so --help lists exactly what works, without importing torch)."""
    from lmlab.models.presets import list_presets
    from lmlab.objectives.registry import available_objectives

    sizes: dict[str, list[str]] = {}
    from lmlab.models.rnn.config import SIZES as RECURRENT_SIZES  # AWD-LSTM, ELMo

    for family, size in list_presets() + [(f, s) for f, names in RECURRENT_SIZES.items()
                                          for s in names]:
        sizes.setdefault(family, []).append(size)
    return {
        "objectives": ", ".join(available_objectives()),
        "families": ", ".join(sizes),
        "sizes": "; ".join(f"{family}: {', '.join(names)}" for family, names in sizes.items()),
    }


class ArgumentParser(argparse.ArgumentParser):
    """argparse's parser, reporting a malformed argument (``--seed abc``, a missing
    ``--out``) as every other bad input is: "lmlab: error:" and "lmlab: fix:", exit 2."""

    def error(self, message: str) -> None:  # type: ignore[override]
        import sys

        self.print_usage(sys.stderr)
        self.exit(2, f"lmlab: error: {self.prog}: {message}\n"
                     f"lmlab: fix: see `{self.prog} --help` for the arguments and an example\n")


def build_parser() -> tuple[argparse.ArgumentParser, CommandRegistry]:
    from importlib.metadata import version  # the installed lmlab's (lmlab.__version__)

    parser = ArgumentParser(
        prog="lmlab",
        description="Pretrain, fine-tune, probe and compress Transformer language models.",
        epilog="example:\n  lmlab data list\n\nEvery command's --help shows an example.",
        formatter_class=HelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"lmlab {version('lmlab')}")
    subparsers = parser.add_subparsers(title="commands", metavar="COMMAND")
    return parser, CommandRegistry(subparsers)
