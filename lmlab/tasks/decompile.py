"""Decompilation as an inverse problem (Katz et al. 2019, "Towards neural decompilation"):
small C functions ``int f(int a, int b)`` from a grammar (integer arithmetic, branches, counted
loops, calls to fixed helpers), compiled by the machine's C compiler to assembly at -O0 and
-O1, the assembly normalised into tokens, and :func:`verify`, which judges a predicted C
function by compiling it beside the original and comparing their results on random inputs.
The compiler and every compiled program run in :mod:`lmlab.tasks.sandbox` (docs/
encoder-decoders.md)."""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from lmlab.tasks.sandbox import (
    COMPILE_LIMITS,
    RUN_LIMITS,
    Limits,
    compiler,
    run_limited,
    scratch_folder,
)
from lmlab.tasks.types import TextPair
from lmlab.utils.errors import LmlabError

PARAMS = ("a", "b")
LOCALS = ("x", "y", "z")
COUNTERS = ("i", "j")  # loop counters, by nesting level; read-only in loop bodies
#: the fixed helpers a function may call: name -> (arity, C definition)
HELPERS = {
    "max2": (2, "int max2(int p, int q) { return p > q ? p : q; }"),
    "min2": (2, "int min2(int p, int q) { return p < q ? p : q; }"),
    "abs1": (1, "int abs1(int p) { return p < 0 ? -p : p; }"),
    "sq": (1, "int sq(int p) { return p * p; }"),
}
LEVELS = ("O0", "O1")
RELATIONS = ("<", "<=", ">", ">=", "==", "!=")
#: every C token a hypothesis the verifier compiles may hold: the grammar's, and a few more a
#: rewrite by hand may use (while, compound assignments, logic, the conditional operator)
C_WORDS = frozenset({"int", "if", "else", "for", "while", "return", "f", *PARAMS, *LOCALS,
                     *COUNTERS, *HELPERS})
C_PUNCTUATION = frozenset({"(", ")", "{", "}", ";", ",", "=", "+", "-", "*", "/", "%", "++",
                           "--", "+=", "-=", "*=", "/=", "%=", "&&", "||", "!", "?", ":",
                           *RELATIONS})
#: gcc's flags for every compilation: signed overflow wraps (defined, so -O0 and -O1 agree),
#: no unwind tables or CET landing pads in the assembly
FLAGS = ("-std=gnu17", "-fwrapv", "-w", "-fno-asynchronous-unwind-tables",
         "-fcf-protection=none")
FINGERPRINT_INPUTS = ((0, 0), (1, -1), (2, 3), (-5, 7), (10, 4), (-13, -2), (6, 6), (-1, 9),
                      (25, -17), (3, 30), (-40, 11), (17, 0), (0, -8), (99, 50), (-64, -63),
                      (7, -100))
PRELUDE = "\n".join(definition for _, definition in HELPERS.values())
PROTOTYPES = "\n".join(definition.split(" {")[0] + ";" for _, definition in HELPERS.values())


# -- the grammar ----------------------------------------------------------------------------------
@dataclass(frozen=True)
class Grammar:
    """Bounds of the random functions: ``max_statements`` statements (declarations,
    assignments, ``if``, ``for``; nested ones counted) at most, expressions at most
    ``max_depth`` operators deep, constants ``0..max_const``, ``if``/``for`` nested at most
    ``max_nesting`` deep, loops of at most ``max_trips`` iterations."""

    max_statements: int = 4
    max_depth: int = 2
    max_const: int = 9
    max_nesting: int = 2
    max_trips: int = 8
    p_call: float = 0.15
    p_branch: float = 0.25
    p_loop: float = 0.2

    def __post_init__(self) -> None:
        if min(self.max_statements, self.max_depth, self.max_const, self.max_trips) < 1 \
                or self.max_nesting < 0:
            raise LmlabError(f"grammar bounds must be positive: {self}",
                             "use e.g. Grammar(max_statements=4, max_depth=2)")
        if self.max_statements > 20:
            raise LmlabError(f"max_statements {self.max_statements} is over 20",
                             "keep the functions small (the assembly grows fast)")


_PRECEDENCE = {"+": 1, "-": 1, "*": 2, "/": 2, "%": 2}


