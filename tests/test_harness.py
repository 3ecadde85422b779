"""lmlab as an lm-evaluation-harness backend (lmlab/harness, docs/lm-eval.md): per-request
log-likelihoods, rolling log-likelihoods and greedy generations equal the harness's own
transformers backend (``hf``) on the same HF folder (a random 2-layer Llama, 64 positions, on
SmolLM2's tokenizer), directly and through local YAML tasks over JSONL files; ``lm_eval --model
lmlab`` finds the backend in a fresh process."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from conftest import perturb

pytest.importorskip("lm_eval", reason="lm-evaluation-harness (pip install 'lmlab[eval]')")
from lm_eval.api.instance import Instance  # noqa: E402
from lm_eval.api.registry import get_model  # noqa: E402

from lmlab.utils.errors import LmlabError  # noqa: E402

TOLERANCE = 1e-4  # issue 32: per-request log-likelihoods within 1e-4 of the hf backend's
LONG_TEXT = "In the beginning God created the heaven and the earth. And the earth was without " \
            "form, and void; and darkness was upon the face of the deep. " * 5
CAPITALS = [{"country": "France", "choices": [" Paris", " London", " Rome"], "answer": 0},
            {"country": "Italy", "choices": [" Paris", " London", " Rome"], "answer": 2},
            {"country": "England", "choices": [" Paris", " London", " Rome"], "answer": 1}]


def save_tiny(path: Path, tokenizer, family: str, positions: int, **extra) -> Path:
    """A random 2-layer decoder (moved off its initialisation) as an HF folder with its
    tokenizer."""
    import lmlab
    from lmlab.models.model import LanguageModel
    from lmlab.models.presets import family_config

    torch.manual_seed(0)
    model = LanguageModel(family_config(
        family, vocab_size=len(tokenizer), hidden_size=32, num_hidden_layers=2,
        num_attention_heads=4, intermediate_size=64, max_position_embeddings=positions,
        eos_token_id=tokenizer.eos_token_id, bos_token_id=tokenizer.bos_token_id, **extra),
        heads=("clm",))
    lmlab.save_pretrained(perturb(model, scale=0.2), path)
    tokenizer.save_pretrained(path)
    return path


@pytest.fixture(scope="module")
def smol_tokenizer(smollm2_gguf):
    from lmlab.tokenization.tokenizer import Tokenizer

    return Tokenizer.from_pretrained(smollm2_gguf)


@pytest.fixture(scope="module")
def folder(tmp_path_factory, smol_tokenizer):
    return save_tiny(tmp_path_factory.mktemp("harness") / "tiny", smol_tokenizer, "llama", 64,
                     num_key_value_heads=2)


@pytest.fixture(scope="module")
def backends(folder):
    """(hf, lmlab) on the same folder; batch size 3 so that requests share batches."""
    hf = get_model("hf")(pretrained=str(folder), batch_size=3, device="cpu", dtype="float32")
    ours = get_model("lmlab")(pretrained=str(folder), batch_size=3)
    assert ours.max_length == hf.max_length == 64
    return hf, ours


def _requests(kind: str, args: list[tuple]) -> list[Instance]:
    return [Instance(kind, {}, one, i) for i, one in enumerate(args)]


def _assert_scores_equal(got, want) -> None:
    diffs = [abs(a - b) for a, b in zip(got, want, strict=True)]
    assert max(diffs) <= TOLERANCE, (max(diffs), got, want)


def test_loglikelihood_equals_hf(backends):
    hf, ours = backends
    greedy = hf.generate_until(_requests("generate_until", [
        ("The capital of France is", {"until": [], "max_gen_toks": 3, "do_sample": False})]))[0]
    pairs = [("The capital of France is", " Paris"), ("The capital of France is", " London"),
             ("The capital of France is", greedy),  # its greedy continuation: is_greedy
             ("Question: what is 2+2?\nAnswer:", " 4"), ("", "Hello world"),
             ("a b c d " * 30, " e f g")]  # 120 tokens of context: cut to the 64-token window
    want = hf.loglikelihood(_requests("loglikelihood", pairs))
    got = ours.loglikelihood(_requests("loglikelihood", pairs))
    _assert_scores_equal([s for s, _ in got], [s for s, _ in want])
    assert [g for _, g in got] == [g for _, g in want]
    assert got[2][1] and not got[0][1]


def test_loglikelihood_rolling_over_windows_equals_hf(backends):
    hf, ours = backends
    assert len(ours.tok_encode(LONG_TEXT)) > 2 * ours.max_length  # three rolling windows
    texts = [(LONG_TEXT,), ("A short text.",)]
    want = hf.loglikelihood_rolling(_requests("loglikelihood_rolling", texts))
    got = ours.loglikelihood_rolling(_requests("loglikelihood_rolling", texts))
    _assert_scores_equal(got, want)


def test_learned_positions_windows_of_every_length_equal_hf(tmp_path, smol_tokenizer):
    """GPT-2 (a table of 48 positions): windows of different lengths share a batch (the last
    rolling window is short, its context long) and never look past the table."""
    path = save_tiny(tmp_path / "gpt2", smol_tokenizer, "gpt2", 48)
    hf = get_model("hf")(pretrained=str(path), batch_size=3, device="cpu", dtype="float32")
    ours = get_model("lmlab")(pretrained=str(path), batch_size=3)
    texts = [("word " * 150,), (LONG_TEXT,)]
    _assert_scores_equal(ours.loglikelihood_rolling(_requests("loglikelihood_rolling", texts)),
                         hf.loglikelihood_rolling(_requests("loglikelihood_rolling", texts)))
    pairs = [("x y z " * 40, " w"), ("The capital of France is", " Paris, a city")]
    want = hf.loglikelihood(_requests("loglikelihood", pairs))
    _assert_scores_equal([s for s, _ in ours.loglikelihood(_requests("loglikelihood", pairs))],
                         [s for s, _ in want])


def test_generate_until_stops_as_hf_greedy(backends):
    hf, ours = backends
    prompts = ["Once upon a time", "The capital of France is", "1, 2, 3,", "Hello"]
    free = ours.generate_until(_requests("generate_until", [
        (p, {"until": [], "max_gen_toks": 10, "do_sample": False}) for p in prompts]))
    stop = free[1].split()[1]  # a word the second answer reaches: it must stop there
    settings = {"until": [stop, "\n\n"], "max_gen_toks": 10, "do_sample": False}
    args = [(p, settings) for p in prompts]
    got = ours.generate_until(_requests("generate_until", args))
    assert got == hf.generate_until(_requests("generate_until", args))
    assert got[1] == free[1].split(stop)[0] and len(got[1]) < len(free[1])


def test_chat_template_is_the_one_transformers_renders(smollm2_gguf):
    """``--apply_chat_template``: SmolLM2's template (its GGUF's) as transformers renders it,
    with the generation prompt, and without it the last assistant message left open."""
    from types import SimpleNamespace

    from transformers.utils.chat_template_utils import render_jinja_template

    from lmlab.harness.adapter import LmlabLM
    from lmlab.tokenization.tokenizer import Tokenizer

    tokenizer = Tokenizer.from_pretrained(smollm2_gguf)
    history = [{"role": "system", "content": "Be brief."},
               {"role": "user", "content": "What is the capital of France?"}]
    for messages, prompt in ((history, True),
                             (history + [{"role": "assistant", "content": "It is "}], False)):
        want = render_jinja_template([messages], chat_template=tokenizer.chat_template,
                                     add_generation_prompt=prompt, continue_final_message=not prompt,
                                     bos_token=tokenizer.bos_token, eos_token=tokenizer.eos_token)
        want = want[0][0] if isinstance(want, tuple) else want
        got = LmlabLM.apply_chat_template(SimpleNamespace(tokenizer=tokenizer), messages, prompt)
        assert got == want
    assert got.endswith("assistant\nIt is ")  # open: its trailing space kept, as transformers


def _write_tasks(root: Path) -> Path:
    """Three local tasks over JSONL files: multiple choice, rolling perplexity, generation."""
    tasks = root / "tasks"
    tasks.mkdir()
    files = {"capitals": CAPITALS, "verses": [{"text": LONG_TEXT}, {"text": "Let there be light."}],
             "count": [{"q": "1, 2, 3,", "a": " 4"}, {"q": "a, b, c,", "a": " d"}]}
    for name, rows in files.items():
        (root / f"{name}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    common = ("dataset_path: json\ndataset_kwargs:\n  data_files:\n    test: {data}\n"
              "  cache_dir: {cache}\ntest_split: test\n")
    specs = {
        "capitals": "output_type: multiple_choice\ndoc_to_text: 'The capital of {{country}} is'\n"
                    "doc_to_choice: '{{choices}}'\ndoc_to_target: '{{answer}}'\n"
                    "metric_list:\n  - metric: acc\n",
        "verses": "output_type: loglikelihood_rolling\ndoc_to_text: ''\n"
                  "doc_to_target: '{{text}}'\nmetric_list:\n  - metric: word_perplexity\n"
                  "  - metric: bits_per_byte\n",
        "count": "output_type: generate_until\ndoc_to_text: '{{q}}'\ndoc_to_target: '{{a}}'\n"
                 "generation_kwargs:\n  until: [',']\n  max_gen_toks: 6\n  do_sample: false\n"
                 "metric_list:\n  - metric: exact_match\n",
    }
    for name, spec in specs.items():
        head = common.format(data=root / f"{name}.jsonl", cache=root / "cache")
        (tasks / f"{name}.yaml").write_text(f"task: lmlab_{name}\n{head}{spec}")
    return tasks


@pytest.fixture(scope="module")
def task_dir(tmp_path_factory):
    return _write_tasks(tmp_path_factory.mktemp("tasks"))


@pytest.fixture(scope="module")
def evaluate(task_dir):
    """simple_evaluate on the three local tasks, one TaskManager (its index) for every call."""
    from lm_eval import simple_evaluate
    from lm_eval.tasks import TaskManager

    manager = TaskManager(include_path=str(task_dir))
    return lambda lm: simple_evaluate(
        model=lm, tasks=["lmlab_capitals", "lmlab_verses", "lmlab_count"],
        task_manager=manager, log_samples=True, bootstrap_iters=0)


@pytest.fixture(scope="module")
def hf_results(backends, evaluate):
    return evaluate(backends[0])


def _responses(samples: list[dict]) -> list:
    """Every request's response in order: (loglikelihood, is_greedy), a rolling total or text."""
    return [response for sample in samples for request in sample["resps"]
            for response in request]


