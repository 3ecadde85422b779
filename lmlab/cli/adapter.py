"""``lmlab adapter``: merge a LoRA adapter into its base model, and move adapters between
lmlab's format and PEFT's (docs/adaptation.md)."""

from __future__ import annotations

import argparse

from lmlab.cli import _common

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
    from pathlib import Path

    from lmlab.utils.checks import check_output_folder
    from lmlab.utils.errors import LmlabError

    check_output_folder(Path(args.out), args.overwrite, f"adapter {args.action} output")
    from lmlab.adapt import load_adapter, merge, read_adapter_config, save_adapter
    from lmlab.adapt.peft_format import PEFT_CONFIG, load_peft, read_peft_config, save_peft
    from lmlab.interop.folders import adapter_folder

    source = Path(args.source)
    lmlab_folder = adapter_folder(source)
    is_peft = (source / PEFT_CONFIG).is_file()
    if args.action == "from-peft" and not is_peft or args.action == "to-peft" and \
            lmlab_folder is None or lmlab_folder is None and not is_peft:
        wanted = "a PEFT folder" if args.action == "from-peft" else "an lmlab adapter"
        raise LmlabError(f"{source} is not {wanted} (no adapter.json or {PEFT_CONFIG})",
                         "give a run fine-tuned with --method, its model/ folder, or a folder "
                         "written by PeftModel.save_pretrained")
    if lmlab_folder is not None:
        base = args.base or read_adapter_config(lmlab_folder).get("base_model")
        model = load_adapter(lmlab_folder, args.base)
    else:
        base = args.base or read_peft_config(source).get("base_model_name_or_path")
        model = load_peft(source, args.base)
    out = Path(args.out)
    if args.action == "merge":
        from lmlab.interop.native import save_model

        save_model(merge(model), out)
    elif args.action == "to-peft":
        save_peft(model, out, base_model=base, overwrite=args.overwrite)
    else:
        save_adapter(model, out, base_model=base, overwrite=args.overwrite)
    if args.action != "to-peft":  # what lmlab loads from the folder needs the tokenizer too
        _copy_tokenizer(out, lmlab_folder, base)
    print(f"lmlab adapter {args.action}: wrote {out}")
    return 0


def _copy_tokenizer(out, *sources) -> None:
    """The first tokenizer found among ``sources`` (folders or None), saved into ``out``."""
    from pathlib import Path

    from lmlab.finetune.runner import load_tokenizer
    from lmlab.utils.errors import LmlabError

    for folder in sources:
        if folder is None:
            continue
        try:
            load_tokenizer(Path(folder)).save_pretrained(out)
            return
        except (LmlabError, OSError):
            continue