class _Writer:
    """One random function: its statements' tokens, the variables in scope, its size."""

    def __init__(self, rng: np.random.Generator, grammar: Grammar):
        self.rng, self.g = rng, grammar
        self.locals: list[str] = []
        self.counters: list[str] = []

    def pick(self, options):
        return options[int(self.rng.integers(len(options)))]

    def expression(self, depth: int) -> tuple[list[str], int]:
        """(tokens, precedence; 3 for an atom) of a random expression."""
        g, rng = self.g, self.rng
        readable = [*PARAMS, *self.locals, *self.counters]
        if depth == 0 or rng.random() < 0.3:
            if rng.random() < 0.25:
                return [str(int(rng.integers(0, g.max_const + 1)))], 3
            return [self.pick(readable)], 3
        if rng.random() < g.p_call:
            name = self.pick(tuple(HELPERS))
            args = [self.expression(depth - 1)[0] for _ in range(HELPERS[name][0])]
            return [name, "(", *args[0], *sum(([",", *a] for a in args[1:]), []), ")"], 3
        op = self.pick(("+", "-", "*", "+", "-", "*", "/", "%"))
        left, lp = self.expression(depth - 1)
        if op in "/%":  # by a nonzero constant: never undefined
            right, rp = [str(int(rng.integers(2, max(3, g.max_const + 1))))], 3
        else:
            right, rp = self.expression(depth - 1)
        prec = _PRECEDENCE[op]
        left = left if lp >= prec else ["(", *left, ")"]
        right = right if rp > prec else ["(", *right, ")"]
        return [*left, op, *right], prec

    def condition(self) -> list[str]:
        return [*self.expression(1)[0], self.pick(RELATIONS), *self.expression(1)[0]]

    def block(self, budget: int, nesting: int) -> list[str]:
        """Statements using exactly ``budget`` of the size (top level: ``nesting`` 0)."""
        g, rng, out = self.g, self.rng, []
        while budget > 0:
            kind = "assign"
            if budget >= 2 and nesting < g.max_nesting:
                draw = rng.random()
                if draw < g.p_branch:
                    kind = "if"
                elif draw < g.p_branch + g.p_loop and len(self.counters) < len(COUNTERS):
                    kind = "for"
            if kind == "assign":
                out += self.assignment(nesting)
                budget -= 1
                continue
            inner = int(rng.integers(1, budget))  # statements inside, beside this one
            budget -= 1 + inner
            if kind == "for":
                counter = COUNTERS[len(self.counters)]
                trips = str(int(rng.integers(1, g.max_trips + 1)))
                self.counters.append(counter)
                body = self.block(inner, nesting + 1)
                self.counters.pop()
                out += ["for", "(", "int", counter, "=", "0", ";", counter, "<", trips, ";",
                        counter, "++", ")", "{", *body, "}"]
                continue
            then = int(rng.integers(1, inner + 1)) if inner > 1 else 1
            out += ["if", "(", *self.condition(), ")", "{", *self.block(then, nesting + 1), "}"]
            if inner > then:
                out += ["else", "{", *self.block(inner - then, nesting + 1), "}"]
        return out

    def assignment(self, nesting: int) -> list[str]:
        """A declaration of the next local (top level only) or an assignment."""
        value = self.expression(self.g.max_depth)[0]
        if nesting == 0 and len(self.locals) < len(LOCALS) and \
                (not self.locals or self.rng.random() < 0.5):
            self.locals.append(LOCALS[len(self.locals)])
            return ["int", self.locals[-1], "=", *value, ";"]
        return [self.pick([*PARAMS, *self.locals]), "=", *value, ";"]


def random_function(rng: np.random.Generator, grammar: Grammar = Grammar()
                    ) -> tuple[list[str], int]:
    """(tokens of a random ``int f(int a, int b)``, its size in statements)."""
    size = int(rng.integers(1, grammar.max_statements + 1))
    writer = _Writer(rng, grammar)
    body = writer.block(size, 0)
    result = writer.expression(grammar.max_depth)[0]
    return ["int", "f", "(", "int", "a", ",", "int", "b", ")", "{", *body, "return", *result,
            ";", "}"], size


