"""The decompilation task (Katz et al.): the grammar's functions compile, the assembly
normalises, the verifier accepts the original and an equivalent rewrite and rejects a wrong or
non-compiling one, the sandbox stops a program that loops or allocates without bound, and
``lmlab seq2seq data -> train -> evaluate`` runs end to end on a toy set."""

from __future__ import annotations

import importlib.util
import json
import shutil
from pathlib import Path

import numpy as np
import pytest
from conftest import assert_clean_refusal, run_lmlab_here

from lmlab.tasks import decompile
from lmlab.tasks.decompile import Grammar, c_tokens, normalise_assembly, random_function, verify
from lmlab.tasks.inverse import read_task_data, score, task_info
from lmlab.tasks.sandbox import COMPILE_LIMITS, Limits, compiler, run_limited, scratch_folder
from lmlab.tasks.types import TextPair

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "decompile_table.py"
pytestmark = pytest.mark.skipif(shutil.which("gcc") is None and shutil.which("cc") is None,
                                reason="needs a C compiler")

ORIGINAL = ("int f ( int a , int b ) { int x = a * 3 ; for ( int i = 0 ; i < 4 ; i ++ ) "
            "{ if ( x > b ) { x = x - max2 ( a , i ) ; } else { x = x + b / 3 ; } } "
            "return x % 7 ; }")
#: the same function written by hand another way (statements reordered, a while loop)
REWRITE = """int f(int a, int b) {
    int x = a + a + a;
    int i = 0;
    while (i < 4) {
        if (b < x) x -= max2(a, i); else x += b / 3;
        i++;
    }
    return x % 7;
}"""


def test_grammar_functions_compile_and_have_their_size():
    rng = np.random.default_rng(1)
    drawn = [random_function(rng, Grammar(max_statements=5)) for _ in range(60)]
    assert {size for _, size in drawn} == {1, 2, 3, 4, 5}
    assembly, values = decompile.compile_batch([tokens for tokens, _ in drawn])
    for level in decompile.LEVELS:  # every function compiled, at both levels
        assert all(text and "ret" in text.split() for text in assembly[level])
    assert all(v is not None and len(v.split()) == len(decompile.FINGERPRINT_INPUTS)
               for v in values)
    kinds = {t for tokens, _ in drawn for t in tokens}
    assert {"if", "for", "else", "%", "/"} <= kinds and kinds & set(decompile.HELPERS)
    assert all(decompile.check_alphabet(tokens) is None for tokens, _ in drawn)


def test_assembly_normalised():
    lines = ["\t.globl\tf_0", "f_0:", "\tpushq\t%rbp", "\tmovl\t%edi, -20(%rbp)", "\tjmp\t.L7",
             ".L9:", "\tleal\t8(%rax,%rdx,4), %eax", "\tcall\tmax2@PLT", ".L7:",
             "\tcmpl\t$3, -20(%rbp)  # a comment", "\tjle\t.L9", "\tret", "\t.size\tf_0, .-f_0"]
    assert normalise_assembly(lines, "f_0") == (
        "pushq %rbp movl %edi -20(%rbp) jmp L0 L1 : leal 8 ( %rax %rdx 4 ) %eax call max2 "
        "L0 : cmpl $3 -20(%rbp) jle L1 ret")


def test_verifier_accepts_equivalents_and_rejects_the_rest():
    assert verify(ORIGINAL, ORIGINAL).method == "identical"
    rewritten = verify(REWRITE, ORIGINAL)
    assert rewritten.correct and rewritten.method == "equal-results"
    wrong = verify(REWRITE.replace("x % 7", "x % 5"), ORIGINAL)  # differs on some inputs
    assert not wrong.correct and wrong.method == "different-results"
    broken = verify(REWRITE.replace("x -= max2(a, i);", "x -= max2(a);"), ORIGINAL)
    assert not broken.correct and broken.method == "does-not-compile"
    outside = verify('int f(int a, int b) { return system("true"); }', ORIGINAL)
    assert not outside.correct and outside.method == "not-the-grammar"  # never compiled
    assert c_tokens("x=a+1;i++") == ["x", "=", "a", "+", "1", ";", "i", "++"]


def test_a_hypothesis_that_never_ends_is_stopped():
    endless = "int f(int a, int b) { for (int i = 0; i < 4; a++) { b = b + 1; } return b; }"
    verdict = verify(endless, ORIGINAL, timeout=10.0)
    assert not verdict.correct and verdict.method == "timeout"


