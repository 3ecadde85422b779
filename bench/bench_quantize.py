"""Dynamic int8 quantisation on the CPU: which int8 route is fastest, and what it costs.

Speed (default): a random-init bert-base-shaped encoder (hidden 768, 12 layers; random weights
time the same as trained ones) on batches of B x T tokens, forward passes in inference mode,
sides alternated, medians and ratios to our fp32:

- ``fp32``: lmlab's model as loaded;
- ``int8-default``: lmlab.compress.quantize's defaults (the engine measured per layer shape,
  per-channel weights, per-token activations); ``int8-default-per-tensor-act``: the same with
  one activation range per call;
- ``int8-onednn`` / ``int8-onednn-channel`` / ``int8-x86`` / ``int8-x86-channel``: one engine
  for every layer, oneDNN (AMX-INT8 where the CPU has it) or fbgemm, per-tensor or per-channel
  weights (per-token activations);
- ``torch.ao``: ``torch.ao.quantization.quantize_dynamic`` as shipped (deprecated; engine x86);
- ``torchao`` (``--torchao``): torchao's ``Int8DynamicActivationInt8WeightConfig`` in eager mode.

ONNX Runtime (``--onnxruntime``): MiniLM (``--bert-base``: the random bert-base shape) as lmlab
fp32, lmlab int8 (the defaults: engine measured per shape, per-token activations; and per-tensor
activations), and the exported file in onnxruntime fp32 and after onnxruntime's own dynamic int8
(``quantize_dynamic``, per-tensor and per-channel weights); onnxruntime's intra-op threads =
torch's; alternated, medians; the cosine of each side's mean-pooled sentence vectors to fp32's
on real sentences; the op types onnxruntime's optimised int8 graph runs (its fusions).

Table (``--run RUN``, a fine-tuned classifier run directory): size on disk, peak resident
memory (a fresh process per format, so the Python + torch runtime is included), tokens/s over
the test split and test accuracy, for fp32, bf16, int8 and ONNX (onnxruntime), each measured in
its own subprocess.

Usage:
    python bench/bench_quantize.py --batch 8 --seq 128 --reps 5
    python bench/bench_quantize.py --onnxruntime --batch 8 --seq 128 --reps 7
    python bench/bench_quantize.py --run runs/compress-minilm-fortunes-topic --table-out bench/results/q.json
"""

from __future__ import annotations

import argparse
import copy
import json
import subprocess
import sys
import time
import warnings
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench._common import alternate, peak_rss_mib, print_json  # noqa: E402


def bert_base():
    import torch

    from lmlab.models.config import TransformerConfig
    from lmlab.models.model import LanguageModel

    torch.manual_seed(0)
    return LanguageModel(TransformerConfig()).eval()


def speed(batch: int, seq: int, reps: int, with_torchao: bool) -> dict:
    import torch

    from lmlab.compress.quantize import quantize_int8
    from lmlab.utils.host import describe_host

    model = bert_base()
    ids = torch.randint(1000, 29000, (batch, seq))
    sides = {"fp32": model,
             "int8-default": quantize_int8(copy.deepcopy(model)),  # measured engine, per token
             "int8-default-per-tensor-act": quantize_int8(copy.deepcopy(model),
                                                          activations="per-tensor"),
             "int8-onednn": quantize_int8(copy.deepcopy(model), "onednn", "per-tensor"),
             "int8-onednn-channel": quantize_int8(copy.deepcopy(model), "onednn", "per-channel"),
             "int8-x86": quantize_int8(copy.deepcopy(model), "x86", "per-tensor"),
             "int8-x86-channel": quantize_int8(copy.deepcopy(model), "x86", "per-channel")}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        sides["torch.ao"] = torch.ao.quantization.quantize_dynamic(
            copy.deepcopy(model), {torch.nn.Linear}, dtype=torch.qint8)
    if with_torchao:
        from torchao.quantization import Int8DynamicActivationInt8WeightConfig, quantize_

        sides["torchao"] = copy.deepcopy(model)
        quantize_(sides["torchao"], Int8DynamicActivationInt8WeightConfig())
    with torch.inference_mode():
        reference = model(input_ids=ids).last_hidden_state
        drift = {}
        for name, m in sides.items():
            out = m(input_ids=ids).last_hidden_state  # warm-up, and the distance to fp32
            drift[name] = float(torch.nn.functional.cosine_similarity(
                out.flatten(0, 1), reference.flatten(0, 1), dim=-1).mean())

    def timed(m):
        def run() -> float:
            with torch.inference_mode():
                start = time.perf_counter()
                m(input_ids=ids)
                return batch * seq / (time.perf_counter() - start)  # tokens/s
        return run

    results = alternate({name: timed(m) for name, m in sides.items()}, reps)
    fp32 = results["fp32"]["median"]
    return {"host": describe_host(), "shape": f"bert-base, batch {batch} x {seq} tokens",
            "tokens_per_s": {k: round(v["median"], 1) for k, v in results.items()},
            "speedup_vs_fp32": {k: round(v["median"] / fp32, 2) for k, v in results.items()},
            "mean_cosine_to_fp32": {k: round(v, 4) for k, v in drift.items()},
            "interference_cpu_s_per_s": {k: v["interference_s"] for k, v in results.items()}}