def test_local_yaml_tasks_equal_hf_per_request(backends, evaluate, hf_results):
    got = evaluate(backends[1])
    for task in ("lmlab_capitals", "lmlab_verses", "lmlab_count"):
        mine, theirs = (_responses(r["samples"][task]) for r in (got, hf_results))
        assert len(mine) == len(theirs) > 0
        if task == "lmlab_count":
            assert mine == theirs
        elif task == "lmlab_verses":
            _assert_scores_equal(mine, theirs)
        else:
            _assert_scores_equal([s for s, _ in mine], [s for s, _ in theirs])
            assert [g for _, g in mine] == [g for _, g in theirs]
    for task, metric in (("lmlab_capitals", "acc,none"), ("lmlab_verses", "bits_per_byte,none")):
        # tol: the per-request log-likelihoods agree within rounding (above); accuracy and bits
        # per byte, averages of them over many bytes, move by less than 1e-5
        assert got["results"][task][metric] == pytest.approx(
            hf_results["results"][task][metric], abs=1e-5)


def _run_harness(command: list[str], folder: Path, task_dir: Path, out: Path) -> dict:
    """A harness command line on the capitals task in a fresh process: its results.json."""
    env = dict(os.environ, HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1", TQDM_DISABLE="1")
    done = subprocess.run([*command, "--model", "lmlab", "--model_args", f"pretrained={folder}",
                           "--tasks", "lmlab_capitals", "--include_path", str(task_dir),
                           "--output_path", str(out)],
                          env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(next(out.rglob("results*.json")).read_text())


def test_lm_eval_finds_lmlab_in_a_fresh_process(folder, task_dir, tmp_path, hf_results):
    """The ``lm_eval`` command finds the backend (the .pth hook scripts/setup.sh installs);
    the multiple-choice accuracy is the in-process one."""
    results = _run_harness([str(Path(sys.executable).parent / "lm_eval")], folder, task_dir,
                           tmp_path)
    assert results["config"]["model"] == "lmlab"
    assert results["results"]["lmlab_capitals"]["acc,none"] == hf_results["results"][
        "lmlab_capitals"]["acc,none"]


@pytest.mark.slow
def test_python_m_lmlab_harness_runs_the_harness(folder, task_dir, tmp_path, hf_results):
    """``python -m lmlab.harness`` registers the backend itself (for a site without the hook)."""
    results = _run_harness([sys.executable, "-m", "lmlab.harness"], folder, task_dir,
                           tmp_path)
    assert results["results"]["lmlab_capitals"]["acc,none"] == hf_results["results"][
        "lmlab_capitals"]["acc,none"]


def test_bad_input_is_refused(folder, minilm_dir, backends):
    _, ours = backends
    with pytest.raises(LmlabError, match="unknown lmlab model_args"):
        get_model("lmlab")(pretrained=str(folder), temperature=1)
    with pytest.raises(LmlabError, match="decoder"):
        get_model("lmlab")(pretrained=str(minilm_dir))
    with pytest.raises(LmlabError, match="batch_size"):
        get_model("lmlab")(pretrained=str(folder), batch_size="many")
    with pytest.raises(LmlabError, match="exceeds the model's 64 positions"):
        get_model("lmlab")(pretrained=str(folder), max_length=65)
    with pytest.raises(LmlabError, match="no room for a context"):
        ours.generate_until(_requests("generate_until", [("Hi", {"max_gen_toks": 64})]))
    with pytest.raises(LmlabError, match="does not read"):
        ours.generate_until(_requests("generate_until", [("Hi", {"num_beams": 2})]))


def test_lmlab_imports_without_the_harness():
    """With lm_eval unimportable, lmlab and the hook import; the adapter names the extra."""
    code = ("import sys; sys.modules['lm_eval'] = None\nimport lmlab, lmlab.harness.hook\n"
            "try:\n    import lmlab.harness.adapter\nexcept lmlab.LmlabError as e:\n"
            "    print(e)\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr
    assert "lmlab[eval]" in done.stdout


def test_the_pth_line_activates_the_hook(tmp_path):
    """``install`` writes a .pth whose line, run as site-packages' are at start-up, imports the
    hook (and nothing heavy); without lmlab the line does nothing."""
    from lmlab.harness.hook import PTH_FILE, install

    assert install(str(tmp_path)) == tmp_path / PTH_FILE
    root = str(Path(__file__).resolve().parent.parent)
    code = ("import site, sys\nsys.path.insert(0, {root!r})\nsite.addsitedir({site!r})\n"
            "print('lmlab.harness.hook' in sys.modules, 'torch' in sys.modules)")
    for path, want in ((root, "True False"), ("/nonexistent", "False False")):
        done = subprocess.run([sys.executable, "-S", "-c", code.format(root=path,
                                                                      site=str(tmp_path))],
                              cwd=tmp_path, capture_output=True, text=True, timeout=60)
        assert done.returncode == 0 and done.stderr == "", done.stderr
        assert done.stdout.split() == want.split()
