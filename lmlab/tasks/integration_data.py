"""Lample & Charton's three generators of integration pairs ``f -> F``: backward (``bwd``: F
random, f = F'), forward (``fwd``: f random, F its integral by sympy under a time limit) and
integration by parts (``ibp``: F and G random; where the integral H of F'G is known, that of
F G' is F G - H), seeded, one pair per function, and resumable from a checkpoint file
(docs/tasks.md)."""

from __future__ import annotations

import dataclasses
import time
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np

from lmlab.tasks.integration import (
    Grammar,
    fingerprint,
    from_prefix,
    prefix_depth,
    random_function,
    time_limit,
    to_prefix,
    usable,
)
from lmlab.tasks.types import TextPair
from lmlab.utils.checks import check_choice
from lmlab.utils.errors import LmlabError

GENERATORS = ("bwd", "fwd", "ibp")
SAVE_EVERY = 30.0  # seconds between checkpoints


@dataclasses.dataclass
class _State:
    """What a generation has drawn: the random state, the pairs by key, the integrals an IBP
    run knows (fingerprint of the integrand -> antiderivative, prefix text) and the counts of
    skipped draws by reason."""

    rng: np.random.Generator
    pairs: dict[str, TextPair]
    known: dict[str, str]
    skipped: Counter

    def save(self, path: Path, settings: dict[str, Any]) -> None:
        from lmlab.utils.io import atomic_write_json

        atomic_write_json(path, {"settings": settings, "rng": self.rng.bit_generator.state,
                                 "pairs": [dataclasses.astuple(p) for p in self.pairs.values()],
                                 "known": self.known, "skipped": dict(self.skipped)}, indent=0)

    @classmethod
    def load(cls, path: Path | None, settings: dict[str, Any], seed: int) -> _State:
        """The checkpoint at ``path`` when it was written with the same ``settings``; a fresh
        state when there is none; a checkpoint of other settings is refused, naming them."""
        if path is None or not path.is_file():
            return cls(np.random.default_rng(seed), {}, {}, Counter())
        from lmlab.utils.io import read_json

        saved = read_json(path)
        differ = sorted(k for k in settings if saved["settings"].get(k) != settings[k])
        if differ:
            raise LmlabError(f"{path} continues a generation with other settings ({', '.join(differ)}: "
                             f"{[saved['settings'].get(k) for k in differ]})",
                             "rerun with that generation's settings, or pass --overwrite to "
                             "start again")
        rng = np.random.default_rng()
        rng.bit_generator.state = saved["rng"]
        pairs = [TextPair(i, tuple(r), k, t) for i, r, k, t in saved["pairs"]]
        return cls(rng, {p.key: p for p in pairs}, saved["known"], Counter(saved["skipped"]))


def _backward(state: _State, grammar: Grammar, timeout: float) -> tuple[Any, Any] | str:
    """F random, f = F' (a derivative slower than ``timeout`` is an error: skipping it would
    make the data depend on the machine's speed)."""
    import sympy

    function = random_function(state.rng, grammar)
    try:
        with time_limit(timeout):
            derivative = sympy.diff(function, sympy.Symbol("x"))
    except TimeoutError:
        raise LmlabError(f"differentiating {function} took longer than {timeout:g} s",
                         "raise the timeout, or bound the grammar tighter (max_ops, "
                         "max_depth)") from None
    return derivative, function


def _forward(state: _State, grammar: Grammar, timeout: float) -> tuple[Any, Any] | str:
    """f random, F = sympy's integral of f, skipped when sympy takes longer than ``timeout``
    or finds none (the paper's FWD: what a CAS can integrate)."""
    import sympy

    integrand = random_function(state.rng, grammar)
    try:
        with time_limit(timeout):
            integral = sympy.integrate(integrand, sympy.Symbol("x"))
    except TimeoutError:
        return "timeout"
    except Exception:  # noqa: BLE001 - sympy's integrators raise many kinds on hard inputs
        return "sympy-error"
    if integral.has(sympy.Integral):
        return "no-closed-form"
    return integrand, integral


