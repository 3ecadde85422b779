"""lm-evaluation-harness backends on one model: lmlab's (``--model lmlab``: each context once,
its key/value cache shared by its continuations) against the harness's transformers backend
(``hf``) on the same Hugging Face folder, for the two request kinds benchmarks spend their time
on: multiple-choice log-likelihoods (``--questions`` contexts of ``--context-words`` words,
4 choices each) and rolling log-likelihoods (``--texts`` texts of ``--windows`` windows).

Both backends load once in this process, with the same batch size; sides alternate per
repetition; medians over ``--repeats``, with the other processes' CPU share per repetition.
Timings need a quiet machine.

    python bench/bench_harness.py --repeats 3          # the figures of docs/benchmarks.md
    python bench/bench_harness.py --repeats 1 --questions 4 --texts 1 --windows 2
"""

from __future__ import annotations

import argparse
import random
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench._common import alternate, environment, print_json  # noqa: E402

WORDS = ("the of and to in a is that for it as with was on be by at this from or an are not "
         "have had which one all were when there can more if will some out so what time up "
         "about into than them only other new could two first people water words called").split()


def requests(kind: str, args: list[tuple]) -> list:
    from lm_eval.api.instance import Instance

    return [Instance(kind, {}, one, i) for i, one in enumerate(args)]


def workloads(args: argparse.Namespace, max_length: int) -> dict[str, tuple[str, list, int]]:
    """name -> (request kind, requests, units counted: requests or tokens)."""
    rng = random.Random(0)
    text = lambda n: " ".join(rng.choice(WORDS) for _ in range(n))  # noqa: E731
    choices = [(text(args.context_words), " " + text(3)) for _ in range(args.questions)]
    pairs = [(context, " " + text(3)) for context, _ in choices for _ in range(4)]
    long = [(text(int(max_length * args.windows * 0.75)),) for _ in range(args.texts)]
    return {"multiple_choice": ("loglikelihood", requests("loglikelihood", pairs), len(pairs)),
            "rolling": ("loglikelihood_rolling", requests("loglikelihood_rolling", long),
                        len(long))}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="smollm2")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--questions", type=int, default=32)
    parser.add_argument("--context-words", type=int, default=80)
    parser.add_argument("--texts", type=int, default=4)
    parser.add_argument("--windows", type=int, default=3)
    parser.add_argument("--max-length", type=int, default=256, help="both backends' window")
    args = parser.parse_args()

    from lm_eval.api.registry import get_model

    import lmlab
    import lmlab.harness.adapter  # noqa: F401  registers "lmlab"
    from lmlab.load import load_model_and_tokenizer

    with tempfile.TemporaryDirectory() as tmp:
        model, tokenizer = load_model_and_tokenizer(args.model)
        lmlab.save_pretrained(model, tmp)
        tokenizer.save_pretrained(tmp)
        common = dict(pretrained=tmp, batch_size=args.batch_size, max_length=args.max_length)
        backends = {"lmlab": get_model("lmlab")(**common),
                    "hf": get_model("hf")(device="cpu", dtype="float32", **common)}
    results = {}
    for name, (method, batch, units) in workloads(args, args.max_length).items():
        def run(lm, method=method, batch=batch, units=units) -> float:
            start = time.perf_counter()
            getattr(lm, method)(batch, disable_tqdm=True)
            return units / (time.perf_counter() - start)  # requests per second

        sides = {side: (lambda lm=lm, run=run: run(lm)) for side, lm in backends.items()}
        results[name] = alternate(sides, args.repeats)
        results[name]["speedup"] = round(results[name]["lmlab"]["median"]
                                         / results[name]["hf"]["median"], 2)
    print_json({"bench": "harness", "unit": "requests per second", "args": vars(args),
                "environment": environment(), "results": results})


if __name__ == "__main__":
    main()