# -- assembly -------------------------------------------------------------------------------------
_OPERAND_SPLIT = re.compile(r",(?![^(]*\))")  # commas outside parentheses
_MEMORY = re.compile(r"^(-?\d*)\((%\w+)?(?:,(%\w+))?(?:,(\d))?\)$")


def _operand(text: str, label) -> list[str]:
    """One operand's tokens: a stack slot ``-20(%rbp)`` whole (a variable, in effect); any other
    memory operand in parts (``8(%rax,%rdx,4)`` -> ``8 ( %rax %rdx 4 )``); the rest whole."""
    text = text.strip().replace("@PLT", "").replace(" ", "")
    if text.startswith(".L"):
        return [label(text)]
    memory = _MEMORY.match(text)
    if memory is None or memory[2] == "%rbp" and memory[1].startswith("-") and not memory[3]:
        return [text]
    displacement, base, index, scale = memory.groups()
    return [t for t in (displacement, "(", base, index, scale, ")") if t]


def normalise_assembly(lines: Sequence[str], name: str) -> str:
    """One function's assembly as model tokens: directives, comments and the function's own
    label dropped; local labels renumbered ``L0, L1, ...`` in order of appearance; ``@PLT``
    dropped; one token per mnemonic and per operand, commas dropped (``movl -20(%rbp), %eax``
    -> ``movl -20(%rbp) %eax``), but other memory operands in parts (:func:`_operand`); a
    label's definition ``L0 :``."""
    labels: dict[str, str] = {}

    def label(text: str) -> str:
        return labels.setdefault(text, f"L{len(labels)}")

    out: list[str] = []
    for raw in lines:
        line = raw.split("#", 1)[0].strip()
        if not line or line == f"{name}:":
            continue
        if line.endswith(":"):
            out += [label(line[:-1]), ":"]
            continue
        if line.startswith("."):
            continue  # a directive
        mnemonic, *rest = line.split(None, 1)
        out.append(mnemonic)
        for operand in _OPERAND_SPLIT.split(rest[0]) if rest else []:
            out += _operand(operand, label)
    return " ".join(out)


def split_functions(assembly: str, names: Sequence[str]) -> dict[str, str]:
    """Each named function's normalised assembly from one compiled file (from its label to its
    ``.size`` directive)."""
    found, current, lines = {}, None, []
    for line in assembly.splitlines():
        stripped = line.strip()
        if current is None and stripped.endswith(":") and stripped[:-1] in names:
            current, lines = stripped[:-1], []
        elif current is not None and stripped.startswith(".size") and \
                stripped.split()[1].rstrip(",") == current:
            found[current] = normalise_assembly(lines, current)
            current = None
        elif current is not None:
            lines.append(line)
    return found


def _rename(tokens: Sequence[str], name: str) -> str:
    return " ".join(name if t == "f" else t for t in tokens)


def compile_batch(functions: Sequence[Sequence[str]], levels: Sequence[str] = LEVELS
                  ) -> tuple[dict[str, list[str | None]], list[str | None]]:
    """Compile the functions (token lists) in one file per level to assembly (sandboxed) and
    once to a program that prints each one's results on :data:`FINGERPRINT_INPUTS`: the
    assembly per level (``None`` where a function was missing) and each function's results as
    text (its fingerprint; ``None`` where the run failed)."""
    names = [f"f_{k}" for k in range(len(functions))]
    source = PROTOTYPES + "\n" + "\n".join(_rename(t, n) for t, n in zip(functions, names))
    cc, assembly = compiler(), {}
    with scratch_folder() as folder:
        (folder / "batch.c").write_text(source + "\n")
        for level in levels:
            done = run_limited([cc, f"-{level}", *FLAGS, "-S", "-o", f"{level}.s", "batch.c"],
                               folder, COMPILE_LIMITS)
            if done.returncode != 0:
                raise LmlabError(f"the C compiler failed on generated functions: "
                                 f"{done.stderr.strip()[:500]}", "report this as a bug")
            found = split_functions((folder / f"{level}.s").read_text(), names)
            assembly[level] = [found.get(n) for n in names]
        values = _run_functions(folder, cc, names, FINGERPRINT_INPUTS,
                                "\n".join(_rename(t, n) for t, n in zip(functions, names)))
    return assembly, values


