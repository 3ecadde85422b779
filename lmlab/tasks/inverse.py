"""The text-to-text tasks of the inverse-problems family, written to disk and scored: symbolic
``integration`` and ``decompile`` (verified accuracy), WordNet ``definitions`` and ``reverse-dictionary`` (BLEU,
chrF, exact match), a folder of your own pairs (``text``), and the built-in classification tasks
in T5's formulation (docs/encoder-decoders.md). A text task's folder also holds a pretraining
corpus of its *train* split only, so a pretrained initialisation never reads a dev or test text.
"""

from __future__ import annotations

import json
from collections import defaultdict
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from lmlab.tasks.types import SPLITS, TextPair
from lmlab.utils.checks import check_choice
from lmlab.utils.errors import LmlabError
from lmlab.utils.io import atomic_write_json, atomic_write_text, iter_jsonl, read_json

TASKS = ("integration", "decompile", "definitions", "reverse-dictionary")
#: generated tasks scored by verifying each hypothesis (every beam's hypotheses count), with a
#: tokenizer of their train split's symbols
VERIFIED_TASKS = ("integration", "decompile")
#: the generation options each generated task takes (write_task_data's keywords)
GENERATION_OPTIONS = {"integration": ("generator", "grammar", "max_ops", "timeout"),
                      "decompile": ("max_statements", "levels")}
#: a folder of your own pairs (``task.json``: ``{"task": "text"}``), scored as ``definitions``
USER_TASK = "text"
#: built-in classification tasks in T5's formulation: ``"<task>: <text>"`` -> the label's name
CLASSIFICATION_TASKS = ("wordnet-supersense", "wordnet-wic", "fortunes-topic")


def check_task(name: str) -> str:
    """``name`` is a text-to-text task (``text``: a folder of your own pairs)."""
    return check_choice(name, (*TASKS, *CLASSIFICATION_TASKS, USER_TASK), "--task",
                        "text-to-text task")


def classification_pairs(name: str) -> tuple[dict[str, list[TextPair]], dict[str, Any]]:
    """A built-in classification task (its CPU size) as text pairs, T5's way: the input is
    ``"<task>: <text>"`` (``" | <second text>"`` for pairs), the target the label's name; and
    what scoring needs (metrics, labels, positive label)."""
    from lmlab.tasks.builtin import load_builtin_task

    task = load_builtin_task(name)

    def source(example) -> str:
        text = f"{name}: {example.text}"
        return text if example.text_pair is None else f"{text} | {example.text_pair}"

    splits = {split: [TextPair(source(e), (str(e.label),), e.id) for e in task.split(split)]
              for split in SPLITS}
    return splits, {"metrics": list(task.metrics), "labels": list(task.labels),
                    "positive_label": task.positive_label}


def build_pairs(task: str, count: int | None = None, seed: int = 0,
                show_progress: bool = False, generator: str = "bwd", grammar: str = "small",
                max_ops: int | None = None, timeout: float = 2.0,
                checkpoint: str | Path | None = None, max_statements: int = 4,
                levels: Sequence[str] = ("O0", "O1")) -> dict[str, list[TextPair]]:
    """Every split of ``task``: ``count`` generated expressions (integration; required; from
    ``generator`` bwd/fwd/ibp over the ``grammar`` small/paper, ``max_ops`` overriding its
    operator bound; ``checkpoint`` resumes a killed generation), ``count`` generated C
    functions of at most ``max_statements`` statements, each compiled at ``levels``
    (decompile; required), or the WordNet pairs (text tasks; ``count`` caps the train
    split)."""
    check_task(task)
    if task == USER_TASK:
        raise LmlabError("the 'text' task is a folder of your own pairs; there is nothing to "
                         "generate", "write train/dev/test.jsonl ({\"input\": ..., "
                         "\"references\": [...]} per line) and task.json ({\"task\": "
                         "\"text\"}) yourself")
    if task in CLASSIFICATION_TASKS:
        return classification_pairs(task)[0]
    if task in VERIFIED_TASKS and count is None:
        raise LmlabError(f"the {task} task needs a count of items to generate",
                         "pass e.g. count=50000 (--count 50000)")
    if task == "decompile":
        return decompile_splits(count, seed, max_statements, levels, show_progress)[0]
    if task == "integration":
        from lmlab.tasks.integration import make_splits
        from lmlab.tasks.integration_data import generate_pairs

        pairs = generate_pairs(count, seed, integration_grammar(grammar, max_ops), generator,
                               timeout=timeout, checkpoint=checkpoint,
                               show_progress=show_progress)
        return make_splits(pairs)
    from lmlab.tasks.definitions import definition_splits

    splits = definition_splits("define" if task == "definitions" else "reverse")
    if count is not None:
        splits["train"] = splits["train"][:count]
    return splits


