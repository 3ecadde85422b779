"""Parameter-efficient fine-tuning on all-MiniLM-L6-v2: each method against full fine-tuning,
lmlab beside peft + transformers (the reference).

For every side: trainable parameters, the size on disk of what a run keeps (the adapter file;
the whole checkpoint for full fine-tuning), the training step time (forward, backward, AdamW
step on real wordnet-supersense batches: 16 examples, a fresh 45-way head) and the peak memory
a training step adds to the loaded model (resident set, measured in a child process per side:
its high-water mark is reset after loading, read after the steps: gradients, optimizer
states and activations). Step time is given as wall time and as the process's CPU time (all
its threads): on a shared host the CPU time is the steadier of the two.

Step times alternate between the sides (ours full, ours lora, ..., peft lora, ...) for
``--reps`` rounds of ``--steps`` steps; the medians and the ratio to our full fine-tuning are
printed as JSON and as a Markdown table. ``--accuracy`` also fine-tunes one seed of each of our
methods on wordnet-supersense (1,000 training examples, the method's recipe, ``--budget``).

    OMP_NUM_THREADS=2 python bench/bench_peft.py --reps 5 --steps 5
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench._common import rss_kib  # noqa: E402

OURS = ("full", "lora", "adapter", "bitfit", "prompt", "prefix")
THEIRS = ("hf-full", "peft-lora", "peft-prompt", "peft-prefix")
OPTIONS = {"lora": {"r": 8, "alpha": 16}, "adapter": {"bottleneck": 64}, "bitfit": {},
           "prompt": {"num_virtual_tokens": 20}, "prefix": {"num_virtual_tokens": 20}}
BATCH = 16


def batches(count: int):
    """The first ``count`` training batches of wordnet-supersense, as lmlab fine-tuning makes
    them (MiniLM's tokenizer, 128 tokens at most, right padding)."""
    from lmlab.finetune import data as fdata
    from lmlab.finetune.runner import load_tokenizer
    from lmlab.tasks import load_builtin_task
    from lmlab.utils.catalog import minilm_dir

    task = load_builtin_task("wordnet-supersense")
    tokenizer = load_tokenizer(minilm_dir())
    examples = task.split("train")[:count * BATCH]
    features = fdata.encode_examples(task, examples, tokenizer, 128, split="train")
    return task, [fdata.collate(features[i:i + BATCH], tokenizer.pad_token_id)
                  for i in range(0, len(features), BATCH)]


def build(side: str, task):
    """(model, step function, trainable parameters, bytes on disk) for one side."""
    import torch

    from lmlab.utils.catalog import minilm_dir

    folder = tempfile.mkdtemp()
    if side in OURS:
        from lmlab.adapt import apply_method, save_adapter
        from lmlab.finetune.objective import TaskObjective
        from lmlab.finetune.runner import load_model

        model = load_model(minilm_dir())[0]
        objective = TaskObjective(task.type, len(task.labels), dict(enumerate(task.labels)),
                                  pooling="mean")
        objective.prepare(model)
        if side == "full":  # mean pooling: lmlab's own format (transformers would pool [CLS])
            from lmlab.interop.native import save_model

            save_model(model, folder)
            size = os.path.getsize(Path(folder) / "model.safetensors")
        else:
            apply_method(model, side, **OPTIONS[side])
            save_adapter(model, folder, base_model=minilm_dir())
            size = os.path.getsize(Path(folder) / "adapter.safetensors")

        def loss(batch):
            return objective.compute_loss(model, batch).loss
    else:
        import peft
        import transformers

        transformers.logging.set_verbosity_error()
        model = transformers.AutoModelForSequenceClassification.from_pretrained(
            minilm_dir(), num_labels=len(task.labels))
        kind = side.removeprefix("peft-")
        if kind == "lora":
            config = peft.LoraConfig(task_type="SEQ_CLS", r=8, lora_alpha=16,
                                     target_modules=["query", "value"])
        elif kind in ("prompt", "prefix"):
            cls = peft.PromptTuningConfig if kind == "prompt" else peft.PrefixTuningConfig
            config = cls(task_type="SEQ_CLS", num_virtual_tokens=20)
        if side != "hf-full":
            model = peft.get_peft_model(model, config)
            model.save_pretrained(folder)
            size = os.path.getsize(Path(folder) / "adapter_model.safetensors")
        else:
            model.save_pretrained(folder)
            size = os.path.getsize(Path(folder) / "model.safetensors")

        def loss(batch):
            return model(**batch).loss
    model.train()
    params = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=1e-5)

    def step(batch) -> None:
        optimizer.zero_grad(set_to_none=True)
        loss(batch).backward()
        optimizer.step()

    return model, step, sum(p.numel() for p in params), size



