"""``lmlab cost ...``: estimate a run's cost, show FLOPs per token, measure this machine's peaks."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from lmlab.cli import _common


def _float(text: str) -> float:
    """Accept 42e9, 42_000_000_000, 4.2B, 135M."""
    raw = text.strip().replace("_", "").replace(",", "")
    scale = {"k": 1e3, "m": 1e6, "b": 1e9, "g": 1e9, "t": 1e12}.get(raw[-1:].lower(), 1.0)
    if scale != 1.0:
        raw = raw[:-1]
    try:
        return float(raw) * scale
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r} (write e.g. 42e9)") from None


def _estimate(args: argparse.Namespace) -> int:
    from lmlab.cost.estimate import estimate_run

    result = estimate_run(
        args.model, args.tokens, device=args.device, devices=args.count,
        precision=args.precision, mfu=args.mfu, seq_len=args.seq_len, head=args.head,
        sparse_prediction_fraction=args.sparse_prediction, causal_attention=args.causal_attention,
        global_tokens=args.global_tokens, price_per_hour=args.price_per_hour, grid_g_per_kwh=args.grid, pue=args.pue,
        peak_flops_per_s=None if args.peak_tflops is None else args.peak_tflops * 1e12,
        power_watts=args.power_watts,
    )
    if args.json:
        print(json.dumps(result.to_dict(), indent=2))
    else:
        print(result.to_text())
    return 0


def _flops(args: argparse.Namespace) -> int:
    from lmlab.cost.flops import flops_breakdown, parts_markdown
    from lmlab.cost.presets import default_head, preset_config

    config = preset_config(args.model)
    head = args.head or default_head(config)
    if hasattr(config, "flop_parts"):  # AWD-LSTM, ELMo: no attention, no length dependence
        table = parts_markdown(config.flop_parts(not args.forward, head, args.sparse_prediction),
                               not args.forward, "any sequence length")
        without = "without the vocabulary-sized matrices"
    else:
        table = flops_breakdown(config, args.seq_len, training=not args.forward, head=head,
                                sparse_prediction_fraction=args.sparse_prediction,
                                causal_attention=args.causal_attention,
                                global_tokens=args.global_tokens).to_markdown()
        without = "without embeddings"
    print(f"{args.model}: {config.num_parameters():,} parameters "
          f"({config.num_parameters(include_embeddings=False):,} {without})")
    print(table)
    return 0


def _peak(args: argparse.Namespace) -> int:
    from dataclasses import asdict

    from lmlab.cost.peak import GPU_SPECS, PATH_LABELS, cpu_peaks

    peaks = cpu_peaks(refresh=args.refresh)
    if args.json:
        print(json.dumps({"cpu": peaks.__dict__,
                          "gpus": {key: asdict(spec) for key, spec in GPU_SPECS.items()}},
                         indent=2))
        return 0
    print(f"This machine: {peaks.cpu_model}, {peaks.threads} threads, torch "
          f"{peaks.torch_version} (measured {peaks.measured_at}; `--refresh` to measure again)")
    for path, value in peaks.peaks.items():
        print(f"  {PATH_LABELS.get(path, path):32s} {value / 1e9:8,.0f} GFLOP/s")
    if peaks.measured_under_load:
        print(f"  warning: measured under load (load average {peaks.load_average:g} on "
              f"{peaks.threads} threads); these peaks read low. Re-measure on an idle machine "
              "with `lmlab cost peak --refresh`.")
    print("\nGPUs (data sheets, dense, TFLOP/s):")
    print(f"  {'key':10s} {'fp32':>7s} {'tf32':>7s} {'fp16':>7s} {'bf16':>7s} {'TDP W':>6s}  name")
    for key, spec in GPU_SPECS.items():
        cells = [f"{spec.peaks[p] / 1e12:7.1f}" if p in spec.peaks else f"{'-':>7s}"
                 for p in ("fp32", "tf32", "fp16", "bf16")]
        print(f"  {key:10s} {' '.join(cells)} {spec.tdp_watts:6.0f}  {spec.name}")
    return 0


def _project(args: argparse.Namespace) -> int:
    from lmlab.training.project import project_cost, write_project_report

    project = project_cost(args.folder, final=args.final, price_per_hour=args.price_per_hour,
                           grid_g_per_kwh=args.grid)
    out = args.out or str(Path(args.folder) / "project-cost.png")
    plot = write_project_report(project, out)
    if args.json:
        print(json.dumps(project.to_dict(), indent=2))
    else:
        print(project.to_markdown())
        print(f"lmlab: plot {plot}; table {plot.with_suffix('.md')}")
    return 0


def _published(args: argparse.Namespace) -> int:
    from lmlab.cost.published import published_costs, published_markdown

    rows = published_costs()
    print(json.dumps(rows, indent=2) if args.json else published_markdown(rows))
    return 0


def _add_flop_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--head", choices=["mlm", "clm", "emd", "plm", "none"], default=None,
                        help="prediction head (default: clm for causal models, else mlm)")
    parser.add_argument("--sparse-prediction", type=float, default=None, metavar="FRACTION",
                        help="only this fraction of positions goes through the head (e.g. 0.15)")
    parser.add_argument("--causal-attention", choices=["full", "half"], default="full",
                        help="count causal attention scores in full (default) or half")
    parser.add_argument("--global-tokens", type=int, default=0, metavar="G",
                        help="global tokens per sequence of windowed attention (Longformer's)")


def register(commands) -> None:
    from lmlab.cost.presets import preset_names

    models = ", ".join(preset_names())
    p = commands.command(
        "estimate", group="cost",
        help="estimate a training run's time, energy, CO2 and money before it starts",
        example="lmlab cost estimate --model bert-base --tokens 42e9 --device v100 --count 64",
        handler=_estimate,
    )
    p.add_argument("--model", required=True, help=f"model size: {models}")
    p.add_argument("--tokens", required=True, type=_float, help="training tokens, e.g. 42e9")
    p.add_argument("--device", default="v100", help="cpu, or a GPU: v100, a100, h100, ...")
    p.add_argument("--count", type=int, default=1, help="number of devices")
    p.add_argument("--precision", choices=["fp32", "tf32", "fp16", "bf16"], default=None,
                   help="default: bf16 where the device has it, else fp16, else fp32")
    p.add_argument("--mfu", type=float, default=0.3, help="assumed model FLOPs utilisation")
    p.add_argument("--seq-len", default="512",
                   help="length, or a schedule of step fractions such as 128:0.9,512:0.1")
    _add_flop_options(p)
    p.add_argument("--price-per-hour", type=float, default=None,
                   help="price per device-hour in dollars")
    p.add_argument("--grid", type=float, default=None,
                   help="grid carbon intensity, g CO2e/kWh (default: world average 480)")
    p.add_argument("--pue", type=float, default=1.0, help="data-centre PUE (Strubell: 1.58)")
    p.add_argument("--peak-tflops", type=float, default=None, help="override the device peak")
    p.add_argument("--power-watts", type=float, default=None, help="override power per device")
    _common.add_flags(p, "json")

    p = commands.command(
        "flops", group="cost", help="FLOPs per token of a model size, by component",
        example="lmlab cost flops --model bert-base --seq-len 128", handler=_flops,
    )
    p.add_argument("--model", required=True, help=f"model size: {models}")
    p.add_argument("--seq-len", type=int, default=512, help="sequence length")
    p.add_argument("--forward", action="store_true", help="forward only (default: training)")
    _add_flop_options(p)

    p = commands.command(
        "project", group="cost",
        help="what every run under a folder cost (sweeps, seeds, failed and resumed runs), "
             "against the final run (Strubell et al.'s 'with tuning')",
        example="lmlab cost project runs/ --final runs/final", handler=_project,
    )
    p.add_argument("folder", metavar="DIR", help="the folder holding the project's runs")
    p.add_argument("--final", help="the final run's folder (default: the finished run that "
                                   "ended last)")
    p.add_argument("--price-per-hour", type=float, default=None,
                   help="price every run at this price per device-hour (default: each run's own)")
    p.add_argument("--grid", type=float, default=None,
                   help="grid carbon intensity, g CO2e/kWh, for every run (default: each run's)")
    p.add_argument("--out", help="the plot's path, with a .md table and a .json beside it "
                                 "(default DIR/project-cost.png)")
    _common.add_flags(p, "json")

    p = commands.command(
        "published", group="cost",
        help="the papers' published training compute (GPT-3, BERT, XLNet) recomputed by "
             "`lmlab cost estimate`, beside the published figures",
        example="lmlab cost published", handler=_published,
    )
    _common.add_flags(p, "json")

    p = commands.command(
        "peak", group="cost",
        help="measure (once, cached) this CPU's matmul peaks and list GPU peaks",
        example="lmlab cost peak", handler=_peak,
    )
    p.add_argument("--refresh", action="store_true", help="measure again even if cached")
    _common.add_flags(p, "json")