def _run_functions(folder, cc: str, names: Sequence[str], inputs, source: str
                   ) -> list[str | None]:
    """Each function's results on ``inputs`` (text), compiled at -O0 with the helpers."""
    a = ", ".join(str(x) for x, _ in inputs)
    b = ", ".join(str(y) for _, y in inputs)
    main = (f"static const int A[] = {{{a}}}, B[] = {{{b}}};\n"
            f"static int (*const F[])(int, int) = {{{', '.join(names)}}};\n"
            "int main(void) { for (int k = 0; k < (int)(sizeof F / sizeof F[0]); k++) {\n"
            f"  for (int m = 0; m < {len(inputs)}; m++) printf(\"%d \", F[k](A[m], B[m]));\n"
            "  printf(\"\\n\"); } return 0; }\n")
    (folder / "run.c").write_text("#include <stdio.h>\n" + PRELUDE + "\n" + source + "\n" + main)
    built = run_limited([cc, "-O0", *FLAGS, "-o", "run", "run.c"], folder, COMPILE_LIMITS)
    if built.returncode != 0:
        raise LmlabError(f"the C compiler failed on generated functions: "
                         f"{built.stderr.strip()[:500]}", "report this as a bug")
    ran = run_limited(["./run"], folder, Limits(cpu_seconds=10, wall_seconds=60.0))
    rows = ran.stdout.splitlines() if ran.returncode == 0 else []
    return [rows[k].strip() if k < len(rows) else None for k in range(len(names))]


# -- data -----------------------------------------------------------------------------------------
def generate_pairs(count: int, seed: int, grammar: Grammar = Grammar(),
                   levels: Sequence[str] = LEVELS, max_input_tokens: int = 512,
                   batch: int = 200, show_progress: bool = False
                   ) -> tuple[list[TextPair], Counter]:
    """Pairs assembly -> C for ``count`` distinct functions (by their results on
    :data:`FINGERPRINT_INPUTS`: one function per behaviour, however written), one pair per
    function and level, keyed by that fingerprint (so a function's levels share a split) and
    tagged ``"O1 size 3"``; and why draws were skipped. Deterministic for ``seed``."""
    if count < 1:
        raise LmlabError(f"count {count} must be at least 1", "ask for some functions")
    unknown = sorted(set(levels) - set(LEVELS))
    if unknown or not levels:
        raise LmlabError(f"optimisation levels {unknown or 'missing'}", f"use {', '.join(LEVELS)}")
    rng = np.random.default_rng(seed)
    pairs: dict[str, list[TextPair]] = {}
    skipped: Counter = Counter()
    bar = None
    if show_progress:
        from lmlab.utils.progress import progress

        bar = progress(total=count, desc="functions", unit="function")
    draws = 0
    while len(pairs) < count:
        if draws > 50 * count + 1000:
            raise LmlabError(f"only {len(pairs)} distinct functions in {draws} draws",
                             "raise max_statements or max_depth")
        size = min(batch, 2 * (count - len(pairs)) + 8)  # the same stream, whatever the size
        drawn = [random_function(rng, grammar) for _ in range(size)]
        draws += size
        assembly, values = compile_batch([t for t, _ in drawn], levels)
        for k, (tokens, size) in enumerate(drawn):
            texts = [assembly[level][k] for level in levels]
            if values[k] is None or None in texts:
                skipped["failed"] += 1
            elif values[k] in pairs:
                skipped["duplicate"] += 1
            elif max(len(t.split()) for t in texts) > max_input_tokens:
                skipped["too-long"] += 1
            else:
                pairs[values[k]] = [TextPair(text, (" ".join(tokens),), values[k],
                                             f"{level} size {size}")
                                    for level, text in zip(levels, texts)]
                if bar is not None:
                    bar.update(1)
            if len(pairs) == count:
                break
    if bar is not None:
        bar.close()
    return [p for group in pairs.values() for p in group], skipped


# -- verification ---------------------------------------------------------------------------------
@dataclass(frozen=True)
class Verdict:
    """Whether a predicted function is right, and what decided (:func:`verify`)."""

    correct: bool
    method: str

    @property
    def unverifiable(self) -> bool:
        """The check could not decide (the reference itself failed in the sandbox)."""
        return self.method == "sandbox-error"


