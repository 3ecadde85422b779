"""ONNX Runtime against lmlab on the CPU: the same model, the same batches, tokens/s.

The model (MiniLM with a sequence-classification head by default; ``--bert-base`` for a
random-init bert-base-shaped encoder) is exported once with lmlab.export.onnx, then lmlab's
fp32 forward pass and onnxruntime's session (intra-op threads = torch's threads) run the same
padded batch in turn; medians of ``--reps`` alternations and the ratio onnxruntime / lmlab.

Usage:
    python bench/bench_onnx.py --batch 8 --seq 128 --reps 7
    python bench/bench_onnx.py --bert-base --batch 8 --seq 128
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
import warnings
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench._common import alternate, print_json  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--bert-base", action="store_true")
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--seq", type=int, default=128)
    parser.add_argument("--reps", type=int, default=7)
    parser.add_argument("--out", type=Path, help="also write the result as JSON here")
    args = parser.parse_args()
    warnings.filterwarnings("ignore")

    import torch

    import lmlab
    from lmlab.export.onnx import OnnxModel, export_onnx
    from lmlab.models.config import TransformerConfig
    from lmlab.models.model import LanguageModel
    from lmlab.utils.host import describe_host

    torch.manual_seed(0)
    if args.bert_base:
        config = TransformerConfig(extra={"num_labels": 2})
        model, name = LanguageModel(config, heads=["sequence-classification"]), "bert-base (random)"
    else:
        model, name = lmlab.from_pretrained("minilm"), "MiniLM-L6 (all-MiniLM-L6-v2)"
        model.config.extra["num_labels"] = 2
        model.add_head("sequence-classification")
    model.eval()
    ids = torch.randint(1000, 29000, (args.batch, args.seq))
    mask = torch.ones_like(ids)
    mask[args.batch // 2:, args.seq * 3 // 4:] = 0  # half the rows padded by a quarter
    types = torch.zeros_like(ids)
    with tempfile.TemporaryDirectory() as tmp:
        started = time.perf_counter()
        export_onnx(model, Path(tmp) / "onnx")
        export_seconds = time.perf_counter() - started
        session = OnnxModel(Path(tmp) / "onnx", threads=torch.get_num_threads())
        feed = {"input_ids": ids.numpy(), "attention_mask": mask.numpy(),
                "token_type_ids": types.numpy()}
        tokens = int(mask.sum())

        def ours() -> float:
            with torch.inference_mode():
                start = time.perf_counter()
                model(input_ids=ids, attention_mask=mask, token_type_ids=types)
                return tokens / (time.perf_counter() - start)

        def onnxruntime() -> float:
            start = time.perf_counter()
            session.run(**feed)
            return tokens / (time.perf_counter() - start)

        ours(), onnxruntime()  # warm-up
        results = alternate({"lmlab-fp32": ours, "onnxruntime": onnxruntime}, args.reps)
    result = {"host": describe_host(), "model": name,
              "shape": f"batch {args.batch} x {args.seq} tokens ({tokens} real)",
              "export_seconds": round(export_seconds, 1),
              "tokens_per_s": {k: round(v["median"], 1) for k, v in results.items()},
              "onnxruntime_over_lmlab": round(results["onnxruntime"]["median"]
                                              / results["lmlab-fp32"]["median"], 2),
              "interference_cpu_s_per_s": {k: v["interference_s"] for k, v in results.items()}}
    print_json(result)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
