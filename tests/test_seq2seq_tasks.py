"""Text-to-text tasks end to end: task folders (integration generated for a seed, WordNet's
definitions with a train-only pretraining corpus), the symbol tokenizer, training through
``lmlab seq2seq train`` and scoring through ``lmlab seq2seq evaluate`` in fresh processes,
and the refusals."""

from __future__ import annotations

import json

import pytest
import torch
from conftest import assert_clean_refusal, disk_snapshot, run_lmlab, run_lmlab_here

from lmlab.finetune.text_to_text import encode_pairs
from lmlab.tasks.integration import prefix_depth
from lmlab.tasks.inverse import (
    build_pairs,
    read_task_data,
    score,
    task_info,
    verified_accuracy,
    write_task_data,
)
from lmlab.tasks.types import TextPair
from lmlab.tokenization.symbols import symbol_tokenizer
from lmlab.tokenization.tokenizer import Tokenizer
from lmlab.utils.errors import LmlabError


@pytest.mark.parametrize("text,depth", [("x", 0), ("exp x", 1), ("add x exp x", 2),
                                        ("add INT+ 1 2 mul x cos x", 3),
                                        ("mul exp sin x log x", 3), ("INT- 3", 0)])
def test_prefix_depth(text, depth):
    assert prefix_depth(text.split()) == depth


def test_integration_folder_round_trip(tmp_path):
    sizes = write_task_data("integration", tmp_path / "d", count=200, seed=3)
    task, splits = read_task_data(tmp_path / "d")
    assert task == "integration" and {k: len(v) for k, v in splits.items()} == sizes
    assert sum(sizes.values()) == 200
    inputs = [{p.input_text for p in splits[s]} for s in ("train", "dev", "test")]
    assert not (inputs[0] & inputs[1] or inputs[0] & inputs[2] or inputs[1] & inputs[2])
    assert all(p.tag.startswith("depth ") for p in splits["test"])
    assert build_pairs("integration", count=200, seed=3)["test"] == splits["test"]  # seeded
    overlap = task_info(tmp_path / "d")["overlap"]  # by function: none; by structure: some
    assert overlap["test"]["input"] == overlap["test"]["function"] == 0.0
    assert 0.0 < overlap["test"]["target_skeleton"] < 1.0
    with pytest.raises(LmlabError, match="holds something|already"):
        write_task_data("integration", tmp_path / "d", count=10)


def test_definitions_corpus_holds_only_train_texts(tmp_path):
    write_task_data("definitions", tmp_path / "d")
    _, splits = read_task_data(tmp_path / "d")
    corpus = [json.loads(line) for name in ("train", "validation")
              for line in (tmp_path / "d" / "corpus" / f"{name}.jsonl").open()]
    texts = {s for doc in corpus for s in doc["sentences"]}
    train_glosses = {p.target for p in splits["train"]}
    held_out = {p.target for split in ("dev", "test") for p in splits[split]}
    assert held_out and not (texts & held_out)  # no dev or test gloss, even as another's
    assert train_glosses <= texts


def test_verified_accuracy_counts_any_verified_hypothesis():
    pairs = [TextPair("mul INT+ 2 x", ("pow x INT+ 2",), tag="depth 1"),
             TextPair("cos x", ("sin x",), tag="depth 1")]
    result = verified_accuracy(pairs, [["x", "add pow x INT+ 2 INT+ 7"], ["cos x", "sin"]])
    assert result["verified_accuracy"] == 0.5  # the first via its second hypothesis
    assert result["by_tag"]["depth 1"] == {"verified_accuracy": 0.5, "examples": 2}
    assert result["verdicts"]["numeric"] == 1 and result["verdicts"]["unparsable"] == 1
    assert result["unverifiable"] == 0.0