@pytest.mark.parametrize("body,limits", [
    ("for (;;) {}", Limits(cpu_seconds=1, wall_seconds=20.0)),  # the CPU limit
    ("for (;;) { volatile char *p = malloc(1 << 20); if (!p) return 7; p[0] = 1; }",
     Limits(cpu_seconds=10, memory_mib=64, wall_seconds=20.0)),  # the address space
    ("sleep(60);", Limits(cpu_seconds=5, wall_seconds=1.0)),  # the wall clock
])
def test_sandbox_limits_stop_a_program(body, limits):
    with scratch_folder() as folder:
        (folder / "p.c").write_text("#include <stdlib.h>\n#include <unistd.h>\n"
                                    f"int main(void) {{ {body} return 0; }}\n")
        built = run_limited([compiler(), "-O0", "-o", "p", "p.c"], folder, COMPILE_LIMITS)
        assert built.returncode == 0, built.stderr
        done = run_limited(["./p"], folder, limits)
        kept = Path(folder)
    assert not kept.exists()  # the scratch folder is gone
    if "malloc" in body:  # the allocation fails at the limit and the program says so
        assert done.returncode == 7
    else:
        assert done.stopped and done.returncode != 0


def test_scoring_counts_any_verified_hypothesis():
    pair = TextPair("movl ...", (ORIGINAL,), "k", "O0 size 3")
    result = score("decompile", [pair, pair], [["int f(int a, int b) { return a; }", REWRITE],
                                               ["int f(int a, int b) { return }"]])
    assert result["verified_accuracy"] == 0.5 and result["unverifiable"] == 0.0
    assert result["by_tag"] == {"O0 size 3": {"verified_accuracy": 0.5, "examples": 2}}
    assert result["verdicts"] == {"different-results": 1, "does-not-compile": 1,
                                  "equal-results": 1}


def test_generate_train_evaluate_end_to_end(tmp_path):
    data, run = tmp_path / "data", tmp_path / "run"
    made = run_lmlab_here("seq2seq", "data", "--task", "decompile", "--count", "40",
                          "--max-statements", "2", "--seed", "3", "--out", data)
    assert made.returncode == 0, made.stderr
    task, splits = read_task_data(data)
    assert task == "decompile" and sum(map(len, splits.values())) == 80  # two levels each
    for split in ("dev", "test"):  # a function's levels share its split; none is in train
        keys = {p.key for p in splits[split]}
        assert not keys & {p.key for p in splits["train"]}
    assert all(p.tag.split()[0] in ("O0", "O1") for p in splits["train"])
    assert task_info(data)["generation"] == {"max_statements": 2, "levels": ["O0", "O1"]}
    trained = run_lmlab_here("seq2seq", "train", "--data", data, "--layers", "1", "--hidden",
                             "32", "--steps", "2", "--batch-size", "8",
                             "--max-source-length", "256", "--max-target-length", "64",
                             "--precision", "fp32", "--out", run)
    assert trained.returncode == 0, trained.stderr
    evaluated = run_lmlab_here("seq2seq", "evaluate", "--model", run / "model", "--data",
                               data, "--beams", "1,2", "--max-examples", "3",
                               "--max-new-tokens", "8", "--out", tmp_path / "eval.json")
    assert evaluated.returncode == 0, evaluated.stderr
    result = json.loads((tmp_path / "eval.json").read_text())
    for beam in ("beam 1", "beam 2"):  # an untrained model's C: scored, not crashed
        scores = result[beam]
        assert scores["examples"] == 3 and 0.0 <= scores["verified_accuracy"] <= 1.0
        assert sum(scores["verdicts"].values()) >= 3
    spec = importlib.util.spec_from_file_location("decompile_table", SCRIPT)
    table = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(table)
    assert table.main([str(tmp_path / "eval.json"), "--out", str(tmp_path / "docs")]) == 0
    text = (tmp_path / "docs" / "decompile.md").read_text()
    tags = {p.tag for p in splits["test"][:3]}
    assert "| greedy | beam 2 |" in text and "**all**" in text and "Greedy hypotheses" in text
    assert all(f"| {t.split()[0]} | {t.split()[2]} |" in text for t in tags)
    assert (tmp_path / "docs" / "decompile.png").stat().st_size > 1000


def test_refusals(tmp_path):
    assert_clean_refusal(run_lmlab_here("seq2seq", "data", "--task", "decompile", "--out",
                                        tmp_path / "a"), "needs a count", fix="--count")
    assert_clean_refusal(run_lmlab_here("seq2seq", "data", "--task", "decompile", "--count",
                                        "5", "--max-ops", "3", "--out", tmp_path / "b"),
                         "max_ops", fix="max_statements")
    assert_clean_refusal(run_lmlab_here("seq2seq", "data", "--task", "decompile", "--count",
                                        "5", "--levels", "O3", "--out", tmp_path / "c"),
                         "O3", fix="O0")
