"""Benchmark: building token shards (MB/s of corpus text, peak RSS) on a default-size corpus and
on the same corpus repeated ten times, to show that memory does not grow with corpus size.

Uses /tmp/lmlab-default-corpus when it exists, else builds a stand-in corpus of real text
(WordNet glosses + the KJV Bible, about 2.2M words) with :func:`make_corpus`.

    .venv/bin/python bench/bench_shards.py [--reps 2] [--workers 1 2]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

DEFAULT_CORPUS = Path("/tmp/lmlab-default-corpus")


def _kjv_documents() -> list[dict]:
    text = subprocess.run(["bible", "-l", "100000", "gen1:1-rev22:21"], capture_output=True,
                          text=True, check=True).stdout
    docs, current, title = [], [], None
    for line in text.splitlines():
        verse = re.match(r"^\s*\d+\s+(\S.*)$", line)
        if verse:
            current.append(verse.group(1))
        elif line.strip():
            if current:
                docs.append({"id": f"kjv/{title}", "source": "kjv", "sentences": current})
            current, title = [], line.strip()
    if current:
        docs.append({"id": f"kjv/{title}", "source": "kjv", "sentences": current})
    return docs


def _wordnet_documents() -> list[dict]:
    docs = []
    for pos in ("noun", "verb", "adj", "adv"):
        with open(f"/usr/share/wordnet/data.{pos}", encoding="utf-8") as handle:
            for line in handle:
                if line.startswith(" ") or "|" not in line:
                    continue
                parts = [s.strip() for s in line.split("|", 1)[1].split(";") if s.strip()]
                docs.append({"id": f"wordnet/{pos}/{line[:8]}", "source": "wordnet",
                             "sentences": parts})
    return docs


def make_corpus(out: Path, repeat: int = 1, source: Path | None = None,
                slice_mb: float | None = None) -> Path:
    """Write an lmlab corpus to ``out``: ``source``'s train split (or WordNet + KJV) ``repeat``
    times over, streamed line by line; validation once. ``slice_mb`` keeps the first MB."""
    out.mkdir(parents=True, exist_ok=True)
    if source is None:
        docs = _wordnet_documents() + _kjv_documents()
        with open(out / "base.jsonl", "w", encoding="utf-8") as handle:
            handle.writelines(json.dumps(d, ensure_ascii=False) + "\n"
                              for i, d in enumerate(docs) if i % 50)
        with open(out / "validation.jsonl", "w", encoding="utf-8") as handle:
            handle.writelines(json.dumps(d, ensure_ascii=False) + "\n" for d in docs[::50])
        base = out / "base.jsonl"
    else:
        base = source / "train.jsonl"
        if (source / "validation.jsonl").exists():
            shutil.copyfile(source / "validation.jsonl", out / "validation.jsonl")
    limit = int(slice_mb * 1e6) if slice_mb else None
    with open(out / "train.jsonl", "w", encoding="utf-8") as target:
        for _ in range(repeat):
            written = 0
            with open(base, encoding="utf-8") as handle:
                for line in handle:
                    if limit is not None and written >= limit:
                        break
                    target.write(line)
                    written += len(line)
    (out / "base.jsonl").unlink(missing_ok=True)
    (out / "manifest.json").write_text(json.dumps({"repeat": repeat}), encoding="utf-8")
    return out


# Peak RSS is read from /proc/self/status (VmHWM): getrusage's ru_maxrss survives exec and
# would report the benchmark parent's memory at fork time.
_RUN = """
import json, sys, time
def hwm_mb():
    for line in open("/proc/self/status"):
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
from lmlab.data.shards import build_shards
t = time.perf_counter()
m = build_shards(sys.argv[1], sys.argv[2], sys.argv[3], workers=int(sys.argv[4]),
                 show_progress=False)
elapsed = time.perf_counter() - t
print(json.dumps({"seconds": elapsed, "tokens": m["splits"]["train"]["num_tokens"],
                  "rss_mb": hwm_mb()}))
"""


def run_once(tokenizer: str, corpus: Path, workers: int) -> dict:
    """Build shards in a fresh process; returns seconds, tokens and that process's peak RSS."""
    out = Path(tempfile.mkdtemp(prefix="lmlab-bench-shards-"))
    try:
        result = subprocess.run([sys.executable, "-c", _RUN, tokenizer, str(corpus), str(out),
                                 str(workers)], capture_output=True, text=True, check=True,
                                env={**os.environ, "LMLAB_NO_PROGRESS": "1"})
        return json.loads(result.stdout.strip().splitlines()[-1])
    finally:
        shutil.rmtree(out, ignore_errors=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=2)
    parser.add_argument("--workers", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--tokenizer", default=None, help="default: the MiniLM tokenizer")
    parser.add_argument("--slice-mb", type=float, default=None,
                        help="use only the first MB of the default corpus as the 1x corpus")
    parser.add_argument("--sizes", nargs="+", type=int, default=[1, 10],
                        help="repetitions of the corpus to measure")
    args = parser.parse_args()
    from lmlab.utils.catalog import minilm_dir

    tokenizer = args.tokenizer or str(minilm_dir())
    work = Path(tempfile.mkdtemp(prefix="lmlab-bench-corpus-"))
    source = DEFAULT_CORPUS if (DEFAULT_CORPUS / "train.jsonl").exists() else None
    print(f"corpus: {source or 'stand-in WordNet + KJV (no /tmp/lmlab-default-corpus yet)'}")
    if source is not None and args.slice_mb:
        print(f"1x = the first {args.slice_mb} MB of its train split")
    corpora = {f"{n}x": make_corpus(work / f"x{n}", n, source, args.slice_mb) for n in args.sizes}
    try:
        for name, corpus in corpora.items():
            size_mb = (corpus / "train.jsonl").stat().st_size / 1e6
            for workers in args.workers:
                runs = [run_once(tokenizer, corpus, workers) for _ in range(args.reps)]
                seconds = statistics.median(r["seconds"] for r in runs)
                rss = max(r["rss_mb"] for r in runs)
                print(f"{name:>4} corpus {size_mb:7.1f} MB jsonl, {runs[0]['tokens']:>11,} tokens, "
                      f"workers={workers}: median {seconds:6.1f} s = {size_mb / seconds:5.2f} MB/s "
                      f"{runs[0]['tokens'] / seconds / 1e3:7.0f}k tok/s; peak RSS main "
                      f"{rss:6.0f} MB (workers not counted) reps={[round(r['seconds'], 1) for r in runs]}")
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
