"""Evaluation that measures what it says, run reports that tell the truth (issue #11, "Trust").

- the subset sampler (few-shot evaluation and fine-tuning): label-stratified, stable, no prefix;
- the cloze scorer on a model whose greedy continuation is known in advance;
- `lmlab pretrain` / `lmlab runs show` / report.md: the last step (not the last logged one), the
  cost report printed, price and grid intensity settable, the host named.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest
import torch
from conftest import kjv_shards

from lmlab.cli import main
from lmlab.tasks.sampling import sample_examples
from lmlab.tasks.types import Example, Task
from lmlab.training.metrics_log import read_metrics
from lmlab.utils.host import cpu_from_cpuinfo, describe_host

# -- host -----------------------------------------------------------------------------------------
ZEN5 = """processor\t: 0
vendor_id\t: AuthenticAMD
cpu family\t: 26
model\t\t: 2
model name\t: AMD EPYC
flags\t\t: fpu sse sse2 avx avx2 avx512f avx512dq avx512_bf16 avx512_vnni

processor\t: 1
vendor_id\t: AuthenticAMD
cpu family\t: 26
model\t\t: 2
model name\t: AMD EPYC
flags\t\t: fpu sse sse2 avx avx2 avx512f avx512dq avx512_bf16 avx512_vnni
"""
ZEN3 = """processor\t: 0
cpu family\t: 25
model\t\t: 1
model name\t: AMD EPYC 7B13
flags\t\t: fpu sse4_2 avx avx2 fma
"""
SAPPHIRE_RAPIDS = """processor\t: 0
cpu family\t: 6
model\t\t: 143
model name\t: Intel(R) Xeon(R) Platinum 8481C CPU @ 2.70GHz
flags\t\t: avx2 avx512f avx512_bf16 avx512_fp16 amx_bf16 amx_tile
"""
GRAVITON3 = """processor\t: 0
BogoMIPS\t: 2100.00
Features\t: fp asimd evtstrm aes sve bf16 i8mm
CPU implementer\t: 0x41
"""


def test_cpu_from_cpuinfo_names_model_family_and_isa():
    assert cpu_from_cpuinfo(ZEN5) == ("AMD EPYC (family 26 model 2)", "AVX-512 + AVX512-BF16")
    assert cpu_from_cpuinfo(ZEN3) == ("AMD EPYC 7B13 (family 25 model 1)", "AVX2")
    assert cpu_from_cpuinfo(SAPPHIRE_RAPIDS) == (
        "Intel(R) Xeon(R) Platinum 8481C CPU @ 2.70GHz (family 6 model 143)",
        "AVX-512 + AVX512-BF16 + AVX512-FP16 + AMX-BF16")
    assert cpu_from_cpuinfo(GRAVITON3) == ("", "NEON + SVE + BF16")  # no name: describe_host
    # only the first processor block counts (a later, different block is ignored)
    assert cpu_from_cpuinfo(ZEN3 + "\n" + SAPPHIRE_RAPIDS)[0].startswith("AMD EPYC 7B13")


def test_describe_host_names_threads_and_torch():
    line = describe_host()
    assert f"{torch.get_num_threads()} thread" in line and f"torch {torch.__version__}" in line
    assert "3 threads" in describe_host(threads=3) and "1 thread," in describe_host(threads=1)
    cpuinfo = Path("/proc/cpuinfo")
    if cpuinfo.is_file():
        name, isa = cpu_from_cpuinfo(cpuinfo.read_text(errors="replace"))
        assert line.startswith(name) and isa in line


# -- the subset sampler ---------------------------------------------------------------------------
def _sorted_by_label(sizes: dict[str, int]) -> list[Example]:
    """A split as task files often are: sorted by id, hence by label."""
    return [Example(id=f"{label}:{i:04d}", text=f"{label} text {i}", label=label)
            for label, count in sizes.items() for i in range(count)]


# label sizes shaped like fortunes-topic's test split: 40 labels, 2 to 83 examples each
SIZES = {f"label{j:02d}": count for j, count in enumerate(
    [2, 2, 2, 3, 4, 5, 5, 6, 6, 6, 7, 7, 8, 8, 11, 14, 14, 14, 16, 16, 16, 17, 19, 20, 29, 30,
     31, 31, 33, 34, 38, 41, 41, 47, 48, 51, 72, 81, 82, 83])}


def test_sample_covers_as_many_labels_as_possible_in_proportion():
    examples = _sorted_by_label(SIZES)
    total = len(examples)
    for count in (1, 10, 39, 40):
        labels = Counter(e.label for e in sample_examples(examples, count))
        assert len(labels) == count, "below the label count, every example is another label"
    sample = sample_examples(examples, 100)
    labels = Counter(e.label for e in sample)
    assert len(sample) == 100 and set(labels) == set(SIZES)
    assert len({e.label for e in examples[:100]}) == 17  # what "the first 100" covered
    for label, size in SIZES.items():
        # label l keeps its examples of rank i < t * n_l, i.e. ceil(t * n_l), where the threshold
        # t lies between (100 - 40) / total and 100 / total (40 labels, each rounding up by < 1)
        low, high = 60 * size / total, 100 * size / total + 1
        assert max(1, low) <= labels[label] <= high, (label, labels[label])
    assert labels.most_common(1)[0][0] in ("label37", "label38", "label39")
    assert sample_examples(examples, None) == examples == sample_examples(examples, 10_000)


def test_sample_is_stable_across_order_and_processes():
    examples = _sorted_by_label(SIZES)
    ids = [e.id for e in sample_examples(examples, 100)]
    shuffled = list(examples)
    torch.manual_seed(1)
    shuffled = [shuffled[i] for i in torch.randperm(len(shuffled)).tolist()]
    assert sorted(e.id for e in sample_examples(shuffled, 100)) == sorted(ids)
    assert [e.id for e in sample_examples(examples, 100)] == ids  # the order of the split
    code = ("import json\n"
            "from lmlab.tasks.sampling import sample_examples\n"
            "from lmlab.tasks.types import Example\n"
            f"sizes = {SIZES!r}\n"
            "examples = [Example(id=f'{label}:{i:04d}', text='', label=label)\n"
            "            for label, count in sizes.items() for i in range(count)]\n"
            "print(json.dumps([e.id for e in sample_examples(examples, 100)]))")
    for hash_seed in ("1", "2"):  # Python's salted hash() must play no part
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                             check=True, env={"PYTHONHASHSEED": hash_seed, "PATH": ""}).stdout
        assert json.loads(out) == ids


def test_sample_of_unlabelled_examples_is_a_hash_draw_and_fine_tuning_uses_it():
    from lmlab.finetune import runner
    from lmlab.tasks.builtin import hash_unit

    scores = [Example(id=f"s{i}", text="t", label=float(i % 5)) for i in range(50)]
    expected = sorted(scores, key=lambda e: hash_unit(f"subset:{e.id}"))[:7]
    assert {e.id for e in sample_examples(scores, 7)} == {e.id for e in expected}
    task = Task("sorted", "classification", sorted(SIZES), ["accuracy"],
                {"train": _sorted_by_label(SIZES), "dev": []})
    assert runner.sample_examples is sample_examples  # one sampler, not two
    subset = runner._subset(task, 40).split("train")
    assert [e.id for e in subset] == [e.id for e in sample_examples(task.split("train"), 40)]


class AsciiTokenizer:
    """One token per ASCII character (ids 0..127): decode inverts encode."""

    eos_token_id = None
    pad_token_id = 0
    bos_token_id = None

    def __init__(self):
        self.encoded: list[str] = []

    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        self.encoded.append(text)
        return [ord(c) for c in text]

    def decode(self, ids, skip_special_tokens: bool = True) -> str:
        return "".join(chr(i) for i in ids)


def _tiny_decoder(vocab: int = 128):
    from lmlab.models.model import LanguageModel
    from lmlab.models.presets import family_config

    torch.manual_seed(0)  # the same weights on every call
    config = family_config("gpt2", vocab_size=vocab, hidden_size=32, num_hidden_layers=1,
                            num_attention_heads=4, intermediate_size=64,
                            max_position_embeddings=512, initializer_range=0.3)
    return LanguageModel(config, heads=("clm",)).eval()


def test_few_shot_scores_the_stratified_sample_and_reports_on_it():
    from lmlab.evaluation.lm import few_shot_evaluate, few_shot_report

    sizes = {"ab": 6, "cd": 3, "ef": 1}
    test = _sorted_by_label(sizes)
    train = [Example(id=f"t{i}", text=f"train {i}", label=label)
             for i, label in enumerate(["ab", "cd", "ef"] * 2)]
    task = Task("sorted", "classification", list(sizes), ["accuracy"],
                {"train": train, "test": test})
    tokenizer = AsciiTokenizer()
    results = few_shot_evaluate(_tiny_decoder(), tokenizer, task, [0, 1], max_examples=4,
                                calibrate=True)
    sample = sample_examples(test, 4)
    assert {e.label for e in sample} == {"ab", "cd", "ef"}
    scored = [e.text for e in test if any(e.text + "\n" in text for text in tokenizer.encoded)]
    assert scored == [e.text for e in sample]  # not the first 4 (all "ab")
    majority = sum(e.label == "ab" for e in sample) / 4  # "ab" is the train majority (tie, first)
    report = few_shot_report(task, "test", results)
    assert f"majority class 'ab' {majority:.3f}" in report
    assert report.endswith(f"host: {describe_host()}")
    plain = few_shot_evaluate(_tiny_decoder(), AsciiTokenizer(), task, [0, 1], max_examples=4)
    for k in (0, 1):  # the calibrated run also gives the plain accuracy of the same prompts
        assert results[k]["uncalibrated_accuracy"] == plain[k]["accuracy"]
        assert f"({plain[k]['accuracy']:.3f} without calibration)" in report


# -- cloze: a model whose greedy continuation is known --------------------------------------------
def scripted_decoder(text: str, width: int = 64):
    """A GPT-2-shaped model that ignores its input and, at position p, predicts text[p + 1]
    with certainty ("." past the end): word embeddings and blocks are zero, position p's
    embedding is one-hot, and the LM head maps that one-hot to the scripted character."""
    from lmlab.models.model import LanguageModel
    from lmlab.models.presets import family_config

    config = family_config("gpt2", vocab_size=128, hidden_size=width, num_hidden_layers=1,
                            num_attention_heads=4, intermediate_size=64,
                            max_position_embeddings=width, tie_word_embeddings=False)
    model = LanguageModel(config, heads=("clm",)).eval()
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.zero_()
        model.transformer.final_norm.weight.fill_(1.0)
        model.transformer.embeddings.position_embeddings.weight.copy_(10 * torch.eye(width))
        for position in range(width):
            following = text[position + 1] if position + 1 < len(text) else "."
            model.heads["clm"].decoder.weight[ord(following), position] = 10.0
    return model


def test_cloze_accuracy_on_a_model_with_a_known_answer():
    from lmlab.evaluation.lm import lambada_cloze

    context = "The bell rang in the"
    model = scripted_decoder(context + " church.")
    # the same length of context, whatever its words: the model says " church." after it
    passages = [(context, "church"), ("Xqzt vvvv wwww yyyyy", "church"),
                (context, "temple"), (context, "churches"), (context, "chur")]
    result = lambada_cloze(model, AsciiTokenizer(), passages)
    assert result == {"accuracy": 2 / 5, "n": 5}  # exact words only, no prefix, no extension
    assert lambada_cloze(model, AsciiTokenizer(), [(context + " old", "church")])["accuracy"] == 0


# -- pretrain: final step, cost report, price and grid intensity, host ----------------------------
@pytest.fixture(scope="module")
def shards(tmp_path_factory) -> Path:
    """Shards of 16 + 4 KJV chapters."""
    return kjv_shards(tmp_path_factory, train=16, validation=4)


def _pretrain_args(shards: Path, out: Path, steps: int) -> list[str]:
    return ["pretrain", "--family", "bert", "--size", "tiny", "--objective", "mlm",
            "--shards", str(shards), "--seq-len", "32", "--batch-size", "3", "--steps",
            str(steps), "--eval-batches", "1", "--out", str(out)]


def test_three_step_run_with_log_interval_two_reports_three_steps(shards, tmp_path, capsys):
    out = tmp_path / "run"
    args = _pretrain_args(shards, out, 3) + ["--log-every", "2", "--price-per-hour", "2.5",
                                             "--grid-intensity", "100"]
    assert main(args) == 0
    printed = capsys.readouterr().out
    state = json.loads((out / "checkpoints" / "step-3" / "state.json").read_text())
    tokens = state["tokens"]
    records = read_metrics(out / "metrics.jsonl")
    train = [r for r in records if r["kind"] == "train"]
    assert [r["step"] for r in train] == [1, 2, 3]  # 1 and 2 on the interval, 3: the last
    assert train[1]["tokens"] < tokens == train[2]["tokens"]
    assert records[-1] == {**records[-1], "kind": "end", "step": 3, "tokens": tokens,
                           "stop_reason": "max_steps"}
    report = (out / "report.md").read_text()
    assert "- steps: 3\n" in report and f"- tokens: {tokens:,}\n" in report
    assert "- stopped by: max_steps" in report and f"- host: {describe_host()}" in report
    assert f"3 steps, {tokens:,} tokens" in printed
    # the cost report is printed, with the price and grid intensity given
    cost = json.loads((out / "cost.json").read_text())
    assert cost["tokens"] == tokens and cost["host"] == describe_host()
    assert cost["price_per_device_hour"] == 2.5 and cost["grid_g_per_kwh"] == 100
    assert cost["money"] == pytest.approx(cost["wall_seconds"] / 3600 * 2.5, rel=1e-9)
    assert cost["co2_kg"] == pytest.approx(cost["energy_joules"] / 3.6e6 * 100 / 1000, rel=1e-9)
    assert f"| money | ${cost['money']:,.4f} at $2.5/device-hour |" in printed
    assert "at 100 g/kWh" in printed and f"| tokens seen | {tokens:,} |" in printed
    assert f"| host | {describe_host()} |" in printed
    config = json.loads((out / "config.json").read_text())
    assert config["cost"] == {"price_per_hour": 2.5, "grid_g_per_kwh": 100.0}
    # `lmlab runs show`: the report, and the same truth from metrics alone mid-run
    assert main(["runs", "show", str(out)]) == 0
    assert "- steps: 3\n" in capsys.readouterr().out
    (out / "report.md").unlink()
    assert main(["runs", "show", str(out)]) == 0
    shown = capsys.readouterr().out
    assert f"steps 3, tokens {tokens:,}" in shown and f"host: {describe_host()}" in shown
    # resumed to 5 steps: one "end" record, the new one (the file reads like one run)
    longer = list(args)
    longer[longer.index("--steps") + 1] = "5"
    assert main(longer) == 0
    capsys.readouterr()
    ends = [r for r in read_metrics(out / "metrics.jsonl") if r["kind"] == "end"]
    assert [r["step"] for r in ends] == [5]
    assert "- steps: 5\n" in (out / "report.md").read_text()


def test_cost_settings_from_a_config_file_and_bad_values_fail_first(shards, tmp_path, capsys):
    config = tmp_path / "run.yaml"
    config.write_text("hparams:\n  max_steps: 1\ncost:\n  price_per_hour: 0.5\n"
                      "  grid_g_per_kwh: 20\n")
    out = tmp_path / "yaml"
    assert main(_pretrain_args(shards, out, 1) + ["--config", str(config)]) == 0
    cost = json.loads((out / "cost.json").read_text())
    assert (cost["price_per_device_hour"], cost["grid_g_per_kwh"]) == (0.5, 20)
    assert "at $0.5/device-hour" in capsys.readouterr().out
    # the flag overrides the file
    override = tmp_path / "override"
    assert main(_pretrain_args(shards, override, 1) + ["--config", str(config),
                                                        "--grid-intensity", "700"]) == 0
    assert json.loads((override / "cost.json").read_text())["grid_g_per_kwh"] == 700
    capsys.readouterr()
    for bad, message in ((["--price-per-hour", "-1"], "price_per_hour = -1.0"),
                         (["--grid-intensity", "nan"], "grid_g_per_kwh = nan")):
        never = tmp_path / "never"
        assert main(_pretrain_args(shards, never, 1) + bad) == 2
        err = capsys.readouterr().err
        assert message in err and "lmlab: fix:" in err and not never.exists()
    typo = tmp_path / "typo.yaml"
    typo.write_text("hparams:\n  max_steps: 1\ncost:\n  price: 3\n")
    assert main(_pretrain_args(shards, tmp_path / "never", 1) + ["--config", str(typo)]) == 2
    assert "unknown cost setting 'price'" in capsys.readouterr().err


def test_host_line_says_when_the_kernels_are_capped(monkeypatch):
    """A figure measured with the kernels held to AVX2 (docs/setup.md) is not this CPU's own:
    the host line says so, and the measured peaks are cached under that line, apart."""
    from lmlab.utils.host import KERNEL_CAPS

    for var in KERNEL_CAPS:
        monkeypatch.delenv(var, raising=False)
    plain = describe_host()
    assert "capped" not in plain
    monkeypatch.setenv("ONEDNN_MAX_CPU_ISA", "AVX2")
    capped = describe_host()
    assert "kernels capped: ONEDNN_MAX_CPU_ISA=AVX2" in capped and capped != plain
