"""How far each layer moves its input (ALBERT's Figure 1, Lan et al. 2020): per layer, the L2
distance and the cosine similarity (and its angle in degrees) between the layer's input and
output hidden states, each token's, averaged over the real tokens of a text sample (special
tokens included, padding not). ALBERT's one shared layer gave smoother transitions than BERT's
(docs/attention.md, "Layer transitions").
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from lmlab.analysis.features import run_texts
from lmlab.analysis.report import pyplot, save_png
from lmlab.models.inputs import input_limit
from lmlab.utils.errors import LmlabError


@dataclass
class LayerTransitions:
    """Per layer (L,): mean L2 distance, mean cosine and mean angle (degrees) between a layer's
    input (the embeddings for layer 0) and its output, over ``tokens`` real tokens."""

    name: str
    l2: np.ndarray
    cosine: np.ndarray
    degrees: np.ndarray
    tokens: int
    texts: int
    hidden_size: int

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "tokens": self.tokens, "texts": self.texts,
                "hidden_size": self.hidden_size, "l2": self.l2.round(6).tolist(),
                "cosine": self.cosine.round(6).tolist(), "degrees": self.degrees.round(4).tolist()}


def transition_sums(hidden_states: Sequence[torch.Tensor], mask: torch.Tensor
                    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Sums over the real tokens (``mask`` (B, T)) of each layer's L2 distance, cosine and angle
    in degrees, each (L,), from L + 1 hidden states (B, T, H)."""
    states = torch.stack(list(hidden_states)).double()  # (L+1, B, T, H)
    inputs, outputs = states[:-1], states[1:]
    real = mask.bool()[None].double()  # (1, B, T)
    l2 = (outputs - inputs).norm(dim=-1)  # (L, B, T)
    cosine = torch.nn.functional.cosine_similarity(outputs, inputs, dim=-1, eps=1e-12)
    degrees = torch.rad2deg(torch.arccos(cosine.clamp(-1.0, 1.0)))
    return tuple((value * real).sum(dim=(1, 2)) for value in (l2, cosine, degrees))


@torch.inference_mode()
def layer_transitions(model: Any, tokenizer: Any, texts: Sequence[str], batch_size: int = 32,
                      max_length: int | None = None, name: str = "") -> LayerTransitions:
    """ALBERT's Figure 1 measures of ``model`` over ``texts`` (cut to ``max_length``, default
    the model's limit). A pre-norm stack's last output is after its final norm, as
    ``output_hidden_states`` gives it.

    Example:
        >>> layer_transitions(model, tok, default_sample(200)).degrees  # (layers,)
    """
    texts = [t for t in texts if t.strip()]
    if not texts:
        raise LmlabError("no text to measure layer transitions on", "give at least one text")
    model.eval()
    limit = input_limit(model, tokenizer, max_length) or 512
    sums = [torch.zeros(model.config.num_hidden_layers, dtype=torch.float64) for _ in range(3)]
    tokens = 0
    for start in range(0, len(texts), batch_size):
        batch, hidden = run_texts(model, tokenizer, texts[start:start + batch_size], limit)
        mask = batch["attention_mask"]
        for total, value in zip(sums, transition_sums(hidden, mask)):
            total += value
        tokens += int(mask.sum())
    l2, cosine, degrees = (s.numpy() / tokens for s in sums)
    return LayerTransitions(name, l2, cosine, degrees, tokens, len(texts),
                            model.config.hidden_size)


def to_markdown(results: Sequence[LayerTransitions]) -> str:
    """One row per layer: each model's L2 distance and angle."""
    head = " | ".join(f"{r.name} L2 | {r.name} degrees" for r in results)
    lines = [f"| layer | {head} |", "|---" * (1 + 2 * len(results)) + "|"]
    for layer in range(max(len(r.l2) for r in results)):
        cells = " | ".join(f"{r.l2[layer]:.2f} | {r.degrees[layer]:.1f}" if layer < len(r.l2)
                           else " | " for r in results)
        lines.append(f"| {layer} | {cells} |")
    return "\n".join(lines) + "\n"


def plot_transitions(results: Sequence[LayerTransitions], path: str | Path, title: str = ""
                     ) -> Path:
    """Two panels as the paper's figure: L2 distance and angle (degrees) against the layer.
    Results named ``"<model> seed <n>"`` share their model's colour and one legend entry."""
    plt = pyplot()
    fig, axes = plt.subplots(1, 2, figsize=(9.0, 3.4))
    models = list(dict.fromkeys(r.name.split(" seed ")[0] for r in results))
    labelled: set[str] = set()
    for result in results:
        model = result.name.split(" seed ")[0]
        style = {"marker": "o", "color": f"C{models.index(model)}",
                 "label": None if model in labelled else model}
        labelled.add(model)
        layers = np.arange(len(result.l2))
        axes[0].plot(layers, result.l2, **style)
        axes[1].plot(layers, result.degrees, **style)
    for ax, label in zip(axes, ("L2 distance", "cosine similarity (degrees)")):
        ax.set_xlabel("layer")
        ax.set_ylabel(label)
        ax.set_xticks(range(max(len(r.l2) for r in results)))
        ax.legend(fontsize=8)
    fig.suptitle(title or "input vs output embedding of each layer", fontsize=10)
    fig.tight_layout()
    return save_png(fig, path, dpi=110)


def check_same_width(widths: dict[str, int]) -> None:
    """Refuse to compare models of different widths (``{name: hidden size}``): their
    distances would not compare."""
    if len(set(widths.values())) > 1:
        raise LmlabError(f"the models differ in width ({widths})",
                         "compare models with the same hidden size, as the paper's figure does")