def test_unverifiable_inputs_are_reported_apart_and_not_solved():
    """exp^4(x + 3) overflows at every point: a wrong G there is undecided, so the input is
    neither solved nor wrong-for-sure; a hypothesis that verifies after it still solves it."""
    import sympy

    from lmlab.tasks.integration import to_prefix

    x = sympy.Symbol("x")
    tower = sympy.exp(sympy.exp(sympy.exp(sympy.exp(x + 3))))
    f, wrong = " ".join(to_prefix(sympy.diff(tower, x))), " ".join(to_prefix(tower + x))
    pairs = [TextPair(f, (" ".join(to_prefix(tower)),), tag="depth 5")] * 2
    result = verified_accuracy(pairs, [[wrong], [wrong, " ".join(to_prefix(tower))]])
    assert result["verified_accuracy"] == 0.5 and result["unverifiable"] == 0.5
    assert result["verdicts"] == {"simplify": 1, "undecided": 2}


def test_text_scores_use_sacrebleu_and_any_reference():
    sacrebleu = pytest.importorskip("sacrebleu")
    pairs = [TextPair("bank: the bank of the river", ("sloping land beside water",)),
             TextPair("cat: the cat sat", ("a small domesticated feline",))]
    hypotheses = [["sloping land beside a river"], ["a small domesticated feline"]]
    result = score("definitions", pairs, hypotheses)
    expected = sacrebleu.corpus_bleu([h[0] for h in hypotheses],
                                     [[p.target for p in pairs]]).score / 100
    assert result["bleu"] == pytest.approx(expected) and result["exact_match"] == 0.5
    reverse = score("reverse-dictionary", [TextPair("a feline", ("cat", "true cat"))],
                    [["True Cat"]])
    assert reverse["exact_match"] == 1.0


def test_symbol_tokenizer_round_trips_and_saves(tmp_path):
    tok = symbol_tokenizer("add x INT+ 1 2 cos".split())
    ids = tok.encode("add x INT+ 1 2 cos")
    assert ids[-1] == tok.eos_token_id and tok.pad_token_id == 0
    assert tok.decode(ids, skip_special_tokens=True) == "add x INT+ 1 2 cos"
    tok.save_pretrained(tmp_path)
    assert Tokenizer.from_pretrained(tmp_path).encode("cos x") == tok.encode("cos x")
    with pytest.raises(LmlabError, match="whitespace"):
        symbol_tokenizer(["a b"])


def test_targets_longer_than_the_limit_are_refused():
    tok = symbol_tokenizer("add x INT+ 1 2 cos".split())
    pairs = [TextPair("x", ("add x add x add x x",)), TextPair("x", ("x",))]
    with pytest.raises(LmlabError, match="1 of 2 targets are longer than max_target_length=4"):
        encode_pairs(pairs, tok, 16, 4)


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """A task folder and a model trained on it by the command, in a fresh process."""
    root = tmp_path_factory.mktemp("seq2seq")
    data = run_lmlab("seq2seq", "data", "--task", "integration", "--count", "300", "--out",
                     root / "data")
    assert data.returncode == 0, data.stderr
    run = run_lmlab("seq2seq", "train", "--data", root / "data", "--family", "marian",
                    "--layers", "1", "--hidden", "64", "--steps", "30", "--batch-size", "16",
                    "--lr", "2e-3", "--precision", "fp32", "--out", root / "run")
    assert run.returncode == 0, run.stderr
    return root


def test_train_and_evaluate_commands(trained):
    summary = json.loads(trained.joinpath("run", "model", "config.json").read_text())
    assert summary["model_type"] == "marian" and summary["architectures"] == ["MarianMTModel"]
    out = trained / "metrics.json"
    result = run_lmlab("seq2seq", "evaluate", "--model", trained / "run" / "model", "--data",
                       trained / "data", "--beams", "1,3", "--max-examples", "8",
                       "--max-new-tokens", "24", "--out", out)
    assert result.returncode == 0, result.stderr
    metrics = json.loads(out.read_text())
    assert metrics["examples"] == 8 and set(metrics) >= {"beam 1", "beam 3"}
    for beam in ("beam 1", "beam 3"):
        assert 0.0 <= metrics[beam]["verified_accuracy"] <= 1.0
        assert sum(v["examples"] for v in metrics[beam]["by_tag"].values()) == 8
    # beam 3 checks 3 hypotheses per input where the greedy run checks one
    assert sum(metrics["beam 3"]["verdicts"].values()) > sum(metrics["beam 1"]["verdicts"].values())