# -- against onnxruntime's dynamic int8 -----------------------------------------------------------
SENTENCES = ["The cat sat on the mat.", "A quick brown fox jumps over the lazy dog.",
             "Quantisation makes inference faster on CPUs.", "I love pizza with extra cheese",
             "The stock market fell sharply on Monday after the announcement.", "Hello world",
             "This is a test sentence.", "What is the capital of France?",
             'He said: "no, never!" and left; the door slammed (loudly).']


def onnx_sides(folder: Path, threads: int) -> tuple[dict, dict]:
    """onnxruntime sessions on the exported fp32 file and its two dynamic-int8 versions, and
    the op types of each int8 graph as onnxruntime optimised it."""
    import collections

    import onnx
    import onnxruntime as ort
    from onnxruntime.quantization import QuantType, quantize_dynamic

    from lmlab.export.onnx import MODEL_FILE

    files = {"ort-fp32": folder / MODEL_FILE, "ort-int8": folder / "int8.onnx",
             "ort-int8-channel": folder / "int8-channel.onnx"}
    quantize_dynamic(files["ort-fp32"], files["ort-int8"], weight_type=QuantType.QInt8)
    quantize_dynamic(files["ort-fp32"], files["ort-int8-channel"], weight_type=QuantType.QInt8,
                     per_channel=True)
    sessions, ops = {}, {}
    for name, file in files.items():
        options = ort.SessionOptions()
        options.intra_op_num_threads = threads
        optimized = folder / f"{name}.optimized.onnx"
        options.optimized_model_filepath = str(optimized)
        sessions[name] = ort.InferenceSession(str(file), options,
                                              providers=["CPUExecutionProvider"])
        ops[name] = dict(collections.Counter(n.op_type for n in onnx.load(optimized).graph.node)
                         .most_common())
    return sessions, ops


