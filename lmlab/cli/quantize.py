"""``lmlab quantize``: post-training dynamic int8 quantisation of a model's linear layers
(docs/compression-inference.md)."""

from __future__ import annotations

import argparse

from lmlab.cli import _common


def register(commands) -> None:
    p = commands.command(
        "quantize",
        help="quantise a model's linear layers to int8 (dynamic activations) for CPU inference "
             "and save it (int8 weights + scales in safetensors; lmlab.from_pretrained loads it)",
        example="lmlab quantize runs/my-finetune my-finetune-int8 --int8",
        handler=_quantize)
    _common.add_model(p)
    p.add_argument("out", help="folder for the quantised model")
    p.add_argument("--int8", action="store_true", required=True,
                   help="int8 weights, activations quantised per call (the one scheme so far)")
    p.add_argument("--engine", default="auto",
                   help="int8 kernels: auto (default: per layer shape the fastest measured on "
                        "this host, cached; a shape faster in fp32 stays fp32), onednn, x86 or "
                        "fbgemm")
    p.add_argument("--granularity", default="per-channel", choices=("per-channel", "per-tensor"),
                   help="one weight scale per output channel (default) or per layer")
    p.add_argument("--activations", default="per-token", choices=("per-token", "per-tensor"),
                   help="one input range per token (default: closer to fp32) or per call "
                        "(faster, less exact)")
    _common.add_overwrite(p, "write into an OUT that holds files")


def _quantize(args: argparse.Namespace) -> int:
    from collections import Counter
    from pathlib import Path

    from lmlab.compress.quantize import (
        check_options,
        quantizable_linears,
        quantize_int8,
        quantized_layers,
        save_quantized,
    )
    from lmlab.finetune.runner import load_tokenizer
    from lmlab.load import from_pretrained
    from lmlab.models.model import count_parameters
    from lmlab.utils.catalog import resolve_model_dir
    from lmlab.utils.checks import check_output_folder

    check_options(args.engine, args.granularity, args.activations)
    out = Path(args.out)
    check_output_folder(out, args.overwrite, "quantised model", ignore=(".*.tmp",))
    folder = resolve_model_dir(args.model)
    model = from_pretrained(folder)
    layers = quantizable_linears(model)
    try:
        tokenizer = load_tokenizer(folder)
    except Exception:  # noqa: BLE001 - a model folder without tokenizer files still quantises
        tokenizer = None
    total = count_parameters(model)
    quantize_int8(model, args.engine, args.granularity, args.activations)
    save_quantized(model, out, tokenizer=tokenizer, overwrite=args.overwrite)
    size = sum(p.stat().st_size for p in out.glob("*.safetensors")) / 1e6
    int8 = quantized_layers(model)
    engines = Counter(model.get_submodule(name).engine for name in int8)
    print(f"wrote {out}: {len(int8)} of {len(layers)} linear layers int8 ({args.granularity} "
          f"weights, {args.activations} activations; engine "
          f"{', '.join(f'{e} x{n}' for e, n in engines.items())}) of a {total / 1e6:.1f}M-"
          f"parameter model, {size:.1f} MB of weights")
    return 0
