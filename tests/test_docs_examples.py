"""Every command and snippet in README.md and docs/*.md runs as written.

The fenced blocks of each page run in order, in one fresh temporary directory per page (so
``lmlab data build --out corpus/`` feeds a later ``lmlab tokenizer train --corpus corpus/``),
each in a subprocess with the virtual environment's ``bin/`` first on PATH:

- ```` ```bash ```` blocks run with ``bash -e -o pipefail``; ```` ```console ```` blocks run the
  lines that start with ``$ `` (and their ``\\`` continuations); the rest is shown output.
- ```` ```python ```` blocks run with this Python as a script.
- ```` ```text ````, ```` ```yaml ````, ```` ```json ```` ... are listings and never run. A fence
  without a language is an error: a reader cannot tell a command from an output.

A page marks its expensive or unrunnable blocks with an HTML comment (invisible when
rendered) on the line before the fence:

- ``<!-- doc-test: slow -->``: over ~20 s (a real corpus, a pretraining budget); runs only
  under ``pytest -m slow``, where the whole page runs, slow blocks included, in order. A cheap
  block that needs the output of a slow one is marked slow too.
- ``<!-- doc-test: skip (reason) -->``: never run (the 20-minute ``make demo`` itself, an
  hour-long benchmark, a multi-process launch); the reason is required and shown.

The default suite runs each page's cheap blocks; ``-m slow`` runs every page whole.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
RUN_LANGUAGES = {"bash", "console", "python"}
LISTING_LANGUAGES = {"text", "yaml", "json", "jsonl", "markdown", "toml", "csv"}
CHEAP_TIMEOUT_S = 120   # a cheap block takes < ~20 s alone; this allows for 8 people on 2 cores
SLOW_TIMEOUT_S = 1800
_MARK = re.compile(r"<!--\s*doc-test:\s*(slow|skip)\s*(?:\((.+)\))?\s*-->")


@dataclass
class Block:
    page: Path
    line: int        # line number of the opening fence
    language: str
    code: str
    mark: str | None  # None, "slow" or "skip"
    reason: str | None

    @property
    def where(self) -> str:
        return f"{self.page.relative_to(ROOT)}:{self.line}"


def parse_blocks(page: Path) -> list[Block]:
    """Every fenced block of a markdown page, with the doc-test mark on the line before it."""
    lines = page.read_text(encoding="utf-8").splitlines()
    blocks: list[Block] = []
    i = 0
    while i < len(lines):
        opening = re.match(r"^(\s*)```(\S*)\s*$", lines[i])
        if not opening:
            i += 1
            continue
        end = i + 1
        while end < len(lines) and not lines[end].strip().startswith("```"):
            end += 1
        previous = lines[i - 1].strip() if i > 0 else ""
        mark = _MARK.search(previous)
        blocks.append(Block(page, i + 1, opening.group(2).lower(), "\n".join(lines[i + 1:end]),
                            mark.group(1) if mark else None,
                            mark.group(2) if mark else None))
        i = end + 1
    return blocks


def console_commands(code: str) -> str:
    """The commands of a console block: ``$ `` lines and their backslash continuations."""
    commands, continuing = [], False
    for line in code.splitlines():
        if line.startswith("$ "):
            commands.append(line[2:])
            continuing = line.rstrip().endswith("\\")
        elif continuing:
            commands.append(line)
            continuing = line.rstrip().endswith("\\")
    return "\n".join(commands)


def _environment(workdir: Path) -> dict[str, str]:
    bin_dir = str(Path(sys.executable).parent)
    return {**os.environ, "PATH": bin_dir + os.pathsep + os.environ.get("PATH", ""),
            "LMLAB_CACHE": str(workdir / ".lmlab-cache"), "LMLAB_NO_PROGRESS": "1",
            "PYTHONUNBUFFERED": "1", "MPLBACKEND": "Agg"}


def page_directory(tmp_path: Path) -> Path:
    """A fresh working directory with a copy of the user's lmlab cache (built tasks, measured
    peaks), so examples like ``lmlab cost peak --refresh`` never rewrite the real one."""
    from lmlab.utils.paths import cache_dir

    shutil.copytree(cache_dir(), tmp_path / ".lmlab-cache",
                    ignore=shutil.ignore_patterns("debian", "probe-features"), dirs_exist_ok=True)
    return tmp_path


def run_block(block: Block, workdir: Path, timeout: float) -> float:
    """Run one block in ``workdir``; fail the test with its output if it fails. Returns seconds."""
    if block.language == "python":
        script = workdir / f"_doc_example_{block.line}.py"
        script.write_text(block.code + "\n", encoding="utf-8")
        argv = [sys.executable, script.name]
    else:
        code = console_commands(block.code) if block.language == "console" else block.code
        argv = ["bash", "-e", "-o", "pipefail", "-c", code]
    start = time.perf_counter()
    try:
        result = subprocess.run(argv, cwd=workdir, env=_environment(workdir), capture_output=True,
                                stdin=subprocess.DEVNULL, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        pytest.fail(f"{block.where}: the {block.language} example ran over {timeout:.0f} s; "
                    "make it cheaper or mark it `<!-- doc-test: slow -->`")
    seconds = time.perf_counter() - start
    print(f"{block.where}: {block.language} example ran in {seconds:.1f} s")  # shown with -rP
    if result.returncode != 0:
        pytest.fail(f"{block.where}: the {block.language} example failed "
                    f"(exit {result.returncode}):\n{block.code}\n--- stdout ---\n"
                    f"{result.stdout[-3000:]}\n--- stderr ---\n{result.stderr[-3000:]}")
    return seconds


def _runnable(page: Path) -> list[Block]:
    return [b for b in parse_blocks(page) if b.language in RUN_LANGUAGES and b.mark != "skip"]


def test_every_fence_says_what_it_is():
    problems = []
    for page in PAGES:
        for block in parse_blocks(page):
            if block.language not in RUN_LANGUAGES | LISTING_LANGUAGES:
                problems.append(f"{block.where}: fence language {block.language!r} (use bash, "
                                "console or python for examples, text/yaml/json for listings)")
            if block.mark == "skip" and not block.reason:
                problems.append(f"{block.where}: `doc-test: skip` needs a (reason)")
            if block.mark and block.language not in RUN_LANGUAGES:
                problems.append(f"{block.where}: a doc-test mark on a listing that never runs")
    assert not problems, "\n".join(problems)


def test_parser_reads_marks_and_console_prompts(tmp_path):
    page = tmp_path / "page.md"
    page.write_text("<!-- doc-test: skip (needs two machines) -->\n```bash\ntorchrun x\n```\n"
                    "<!-- doc-test: slow -->\n```python\nprint(1)\n```\n```console\n"
                    "$ echo a \\\n    b\nan output line\n$ echo c\n```\n", encoding="utf-8")
    skip, slow, console = parse_blocks(page)
    assert (skip.mark, skip.reason, skip.line) == ("skip", "needs two machines", 2)
    assert (slow.mark, slow.language) == ("slow", "python")
    assert console.mark is None
    assert console_commands(console.code) == "echo a \\\n    b\necho c"


def test_a_failing_example_fails_with_its_location(tmp_path):
    block = Block(tmp_path / "x.md", 7, "bash", "lmlab no-such-command", None, None)
    block.page = ROOT / "docs" / "x.md"
    with pytest.raises(pytest.fail.Exception, match=r"docs/x\.md:7: the bash example failed"):
        run_block(block, tmp_path, timeout=60)


#: Pages whose cheap blocks together take over ~15 s of an idle 2-core host (measured
#: 2026-11-26 with ``--durations``): their cheap run is itself slow, to keep the default suite
#: under CI's 15 minutes. ``-m slow`` still runs them.
HEAVY_PAGES = {"docs/finetuning.md": 66, "docs/encoder-decoders.md": 25,
               "docs/sentence-encoders.md": 25, "docs/senses.md": 18, "docs/vectors.md": 18}


def _cheap_pages() -> list:
    pages = [p for p in PAGES if any(b.mark is None for b in _runnable(p))]
    return [pytest.param(p, marks=pytest.mark.slow) if str(p.relative_to(ROOT)) in HEAVY_PAGES
            else p for p in pages]


@pytest.mark.parametrize("page", _cheap_pages(), ids=lambda p: str(p.relative_to(ROOT)))
def test_cheap_examples_run(page: Path, tmp_path: Path):
    """The page's blocks not marked slow or skip, in order, in one fresh directory (a page of
    :data:`HEAVY_PAGES` only under ``-m slow``)."""
    blocks = [b for b in _runnable(page) if b.mark is None]
    workdir = page_directory(tmp_path)
    for block in blocks:
        run_block(block, workdir, CHEAP_TIMEOUT_S)


@pytest.mark.slow
@pytest.mark.timeout(4 * SLOW_TIMEOUT_S)  # a whole page; each block has its own limit
@pytest.mark.parametrize("page", [p for p in PAGES if any(b.mark == "slow" for b in _runnable(p))],
                         ids=lambda p: str(p.relative_to(ROOT)))
def test_all_examples_run(page: Path, tmp_path: Path):
    """The whole page, slow blocks included, in order, in one fresh directory."""
    workdir = page_directory(tmp_path)
    for block in _runnable(page):
        run_block(block, workdir, SLOW_TIMEOUT_S)