def decompile_splits(count: int, seed: int = 0, max_statements: int = 4,
                     levels: Sequence[str] = ("O0", "O1"), show_progress: bool = False
                     ) -> tuple[dict[str, list[TextPair]], dict[str, int]]:
    """``count`` generated C functions as assembly -> C pairs by split (a function's levels in
    one split, by its behaviour's fingerprint), and why draws were skipped."""
    from lmlab.tasks.decompile import Grammar, generate_pairs
    from lmlab.tasks.integration import make_splits

    if count is None:
        raise LmlabError("the decompile task needs a count of functions to generate",
                         "pass e.g. count=20000 (--count 20000)")

    pairs, skipped = generate_pairs(count, seed, Grammar(max_statements=max_statements),
                                    tuple(levels), show_progress=show_progress)
    return make_splits(pairs), dict(sorted(skipped.items()))


def integration_grammar(name: str, max_ops: int | None = None):
    """The grammar ``small`` (ours) or ``paper`` (Lample & Charton's), ``max_ops`` overriding
    its operator bound (and the small one's depth, which must admit it)."""
    import dataclasses

    from lmlab.tasks.integration import GRAMMARS

    grammar = GRAMMARS[check_choice(name, tuple(GRAMMARS), "--grammar", "integration grammar")]
    if max_ops is None:
        return grammar
    return dataclasses.replace(grammar, max_ops=max_ops,
                               max_depth=max(grammar.max_depth, max_ops if grammar.uniform
                                             else grammar.max_depth))


def write_task_data(task: str, out: str | Path, count: int | None = None, seed: int = 0,
                    overwrite: bool = False, show_progress: bool = False,
                    **generation: Any) -> dict[str, int]:
    """Write ``task``'s splits (and, for the text tasks, the train split's pretraining corpus)
    under ``out``; returns the split sizes. Integration takes :func:`build_pairs`'s generation
    options (``generator``, ``grammar``, ``max_ops``, ``timeout``) and keeps its state in
    ``out/generation.json``: run again with the same options, a killed generation continues;
    decompile takes ``max_statements`` and ``levels``."""
    from lmlab.utils.checks import check_output_folder

    check_task(task)
    out = Path(out)
    check_output_folder(out, overwrite, "task data", ignore=("generation.json",))
    foreign = sorted(set(generation) - set(GENERATION_OPTIONS.get(task, ())))
    if foreign:
        verb = "does" if len(foreign) == 1 else "do"
        raise LmlabError(f"{', '.join(foreign)} {verb} not apply to the {task} task",
                         "leave them out for this task" + "".join(
                             f"; {name} takes {', '.join(options)}"
                             for name, options in GENERATION_OPTIONS.items()))
    if task in CLASSIFICATION_TASKS:  # the pairs and what scoring needs, from one load
        splits, scoring = classification_pairs(task)
    elif task == "integration":
        out.mkdir(parents=True, exist_ok=True)
        if overwrite:
            (out / "generation.json").unlink(missing_ok=True)
        splits = build_pairs(task, count, seed, show_progress,
                             checkpoint=out / "generation.json", **generation)
        scoring = {"generation": {"generator": "bwd", "grammar": "small", **generation}}
    elif task == "decompile":
        splits, skipped = decompile_splits(count, seed, show_progress=show_progress,
                                           **generation)
        scoring = {"generation": {"max_statements": 4, "levels": ["O0", "O1"], **generation},
                   "skipped_draws": skipped}
    else:
        splits, scoring = build_pairs(task, count, seed, show_progress), {}
    out.mkdir(parents=True, exist_ok=True)
    for split in SPLITS:
        lines = [json.dumps({"input": p.input_text, "references": list(p.references),
                             "key": p.key, "tag": p.tag}, ensure_ascii=False)
                 for p in splits[split]]
        atomic_write_text(out / f"{split}.jsonl", "\n".join(lines) + "\n")
    sizes = {split: len(splits[split]) for split in SPLITS}
    if task not in VERIFIED_TASKS:
        _write_corpus(splits["train"], out / "corpus")
    else:  # how much of dev and test train already holds, by text, function and structure
        from lmlab.tasks.integration import overlap

        scoring = {**scoring, "overlap": overlap(splits)}
        if task == "integration":
            from lmlab.tasks.integration_data import skipped_draws

            scoring["skipped_draws"] = skipped_draws(out / "generation.json")
    atomic_write_json(out / "task.json", {"task": task, "count": count, "seed": seed,
                                          "sizes": sizes, **scoring})
    return sizes


def _write_corpus(train: Sequence[TextPair], folder: Path) -> None:
    """The train split's inputs and references as an lmlab corpus (one document per pair; 2%
    kept as its validation split)."""
    folder.mkdir(parents=True, exist_ok=True)
    documents = {"train": [], "validation": []}
    for index, pair in enumerate(train):
        split = "validation" if index % 50 == 0 else "train"
        record = {"id": f"{split}/{index}", "source": "wordnet-train",
                  "sentences": [pair.input_text, *pair.references]}
        documents[split].append(json.dumps(record, ensure_ascii=False))
    for split, lines in documents.items():
        atomic_write_text(folder / f"{split}.jsonl", "\n".join(lines) + "\n")


