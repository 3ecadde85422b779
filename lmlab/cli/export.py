"""``lmlab export onnx``: write an encoder (with its task head) or a decoder as an ONNX file
(docs/compression-inference.md)."""

from __future__ import annotations

import argparse

from lmlab.cli import _common


def register(commands) -> None:
    p = commands.command(
        "onnx", group="export",
        help="export an encoder with its task head, or a decoder (logits of a prompt, no "
             "key/value cache), to ONNX with dynamic batch and sequence axes; checked against "
             "lmlab's outputs with onnxruntime",
        example="lmlab export onnx runs/my-finetune minilm-onnx",
        handler=_onnx)
    _common.add_model(p)
    p.add_argument("out", help="folder for model.onnx, onnx-export.json and the tokenizer")
    p.add_argument("--task-head", default=None,
                   help="the head to export (default: the model's first head); 'none' exports "
                        "the last hidden state")
    _common.add_overwrite(p, "write into an OUT that holds files")
    p.add_argument("--no-check", action="store_true",
                   help="skip running the file with onnxruntime against lmlab's outputs")


def _onnx(args: argparse.Namespace) -> int:
    from pathlib import Path

    from lmlab.utils.checks import check_output_folder

    check_output_folder(Path(args.out), args.overwrite, "ONNX export", ignore=(".*.tmp",))
    from lmlab.export.onnx import check_exportable, export_onnx, require
    from lmlab.finetune.runner import load_tokenizer
    from lmlab.load import from_pretrained
    from lmlab.utils.catalog import resolve_model_dir

    for module in ("onnx", "onnxscript", "onnxruntime"):
        require(module)  # before the model loads
    folder = resolve_model_dir(args.model)
    model = from_pretrained(folder)
    head = check_exportable(model, args.task_head)
    try:
        tokenizer = load_tokenizer(folder)
    except Exception:  # noqa: BLE001 - a model folder without tokenizer files still exports
        tokenizer = None
    path = export_onnx(model, args.out, head=head, tokenizer=tokenizer, overwrite=args.overwrite,
                       check=not args.no_check, source=str(args.model))
    print(f"wrote {path} (head {head}, inputs and checks in {Path(args.out) / 'onnx-export.json'})")
    return 0
