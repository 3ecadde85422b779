"""How long SmolLM2-135M-Instruct (the installed Q4_1 GGUF) takes to start, phase by phase.

Each repetition is a fresh process (what a user's ``lmlab generate smollm2 ...`` pays):
``import`` (lmlab, torch and the GGUF reader), ``load`` (``load_gguf_model``: header, model
build, dequantisation to fp32), ``tokenizer`` (``Tokenizer.from_pretrained``), and ``cli``: the
wall time of ``lmlab generate smollm2 Hi --max-new-tokens 1`` from start to exit. Medians of
``--reps``; with ``--compare DIR`` the lmlab tree in DIR (e.g. an ``git archive`` of an older
commit) runs alternately with this one (A B A B), so both see the same machine load.

Run:  .venv/bin/python bench/bench_gguf_load.py --reps 3 [--compare /tmp/before]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
_PHASES = """
import time, json
t0 = time.perf_counter()
import torch, lmlab
from lmlab.interop.gguf import load_gguf_model
from lmlab.tokenization.tokenizer import Tokenizer
from lmlab.utils.catalog import smollm2_gguf
t1 = time.perf_counter()
load_gguf_model(smollm2_gguf())
t2 = time.perf_counter()
Tokenizer.from_pretrained(smollm2_gguf())
t3 = time.perf_counter()
print(json.dumps({"import": t1 - t0, "load": t2 - t1, "tokenizer": t3 - t2}))
"""


def one_run(tree: str) -> dict[str, float]:
    """The phases and the CLI's wall time in fresh processes importing lmlab from ``tree``."""
    env = dict(os.environ, PYTHONPATH=tree, LMLAB_NO_PROGRESS="1")
    out = subprocess.run([sys.executable, "-c", _PHASES], env=env, cwd=tree, check=True,
                         capture_output=True, text=True).stdout
    times = json.loads(out.splitlines()[-1])
    start = time.perf_counter()
    subprocess.run([sys.executable, "-m", "lmlab", "generate", "smollm2", "Hi",
                    "--max-new-tokens", "1"], env=env, cwd=tree, check=True,
                   capture_output=True)
    times["cli"] = time.perf_counter() - start
    return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--compare", help="another lmlab source tree, run alternately")
    args = parser.parse_args()
    trees = {"this": ROOT, **({"compare": args.compare} if args.compare else {})}
    runs: dict[str, list[dict]] = {name: [] for name in trees}
    for _ in range(args.reps):
        for name, tree in trees.items():
            runs[name].append(one_run(tree))
            print(name, json.dumps({k: round(v, 2) for k, v in runs[name][-1].items()}),
                  flush=True)
    for name, values in runs.items():
        medians = {k: round(statistics.median(r[k] for r in values), 2) for k in values[0]}
        print(f"median of {args.reps}, {name}: {json.dumps(medians)} "
              f"(load average {os.getloadavg()[0]:.1f})")


if __name__ == "__main__":
    main()