def test_one_model_scored_on_several_generators_test_sets(trained, tmp_path):
    """The cross-generator evaluation: a BWD-trained model on a BWD and an IBP test set (IBP's
    inputs hold products the BWD data rarely has), one table."""
    write_task_data("integration", tmp_path / "ibp", count=30, seed=0, generator="ibp",
                    max_ops=2)
    out = tmp_path / "cross.json"
    result = run_lmlab("seq2seq", "evaluate", "--model", trained / "run" / "model", "--data",
                       trained / "data", tmp_path / "ibp", "--beams", "1,2", "--max-examples",
                       "2", "--max-new-tokens", "16", "--out", out)
    assert result.returncode == 0, result.stderr
    metrics = json.loads(out.read_text())
    assert list(metrics) == [str(trained / "data"), str(tmp_path / "ibp")]
    for folder, scores in metrics.items():
        assert scores["examples"] == 2 and 0.0 <= scores["beam 2"]["verified_accuracy"] <= 1.0
        assert f"| {folder} | 2 | " in result.stdout
    assert "| data | examples | beam 1 | beam 2 |" in result.stdout


def test_evaluate_refuses_to_overwrite_its_output(trained, tmp_path):
    out = tmp_path / "metrics.json"
    out.write_text("{}")
    result = run_lmlab_here("seq2seq", "evaluate", "--model", trained / "run" / "model", "--data",
                       trained / "data", "--max-examples", "2", "--out", out)
    assert_clean_refusal(result, str(out), fix="--overwrite")
    assert out.read_text() == "{}"


def test_sources_beyond_the_positions_are_cut_when_decoding(trained):
    import lmlab
    from lmlab.finetune.text_to_text import predict_texts

    model = lmlab.from_pretrained(trained / "run" / "model")
    tok = lmlab.Tokenizer.from_pretrained(trained / "run" / "model")
    longest = " ".join(["add x"] * model.max_length)  # twice the positions
    out = predict_texts(model, tok, [longest], max_new_tokens=10 * model.max_length)
    assert len(out) == 1 and isinstance(out[0][0], str)


def test_generate_command_prints_the_decoders_output(trained):
    result = run_lmlab("generate", trained / "run" / "model", "mul INT+ 2 x", "--max-new-tokens",
                       "8", "--json")
    assert result.returncode == 0, result.stderr
    row = json.loads(result.stdout)
    assert row["prompt"] == "mul INT+ 2 x" and isinstance(row["generated"], str)