def versus_onnxruntime(batch: int, seq: int, reps: int, use_bert_base: bool) -> dict:
    import tempfile

    import torch

    import lmlab
    from lmlab.compress.quantize import quantize_int8
    from lmlab.export.onnx import export_onnx
    from lmlab.finetune.runner import load_tokenizer
    from lmlab.utils.catalog import resolve_model_dir
    from lmlab.utils.host import describe_host

    model = bert_base() if use_bert_base else lmlab.from_pretrained("minilm").eval()
    ours = {"lmlab-fp32": model,
            "lmlab-int8": quantize_int8(copy.deepcopy(model)),
            "lmlab-int8-per-tensor": quantize_int8(copy.deepcopy(model),
                                                   activations="per-tensor")}
    engines = sorted({m.engine for m in ours["lmlab-int8"].modules() if hasattr(m, "engine")})
    tokenizer = load_tokenizer(resolve_model_dir("minilm"))  # bert-base shares its vocabulary
    text = {k: v for k, v in tokenizer(SENTENCES, padding=True, return_tensors="pt").items()
            if k in ("input_ids", "attention_mask", "token_type_ids")}
    ids = torch.randint(1000, 29000, (batch, seq))
    timed = {"input_ids": ids, "attention_mask": torch.ones_like(ids),
             "token_type_ids": torch.zeros_like(ids)}
    threads = torch.get_num_threads()
    with tempfile.TemporaryDirectory() as tmp:
        export_onnx(model, Path(tmp) / "onnx", head="none")
        sessions, ops = onnx_sides(Path(tmp) / "onnx", threads)

        def hidden(name: str, inputs: dict):
            if name in sessions:
                return torch.from_numpy(sessions[name].run(None, {k: v.numpy() for k, v in
                                                                  inputs.items()})[0])
            with torch.inference_mode():
                return ours[name](**inputs).last_hidden_state

        mask = text["attention_mask"].unsqueeze(-1).float()
        vectors = {name: (hidden(name, text) * mask).sum(1) / mask.sum(1)
                   for name in [*ours, *sessions]}
        cosine = {name: round(float(torch.nn.functional.cosine_similarity(
            v, vectors["lmlab-fp32"]).min()), 4) for name, v in vectors.items()}

        def run(name: str):
            def call() -> float:
                start = time.perf_counter()
                hidden(name, timed)
                return batch * seq / (time.perf_counter() - start)  # tokens/s
            return call

        sides = {name: run(name) for name in vectors}
        for call in sides.values():
            call()  # warm-up
        results = alternate(sides, reps)
    speed = {k: round(v["median"], 1) for k, v in results.items()}
    return {"host": describe_host(), "threads": threads,
            "model": "bert-base (random)" if use_bert_base else "MiniLM-L6 (all-MiniLM-L6-v2)",
            "shape": f"batch {batch} x {seq} tokens", "lmlab_int8_engines": engines,
            "tokens_per_s": speed,
            "lmlab_int8_over_ort_int8": round(speed["lmlab-int8"] / speed["ort-int8"], 2),
            "lmlab_int8_per_tensor_over_ort_int8": round(
                speed["lmlab-int8-per-tensor"] / speed["ort-int8"], 2),
            "min_sentence_cosine_to_fp32": cosine, "ort_optimised_ops": ops,
            "interference_cpu_s_per_s": {k: v["interference_s"] for k, v in results.items()}}


# -- the table on a fine-tuned model -------------------------------------------------------------
FORMATS = ("fp32", "bf16", "int8", "onnx")


def prepare(run: Path) -> dict[str, Path]:
    """The folders each format loads from (int8 and ONNX written once beside the run's model)."""
    import lmlab
    from lmlab.compress.quantize import quantize_int8, save_quantized
    from lmlab.export.onnx import export_onnx

    model_dir = run / "model"
    folders = {"fp32": model_dir, "bf16": model_dir, "int8": run / "compressed" / "int8",
               "onnx": run / "compressed" / "onnx"}
    if not (folders["int8"] / "quantization.json").exists():
        save_quantized(quantize_int8(lmlab.from_pretrained(model_dir)), folders["int8"],
                       overwrite=True)
    if not (folders["onnx"] / "model.onnx").exists():
        export_onnx(lmlab.from_pretrained(model_dir), folders["onnx"], overwrite=True)
    return folders


