"""LM evaluation without fine-tuning: sliding-window perplexity, LAMBADA-style cloze, few-shot
classification by label log-likelihood."""

from __future__ import annotations

import math

import pytest
import torch
from conftest import assert_close_rounding
from torch.nn import functional as F

import lmlab
from lmlab.evaluation.lm import (
    cloze_passages,
    few_shot_evaluate,
    lambada_cloze,
    perplexity,
    score_continuations,
)
from lmlab.models.model import LanguageModel
from lmlab.models.presets import family_config


def tiny(family: str = "gpt2", vocab: int = 61) -> LanguageModel:
    torch.manual_seed(0)
    extra = dict(num_key_value_heads=2) if family == "llama" else {}
    config = family_config(family, vocab_size=vocab, hidden_size=32, num_hidden_layers=2,
                            num_attention_heads=4, intermediate_size=64,
                            max_position_embeddings=256, initializer_range=0.3, **extra)
    return LanguageModel(config, heads=("clm",)).eval()


def _nll(model, ids: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        logits = model(input_ids=ids[None]).logits[0, :-1]
    return F.cross_entropy(logits, ids[1:], reduction="none")


@pytest.mark.numerics
def test_perplexity_full_window_equals_model_loss():
    model = tiny()
    ids = torch.randint(0, 61, (40,))
    result = perplexity(model, ids, max_length=64)
    assert result.tokens == 39 and result.windows == 1
    nll = _nll(model, ids)
    # The same logits; only the mean of the 39 token losses sums in another order.
    assert_close_rounding(result.nll, nll.mean(), terms=39, scale=float(nll.max()))
    assert result.perplexity == math.exp(result.nll)


@pytest.mark.numerics
def test_perplexity_sliding_window_scores_each_token_once():
    model = tiny("llama")
    ids = torch.randint(0, 61, (100,))
    result = perplexity(model, ids, max_length=32, stride=16)
    assert result.tokens == 99
    # Manual HF-guide computation: window [b, b+32), score its last (end - prev_end) targets.
    total, prev = 0.0, 0
    for begin in range(0, 100, 16):
        end = min(begin + 32, 100)
        nll = _nll(model, ids[begin:end])
        total += float(nll[max(0, len(nll) - (end - prev)):].sum())
        prev = end
        if end == 100:
            break
    assert_close_rounding(result.nll, total / 99, terms=99)  # the same windows, summed again
    chunked = perplexity(model, ids, max_length=32, stride=32)
    # Plain chunking: the first token of each of the 4 chunks has no context and is not scored.
    assert chunked.tokens == 96 and chunked.windows == 4
    with pytest.raises(Exception, match="stride"):
        perplexity(model, ids, max_length=16, stride=32)


@pytest.mark.numerics
@pytest.mark.parametrize("family", ["gpt2", "llama"])
def test_score_continuations_equals_naive(family):
    model = tiny(family)
    prompt = [3, 14, 15, 9]
    conts = [[26], [5, 35, 8], [1, 2]]
    scores = score_continuations(model, prompt, conts)
    for score, cont in zip(scores, conts):
        ids = torch.tensor(prompt + cont)
        with torch.no_grad():
            log_probs = F.log_softmax(model(input_ids=ids[None]).logits[0, :-1], dim=-1)
        naive = sum(float(log_probs[len(prompt) - 1 + j, t]) for j, t in enumerate(cont))
        # Cached prompt + padded batch vs one full pass: other kernels through 2 layers of
        # sums of up to 64 terms, then a log-softmax over 61 words.
        assert_close_rounding(score, naive, terms=64, depth=3)


class CharTokenizer:
    """Bytes as tokens (ids 0..255 mod vocab) — enough to drive the evaluation code."""

    def __init__(self, vocab: int = 61):
        self.vocab = vocab
        self.eos_token_id = None
        self.pad_token_id = 0
        self.bos_token_id = None

    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        return [32 + (b % (self.vocab - 32)) for b in text.encode()] or [32]

    def decode(self, ids, skip_special_tokens: bool = True) -> str:
        return "".join(chr(i) for i in ids)


def test_few_shot_predictions_equal_naive_argmax():
    from lmlab.tasks.types import Example, Task

    model = tiny()
    tok = CharTokenizer()
    train = [Example(id=f"t{i}", text=f"text number {i}", label=["ab", "cd"][i % 2])
             for i in range(6)]
    test = [Example(id=f"e{i}", text=f"query {i}", label=["ab", "cd"][i % 2]) for i in range(4)]
    task = Task(name="toy", type="classification", labels=["ab", "cd"], metrics=["accuracy"],
                splits={"train": train, "test": test})
    results = few_shot_evaluate(model, tok, task, [0, 2], max_examples=4)
    assert set(results) == {0, 2} and results[0]["n"] == 4
    for k in (0, 2):
        assert 0.0 <= results[k]["accuracy"] <= 1.0
    # Zero-shot prompts are fixed: recompute the predictions by brute force.
    from lmlab.evaluation.lm import FewShotFormat

    fmt = FewShotFormat(instruction="Classify each text. Possible labels: ab, cd.")
    correct = 0
    for example in test:
        prompt = fmt.instruction + fmt.separator + fmt.render(example.text)
        scores = []
        for label in task.labels:
            ids = torch.tensor(tok.encode(prompt) + tok.encode(" " + label))
            n = len(tok.encode(" " + label))
            with torch.no_grad():
                lp = F.log_softmax(model(input_ids=ids[None]).logits[0, :-1], dim=-1)
            scores.append(sum(float(lp[len(ids) - n - 1 + j, ids[len(ids) - n + j]])
                              for j in range(n)))
        correct += task.labels[max(range(2), key=scores.__getitem__)] == example.label
    assert results[0]["accuracy"] == correct / 4



def test_calibrated_few_shot_subtracts_the_content_free_prior():
    """With calibrate=True the prediction is argmax over labels of log p(label | prompt) -
    log p(label | the same shots + "N/A"), computed here by brute force (no cache)."""
    import random

    from lmlab.evaluation.lm import CONTENT_FREE_TEXT, FewShotFormat, render_prompt
    from lmlab.tasks.types import Example, Task

    model = tiny()
    tok = CharTokenizer()
    train = [Example(id=f"t{i}", text=f"text number {i}", label=["ab", "cd", "ef"][i % 3])
             for i in range(9)]
    test = [Example(id=f"e{i}", text=f"query {i}", label=["ab", "cd", "ef"][i % 3])
            for i in range(6)]
    task = Task(name="toy", type="classification", labels=["ab", "cd", "ef"],
                metrics=["accuracy"], splits={"train": train, "test": test})
    fmt = FewShotFormat(instruction="Classify each text. Possible labels: ab, cd, ef.")

    def total(prompt: str, label: str) -> float:
        ids = torch.tensor(tok.encode(prompt) + tok.encode(" " + label))
        n = len(tok.encode(" " + label))
        with torch.no_grad():
            lp = F.log_softmax(model(input_ids=ids[None]).logits[0, :-1], dim=-1)
        return sum(float(lp[len(ids) - n - 1 + j, ids[len(ids) - n + j]]) for j in range(n))

    flipped = 0  # predictions calibration changes: the test must see some, or it proves nothing
    for k in (0, 2):
        rng = random.Random(0 * 1000 + k)  # few_shot_evaluate's draw for seed 0
        expected = []
        for example in test:
            chosen = rng.sample(train, k) if k else []
            plain = [total(render_prompt(chosen, example.text, fmt), lab) for lab in task.labels]
            prior = [total(render_prompt(chosen, CONTENT_FREE_TEXT, fmt), lab)
                     for lab in task.labels]
            calibrated = [a - b for a, b in zip(plain, prior)]
            best = max(range(3), key=calibrated.__getitem__)
            expected.append(task.labels[best])
            flipped += best != max(range(3), key=plain.__getitem__)
        result = few_shot_evaluate(model, tok, task, k, max_examples=6, calibrate=True)[k]
        assert result["predictions"] == expected
        assert result["accuracy"] == pytest.approx(
            sum(p == e.label for p, e in zip(expected, test)) / 6)
    assert flipped > 0


def test_cloze_passages():
    """Passage extraction (the scorer is tested in test_eval_and_reports.py on a known answer)."""
    text = ("The old man walked slowly down the long road toward the village where he had "
            "lived for many years and he finally saw the church.")
    passages = cloze_passages([text, "too short."], min_words=10)
    assert passages == [(text[: text.rindex(" ")], "church")]


@pytest.mark.slow
def test_real_smollm2_few_shot_and_cloze(smollm2_gguf):
    import lmlab
    from lmlab.tokenization.tokenizer import Tokenizer

    model = lmlab.from_pretrained(smollm2_gguf)
    tok = Tokenizer.from_pretrained(smollm2_gguf)
    passages = cloze_passages([
        "The seven days of the week are Monday, Tuesday, Wednesday, Thursday, Friday, "
        "Saturday and Sunday."],
        min_words=10)
    assert lambada_cloze(model, tok, passages)["accuracy"] == 1.0
    result = few_shot_evaluate(model, tok, "fortunes-topic", [0], max_examples=10)
    assert result[0]["n"] == 10


def test_evaluate_cli_few_shot_reports_accuracy_per_shot(tmp_path, capsys):
    """`lmlab evaluate --few-shot` on a saved decoder and a task from files: one accuracy per
    shot count, the same numbers as the library call, chance and majority printed for scale."""
    import json

    from lmlab.cli import main
    from lmlab.tasks import load_table_task
    from lmlab.tokenization.tokenizer import Tokenizer

    rows = [{"text": f"item {i} is {'red' if i % 3 else 'blue'}", "label": "warm" if i % 3
             else "cold"} for i in range(12)]
    for split, part in (("train", rows[:8]), ("dev", rows[8:])):
        (tmp_path / f"{split}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in part))
    tokenizer = Tokenizer.train([r["text"] for r in rows] * 5, kind="bpe", vocab_size=300,
                                template="gpt2", min_frequency=1)
    model_dir = tmp_path / "model"
    lmlab.save_pretrained(tiny("gpt2", vocab=len(tokenizer)), model_dir)
    tokenizer.save_pretrained(model_dir)
    files = ["--task", "colours", "--train", str(tmp_path / "train.jsonl"),
             "--dev", str(tmp_path / "dev.jsonl"), "--model", str(model_dir)]
    assert main(["evaluate", *files, "--few-shot", "0,2", "--json"]) == 0
    printed = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    task = load_table_task("colours", {"train": str(tmp_path / "train.jsonl"),
                                       "dev": str(tmp_path / "dev.jsonl")}, "text", "label")
    expected = few_shot_evaluate(tiny("gpt2", vocab=len(tokenizer)), tokenizer, task, [0, 2],
                                 split="dev")
    assert printed["split"] == "dev"
    assert {int(k): v for k, v in printed["results"].items()} == expected
    assert main(["evaluate", *files, "--few-shot", "0"]) == 0
    text = capsys.readouterr().out
    assert "chance 0.500" in text and "majority class 'warm' 0.750" in text
    assert " 0-shot accuracy: " in text


def test_shot_counts_parse_or_fail_clearly():
    from lmlab.evaluation.lm import parse_shot_counts
    from lmlab.utils.errors import LmlabError

    assert parse_shot_counts("0, 1,8") == [0, 1, 8]
    with pytest.raises(LmlabError, match="--few-shot '0,one' is not a list of whole numbers"):
        parse_shot_counts("0,one")
    with pytest.raises(LmlabError, match="names no number"):
        parse_shot_counts(" , ")
    with pytest.raises(LmlabError, match="repeats a value"):
        parse_shot_counts("0,1,0")
