"""Inference speed and size of a distilled student against its teacher.

The teacher is all-MiniLM-L6-v2 (``minilm``) or a model folder (``--teacher``); the student
is ``--student`` (a folder or run directory from ``lmlab distil``) or, without one, the
teacher's layers chosen as DistilBERT does (``--student-layers``, default half; the weights do
not change the speed). Both encode the same batch (real wordnet-supersense dev sentences,
the teacher's tokenizer, ``--batch`` x ``--length`` tokens, padded), without gradients, in fp32,
alternating each repetition; reported: the median sentences per second of each, the ratio,
the parameters (embeddings included) and the parameters of the layers alone.

    OMP_NUM_THREADS=2 python bench/bench_distil.py --student-layers 3 --reps 7
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import alternate, print_json  # noqa: E402


def batch(teacher: str, size: int, length: int) -> dict:
    from lmlab.finetune import data as fdata
    from lmlab.finetune.runner import load_tokenizer
    from lmlab.tasks import load_builtin_task

    task = load_builtin_task("wordnet-supersense")
    tokenizer = load_tokenizer(Path(teacher) if Path(teacher).exists() else teacher)
    features = fdata.encode_examples(task, task.split("dev")[:size], tokenizer, length,
                                     split="dev")
    out = fdata.collate(features, tokenizer.pad_token_id)
    return {k: v for k, v in out.items() if k != "labels"}


def main() -> int:
    import torch

    import lmlab
    from lmlab.compress.distil import choose_layers, make_student
    from lmlab.utils.host import describe_host

    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--teacher", default="minilm")
    parser.add_argument("--student", help="a distilled student (default: the teacher's layers)")
    parser.add_argument("--student-layers", type=int)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--length", type=int, default=128)
    parser.add_argument("--reps", type=int, default=7)
    args = parser.parse_args()

    teacher = lmlab.from_pretrained(args.teacher).eval()
    if args.student:
        student = lmlab.from_pretrained(args.student).eval()
    else:
        layers = choose_layers(teacher.config.num_hidden_layers, args.student_layers)
        student = make_student(teacher, layers).eval()
    inputs = batch(args.teacher, args.batch, args.length)

    def timer(model):
        def run() -> float:
            start = time.perf_counter()
            with torch.no_grad():
                model(**inputs, heads=[])
            return args.batch / (time.perf_counter() - start)
        return run

    timer(teacher)(), timer(student)()  # warm-up
    timings = alternate({"teacher": timer(teacher), "student": timer(student)}, args.reps)

    def layer_parameters(model) -> int:
        return sum(p.numel() for p in model.transformer.layers.parameters())

    summary = {
        "host": describe_host(), "batch": args.batch, "length": args.length,
        "tokens": int(inputs["attention_mask"].sum()), "threads": torch.get_num_threads(),
        "teacher": {"layers": teacher.config.num_hidden_layers,
                    "parameters": teacher.num_parameters(),
                    "layer_parameters": layer_parameters(teacher),
                    "sentences_per_s": round(timings["teacher"]["median"], 1)},
        "student": {"layers": student.config.num_hidden_layers,
                    "parameters": student.num_parameters(),
                    "layer_parameters": layer_parameters(student),
                    "sentences_per_s": round(timings["student"]["median"], 1)},
        "speedup": round(timings["student"]["median"] / timings["teacher"]["median"], 2),
        "timings": timings,
    }
    print_json(summary)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