def child(side: str, steps: int) -> None:
    """Peak resident memory that ``steps`` training steps add to the loaded model (KiB)."""
    import gc

    task, data = batches(steps)
    _, step, _, _ = build(side, task)
    gc.collect()
    loaded = rss_kib("VmRSS")
    with open("/proc/self/clear_refs", "w") as handle:
        handle.write("5")  # reset the high-water mark (Linux >= 4.0)
    for batch in data:  # gradients, optimizer states and activations all count
        step(batch)
    print(json.dumps({"peak_added_mib": (rss_kib("VmHWM") - loaded) / 1024,
                      "resident_mib": rss_kib("VmHWM") / 1024}))


def accuracy(method: str, budget: float, out: Path) -> dict:
    from lmlab.finetune.runner import finetune
    from lmlab.tasks import load_builtin_task
    from lmlab.utils.catalog import minilm_dir

    task = load_builtin_task("wordnet-supersense")
    kwargs = {} if method == "full" else {"method": method, "method_options": OPTIONS[method]}
    result = finetune(task, minilm_dir(), out / method, max_train_examples=1000,
                      budget_seconds=budget, show_progress=False, precision="fp32",
                      overwrite=True, **kwargs)
    return {"dev_accuracy": result["dev"]["accuracy"], "test_accuracy":
            result["test"]["accuracy"], "steps": result["steps"],
            "train_seconds": round(result["train_seconds"], 1)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--steps", type=int, default=5, help="steps per side per repetition")
    parser.add_argument("--sides", default=",".join(OURS + THEIRS))
    parser.add_argument("--accuracy", action="store_true")
    parser.add_argument("--budget", type=float, default=240.0,
                        help="--accuracy: training seconds per method")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        return child(args.child, args.steps)

    import torch

    from lmlab.utils.host import describe_host

    sides = [s for s in args.sides.split(",") if s]
    task, data = batches(args.steps)
    built = {side: build(side, task) for side in sides}
    for _, step, _, _ in built.values():
        step(data[0])  # warm-up: first-call costs and the optimizer's states
    times: dict[str, list[float]] = {side: [] for side in sides}
    cpu: dict[str, list[float]] = {side: [] for side in sides}
    for _ in range(args.reps):
        for side in sides:
            step = built[side][1]
            started, cpu_started = time.perf_counter(), time.process_time()
            for batch in data:
                step(batch)
            times[side].append((time.perf_counter() - started) / len(data))
            cpu[side].append((time.process_time() - cpu_started) / len(data))
    rows = {}
    for side in sides:
        _, _, trainable, size = built[side]
        rows[side] = {"trainable": trainable, "disk_bytes": size,
                      "step_ms": 1000 * statistics.median(times[side]),
                      "step_ms_all": [round(1000 * t, 1) for t in times[side]],
                      "step_cpu_ms": 1000 * statistics.median(cpu[side])}
    del built
    for side in sides:  # one child per side: its own high-water mark
        done = subprocess.run([sys.executable, __file__, "--child", side, "--steps",
                               str(args.steps)], capture_output=True, text=True, check=True)
        rows[side].update(json.loads(done.stdout.strip().splitlines()[-1]))
    for reference, group in (("full", OURS), ("hf-full", THEIRS)):
        for side in group:
            if side in rows and reference in rows:
                rows[side]["step_vs_full"] = rows[side]["step_ms"] / rows[reference]["step_ms"]
                rows[side]["cpu_vs_full"] = (rows[side]["step_cpu_ms"]
                                             / rows[reference]["step_cpu_ms"])
    if args.accuracy:
        out = Path(tempfile.mkdtemp())
        for side in [s for s in sides if s in OURS]:
            rows[side].update(accuracy(side, args.budget, out))
    report = {"host": describe_host(), "load": os.getloadavg(), "threads":
              torch.get_num_threads(), "batch": BATCH, "steps": args.steps,
              "reps": args.reps, "rows": rows, "maxrss_mib":
              resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}
    print(json.dumps(report, indent=2))
    print("\n| side | trainable | on disk | step (ms, wall) | vs full | step (ms, CPU) | vs full "
          "| training memory (MiB) |" + (" dev acc | test acc |" if args.accuracy else ""))
    print("|---|---:|---:|---:|---:|---:|---:|---:|" + ("---:|---:|" if args.accuracy else ""))
    for side, row in rows.items():
        line = (f"| {side} | {row['trainable']:,} | {row['disk_bytes'] / 1e6:.2f} MB | "
                f"{row['step_ms']:.0f} | {row.get('step_vs_full', float('nan')):.2f} | "
                f"{row['step_cpu_ms']:.0f} | {row.get('cpu_vs_full', float('nan')):.2f} | "
                f"{row['peak_added_mib']:.0f} |")
        if args.accuracy and "dev_accuracy" in row:
            line += f" {row['dev_accuracy']:.3f} | {row['test_accuracy']:.3f} |"
        print(line)


if __name__ == "__main__":
    main()
