"""``lmlab adapter``: :func:`lmlab.adapt.convert.convert_adapter` (docs/adaptation.md)."""

from __future__ import annotations

import argparse

from lmlab.cli import _common

# lmlab.adapt.convert.ACTIONS (the module imports torch: --help must not)
ACTIONS = ("merge", "to-peft", "from-peft")


def register(commands) -> None:
    p = commands.command(
        "adapter", help="merge a LoRA (or BitFit) adapter into its base model, or convert an "
        "adapter to / from a PEFT folder (adapter_config.json + adapter_model.safetensors)",
        example="lmlab adapter merge runs/ss-lora --out ss-merged", handler=_adapter)
    p.add_argument("action", choices=ACTIONS,
                   help="merge: a plain model folder; to-peft: lmlab adapter -> PEFT folder; "
                        "from-peft: PEFT folder -> lmlab adapter")
    p.add_argument("source", help="a run fine-tuned with --method (or its model/ folder), or a "
                                  "PEFT adapter folder (merge, from-peft)")
    _common.add_out(p, "folder to write")
    p.add_argument("--base", help="the base model (default: the one the adapter names)")
    _common.add_overwrite(p, "write into an --out that holds files")


def _adapter(args: argparse.Namespace) -> int:
    from lmlab.utils.checks import check_output_folder

    check_output_folder(args.out, args.overwrite, f"adapter {args.action} output")  # before torch
    from lmlab.adapt.convert import convert_adapter

    out = convert_adapter(args.action, args.source, args.out, args.base, args.overwrite)
    print(f"lmlab adapter {args.action}: wrote {out}")
    return 0