def measure(fmt: str, folder: Path, run: Path, split: str, batch_size: int) -> dict:
    """One format in this process: accuracy on ``split`` and tokens/s of the prediction loop."""

    import torch

    import lmlab
    from lmlab.finetune import data as fdata
    from lmlab.finetune.runner import load_tokenizer
    from lmlab.models.task_heads import HEAD_FOR_TASK, task_logits
    from lmlab.tasks import load_builtin_task

    task = load_builtin_task(json.loads((run / "finetune.json").read_text())["task"])
    tokenizer = load_tokenizer(run / "model")
    features = fdata.encode_examples(task, task.split(split), tokenizer, 128, split=split)
    head = HEAD_FOR_TASK[task.type]
    if fmt == "onnx":
        from lmlab.export.onnx import OnnxModel

        onnx_model = OnnxModel(folder, threads=torch.get_num_threads())

        def logits(batch):
            return torch.from_numpy(onnx_model.run(**{k: v.numpy() for k, v in batch.items()
                                                      if k in onnx_model.inputs}))
    else:
        model = lmlab.from_pretrained(folder, dtype=torch.bfloat16 if fmt == "bf16" else None)
        model.eval()

        def logits(batch):
            return task_logits(model, head, batch).float()
    pad_id = tokenizer.pad_token_id or 0
    predictions, tokens = [None] * len(features), 0
    batches = list(fdata.eval_batches(features, batch_size, pad_id))
    logits(batches[0][1])  # warm-up (first-call allocations, oneDNN's kernel choice)
    start = time.perf_counter()
    with torch.inference_mode():
        for indices, batch in batches:
            batch = {k: v for k, v in batch.items() if k != "labels"}
            tokens += int(batch["attention_mask"].sum())
            out = logits(batch)
            for row, index in enumerate(indices):
                predictions[index] = task.labels[int(out[row].argmax())]
    seconds = time.perf_counter() - start
    metrics = task.evaluate(split, predictions)
    size = sum(p.stat().st_size for p in Path(folder).iterdir()
               if p.suffix in (".safetensors", ".onnx", ".data"))
    return {"format": fmt, "accuracy": round(100 * metrics["accuracy"], 2),
            "tokens_per_s": round(tokens / seconds, 1), "seconds": round(seconds, 2),
            "size_mb": round(size / 1e6, 1),
            "peak_rss_mb": round(peak_rss_mib(), 1)}  # MiB


def table(run: Path, split: str, batch_size: int, rounds: int) -> dict:
    from lmlab.utils.host import describe_host

    folders = prepare(run)
    rows: dict[str, list[dict]] = {fmt: [] for fmt in FORMATS}
    for _ in range(rounds):  # formats alternate, each in a fresh process
        for fmt in FORMATS:
            out = subprocess.run([sys.executable, __file__, "--measure", fmt, "--folder",
                                  str(folders[fmt]), "--run", str(run), "--split", split,
                                  "--batch-size", str(batch_size)],
                                 capture_output=True, text=True, check=True)
            rows[fmt].append(json.loads(out.stdout.strip().splitlines()[-1]))
    import statistics

    summary = {}
    for fmt, measured in rows.items():
        summary[fmt] = {**measured[0],
                        "tokens_per_s": round(statistics.median(r["tokens_per_s"]
                                                                for r in measured), 1),
                        "peak_rss_mb": round(statistics.median(r["peak_rss_mb"]
                                                               for r in measured), 1),
                        "tokens_per_s_all": [r["tokens_per_s"] for r in measured]}
        summary[fmt]["speedup_vs_fp32"] = round(summary[fmt]["tokens_per_s"]
                                                / summary["fp32"]["tokens_per_s"], 2)
    return {"host": describe_host(), "run": str(run), "split": split, "batch_size": batch_size,
            "rounds": rounds, "formats": summary}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--seq", type=int, default=128)
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--torchao", action="store_true", help="also time torchao (eager)")
    parser.add_argument("--onnxruntime", action="store_true",
                        help="lmlab int8 against onnxruntime's dynamic int8 (MiniLM)")
    parser.add_argument("--bert-base", action="store_true",
                        help="with --onnxruntime: the random bert-base shape, not MiniLM")
    parser.add_argument("--run", type=Path, help="fine-tuned run directory: measure the table")
    parser.add_argument("--split", default="test")
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--measure", choices=FORMATS, help=argparse.SUPPRESS)
    parser.add_argument("--folder", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--table-out", type=Path, help="also write the result as JSON here")
    args = parser.parse_args()
    warnings.filterwarnings("ignore")
    if args.measure:
        print(json.dumps(measure(args.measure, args.folder, args.run, args.split,
                                 args.batch_size)))
        return
    if args.run:
        result = table(args.run, args.split, args.batch_size, args.rounds)
    elif args.onnxruntime:
        result = versus_onnxruntime(args.batch, args.seq, args.reps, args.bert_base)
    else:
        result = speed(args.batch, args.seq, args.reps, args.torchao)
    print_json(result)
    if args.table_out:
        args.table_out.parent.mkdir(parents=True, exist_ok=True)
        args.table_out.write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