def test_bad_train_arguments_are_refused_before_work(trained, tmp_path):
    data = trained / "data"
    no_stop = run_lmlab_here("seq2seq", "train", "--data", data, "--out", tmp_path / "a")
    assert_clean_refusal(no_stop, "neither --steps nor --budget")
    assert not (tmp_path / "a").exists()
    text_task = tmp_path / "defs"
    (text_task).mkdir()
    (text_task / "task.json").write_text(json.dumps({"task": "definitions"}))
    for split in ("train", "dev", "test"):
        (text_task / f"{split}.jsonl").write_text(json.dumps(
            {"input": "a: a b", "references": ["c"]}) + "\n")
    no_tokenizer = run_lmlab_here("seq2seq", "train", "--data", text_task, "--steps", "2", "--out",
                             tmp_path / "b")
    assert_clean_refusal(no_tokenizer, "needs a tokenizer", fix="--tokenizer")
    # the same run folder with another model: refused, naming the difference, nothing touched
    before = disk_snapshot(trained / "run")
    again = run_lmlab_here("seq2seq", "train", "--data", data, "--family", "marian", "--layers", "1",
                      "--hidden", "32", "--steps", "30", "--batch-size", "16", "--lr", "2e-3",
                      "--precision", "fp32", "--out", trained / "run")
    assert_clean_refusal(again, "hidden")
    assert disk_snapshot(trained / "run") == before
    # a device that is not there, even with --overwrite: refused before the run is removed
    devices = [("cuda:x", "unknown device"), ("meta", "unknown device")]
    if not torch.cuda.is_available():
        devices.append(("cuda", "CUDA is not available"))
    for device, problem in devices:
        wrong = run_lmlab_here("seq2seq", "train", "--data", data, "--steps", "2", "--overwrite",
                          "--device", device, "--out", trained / "run")
        assert_clean_refusal(wrong, problem, fix="cpu")
        assert disk_snapshot(trained / "run") == before


def test_a_fresh_model_follows_the_run_seed(tmp_path):
    """Random-init runs of one seed start from the same weights, of another seed not: the three
    seeds of an experiment are three draws, and each can be repeated."""
    import torch

    import lmlab
    from lmlab.finetune.text_to_text import train_on_task
    from lmlab.training.config import TrainingConfig

    write_task_data("integration", tmp_path / "data", count=60, seed=0)
    weights = {}
    for name, seed in (("a", 0), ("b", 0), ("c", 1)):
        cfg = TrainingConfig(max_steps=1, batch_size=8, lr=1e-9, seed=seed, progress=False)
        train_on_task(tmp_path / "data", tmp_path / name, cfg, layers=1, hidden=64)
        model = lmlab.from_pretrained(tmp_path / name / "model")
        weights[name] = model.encoder.layers[0].attention.q_proj.weight.detach()
    assert torch.equal(weights["a"], weights["b"])  # exact: the same run twice
    assert not torch.allclose(weights["a"], weights["c"])


def test_classification_as_text_to_text(tmp_path):
    """T5's formulation of a built-in task: the label's name as the target, read back from the
    generated text and scored with the task's own metrics."""
    from lmlab.tasks import load_builtin_task

    write_task_data("wordnet-supersense", tmp_path / "d")
    task, splits = read_task_data(tmp_path / "d")
    original = load_builtin_task("wordnet-supersense")
    assert len(splits["test"]) == len(original.split("test"))
    first = original.split("test")[0]
    assert splits["test"][0].input_text == f"wordnet-supersense: {first.text}"
    assert splits["test"][0].target == first.label
    info = json.loads((tmp_path / "d" / "task.json").read_text())
    pairs = splits["test"][:50]
    perfect = score(task, pairs, [[p.target] for p in pairs], info=info)
    assert perfect[info["metrics"][0]] == 1.0 and perfect["not_a_label"] == 0.0
    wrong = score(task, pairs, [["not a supersense"] for _ in pairs], info=info)
    assert wrong["accuracy"] == 0.0 and wrong["not_a_label"] == 1.0


def test_text2text_pipeline(trained):
    import lmlab
    from lmlab.finetune.text_to_text import predict_texts

    solve = lmlab.pipeline("text2text-generation", model=trained / "run" / "model")
    out = solve(["mul INT+ 2 x", "cos x"], max_new_tokens=12)
    expected = predict_texts(solve.model, solve.tokenizer, ["mul INT+ 2 x", "cos x"],
                             max_new_tokens=12)
    assert out == [[{"generated_text": e[0]}] for e in expected]
    with pytest.raises(LmlabError, match="needs an encoder-decoder"):
        lmlab.pipeline("text2text-generation", model="minilm")


