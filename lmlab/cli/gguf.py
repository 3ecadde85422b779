"""``lmlab export gguf``: a decoder and its tokenizer as one GGUF file (docs/decoders.md).

It joins ``lmlab export onnx`` (``cli/export.py``) in the ``export`` group."""

from __future__ import annotations

import argparse

from lmlab.cli import _common


def register(commands) -> None:
    p = commands.command(
        "gguf", help="write a Llama-style decoder or a GPT-2 and its tokenizer as one GGUF file "
        "(llama.cpp; F32, F16, Q8_0 or Q4_0)",
        example="lmlab export gguf smollm2 smollm2-q8_0.gguf --type q8_0",
        handler=_write, group="export")
    p.add_argument("model", help="model folder, lmlab run directory, .gguf file or short name "
                                 "(smollm2)")
    p.add_argument("out", help="the .gguf file to write")
    p.add_argument("--type", default="f16", type=str.upper,
                   choices=("F32", "F16", "Q8_0", "Q4_0"), metavar="{f32,f16,q8_0,q4_0}",
                   help="weight type of the matrices (norms stay F32); default f16, "
                        "llama.cpp's converter's default")
    p.add_argument("--tokenizer", help="tokenizer folder or .gguf (default: the model's own)")
    p.add_argument("--name", help="general.name in the file (default: OUT's stem)")
    _common.add_overwrite(p, "replace an existing OUT")


def _family(source) -> str | None:
    """The family of a checkpoint, from its config.json or GGUF header (no weights read)."""
    from lmlab.formats.gguf import read_metadata
    from lmlab.interop.hf import read_hf_config

    if source.suffix.lower() == ".gguf":
        return read_metadata(source).get("general.architecture")
    return read_hf_config(source).get("model_type")


def _write(args: argparse.Namespace) -> int:
    from lmlab.interop.gguf_writer import check_writable_family, write_gguf
    from lmlab.utils.catalog import resolve_model_dir
    from lmlab.utils.checks import check_output_file

    out = check_output_file(args.out, args.overwrite, "OUT")
    source = resolve_model_dir(args.model)
    check_writable_family(_family(source))

    from lmlab.load import load_model_and_tokenizer

    model, tokenizer = load_model_and_tokenizer(source, args.tokenizer, head="clm")
    path = write_gguf(model, out, tokenizer, args.type, overwrite=args.overwrite,
                      name=args.name)
    print(f"wrote {path} ({path.stat().st_size / 1e6:.1f} MB, {args.type})")
    return 0
