"""``lmlab pretrain``: train a model family/size with an objective on token shards.

The same command scales out: ``torchrun --nproc-per-node N -m lmlab pretrain ...`` trains
with DDP (``--strategy fsdp`` for FSDP); ``--batch-size`` is then the global batch.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from lmlab.cli import _common


def register(commands) -> None:
    p = commands.command(
        "pretrain", help="pretrain a Transformer with an objective on token shards",
        example="lmlab pretrain --family bert --size mini --objective mlm,sop --shards shards/ "
                "--budget 10m --out runs/mini",
        handler=_pretrain,
        description="Pretrain (or continue pretraining) a model. The run directory gets "
                    "config.json, metrics.jsonl, checkpoints/, model/, report.md. Rerunning "
                    "the same command on the same --out resumes from the last checkpoint.",
    )
    p.add_argument("--config", help="YAML/JSON file with hparams: and speed: sections "
                                     "(flags override it)")
    choices = _common.pretrain_choices()  # from the registries: what --help lists is what works
    p.add_argument("--family", help=f"model family: {choices['families']}")
    p.add_argument("--size", help=f"preset size of the family: {choices['sizes']}")
    p.add_argument("--objective", help="objective(s), comma-separated, e.g. mlm or mlm,sop: "
                                       f"{choices['objectives']}")
    p.add_argument("--shards", help="token-shard folder (from `lmlab data tokenize`)")
    _common.add_out(p, "run directory (resumed when it has checkpoints)")
    p.add_argument("--init", help="start from a checkpoint: a run directory, a checkpoint "
                                  "folder, a Hugging Face model folder or a short name "
                                  "from `lmlab models list` (minilm)")
    _common.add_training_flags(p)
    p.add_argument("--compile", action="store_true", default=None)
    p.add_argument("--workers", type=int)
    p.add_argument("--strategy", choices=["auto", "ddp", "fsdp"])
    _common.add_overwrite(p, "write into an --out folder that holds other files, or start a "
                             "run that is there over (its checkpoints, metrics and model are "
                             "removed) instead of resuming it")
    p.add_argument("--price-per-hour", type=float,
                   help="cost report: price per device-hour, for the money figure (no default)")
    p.add_argument("--grid-intensity", type=float, dest="grid_g_per_kwh",
                   help="cost report: grid carbon intensity in g CO2e/kWh (default 480, the "
                        "2023 world average)")


def _pretrain(args: argparse.Namespace) -> int:
    """Flags (over the --config file's sections) -> :class:`PretrainConfig` -> ``lmlab.pretrain``,
    then the run's summary and cost report (printed once under torchrun)."""
    import os

    from lmlab.training.pretrain import pretrain

    result = pretrain(_common.pretrain_config(args))
    if int(os.environ.get("RANK", 0)) != 0:
        return 0
    out = Path(args.out)
    _common.print_run_summary(result, "lmlab")
    if result.cost is not None:
        print("lmlab: cost of this session (" + str(out / "cost.md") + ")\n"
              + (out / "cost.md").read_text(encoding="utf-8").rstrip())
    print(f"lmlab: report {out / 'report.md'}; model {out / 'model'}")
    return 0
