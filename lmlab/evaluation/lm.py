"""Evaluating a language model without fine-tuning it: sliding-window :func:`perplexity`,
LAMBADA-style :func:`lambada_cloze` and GPT-3-style :func:`few_shot_evaluate` (docs/decoders.md).
"""

from __future__ import annotations

import math
import random
import re
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch
from torch.nn import functional as F

from lmlab.evaluation.scoring import score_pairs
from lmlab.generation.generate import check_causal_lm, generate
from lmlab.tasks.sampling import sample_examples
from lmlab.utils.checks import parse_int_list
from lmlab.utils.errors import LmlabError
from lmlab.utils.host import describe_host
from lmlab.utils.progress import progress


# -- perplexity ----------------------------------------------------------------------------------
@dataclass
class PerplexityResult:
    perplexity: float
    nll: float  # mean negative log-likelihood per scored token (nats)
    tokens: int  # tokens scored
    windows: int

    def to_dict(self) -> dict[str, float]:
        return asdict(self)


@torch.no_grad()
def perplexity(model: Any, input_ids: Sequence[int] | torch.Tensor, max_length: int | None = None,
               stride: int | None = None, show_progress: bool = False) -> PerplexityResult:
    """Sliding-window perplexity of one token sequence.

    Args:
        input_ids: the token ids of the whole text (1-D).
        max_length: window length (default: the model's ``max_position_embeddings``, at most
            1024).
        stride: how far each window advances (default ``max_length // 2``).
    """
    check_causal_lm(model)
    ids = torch.as_tensor(input_ids, dtype=torch.long).reshape(-1)
    if ids.numel() < 2:
        raise LmlabError("the text has fewer than 2 tokens", "give a longer text")
    max_length = max_length or min(model.config.max_position_embeddings, 1024)
    stride = stride or max(1, max_length // 2)
    if not 0 < stride <= max_length:
        raise LmlabError(f"stride {stride} must be in 1..max_length ({max_length})",
                         "use e.g. stride = max_length // 2")
    model.eval()
    device = next(model.parameters()).device
    total, count, windows, previous_end = 0.0, 0, 0, 0
    starts = range(0, ids.numel(), stride)
    for begin in progress(starts, desc="perplexity") if show_progress else starts:
        end = min(begin + max_length, ids.numel())
        new = end - previous_end  # tokens not scored by an earlier window
        window = ids[begin:end].unsqueeze(0).to(device)  # (1, T)
        logits = model(input_ids=window, heads=["clm"]).logits[0, :-1].float()  # (T-1, V)
        targets = window[0, 1:]
        nll = F.cross_entropy(logits, targets, reduction="none")  # (T-1,)
        first = max(0, nll.numel() - new)  # score only the window's last ``new`` targets
        total += float(nll[first:].sum())
        count += nll.numel() - first
        windows += 1
        previous_end = end
        if end == ids.numel():
            break
    mean = total / count
    return PerplexityResult(math.exp(mean), mean, count, windows)


def text_perplexity(model: Any, tokenizer: Any, text: str, max_length: int | None = None,
                    stride: int | None = None, max_tokens: int | None = None,
                    show_progress: bool = False) -> PerplexityResult:
    """:func:`perplexity` of a text (its first ``max_tokens`` tokens, when given), as
    ``lmlab perplexity`` measures it; a window longer than the model's positions is refused."""
    positions = model.config.max_position_embeddings
    if max_length and max_length > positions:
        raise LmlabError(f"--max-length {max_length} exceeds the model's {positions} "
                         "positions", f"use --max-length {positions} or less")
    ids = tokenizer.encode(text, add_special_tokens=False)
    if max_tokens:
        ids = ids[:max_tokens]
    return perplexity(model, ids, max_length=max_length, stride=stride,
                      show_progress=show_progress)


# -- LAMBADA-style cloze ---------------------------------------------------------------------------
_WORD = re.compile(r"[A-Za-z][A-Za-z'-]*")


def cloze_passages(texts: Iterable[str], min_words: int = 20, max_words: int = 80,
                   limit: int | None = None) -> list[tuple[str, str]]:
    """(context, last word) pairs: each text's first ``max_words`` words cut back to a sentence
    end, kept when the final word is alphabetic and the passage has ``min_words`` words."""
    passages = []
    for text in texts:
        words = text.split()[:max_words]
        while words and not words[-1].endswith((".", "!", "?")) and len(words) > min_words:
            words.pop()
        if len(words) < min_words:
            continue
        last = words[-1].strip(".,;:!?\"')(")
        if not _WORD.fullmatch(last) or len(last) < 2:
            continue
        context = " ".join(words[:-1])
        passages.append((context, last))
        if limit is not None and len(passages) >= limit:
            break
    return passages


def corpus_passages(corpus_dir: str | Path, split: str = "validation", limit: int = 200,
                    **kwargs: Any) -> list[tuple[str, str]]:
    """Cloze passages from an lmlab corpus folder's documents (the validation split)."""
    from lmlab.text.corpus import read_corpus

    return cloze_passages((doc.text for doc in read_corpus(corpus_dir, split)), limit=limit,
                          **kwargs)


@torch.no_grad()
def lambada_cloze(model: Any, tokenizer: Any, passages: Sequence[tuple[str, str]],
                  show_progress: bool = False) -> dict[str, float]:
    """Accuracy of greedy last-word prediction: decode after the context until the first word is
    complete and compare it with the passage's last word (exact match)."""
    check_causal_lm(model)
    if not passages:
        raise LmlabError("no cloze passages", "give passages with at least min_words words")
    device = next(model.parameters()).device
    correct = 0
    for context, word in progress(passages, desc="cloze") if show_progress else passages:
        ids = torch.tensor([tokenizer.encode(context, add_special_tokens=False)], device=device)
        budget = len(tokenizer.encode(" " + word, add_special_tokens=False)) + 1
        out = generate(model, ids, max_new_tokens=budget, eos_token_id=[])
        continuation = tokenizer.decode(out[0, ids.shape[1]:].tolist(), skip_special_tokens=True)
        match = _WORD.match(continuation.lstrip())
        predicted = match.group(0) if match else ""
        correct += predicted == word
    return {"accuracy": correct / len(passages), "n": len(passages)}


# -- few-shot classification -----------------------------------------------------------------------
@dataclass
class FewShotFormat:
    """How an example becomes prompt text."""

    instruction: str = ""
    text_prefix: str = "Text: "
    label_prefix: str = "Topic:"
    separator: str = "\n\n"
    max_chars: int = 300  # long texts are cut so k-shot prompts stay short on a CPU

    def render(self, text: str, label: str | None = None) -> str:
        text = " ".join(text.split())
        if len(text) > self.max_chars:
            text = text[: self.max_chars].rsplit(" ", 1)[0] + " ..."
        out = f"{self.text_prefix}{text}\n{self.label_prefix}"
        return out if label is None else f"{out} {label}"


def label_text(label: str) -> str:
    """A label as words (``"computers"``, ``"science_fiction"`` -> ``"science fiction"``)."""
    return label.replace("_", " ").replace("-", " ")


def score_continuations(model: Any, prompt_ids: list[int], continuations: list[list[int]]
                        ) -> torch.Tensor:
    """Total log-likelihood of each continuation after the prompt: (C,). The prompt runs once,
    its key/value cache copied to every continuation; the continuations run as one batch
    (:func:`lmlab.evaluation.scoring.score_pairs`, whole: no window cuts the prompt)."""
    whole = len(prompt_ids) + max(len(c) for c in continuations)
    pairs = [(prompt_ids, continuation) for continuation in continuations]
    return torch.tensor([score for score, _ in score_pairs(model, pairs, whole)])


def render_prompt(shots: Sequence[Any], text: str, fmt: FewShotFormat) -> str:
    """The instruction, the labelled ``shots``, then ``text`` awaiting its label."""
    parts = [fmt.render(e.text, label_text(e.label)) for e in shots]
    parts.append(fmt.render(text))
    body = fmt.separator.join(parts)
    return f"{fmt.instruction}{fmt.separator}{body}" if fmt.instruction else body


CONTENT_FREE_TEXT = "N/A"


@torch.no_grad()
def few_shot_evaluate(model: Any, tokenizer: Any, task: Any, shots: int | Sequence[int],
                      split: str = "test", max_examples: int | None = 100, seed: int = 0,
                      fmt: FewShotFormat | None = None, show_progress: bool = False,
                      calibrate: bool = False) -> dict[int, dict[str, float]]:
    """In-context classification accuracy for each number of shots.

    Args:
        task: an ``lmlab.tasks`` Task (classification), or a built-in task's name.
        shots: one k or several (e.g. ``[0, 1, 8]``).
        max_examples: evaluate N examples of ``split`` (None = all), drawn by
            :func:`lmlab.tasks.sampling.sample_examples` (stable, label-stratified).
        seed: the random choice of shots (a fresh draw per test example, as in GPT-3).
        calibrate: contextual calibration (Zhao et al. 2021; docs/decoders.md): subtract each
            label's log-likelihood after the content-free text "N/A" under the same shots.

    Returns:
        {k: {"accuracy", "n", "predictions"}}, plus ``"uncalibrated_accuracy"`` when
        ``calibrate``.
    """
    check_causal_lm(model)
    if isinstance(task, str):
        from lmlab.tasks.builtin import load_builtin_task

        task = load_builtin_task(task)
    if task.type not in ("classification",):
        raise LmlabError(f"few-shot evaluation scores label continuations; task {task.name!r} "
                         f"is {task.type}",
                         "use a single-text classification task (e.g. fortunes-topic)")
    fmt = fmt or FewShotFormat(
        instruction=f"Classify each text. Possible labels: "
                    f"{', '.join(label_text(label) for label in task.labels)}.")
    examples = sample_examples(task.split(split), max_examples)
    train = task.split("train")
    label_ids = [tokenizer.encode(" " + label_text(label), add_special_tokens=False)
                 for label in task.labels]
    ks = [shots] if isinstance(shots, int) else list(shots)
    results: dict[int, dict[str, float]] = {}
    for k in ks:
        if k < 0 or k > len(train):
            raise LmlabError(f"{k} shots requested; the train split has {len(train)} examples",
                             "use 0 or more shots, at most the train split's size")
        rng = random.Random(seed * 1000 + k)
        correct, uncalibrated_correct, predictions = 0, 0, []
        for example in progress(examples, desc=f"{k}-shot") if show_progress else examples:
            chosen = rng.sample(list(train), k) if k else []
            prompt = render_prompt(chosen, example.text, fmt)
            scores = score_continuations(model, tokenizer.encode(prompt, add_special_tokens=False),
                                         label_ids)
            if calibrate:
                uncalibrated_correct += task.labels[int(scores.argmax())] == example.label
                neutral = render_prompt(chosen, CONTENT_FREE_TEXT, fmt)
                scores = scores - score_continuations(
                    model, tokenizer.encode(neutral, add_special_tokens=False), label_ids)
            predictions.append(task.labels[int(scores.argmax())])
            correct += predictions[-1] == example.label
        results[k] = {"accuracy": correct / len(examples), "n": len(examples),
                      "predictions": predictions}
        if calibrate:
            results[k]["uncalibrated_accuracy"] = uncalibrated_correct / len(examples)
    return results


def parse_shot_counts(text: str) -> list[int]:
    """``"0,1,8"`` -> ``[0, 1, 8]`` (the CLI's ``--few-shot``), with a clear error."""
    return list(parse_int_list(text, "--few-shot", example="0,1,8"))


def few_shot_report(task: Any, split: str, results: dict[int, dict[str, float]]) -> str:
    """The accuracy-against-shots table the CLI prints, with two reference levels for scale:
    chance (1 / labels) and the majority class of the train split scored on the same
    examples."""
    from collections import Counter

    count = int(next(iter(results.values()))["n"])
    examples = sample_examples(task.split(split), count)  # the examples few_shot_evaluate scored
    majority = Counter(e.label for e in task.split("train")).most_common(1)[0][0]
    majority_accuracy = sum(e.label == majority for e in examples) / max(len(examples), 1)
    lines = [f"{task.name} ({split}, {count} examples, {len(task.labels)} labels): chance "
             f"{1 / len(task.labels):.3f}, majority class {majority!r} {majority_accuracy:.3f}"]
    for k, value in results.items():
        line = f"  {k:>2}-shot accuracy: {value['accuracy']:.3f}"
        if "uncalibrated_accuracy" in value:
            line += f" calibrated ({value['uncalibrated_accuracy']:.3f} without calibration)"
        lines.append(line)
    lines.append(f"  host: {describe_host()}")
    return "\n".join(lines)
