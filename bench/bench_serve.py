"""``lmlab serve`` under load: throughput (generated tokens per second) and request latency at 1,
4 and 16 concurrent clients, continuous batching (``--max-batch 16``) against sequential serving
(the same server with ``--max-batch 1``: one request decodes at a time) and, with
``--transformers``, against ``transformers serve`` on the same Hugging Face folder, with its
defaults and with ``--continuous-batching``.

The model (default smollm2) is written once as a Hugging Face folder that every server loads.
Each server runs in its own process; the clients are threads of this one, each sending
``--requests`` greedy completions of ``--max-tokens`` tokens one after another. Sides alternate
per (concurrency, repetition); medians over ``--repeats``. Timings need a quiet machine.

    python bench/bench_serve.py --repeats 3                  # the figures of docs/benchmarks.md
    python bench/bench_serve.py --repeats 1 --requests 1 --max-tokens 8 --concurrency 1,4
"""

from __future__ import annotations

import argparse
import concurrent.futures
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench._common import environment, other_cpu_seconds, print_json  # noqa: E402

PROMPTS = ["Once upon a time", "The capital of France is", "def add(a, b):",
           "A list of fruits: apples,", "In the beginning God created", "My favourite colour is",
           "The quick brown fox", "Water boils at"]


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def write_folder(model: str, folder: Path) -> None:
    """The model as a Hugging Face folder (weights, config, tokenizer) both servers read."""
    import lmlab
    from lmlab.load import load_model_and_tokenizer

    loaded, tokenizer = load_model_and_tokenizer(model)
    lmlab.save_pretrained(loaded, folder)
    tokenizer.save_pretrained(folder)


def start(command: list[str], port: int, threads: int, log: Path) -> subprocess.Popen:
    import httpx

    env = {**os.environ, "OMP_NUM_THREADS": str(threads), "HF_HUB_OFFLINE": "1",
           "LMLAB_NO_PROGRESS": "1"}
    process = subprocess.Popen(command, env=env, stdout=log.open("w"), stderr=subprocess.STDOUT,
                               stdin=subprocess.DEVNULL)
    deadline = time.time() + 600
    while time.time() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"{command[0]} exited: see {log}")
        try:
            if httpx.get(f"http://127.0.0.1:{port}/health", timeout=2).status_code == 200:
                return process
        except httpx.HTTPError:
            pass
        time.sleep(0.5)
    raise RuntimeError(f"{command} did not start in 10 minutes: see {log}")


def cpu_seconds(pids: list[int]) -> float:
    """CPU seconds the server processes used so far (user + system, from /proc)."""
    total = 0.0
    for pid in pids:
        with open(f"/proc/{pid}/stat") as handle:
            fields = handle.read().rsplit(")", 1)[1].split()
        total += (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    return total


def load(url: str, model: str, clients: int, requests: int, max_tokens: int,
         servers: list[int]) -> dict:
    """``clients`` threads, each ``requests`` completions in a row: tokens/s, latencies, and
    the CPU the rest of the machine used meanwhile (cores; the servers' own excluded)."""
    import httpx

    def client(number: int) -> list[tuple[float, int]]:
        done = []
        with httpx.Client(timeout=3600) as http:
            for i in range(requests):
                prompt = PROMPTS[(number * requests + i) % len(PROMPTS)]
                start_time = time.perf_counter()
                response = http.post(url + "/v1/completions", json={
                    "model": model, "prompt": prompt, "max_tokens": max_tokens,
                    "temperature": 0})
                response.raise_for_status()
                done.append((time.perf_counter() - start_time,
                             response.json()["usage"]["completion_tokens"]))
        return done

    before = other_cpu_seconds() - cpu_seconds(servers)
    start_time = time.perf_counter()
    with concurrent.futures.ThreadPoolExecutor(clients) as pool:
        results = [r for batch in pool.map(client, range(clients)) for r in batch]
    wall = time.perf_counter() - start_time
    latencies = sorted(r[0] for r in results)
    return {"tokens_per_s": sum(r[1] for r in results) / wall,
            "latency_median_s": statistics.median(latencies),
            "latency_p90_s": latencies[min(len(latencies) - 1, int(0.9 * len(latencies)))],
            "interference": round((other_cpu_seconds() - cpu_seconds(servers) - before) / wall,
                                  2)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="smollm2")
    parser.add_argument("--concurrency", default="1,4,16")
    parser.add_argument("--requests", type=int, default=4, help="per client")
    parser.add_argument("--max-tokens", type=int, default=32)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=2, help="torch threads of each server")
    parser.add_argument("--transformers", action="store_true",
                        help="also `transformers serve` on the same folder")
    args = parser.parse_args()
    levels = [int(c) for c in args.concurrency.split(",")]
    work = Path(tempfile.mkdtemp(prefix="bench-serve-"))
    folder = work / "model"
    write_folder(args.model, folder)
    bin_dir = Path(sys.executable).parent
    commands = {"lmlab": [sys.executable, "-m", "lmlab", "serve", str(folder),
                          "--max-batch", "16", "--max-waiting", "256"],
                "lmlab-sequential": [sys.executable, "-m", "lmlab", "serve", str(folder),
                                     "--max-batch", "1", "--max-waiting", "256"]}
    if args.transformers:  # its default (one request at a time) and its continuous batching
        commands["transformers"] = [str(bin_dir / "transformers"), "serve", str(folder)]
        commands["transformers-cb"] = [*commands["transformers"], "--continuous-batching"]
    servers, urls = {}, {}
    try:
        for side, command in commands.items():
            port = free_port()
            servers[side] = start(command + ["--port", str(port)], port, args.threads,
                                  work / f"{side}.log")
            urls[side] = f"http://127.0.0.1:{port}"
            load(urls[side], str(folder), 1, 1, 2, [])  # warm up
        results: dict = {side: {c: [] for c in levels} for side in commands}
        for clients in levels:
            for _ in range(args.repeats):
                for side in commands:
                    pids = [p.pid for p in servers.values()]
                    results[side][clients].append(load(urls[side], str(folder), clients,
                                                       args.requests, args.max_tokens, pids))
    finally:
        for process in servers.values():
            process.terminate()
            process.wait(timeout=30)
    summary = {side: {c: {key: round(statistics.median(r[key] for r in runs), 3)
                          for key in runs[0]} for c, runs in by_level.items()}
               for side, by_level in results.items()}
    print_json({"environment": environment(), "model": args.model,
                "requests_per_client": args.requests, "max_tokens": args.max_tokens,
                "repeats": args.repeats, "server_threads": args.threads, "results": summary})


if __name__ == "__main__":
    main()
