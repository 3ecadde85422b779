"""``lmlab data list`` and ``lmlab data build``: see what text is installed, build a corpus.

(``lmlab data tokenize`` lives in :mod:`lmlab.cli.tokenize`.)
"""

from __future__ import annotations

import argparse

from lmlab.cli import _common


def register(commands) -> None:
    p = commands.command(
        "list", help="list the corpus sources (installed or not, documents, words)",
        example="lmlab data list", handler=_list, group="data",
        description="List the built-in corpus sources: installed or not (with the command that "
                    "installs them), documents, sentences and words. The first run counts "
                    "(about 15 s); counts are cached until the files change.")
    p.add_argument("--no-count", action="store_true",
                   help="skip counting documents and words (instant)")

    p = commands.command(
        "build", help="build a corpus folder (train/validation JSON lines + manifest)",
        example="lmlab data build --sources kjv,wordnet --out corpus/", handler=_build,
        group="data",
        description="Build a corpus: documents split into sentences, the dev/test texts of "
                    "the built-in tasks (and --exclude texts) removed as whole segments, exact "
                    "duplicates removed, a deterministic train/validation split by document, "
                    "written atomically (manifest.json last).")
    p.add_argument("--sources", default=None,
                   help="comma-separated: kjv, wordnet, gcide, fortunes, jargon, pydocs, "
                        "folder:PATH, jsonl:PATH[:FIELD], hf:NAME[:FIELD] "
                        "(default: every installed built-in source)")
    _common.add_out(p, "output folder")
    p.add_argument("--exclude", action="append", default=[], metavar="FILE",
                   help="also keep out the texts of FILE, one per line, matched as whole "
                        "segments (repeatable)")
    p.add_argument("--exclude-tasks", default="all", metavar="TASKS",
                   help="built-in tasks whose dev/test texts are kept out: all (default: "
                        "those installed), none, or a comma-separated list")
    _common.add_overwrite(p, "write into an --out folder that already holds something")
    p.add_argument("--encoding-errors", choices=("strict", "replace"), default="strict",
                   help="a non-UTF-8 byte in your files: strict = error naming file and byte "
                        "offset (default), replace = read it as U+FFFD")
    p.add_argument("--validation-fraction", type=float, default=0.01,
                   help="share of documents in validation (default 0.01)")
    _common.add_flag(p, "seed", help="seed of the train/validation split")
    p.add_argument("--max-documents", type=int, default=None, metavar="N",
                   help="read at most N documents from each source (quick slices)")


def _format_count(value) -> str:
    return "-" if value is None else f"{value:,}"


def _list(args: argparse.Namespace) -> int:
    from lmlab.data.build import list_sources
    from lmlab.tasks.builtin import list_tasks

    rows = list_sources(count=not args.no_count)
    table = [{
        "source": r["name"],
        "installed": "yes" if r["installed"] else "no",
        "documents": _format_count(r["documents"]),
        "sentences": _format_count(r["sentences"]),
        "words": _format_count(r["words"]),
        "description / install with": r["description"] if r["installed"] else r["install_hint"],
    } for r in rows]
    _common.print_table(_common.table_rows(table))
    installed = [r for r in rows if r["installed"] and r["words"] is not None]
    if installed:
        words = sum(r["words"] for r in installed)
        print(f"\ndefault corpus (installed sources): {words:,} words in "
              f"{sum(r['documents'] for r in installed):,} documents")
    print("user data: --sources folder:PATH, jsonl:PATH[:FIELD], hf:NAME[:FIELD]")
    tasks = list_tasks()
    if tasks:
        print("\ntasks:")
        _common.print_table(_common.table_rows(tasks))
    return 0


def _build(args: argparse.Namespace) -> int:
    import time

    from lmlab.data.build import build_corpus

    start = time.perf_counter()
    manifest = build_corpus(args.sources, args.out, exclude=args.exclude,
                            validation_fraction=args.validation_fraction, seed=args.seed,
                            max_documents=args.max_documents, exclude_tasks=args.exclude_tasks,
                            overwrite=args.overwrite, encoding_errors=args.encoding_errors)
    seconds = time.perf_counter() - start
    rows = [{"source": name, "train docs": f"{e['train']['documents']:,}",
             "validation docs": f"{e['validation']['documents']:,}",
             "words": f"{e['train']['words'] + e['validation']['words']:,}",
             "duplicates": f"{e['duplicates']:,}",
             "excluded sentences": f"{e['excluded_sentences']:,}",
             "excluded docs": f"{e['excluded']:,}"}
            for name, e in manifest["sources"].items()]
    _common.print_table(_common.table_rows(rows))
    kept_out = ", ".join(f"{e['name']} ({e['texts']:,} texts)" for e in manifest["exclude"])
    print(f"\nkept out (whole segments): {kept_out or 'nothing (--exclude-tasks none)'}; "
          f"{manifest['excluded_sentences']:,} sentences, {manifest['excluded_words']:,} words "
          "removed")
    print(f"{manifest['total_words']:,} words, {manifest['total_documents']:,} documents "
          f"written to {args.out} in {seconds:.1f} s (sha256 {manifest['sha256'][:16]})")
    return 0
