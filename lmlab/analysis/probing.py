"""Layer-wise probing with a learned scalar mix (Tenney et al. 2019; Liu et al. 2019; Hewitt &
Liang 2019): small classifiers on a frozen model's cached word vectors (:mod:`lmlab.analysis.
layer_cache`) per layer, per scalar mix of all layers (its centre of gravity) and per cumulative
mix of layers 0..l (the expected layer), with a control task (selectivity) and a randomly
initialised model as controls. Features are standardised per layer and dimension with the
training split's statistics; spans are the mean of their words' vectors, a two-span target
concatenates them. The method and its caveats: docs/probing.md.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import torch
from torch import nn

from lmlab.analysis.layer_cache import WordFeatures, WordRequest, cached_word_features, word_rows
from lmlab.analysis.report import pyplot, save_png, template, write_files
from lmlab.tasks.builtin import hash_unit
from lmlab.tasks.probing import ProbingTask
from lmlab.utils.checks import check_choice
from lmlab.utils.errors import LmlabError
from lmlab.vectors.loop import threads_for_training

PROBE_KINDS = ("linear", "mlp")
FEATURE_CACHE = "probe-features"  # under cache_dir(); large, so the docs tests do not copy it
MLP_HIDDEN = 256
MIX_LR = 0.05
LOSS_TIE_GAIN = 0.99  # at equal dev accuracy, a step is better if dev loss fell by 1%
SILVER_NOTE = ("pos, dep and ner labels are SILVER: spaCy en_core_web_sm predictions, not a "
               "treebank; accuracy there is agreement with spaCy")


# -- Tenney's summaries ---------------------------------------------------------------------------
def center_of_gravity(weights: Sequence[float]) -> float:
    """``sum_l l * s_l`` of scalar-mix weights ``s`` (normalised to sum to 1)."""
    w = np.asarray(weights, dtype=np.float64)
    return float((np.arange(len(w)) * w).sum() / w.sum())


def expected_layer(scores: Sequence[float]) -> float | None:
    """``sum_l l * delta_l / sum_l delta_l`` with ``delta_l = scores[l] - scores[l-1]``, where
    ``scores[l]`` is the score of the probe on the cumulative mix of layers ``0..l``. None when
    the deltas sum to zero (no layer adds anything: the summary is undefined)."""
    s = np.asarray(scores, dtype=np.float64)
    delta = s[1:] - s[:-1]
    total = delta.sum()
    if abs(total) < 1e-12:
        return None
    return float((np.arange(1, len(s)) * delta).sum() / total)


# -- the control task -----------------------------------------------------------------------------
def control_labels(types: Sequence[str], labels: Sequence[str], seed: int = 0,
                   salt: str = "") -> list[str]:
    """Hewitt & Liang's control task: each distinct type gets one fixed label, drawn (by a
    stable hash of ``salt``, ``seed`` and the type) from the empirical distribution of
    ``labels``; every occurrence of the type gets that label."""
    counts = Counter(labels)
    names = sorted(counts)
    cdf = np.cumsum([counts[n] for n in names]) / len(labels)
    table: dict[str, str] = {}
    for kind in types:
        if kind not in table:
            u = hash_unit(f"control:{salt}:{seed}:{kind}")
            table[kind] = names[min(int(np.searchsorted(cdf, u, side="right")), len(names) - 1)]
    return [table[kind] for kind in types]


# -- probes ---------------------------------------------------------------------------------------
class LayerProbes(nn.Module):
    """K independent probes trained as one module (the loss is their sum and Adam updates each
    parameter on its own, so each probe trains as if alone, only faster): probe k reads layer k,
    or with ``mixes`` a scalar mix of layers 0..k (``gamma_k * sum_{l<=k} softmax(w_k)_l h_l``,
    :class:`~lmlab.models.pooling.ScalarMix` per probe and masked), the last of which mixes all
    layers (``cumulative=False``: only that one). Each probe is linear, or an MLP with one ReLU
    hidden layer of :data:`MLP_HIDDEN` units.
    """

    def __init__(self, layers: int, dim: int, classes: int, kind: str, mixes: bool = False,
                 cumulative: bool = True):
        super().__init__()
        self.count = layers if not mixes or cumulative else 1  # K
        sizes = [dim, classes] if kind == "linear" else [dim, MLP_HIDDEN, classes]
        self.weights = nn.ParameterList()
        self.biases = nn.ParameterList()
        for fan_in, fan_out in zip(sizes[:-1], sizes[1:]):
            bound = fan_in ** -0.5  # nn.Linear's default initialisation range
            self.weights.append(nn.Parameter(torch.empty(self.count, fan_in, fan_out)
                                             .uniform_(-bound, bound)))
            self.biases.append(nn.Parameter(torch.empty(self.count, 1, fan_out)
                                            .uniform_(-bound, bound)))
        self.mix = None
        if mixes:
            self.mix = nn.Parameter(torch.zeros(self.count, layers))  # (K probes, L+1 layers)
            self.gamma = nn.Parameter(torch.ones(self.count, 1, 1))
            above = torch.ones(layers, layers, dtype=torch.bool).triu(1)  # layer l > probe k
            self.register_buffer("hidden_layers", above[-self.count:])

    def mix_weights(self) -> torch.Tensor:
        """(K, L+1) softmax weights of each probe's mix (zero above its top layer)."""
        return torch.softmax(self.mix.masked_fill(self.hidden_layers, float("-inf")), dim=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """``x`` (N, L+1, D) -> logits (K, N, C)."""
        if self.mix is None:
            h = x.transpose(0, 1)  # (K, N, D)
        else:
            h = self.gamma * torch.einsum("kl,nld->knd", self.mix_weights(), x)  # (K, N, D)
        for number, (weight, bias) in enumerate(zip(self.weights, self.biases)):
            h = torch.baddbmm(bias, h, weight)  # (K, N, out)
            if number < len(self.weights) - 1:
                h = torch.relu(h)
        return h


@dataclass
class ProbeResult:
    """Accuracy of a probe's best dev step (dev and test), its steps, and its mix (if any)."""

    dev: float
    test: float
    steps: int
    weights: list[float] | None = None
    gamma: float | None = None


@threads_for_training(1)
def train_probes(x: dict[str, torch.Tensor], y: dict[str, torch.Tensor], classes: int,
                 kind: str = "linear", mixes: bool = False, cumulative: bool = True,
                 seed: int = 0,
                 max_epochs: int = 300, patience: int = 20,
                 batch_size: int = 8192) -> list[ProbeResult]:
    """Train one probe per layer of ``x[split]`` (N, L+1, D) (or per mix: see
    :class:`LayerProbes`) on the train split with large-batch Adam; each keeps its best step by
    dev accuracy (ties: a 1% lower dev loss) and the run stops when no probe improved for
    ``patience`` epochs. Mix weights learn at :data:`MIX_LR` without weight decay (decay would
    pull them to uniform). Single-threaded: for matrices this small a second thread costs more
    than it saves (docs/probing.md)."""
    check_choice(kind, PROBE_KINDS, "kind", "probe")
    torch.manual_seed(seed)
    probes = LayerProbes(x["train"].shape[1], x["train"].shape[-1], classes, kind, mixes,
                         cumulative)
    layers = probes.count  # K
    heads = [*probes.weights, *probes.biases]
    groups = [{"params": heads, "lr": 1e-2 if kind == "linear" else 3e-3, "weight_decay": 1e-4}]
    if mixes:
        groups.append({"params": [probes.mix, probes.gamma], "lr": MIX_LR, "weight_decay": 0.0})
    optimizer = torch.optim.Adam(groups)
    generator = torch.Generator().manual_seed(seed)
    n = x["train"].shape[0]

    def scores(split: str) -> tuple[torch.Tensor, torch.Tensor]:
        """Per probe: accuracy (K,) and loss (K,) on ``split``."""
        with torch.no_grad():
            logits = probes(x[split])  # (K, N, C)
            target = y[split].expand(layers, -1)  # (K, N)
            loss = nn.functional.cross_entropy(logits.transpose(1, 2), target,
                                               reduction="none").mean(1)
            return (logits.argmax(-1) == target).float().mean(1), loss

    best_acc = torch.full((layers,), -1.0)
    best_loss = torch.full((layers,), float("inf"))
    best_state = {k: v.detach().clone() for k, v in probes.state_dict().items()}
    best_step = torch.zeros(layers, dtype=torch.long)
    stale, steps = 0, 0
    for _ in range(max_epochs):
        order = torch.randperm(n, generator=generator) if n > batch_size else torch.arange(n)
        for begin in range(0, n, batch_size):
            rows = order[begin:begin + batch_size]
            logits = probes(x["train"][rows])  # (K, B, C)
            target = y["train"][rows].expand(layers, -1)  # (K, B)
            loss = nn.functional.cross_entropy(logits.transpose(1, 2), target,
                                               reduction="none").mean(1).sum()
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            steps += 1
        acc, dev_loss = scores("dev")
        better = (acc > best_acc) | ((acc == best_acc) & (dev_loss < best_loss * LOSS_TIE_GAIN))
        if better.any():
            stale = 0
            best_acc = torch.where(better, acc, best_acc)
            best_loss = torch.where(better, dev_loss, best_loss)
            best_step[better] = steps
            for name, value in probes.state_dict().items():
                if value.dim() and value.shape[0] == layers and name != "hidden_layers":
                    best_state[name][better] = value.detach()[better]
        else:
            stale += 1
            if stale >= patience:
                break
    probes.load_state_dict(best_state)
    test_acc, _ = scores("test")
    results = []
    for k in range(layers):
        result = ProbeResult(dev=float(best_acc[k]), test=float(test_acc[k]),
                             steps=int(best_step[k]))
        if mixes:
            result.weights = probes.mix_weights()[k].tolist()
            result.gamma = float(probes.gamma.detach()[k])
        results.append(result)
    return results


# -- features of a task's targets -----------------------------------------------------------------
def word_requests(tasks: Sequence[ProbingTask]
                  ) -> tuple[list[WordRequest], dict[tuple[str, tuple[int, int]], int]]:
    """The requests for the words some target of ``tasks`` uses (:func:`word_rows`), and each
    (text, span)'s row."""
    words = []
    for task in tasks:
        for target in task.targets:
            sentence = task.sentences[target.sentence]
            words += [(sentence.text, sentence.spans[w]) for first, last in target.spans
                      for w in range(first, last)]
    return word_rows(words)


@dataclass
class TaskData:
    """A task's target vectors (N, L+1, D) per split, standardised, with labels and types."""

    x: dict[str, torch.Tensor]
    y: dict[str, torch.Tensor]
    types: dict[str, list[str]]
    labels: list[str]
    dropped: int


def task_data(task: ProbingTask, features: WordFeatures, row_of: dict) -> TaskData:
    """Each target's vector in every layer: each span the mean of its words' rows, spans
    concatenated; targets touching a word without a vector (truncated) are dropped."""
    rows_of: dict[str, list] = {"train": [], "dev": [], "test": []}
    dropped = 0
    for target in task.targets:
        sentence = task.sentences[target.sentence]
        spans = [[row_of[(sentence.text, sentence.spans[w])] for w in range(a, b)]
                 for a, b in target.spans]
        if not all(features.valid[r] for rows in spans for r in rows):
            dropped += 1
            continue
        rows_of[sentence.split].append((spans, target.label, target.type))
    index = {label: i for i, label in enumerate(task.labels)}
    x, y, types = {}, {}, {}
    for split, items in rows_of.items():
        parts = []
        for span in range(task.num_spans):
            groups = [item[0][span] for item in items]
            flat = np.concatenate([np.asarray(g) for g in groups]) if groups else np.zeros(0, int)
            owner = np.repeat(np.arange(len(groups)), [len(g) for g in groups])
            vectors = torch.from_numpy(np.asarray(features.array[flat]))  # (rows, L+1, H)
            pooled = vectors.new_zeros(len(groups), *vectors.shape[1:])  # (N, L+1, H)
            pooled.index_add_(0, torch.from_numpy(owner), vectors)
            counts = torch.tensor([len(g) for g in groups], dtype=pooled.dtype)
            parts.append(pooled / counts.clamp(min=1)[:, None, None])
        x[split] = torch.cat(parts, dim=-1)  # (N, L+1, spans * H)
        y[split] = torch.tensor([index[item[1]] for item in items], dtype=torch.long)
        types[split] = [item[2] for item in items]
    empty = [s for s in x if len(x[s]) == 0]
    if empty:
        raise LmlabError(f"probing task {task.name}: no target left in the {', '.join(empty)} "
                         "split", "use more examples (--max-examples) or another dev file")
    mean = x["train"].mean(0)
    # one training target has no spread (std NaN): scale 1
    std = torch.nan_to_num(x["train"].std(0), nan=1.0).clamp(min=1e-6)
    x = {split: (v - mean) / std for split, v in x.items()}
    return TaskData(x, y, types, list(task.labels), dropped)


# -- one task, all probes -------------------------------------------------------------------------
def probe_task(data: TaskData, kinds: Sequence[str], random_data: TaskData | None = None,
               control: bool = True, seed: int = 0, salt: str = "",
               log: Callable[[str], None] = print) -> dict:
    """Every probe of one task: per layer, scalar mix, cumulative mixes, control task and
    random-init model; with the summaries. Returns a JSON-ready dict per probe kind."""
    classes = len(data.labels)
    y_control = None
    if control:
        train_labels = [data.labels[i] for i in data.y["train"].tolist()]
        index = {label: i for i, label in enumerate(data.labels)}
        y_control = {s: torch.tensor([index[lab] for lab in control_labels(
            data.types[s], train_labels, seed, salt)]) for s in data.y}
    results = {}
    for kind in kinds:
        start = time.perf_counter()
        single = train_probes(data.x, data.y, classes, kind, seed=seed)
        cumulative = train_probes(data.x, data.y, classes, kind, mixes=True, seed=seed)
        mix = cumulative[-1]  # the mix of all layers
        rows = [{"layer": layer, "dev": r.dev, "test": r.test, "cumulative": c.test}
                for layer, (r, c) in enumerate(zip(single, cumulative))]
        if y_control is not None:
            for row, r in zip(rows, train_probes(data.x, y_control, classes, kind, seed=seed)):
                row["control"] = r.test
                row["selectivity"] = row["test"] - r.test
        entry = {"layers": rows, "mix": asdict(mix),
                 "center_of_gravity": center_of_gravity(mix.weights),
                 "expected_layer": expected_layer([c.test for c in cumulative]),
                 "best_layer": int(np.argmax([r["dev"] for r in rows]))}  # chosen on dev
        if random_data is not None:
            for row, r in zip(rows, train_probes(random_data.x, random_data.y, classes, kind,
                                                 seed=seed)):
                row["random_init"] = r.test
            random_mix = train_probes(random_data.x, random_data.y, classes, kind, mixes=True,
                                      cumulative=False, seed=seed)[0]
            entry["random_init_mix"] = asdict(random_mix)
            entry["random_init_center_of_gravity"] = center_of_gravity(random_mix.weights)
        entry["seconds"] = time.perf_counter() - start
        log(f"  {kind}: mix {mix.test:.3f}, centre of gravity "
            f"{entry['center_of_gravity']:.2f}, expected layer {_number(entry['expected_layer'])} "
            f"({entry['seconds']:.1f} s)")
        results[kind] = entry
    return results


def majority_accuracy(data: TaskData) -> float:
    """Test accuracy of always predicting the most frequent training label."""
    top = Counter(data.y["train"].tolist()).most_common(1)[0][0]
    return float((data.y["test"] == top).float().mean())


# -- a whole run ----------------------------------------------------------------------------------
def run_probing(model, tokenizer, tasks: Sequence[ProbingTask], kinds: Sequence[str] = PROBE_KINDS,
                random_model=None, control: bool = True, seed: int = 0, batch_size: int = 32,
                cache_root: str | Path | None = None,
                log: Callable[[str], None] = print) -> dict:
    """Probe ``model`` (and ``random_model``, the same architecture freshly initialised, when
    given) on ``tasks``; returns the JSON-ready results (see :func:`write_report`)."""
    from lmlab.utils.paths import cache_dir

    cache_root = Path(cache_root) if cache_root else cache_dir() / FEATURE_CACHE
    requests, row_of = word_requests(tasks)
    extraction = {}
    features = {}
    for name, encoder in (("model", model), ("random_init", random_model)):
        if encoder is None:
            continue
        start = time.perf_counter()
        features[name] = cached_word_features(encoder, tokenizer, requests, cache_root,
                                              batch_size)
        seconds = time.perf_counter() - start
        stats = features[name].stats
        extraction[name] = {**asdict(stats), "seconds": seconds,
                            "from_cache": features[name].from_cache}
        log(f"{name}: vectors of {stats.words} words in {stats.texts} texts "
            f"{'read from the cache' if features[name].from_cache else 'extracted'} "
            f"({seconds:.1f} s)")
        if stats.warning():
            log(f"warning: {stats.warning()}")
    report = {"tasks": {}, "extraction": extraction, "silver_note": SILVER_NOTE,
              "layers": model.config.num_hidden_layers + 1, "kinds": list(kinds),
              "seed": seed, "control": control, "random_init": random_model is not None}
    for number, task in enumerate(tasks):
        data = task_data(task, features["model"], row_of)
        random_data = (task_data(task, features["random_init"], row_of)
                       if "random_init" in features else None)
        counts = {s: len(v) for s, v in data.y.items()}
        log(f"{task.name}: {sum(counts.values())} targets ({counts['train']} train, "
            f"{counts['dev']} dev, {counts['test']} test), {len(data.labels)} labels"
            + (" (silver)" if task.silver else ""))
        report["tasks"][task.name] = {
            "silver": task.silver, "description": task.description, "labels": data.labels,
            "counts": counts, "dropped": data.dropped, "majority": majority_accuracy(data),
            "probes": probe_task(data, kinds, random_data, control, seed,
                                 salt=f"{number}:{task.name}", log=log)}
    return report


# -- report ---------------------------------------------------------------------------------------
def _pct(value: float | None) -> str:
    return "" if value is None else f"{100 * value:.1f}"


def _number(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.2f}"


def markdown_report(results: dict) -> str:
    """The results as markdown (``probing_report.md.j2``): a summary table, then one table per
    task and probe."""
    return template("probing_report.md.j2").render(results=results, pct=_pct, number=_number,
                                                   zip=zip)


def plot_report(results: dict, path: str | Path) -> None:
    """Accuracy per layer for every task (lines; dashed: MLP) beside each task's scalar-mix
    weights (bars), like Tenney et al.'s figure."""
    plt = pyplot()
    tasks = results["tasks"]
    layers = np.arange(results["layers"])
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4.2))
    width = 0.8 / max(len(tasks), 1)
    for number, (name, task) in enumerate(tasks.items()):
        color = f"C{number}"
        for kind, entry in task["probes"].items():
            left.plot(layers, [100 * r["test"] for r in entry["layers"]], color=color,
                      linestyle="-" if kind == "linear" else "--", marker="o", markersize=3,
                      label=f"{name} ({kind})")
        first = next(iter(task["probes"].values()))
        right.bar(layers + (number - (len(tasks) - 1) / 2) * width, first["mix"]["weights"],
                  width=width, color=color,
                  label=f"{name} (CoG {first['center_of_gravity']:.2f})")
    left.set(xlabel="layer (0 = embeddings)", ylabel="test accuracy (%)",
             title="probe accuracy per layer", xticks=layers)
    right.set(xlabel="layer", ylabel="softmax weight", xticks=layers,
              title="scalar-mix weights")
    left.legend(fontsize=7)
    right.legend(fontsize=7)
    fig.suptitle(f"{results.get('model', '')}: pos/dep/ner labels are silver (spaCy)", fontsize=9)
    fig.tight_layout()
    save_png(fig, path, dpi=110)


def write_report(results: dict, out: str | Path) -> list[Path]:
    """``results.json``, ``results.md`` and ``probing.png`` in ``out``."""
    return write_files(out, {"results.json": results, "results.md": markdown_report(results),
                             "probing.png": lambda path: plot_report(results, path)})


def load_results(out: str | Path) -> dict:
    """The results a run wrote into ``out``."""
    from lmlab.utils.io import read_json

    path = Path(out) / "results.json"
    if not path.is_file():
        raise LmlabError(f"{out} holds no probing results (no results.json)",
                         "give the --out folder of an `lmlab probe` run")
    return read_json(path)
