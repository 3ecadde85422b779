"""Training throughput and memory of lmlab's recurrent LMs against plain torch.

The reference is what a user would write instead: ``nn.Embedding`` -> three ``nn.LSTM`` layers
-> a tied decoder, no dropout (torch's fused CPU LSTM, oneDNN where it applies; cuDNN on a
GPU). Ours is the AWD-LSTM of ``lmlab.models.rnn`` with every dropout on (weight drop swaps a
masked ``W_hh`` in through ``functional_call`` each step), so the ratio is the price of AWD-LSTM's
regularisation on the same kernel. ELMo's biLM (character CNN, two directions) is timed alone.
Steps alternate between the two, medians of ``--repeats`` timed steps are reported with the
host; peak resident memory is the process's (``ru_maxrss``) after each model's steps.

    OMP_NUM_THREADS=1 nice -n 10 .venv/bin/python bench/bench_rnn.py --size mini
"""

from __future__ import annotations

import argparse
import resource
import statistics
import time

import torch
from torch import nn
from torch.nn import functional as F


class PlainLSTMLM(nn.Module):
    """The reference: embeddings, stacked nn.LSTM layers, tied decoder, nothing else."""

    def __init__(self, config):
        super().__init__()
        self.embeddings = nn.Embedding(config.vocab_size, config.embedding_size)
        self.layers = nn.ModuleList(nn.LSTM(i, h, batch_first=True)
                                    for i, h in config.layer_sizes())

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        x = self.embeddings(ids)
        for layer in self.layers:
            x = layer(x)[0]
        logits = x[:, :-1] @ self.embeddings.weight.T  # (B, T-1, V)
        return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), ids[:, 1:].reshape(-1))


def step_seconds(loss_fn, params, ids) -> float:
    started = time.perf_counter()
    loss = loss_fn(ids)
    loss.backward()
    for p in params:
        p.grad = None
    return time.perf_counter() - started


def main() -> int:
    from lmlab.interop.recurrent import build_model
    from lmlab.models.rnn.config import recurrent_preset
    from lmlab.utils.host import describe_host

    p = argparse.ArgumentParser()
    p.add_argument("--size", default="mini")
    p.add_argument("--vocab", type=int, default=8000)
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--seq-len", type=int, default=70)
    p.add_argument("--repeats", type=int, default=10)
    args = p.parse_args()
    torch.manual_seed(0)
    config = recurrent_preset("awd-lstm", args.size, vocab_size=args.vocab)
    ours = build_model(config, ["clm"]).train()
    theirs = PlainLSTMLM(config).train()
    ids = torch.randint(1, args.vocab, (args.batch, args.seq_len))

    def ours_loss(batch):
        out = ours(batch)
        return ours.heads["clm"].loss(out.logits, batch)

    times: dict[str, list[float]] = {"lmlab AWD-LSTM": [], "torch nn.LSTM stack": []}
    for _ in range(2):  # warm-up
        step_seconds(ours_loss, list(ours.parameters()), ids)
        step_seconds(theirs, list(theirs.parameters()), ids)
    for _ in range(args.repeats):  # alternate
        times["lmlab AWD-LSTM"].append(step_seconds(ours_loss, list(ours.parameters()), ids))
        times["torch nn.LSTM stack"].append(step_seconds(theirs, list(theirs.parameters()), ids))
    elmo_config = recurrent_preset("elmo", args.size, vocab_size=args.vocab)
    elmo = build_model(elmo_config, ["bilm"],
                       char_table=torch.randint(1, 257, (args.vocab, elmo_config.max_chars),
                                                dtype=torch.int16)).train()
    elmo_times = [step_seconds(lambda b: elmo(b, labels=b).loss, list(elmo.parameters()), ids)
                  for _ in range(max(args.repeats // 2, 2))]
    tokens = args.batch * args.seq_len
    print(f"host: {describe_host()}; threads {torch.get_num_threads()}; batch {args.batch} x "
          f"{args.seq_len}; size {args.size}, vocab {args.vocab}")
    print("| model | median step (s) | tokens/s | ratio |\n|---|---:|---:|---:|")
    reference = statistics.median(times["torch nn.LSTM stack"])
    for name, values in times.items():
        median = statistics.median(values)
        print(f"| {name} | {median:.3f} | {tokens / median:,.0f} | {median / reference:.2f} |")
    median = statistics.median(elmo_times)
    print(f"| lmlab ELMo biLM ({args.size}) | {median:.3f} | {tokens / median:,.0f} | - |")
    print(f"peak resident memory of the process: "
          f"{resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024:.0f} MiB")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