def task_info(folder: str | Path) -> dict[str, Any]:
    """``task.json`` of a task folder (the task's name; a classification task's metrics)."""
    folder = Path(folder)
    if not (folder / "task.json").is_file():
        raise LmlabError(f"{folder} holds no text-to-text task data (no task.json)",
                         "write it with lmlab seq2seq data --task NAME --out FOLDER")
    info = read_json(folder / "task.json")
    check_task(info["task"])
    return info


def read_task_data(folder: str | Path) -> tuple[str, dict[str, list[TextPair]]]:
    """The task name and splits written by :func:`write_task_data`."""
    folder = Path(folder)
    task = task_info(folder)["task"]  # a folder without task.json is refused first
    return task, {split: [TextPair(r["input"], tuple(r["references"]), r.get("key", ""),
                                   r.get("tag", ""))
                          for _, r in iter_jsonl(folder / f"{split}.jsonl")] for split in SPLITS}


def score(task: str, pairs: Sequence[TextPair], hypotheses: Sequence[Sequence[str]],
          timeout: float | None = None, info: dict[str, Any] | None = None) -> dict[str, Any]:
    """The task's metrics for ``hypotheses`` (per input, best first); a classification task
    scores the best hypothesis as a label with its own metrics (``info``: its task.json; a
    text that is no label counts as wrong). ``timeout``: a verification's limit in seconds
    (default 2 for integration's sympy, 10 of wall clock per sandboxed step for decompile)."""
    check_task(task)
    if len(pairs) != len(hypotheses) or not pairs:
        raise LmlabError(f"{len(hypotheses)} hypothesis lists for {len(pairs)} examples",
                         "give one list of hypotheses per example")
    if task in VERIFIED_TASKS:
        return verified_accuracy(pairs, hypotheses, timeout, task)
    if task in CLASSIFICATION_TASKS:
        from lmlab.metrics import compute_metrics

        info = info or classification_pairs(task)[1]
        labels = set(info["labels"])
        predicted = [h[0].strip() if h and h[0].strip() in labels else "<not a label>"
                     for h in hypotheses]
        result = compute_metrics(info["metrics"], predicted, [p.target for p in pairs],
                                 positive_label=info.get("positive_label"))
        return {**result, "not_a_label": predicted.count("<not a label>") / len(pairs),
                "examples": len(pairs)}
    from lmlab.metrics.generation import bleu, chrf, sequence_accuracy

    best = [h[0] if h else "" for h in hypotheses]
    # exact match ignoring case (a word or gloss is right whatever its capitals): the
    # metric's own comparison on lower-cased text; any reference counts
    exact = sum(sequence_accuracy([b.lower()], [[r.lower() for r in p.references]])
                for b, p in zip(best, pairs)) / len(pairs)
    if task == "reverse-dictionary":
        return {"exact_match": exact, "examples": len(pairs)}
    counts = {len(p.references) for p in pairs}  # sacrebleu wants as many per example
    references = [list(p.references) for p in pairs] if len(counts) == 1 \
        else [p.references[0] for p in pairs]
    return {"bleu": bleu(best, references), "chrf": chrf(best, references),
            "exact_match": exact, "examples": len(pairs)}


def verified_accuracy(pairs: Sequence[TextPair], hypotheses: Sequence[Sequence[str]],
                      timeout: float | None = None, task: str = "integration"
                      ) -> dict[str, Any]:
    """Share of inputs with a verified hypothesis, overall and by tag (integration: depth;
    decompile: level and size); the share left unverifiable (no hypothesis verified and the
    check could not decide one: counted wrong, reported apart); and how the verdicts were
    reached. Integration checks a hypothesis against the input (f), decompile against the
    reference function."""
    check_choice(task, VERIFIED_TASKS, "task", "verified task")
    if task == "integration":
        from lmlab.tasks.integration import verify as check

        def verify(hypothesis: str, pair: TextPair):
            return check(hypothesis, pair.input_text, timeout=timeout or 2.0)
    else:
        from lmlab.tasks.decompile import verify as check

        def verify(hypothesis: str, pair: TextPair):
            return check(hypothesis, pair.target, timeout=timeout or 10.0)

    solved_by_tag: dict[str, list[int]] = defaultdict(lambda: [0, 0])
    methods: dict[str, int] = defaultdict(int)
    solved = unverifiable = 0
    for pair, options in zip(pairs, hypotheses):
        ok = undecided = False
        for hypothesis in options:
            verdict = verify(hypothesis, pair)
            methods[verdict.method] += 1
            undecided |= verdict.unverifiable
            if verdict.correct:
                ok = True
                break
        solved += ok
        unverifiable += undecided and not ok
        solved_by_tag[pair.tag][0] += ok
        solved_by_tag[pair.tag][1] += 1
    return {"verified_accuracy": solved / len(pairs), "unverifiable": unverifiable / len(pairs),
            "examples": len(pairs),
            "by_tag": {tag: {"verified_accuracy": ok / total, "examples": total}
                       for tag, (ok, total) in sorted(solved_by_tag.items())},
            "verdicts": dict(sorted(methods.items()))}