def _by_parts(state: _State, grammar: Grammar, timeout: float) -> tuple[Any, Any] | str:
    """Each draw first learns one integral backward (h = H' -> H), then draws F and G with half
    the grammar's operators: when the integral H of F'G is known, F G' integrates to F G - H."""
    import sympy

    x = sympy.Symbol("x")
    learned = _backward(state, grammar, timeout)
    if learned[0].has(x) and usable(learned[0]) and usable(learned[1]):
        try:
            state.known.setdefault(fingerprint(learned[0]), " ".join(to_prefix(learned[1])))
        except LmlabError:
            pass
    half = dataclasses.replace(grammar, max_ops=max(1, grammar.max_ops // 2))
    first, second = random_function(state.rng, half), random_function(state.rng, half)
    try:
        with time_limit(timeout):
            known = state.known.get(fingerprint(sympy.diff(first, x) * second))
            if known is None:
                return "integral-unknown"
            return first * sympy.diff(second, x), first * second - from_prefix(known.split())
    except TimeoutError:
        raise LmlabError(f"differentiating {first} or {second} took longer than {timeout:g} s",
                         "raise the timeout, or bound the grammar tighter") from None


def _as_pair(integrand, integral, max_tokens: int, bound_target: bool) -> TextPair | str:
    """The pair ``integrand -> integral`` in prefix text, keyed by the integrand's fingerprint,
    or why it is skipped."""
    import sympy

    if not integrand.has(sympy.Symbol("x")) or not (usable(integrand) and usable(integral)):
        return "unusable"
    try:
        source, target = to_prefix(integrand), to_prefix(integral)
        from_prefix(source)  # within the bounds a prediction must respect (MAX_DIGITS)
    except (LmlabError, RecursionError):  # a node prefix notation has no token for
        return "no-prefix"
    if len(source) > max_tokens or bound_target and len(target) > max_tokens:
        return "too-long"
    return TextPair(" ".join(source), (" ".join(target),), fingerprint(integrand),
                    f"depth {prefix_depth(target)}")


def generate_pairs(count: int, seed: int, grammar: Grammar = Grammar(), generator: str = "bwd",
                   max_input_tokens: int = 128, timeout: float = 2.0,
                   checkpoint: str | Path | None = None,
                   show_progress: bool = False) -> list[TextPair]:
    """``count`` pairs ``f -> F`` from ``generator`` (``bwd``, ``fwd``, ``ibp``) in prefix
    tokens joined by spaces, one per function f (keyed by its fingerprint, tagged by F's
    depth), deterministic for ``seed`` (``fwd``: up to which integrals sympy finishes within
    ``timeout``). Unusable draws (constant, undefined, longer than ``max_input_tokens``; for fwd
    and ibp the reference too) are redrawn. With ``checkpoint`` (a JSON file) the state is saved
    every 30 s and at the end, and a later call with the same settings continues from it."""
    check_choice(generator, GENERATORS, "generator", "integration data generator")
    if count < 1:
        raise LmlabError(f"count {count} must be at least 1", "ask for some examples")
    path = Path(checkpoint) if checkpoint is not None else None
    settings = {"generator": generator, "seed": seed, "grammar": dataclasses.asdict(grammar),
                "max_input_tokens": max_input_tokens, "timeout": timeout}
    settings["grammar"] = {k: list(v) if isinstance(v, tuple) else v
                           for k, v in settings["grammar"].items()}
    state = _State.load(path, settings, seed)
    draw = {"bwd": _backward, "fwd": _forward, "ibp": _by_parts}[generator]
    bar = None
    if show_progress:
        from lmlab.utils.progress import progress

        bar = progress(total=count, initial=min(count, len(state.pairs)), desc=generator,
                       unit="pair")
    saved, attempts = time.monotonic(), 0
    while len(state.pairs) < count:
        attempts += 1
        if attempts > (50 if generator == "bwd" else 1000) * count + 1000:
            raise LmlabError(f"the {generator} generator gave only {len(state.pairs)} usable "
                             f"pairs in {attempts} draws", "loosen the grammar (more "
                             "operators, depth) or raise max_input_tokens / timeout")
        drawn = draw(state, grammar, timeout)
        pair = drawn if isinstance(drawn, str) else \
            _as_pair(*drawn, max_input_tokens, generator != "bwd")
        if isinstance(pair, str) or pair.key in state.pairs:
            state.skipped[pair if isinstance(pair, str) else "duplicate"] += 1
            continue
        state.pairs[pair.key] = pair
        if bar is not None:
            bar.update(1)
        if path is not None and time.monotonic() - saved > SAVE_EVERY:
            state.save(path, settings)
            saved = time.monotonic()
    if path is not None:
        state.save(path, settings)
    if bar is not None:
        bar.close()
    return list(state.pairs.values())[:count]


def skipped_draws(checkpoint: str | Path) -> dict[str, int]:
    """Why draws were skipped in the generation saved at ``checkpoint`` (reason -> count)."""
    from lmlab.utils.io import read_json

    return dict(sorted(read_json(checkpoint)["skipped"].items()))
