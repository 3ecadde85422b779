"""``lmlab probe``: layer-wise probing of a frozen model with a scalar mix (docs/probing.md)."""

from __future__ import annotations

import argparse
import sys

from lmlab.cli import _common


def register(commands) -> None:
    p = commands.command(
        "probe", help="train probes on every layer's word vectors (and a scalar mix of all "
        "layers) for POS, dependencies, entities, supersenses or your CoNLL file",
        example="lmlab probe minilm --task pos,supersense --max-examples 500 --out probe-minilm",
        handler=_probe)
    _common.add_model(p)
    p.add_argument("--task", default="",
                   help="comma-separated probing tasks: pos, dep, ner (silver spaCy labels), "
                        "supersense (WordNet)")
    p.add_argument("--conll", action="append", default=[], metavar="TRAIN[,DEV[,TEST]]",
                   help="your own word-labelled file(s) (word and label columns; the last "
                        "column is the label); repeat for several tasks")
    _common.add_out(p, "folder for results.json, results.md and probing.png (default: "
                       "probe-<model name>)", required=False,
                    overwrite="write into an --out that holds files")
    p.add_argument("--probe", default="both", choices=("linear", "mlp", "both"))
    p.add_argument("--max-examples", type=int, default=None,
                   help="labelled items per built-in task (default 2000)")
    p.add_argument("--no-random-init", action="store_true",
                   help="skip the randomly initialised model of the same shape")
    p.add_argument("--no-control-task", action="store_true",
                   help="skip the control task (random label per word type) and selectivity")
    _common.add_flags(p, "seed")
    _common.add_flag(p, "batch_size", default=32, help="texts per forward pass")


def _probe(args: argparse.Namespace) -> int:
    from pathlib import Path

    from lmlab.tasks.probing import DEFAULT_MAX_EXAMPLES, check_task_names
    from lmlab.utils.checks import check_at_least, check_file, check_output_folder
    from lmlab.utils.errors import LmlabError

    names = [n.strip() for n in args.task.split(",") if n.strip()]
    if not names and not args.conll:
        raise LmlabError("no probing task given",
                         "pass --task pos,dep,ner,supersense and/or --conll train.conll")
    check_task_names(names)
    check_at_least(args.max_examples, 10, "--max-examples")
    check_at_least(args.batch_size, 1, "--batch-size")
    conll = [[part for part in spec.split(",") if part] for spec in args.conll]
    for files in conll:
        for path in files:
            check_file(path, "--conll", "give the path of a word<TAB>label file")
    out = Path(args.out or f"probe-{Path(str(args.model).rstrip('/')).name}")
    check_output_folder(out, args.overwrite, "probing results", ignore=(".*.tmp",))

    from lmlab.tasks.probing import load_conll_probing_task, load_probing_task

    tasks = [load_conll_probing_task(files) for files in conll]  # user files fail first
    model, tokenizer, random_model = _load_models(args.model, not args.no_random_init, args.seed)
    tasks += [load_probing_task(n, args.max_examples or DEFAULT_MAX_EXAMPLES) for n in names]

    from lmlab.analysis.probing import PROBE_KINDS, run_probing, write_report
    from lmlab.utils.host import describe_host

    kinds = PROBE_KINDS if args.probe == "both" else (args.probe,)
    results = run_probing(model, tokenizer, tasks, kinds, random_model,
                          control=not args.no_control_task, seed=args.seed,
                          batch_size=args.batch_size)
    results.update(model=str(args.model), host=describe_host(),
                   command="lmlab probe " + " ".join(sys.argv[2:] if sys.argv[1:2] == ["probe"]
                                                     else sys.argv[1:]))
    paths = write_report(results, out)
    print(f"\nwrote {', '.join(str(p) for p in paths)}")
    return 0


def _load_models(source: str, random_init: bool, seed: int):
    """The frozen model and tokenizer, and (when asked) the same architecture randomly
    initialised; encoder-decoders are refused (probing reads one stack's hidden states)."""
    from lmlab.load import load_model_and_tokenizer
    from lmlab.utils.catalog import resolve_model_dir
    from lmlab.utils.errors import LmlabError

    folder = resolve_model_dir(source)
    model, tokenizer = load_model_and_tokenizer(folder)
    if getattr(model.config, "is_encoder_decoder", False):
        raise LmlabError(f"{source} is an encoder-decoder; lmlab probe reads the hidden "
                         "states of one encoder or decoder stack",
                         "probe an encoder (minilm, a pretrain run) or a decoder")
    random_model = None
    if random_init:
        from lmlab.finetune.runner import load_model

        random_model = load_model(folder, random_init=True, seed=seed)[0].eval()
    return model, tokenizer, random_model