_TOKEN = re.compile(r"\s*(\d+|[A-Za-z_]\w*|\+\+|--|&&|\|\||[-+*/%<>=!]=|[-+*/%<>=(){};,?:!]|\S)")


def c_tokens(text: str) -> list[str]:
    """C text as the grammar's tokens (``x=a+1;`` -> ``x = a + 1 ;``)."""
    return _TOKEN.findall(text)


def check_alphabet(tokens: Sequence[str]) -> str | None:
    """The first token outside the grammar's alphabet (no preprocessor, no other names), or
    None: a hypothesis is compiled only when it is made of the grammar's tokens."""
    for token in tokens:
        if not (token in C_WORDS or token in C_PUNCTUATION or token.isdigit()):
            return token
    return None


def random_inputs(count: int, seed: int) -> list[tuple[int, int]]:
    """``count`` random argument pairs in [-1000, 1000] (after a few small ones)."""
    rng = np.random.default_rng(seed)
    fixed = [(0, 0), (1, -1), (-3, 5)][:count]
    return fixed + [(int(a), int(b)) for a, b in rng.integers(-1000, 1001, (count - len(fixed),
                                                                         2))]


def verify(hypothesis: str, reference: str, inputs: int = 32, seed: int = 0,
           timeout: float = 10.0) -> Verdict:
    """Is the C function ``hypothesis`` equivalent to ``reference`` on ``inputs`` random
    argument pairs? Both compiled at -O0 in one program (sandboxed, under ``timeout`` seconds of
    wall clock per step) that compares their results. Verdicts: ``identical`` (same tokens),
    ``equal-results``, ``different-results``, ``does-not-compile``, ``not-the-grammar`` (a token
    outside its alphabet: not compiled), ``timeout`` / ``crashed`` (the hypothesis ran past the
    limits or died; wrong, as the reference always ends), and ``sandbox-error`` (the reference
    itself did not build or run, or the compiler hit a limit: unverifiable)."""
    hyp, ref = c_tokens(hypothesis), c_tokens(reference)
    if hyp == ref:
        return Verdict(True, "identical")
    if check_alphabet(hyp) is not None:
        return Verdict(False, "not-the-grammar")
    pairs = random_inputs(inputs, seed)
    a = ", ".join(str(x) for x, _ in pairs)
    b = ", ".join(str(y) for _, y in pairs)
    source = (f"{PRELUDE}\n#define f ref\n{' '.join(ref)}\n#undef f\n"
              f"static const int A[] = {{{a}}}, B[] = {{{b}}};\n"
              "int main(int argc, char **argv) {\n  (void)argv;\n"
              "  int hyp(int, int);\n"
              f"  for (int k = 0; k < {len(pairs)}; k++)\n"
              "    if (ref(A[k], B[k]) != (argc > 1 ? hyp(A[k], B[k]) : ref(A[k], B[k])))"
              " return 3;\n  return 0;\n}\n"
              f"#define f hyp\n{' '.join(hyp)}\n#undef f\n")
    cc = compiler()
    build, run = (Limits(COMPILE_LIMITS.cpu_seconds, COMPILE_LIMITS.memory_mib,
                         COMPILE_LIMITS.file_mib, timeout),
                  Limits(RUN_LIMITS.cpu_seconds, RUN_LIMITS.memory_mib, RUN_LIMITS.file_mib,
                         timeout))
    with scratch_folder() as folder:
        (folder / "check.c").write_text(source)
        built = run_limited([cc, "-O0", *FLAGS, "-o", "check", "check.c"], folder, build)
        if built.returncode != 0:
            return Verdict(False, "sandbox-error" if built.stopped else "does-not-compile")
        alone = run_limited(["./check"], folder, run)  # the reference against itself
        if alone.returncode != 0:
            return Verdict(False, "sandbox-error")
        done = run_limited(["./check", "hyp"], folder, run)
    if done.stopped:
        return Verdict(False, "timeout")
    if done.returncode == 0:
        return Verdict(True, "equal-results")
    return Verdict(False, "different-results" if done.returncode == 3 else "crashed")