def test_a_derivative_over_the_time_limit_is_a_clear_error(monkeypatch):
    """Generation never skips a slow derivative (the data would depend on the machine's
    speed): it stops with a message naming the function and the fix."""
    import time

    import sympy

    from lmlab.tasks.integration_data import generate_pairs

    def slow_diff(*args, **kwargs):
        time.sleep(5)

    monkeypatch.setattr(sympy, "diff", slow_diff)
    with pytest.raises(LmlabError, match="took longer than 0.2 s") as error:
        generate_pairs(3, seed=0, timeout=0.2)
    assert "raise the timeout" in error.value.fix


def test_a_folder_of_your_own_pairs(tmp_path):
    """task.json {"task": "text"}: your own pairs, trained and scored like definitions (BLEU,
    chrF, exact match; several references per example)."""
    folder = tmp_path / "mine"
    folder.mkdir()
    (folder / "task.json").write_text(json.dumps({"task": "text"}))
    rows = [{"input": f"number {i}", "references": [f"n{i}", f"#{i}"]} for i in range(12)]
    for split in ("train", "dev", "test"):
        (folder / f"{split}.jsonl").write_text("\n".join(map(json.dumps, rows)) + "\n")
    task, splits = read_task_data(folder)
    assert task == "text" and splits["test"][0].references == ("n0", "#0")
    result = score(task, splits["test"], [["#0"]] + [["x"]] * 11)
    assert result["exact_match"] == pytest.approx(1 / 12) and 0 <= result["bleu"] <= 1
    with pytest.raises(LmlabError, match="nothing to generate"):
        write_task_data("text", tmp_path / "other")


def test_a_sequence_beyond_the_positions_is_refused():
    import torch

    from lmlab.models.families import get_family
    from lmlab.models.seq2seq import EncoderDecoderModel

    spec = get_family("bart")
    config = spec.config(hidden_size=32, num_hidden_layers=1, num_decoder_layers=1,
                         num_attention_heads=2, intermediate_size=64, vocab_size=50,
                         max_position_embeddings=12)  # 10 positions + BART's offset of 2
    model = EncoderDecoderModel(config)
    with pytest.raises(LmlabError, match="11 tokens is longer than the 10 positions"):
        model(input_ids=torch.ones(1, 11, dtype=torch.long), labels=torch.ones(1, 3,
                                                                              dtype=torch.long))


def test_finetune_points_an_encoder_decoder_to_text_to_text(trained, tmp_path):
    result = run_lmlab_here("finetune", "--task", "fortunes-topic", "--model",
                       trained / "run" / "model", "--out", tmp_path / "ft")
    assert_clean_refusal(result, "is an encoder-decoder", fix="lmlab seq2seq train")


def test_lm_evaluation_refuses_an_encoder_decoder(trained, tmp_path):
    text = tmp_path / "text.txt"
    text.write_text("mul INT+ 2 x\n")
    result = run_lmlab_here("perplexity", trained / "run" / "model", text)
    assert_clean_refusal(result, "encoder-decoder", fix="lmlab seq2seq evaluate")


@pytest.mark.parametrize("family", ["t5", "mt5"])
def test_a_fresh_t5_family_model_keeps_64_dim_heads(family):
    """``lmlab seq2seq train --family t5|mt5 --hidden H``: T5's heads stay 64 wide, mT5 is T5
    v1.1 (gated GELU, untied head) under its own model_type."""
    from lmlab.finetune.text_to_text import build_seq2seq_model
    from lmlab.tokenization.tokenizer import Tokenizer

    model = build_seq2seq_model(family, Tokenizer.byt5(), layers=1, hidden=128)
    config = model.config
    assert (config.family, config.head_dim, config.num_attention_heads) == (family, 64, 2)
    assert config.vocab_size == 384 and config.num_decoder_layers == 1
    if family == "mt5":
        assert (config.ffn_type, config.hidden_act) == ("glu", "gelu_new")  # gated GELU
        assert not config.tie_word_embeddings
