"""Every command and snippet in README.md and docs/*.md runs as written and prints what the page
shows (the rules: tests/doc_examples.py's docstring and docs/setup.md, "Doc tests").

The default suite runs each page's blocks not marked slow, long or skip; ``-m slow`` runs every
page whole (long blocks too with ``LMLAB_DOC_LONG=1``).
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from doc_examples import (
    PAGES,
    ROOT,
    Block,
    ExampleFailed,
    console_steps,
    fence_problems,
    inventory,
    output_matches,
    page_name,
    parse_blocks,
    run_block,
    run_page,
)


def test_every_fence_says_what_it_is():
    problems = [p for page in PAGES for block in parse_blocks(page) for p in fence_problems(block)]
    assert not problems, "\n".join(problems)


def test_the_inventory_in_setup_md_is_current():
    """docs/setup.md says which blocks run where; it is regenerated, never edited by hand."""
    current = inventory() in (ROOT / "docs" / "setup.md").read_text(encoding="utf-8")
    assert current, (
        "docs/setup.md's doc-test inventory is stale: run `.venv/bin/python tests/doc_examples.py`")


def test_parser_reads_marks_outputs_and_console_prompts(tmp_path):
    page = tmp_path / "page.md"
    page.write_text("<!-- doc-test: skip (needs two machines) -->\n```bash\ntorchrun x\n```\n"
                    "<!-- doc-test: slow -->\n```python\nprint(1)\n```\nIt prints:\n\n"
                    "<!-- doc-test: output -->\n```text\n1\n```\n```console\n"
                    "$ echo a \\\n    b\nan output line\n$ echo c\n```\n"
                    "<!-- doc-test: slwo -->\n```bash\ntrue\n```\n", encoding="utf-8")
    skip, slow, output, console, typo = parse_blocks(page)
    assert (skip.mark, skip.reason, skip.line) == ("skip", "needs two machines", 2)
    assert (slow.mark, slow.language, slow.expected, slow.checks_output) == (
        "slow", "python", "1", True)
    assert output.mark == "output" and not output.runnable
    assert console.mark is None and console.checks_output
    assert console_steps(console.code) == [("echo a \\\n    b", ["an output line"]), ("echo c", [])]
    assert any("unknown mark 'slwo'" in p for p in fence_problems(typo))


def test_misplaced_marks_are_reported(tmp_path):
    page = tmp_path / "page.md"
    page.write_text("<!-- doc-test: slow -->\n\n```bash\ntrue\n```\n<!-- doc-test: long -->\n"
                    "```yaml\na: 1\n```\n<!-- doc-test: output -->\n```text\nx\n```\n",
                    encoding="utf-8")
    bash, yaml, output = parse_blocks(page)
    assert bash.mark is None
    assert [p.split(": ", 1)[1] for p in fence_problems(bash)] == [
        "a doc-test mark not on the line before a fence"]
    assert len(fence_problems(yaml)) == 2  # no reason, and a listing never runs
    assert any("must follow a bash, console or python block" in p for p in fence_problems(output))


def test_output_shapes():
    table = "| component | FLOPs/token | share |\n|---|---:|---:|\n| attention | 12,582,912 | 7.0% |"
    assert output_matches(table, "\n" + table.replace("| 7", "|    7") + "\n\n")
    assert output_matches("| component | FLOPs/token | share |\n...", table)
    assert output_matches("| component | ... | share |\n|---|---:|---:|\n| attention | ... |",
                          table)
    assert not output_matches("| component | FLOPs/token | share |", table)  # a row more
    assert not output_matches("| component | FLOPs | share |\n...", table)  # another header
    assert not output_matches("...\n| embeddings | ... |", table)  # a row that is not there
    assert output_matches("cosine: min 0.99...", "cosine: min 0.9987")
    assert not output_matches("cosine: min 0.99...", "cosine: min 0.87")
    assert output_matches("a\n...\nz", "a\nz") and output_matches("a\n...\nz", "a\nb\nc\nz")


def _block(language: str, code: str, expected: str | None = None) -> Block:
    return Block(ROOT / "docs" / "x.md", 7, language, code, None, None, expected)


def test_a_failing_example_fails_with_its_location(tmp_path):
    with pytest.raises(ExampleFailed, match=r"docs/x\.md:7: the bash example failed"):
        run_block(_block("bash", "lmlab no-such-command"), tmp_path)


def test_an_example_printing_another_shape_fails(tmp_path):
    run_block(_block("python", "print('rows: 3')", "rows: ..."), tmp_path)
    with pytest.raises(ExampleFailed, match=r"docs/x\.md:7: the output of"):
        run_block(_block("python", "print('columns: 3')", "rows: ..."), tmp_path)


def test_console_output_is_compared_command_by_command(tmp_path):
    code = "$ echo one\none\n$ echo two; echo >&2 warned\n$ echo three\nthree\n"
    run_block(_block("console", code), tmp_path)  # the middle one shows no output
    with pytest.raises(ExampleFailed, match=r"the output of\necho three\n"):
        run_block(_block("console", code.replace("\nthree\n", "\n3\n")), tmp_path)
    with pytest.raises(ExampleFailed, match="the output of"):  # stderr is output too
        run_block(_block("console", "$ echo a; echo >&2 b\na\n"), tmp_path)


def _pages(marks: set[str | None]) -> list[Path]:
    return [p for p in PAGES if any(b.runnable and b.mark in marks for b in parse_blocks(p))]


_ids = {"ids": page_name}


@pytest.mark.timeout(0)  # each block has its own limit, HANG_LIMIT_S, that only stops a hang
@pytest.mark.parametrize("page", _pages({None}), **_ids)
def test_cheap_examples_run(page: Path, tmp_path: Path):
    """The page's blocks not marked slow, long or skip, in order, in one fresh directory."""
    run_page(page, tmp_path, {None})


@pytest.mark.slow
@pytest.mark.timeout(0)
@pytest.mark.parametrize("page", _pages({"slow", "long"}), **_ids)
def test_all_examples_run(page: Path, tmp_path: Path):
    """The whole page, slow blocks included (long ones with ``LMLAB_DOC_LONG=1``), in order."""
    marks = {None, "slow"} | ({"long"} if os.environ.get("LMLAB_DOC_LONG") == "1" else set())
    if not any(b.runnable and b.mark in marks - {None} for b in parse_blocks(page)):
        pytest.skip("only long blocks beyond the default ones: set LMLAB_DOC_LONG=1")
    run_page(page, tmp_path, marks)
