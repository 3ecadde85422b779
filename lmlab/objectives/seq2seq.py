"""Encoder-decoder pretraining on :class:`~lmlab.data.pretraining.PretrainingStream`'s packed
windows: ``"t5"`` (span corruption or another row of T5's objective study,
:mod:`lmlab.objectives.t5_spans`) and ``"bart"`` (BART's denoising,
:mod:`lmlab.objectives.bart_noise`). Each window becomes (inputs, targets) ending with the
end-of-sequence token; the loss is teacher-forced cross-entropy on the targets.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

from lmlab.models.heads import IGNORE_INDEX
from lmlab.objectives.base import Objective, ObjectiveResult
from lmlab.objectives.special_tokens import SpecialTokens
from lmlab.utils.errors import LmlabError


def pad_pairs(inputs: Sequence[Sequence[int]], targets: Sequence[Sequence[int]], pad_id: int
              ) -> dict[str, torch.Tensor]:
    """Right-padded ``input_ids``/``attention_mask`` (B, S) and ``labels`` (B, T) (-100 after
    each target), from token id sequences (lists or numpy arrays)."""
    width = max(max(len(x) for x in inputs), 1)
    depth = max(max(len(y) for y in targets), 1)
    ids = torch.full((len(inputs), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(inputs), width), dtype=torch.long)
    labels = torch.full((len(inputs), depth), IGNORE_INDEX, dtype=torch.long)
    for row, (x, y) in enumerate(zip(inputs, targets)):
        ids[row, :len(x)] = torch.as_tensor(x, dtype=torch.long)
        mask[row, :len(x)] = 1
        labels[row, :len(y)] = torch.as_tensor(y, dtype=torch.long)
    return {"input_ids": ids, "attention_mask": mask, "labels": labels}


def seq2seq_loss(model: torch.nn.Module, batch: dict[str, torch.Tensor],
                 weight: float = 1.0) -> ObjectiveResult:
    """Teacher-forced cross-entropy of an encoder-decoder on ``labels`` (the model shifts them
    behind its decoder start token), the number of target tokens it averages over, and the
    share of them predicted right (``target_accuracy``)."""
    labels = batch["labels"]
    out = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"],
                labels=labels)
    real = labels != IGNORE_INDEX
    count = int(real.sum())
    with torch.no_grad():
        right = (out.logits.argmax(-1)[real] == labels[real]).sum()
        accuracy = float(right) / count if count else 0.0
    return ObjectiveResult(out.loss * weight, {"target_accuracy": accuracy}, count)


class _Seq2SeqObjective(Objective):
    """Shared parts: the encoder-decoder check, the head, and the loss."""

    head_names = ("seq2seq-lm",)
    corrupts_tokens = True
    flops_head = "clm"
    reports_perplexity = True
    cls_sep_packing = False

    def prepare(self, model: torch.nn.Module) -> None:
        from lmlab.models.seq2seq import require_encoder_decoder

        require_encoder_decoder(model, f"the {self.name!r} objective")
        super().prepare(model)

    def _end(self) -> list[int]:
        return [self.special.eos_id] if self.special.eos_id is not None else []

    def _rows(self, batch: dict[str, torch.Tensor]) -> list[np.ndarray]:
        """Each window's real tokens as numpy ids."""
        ids, mask = batch["input_ids"], batch.get("attention_mask")
        return [row[mask[i].bool()].numpy() if mask is not None else row.numpy()
                for i, row in enumerate(ids)]

    def compute_loss(self, model: torch.nn.Module, batch: dict[str, torch.Tensor]
                     ) -> ObjectiveResult:
        return seq2seq_loss(model, batch, self.weight)


class T5SpanCorruption(_Seq2SeqObjective):
    """T5's pretraining (Raffel et al. 2020): span corruption by default, or a row of the
    objective study (``variant``: ``span_corruption``, ``prefix_lm``, ``bert_style``,
    ``mass_style``, ``deshuffling``, ``replace_spans``, ``drop_tokens``, ``drop_spans``).

    Args:
        noise_density, mean_span: span corruption's rate (0.15) and mean span length (3); the
            i.i.d. variants read ``noise_density`` as their rate.
    """

    name = "t5"
    salt = 57

    def __init__(self, special: SpecialTokens, variant: str = "span_corruption",
                 noise_density: float = 0.15, mean_span: float = 3.0, weight: float = 1.0):
        super().__init__(special, weight)
        from lmlab.objectives.t5_spans import Tokens, get_objective

        self.variant = variant
        self.function = get_objective(variant)
        uses_sentinels = variant in ("span_corruption", "replace_spans")
        if uses_sentinels and not special.sentinel_ids:
            raise LmlabError(f"the tokenizer has no sentinel tokens (<extra_id_0>, ...), which "
                             f"T5's {variant} needs",
                             "train the tokenizer with sentinels (lmlab tokenizer train "
                             "--extra-ids 100) or use a T5 checkpoint's own tokenizer")
        self.tokens = Tokens(sentinels=special.sentinel_ids, mask_id=special.mask_id,
                             vocab_size=special.vocab_size)
        self.options = {"noise_density": float(noise_density)}
        if variant in ("span_corruption", "drop_spans"):
            self.options["mean_span"] = float(mean_span)
        if variant == "prefix_lm":
            self.options = {}

    def corrupt(self, batch: dict[str, torch.Tensor],
                rng: torch.Generator) -> dict[str, torch.Tensor]:
        inputs, targets = [], []
        for ids, generator in zip(self._rows(batch), self.row_generators(batch, rng)):
            example = self.function(ids, self.tokens, generator, **self.options)
            inputs.append(np.concatenate([example.inputs, self._end()]).astype(np.int64))
            targets.append(np.concatenate([example.targets, self._end()]).astype(np.int64))
        return pad_pairs(inputs, targets, self.special.pad_id)


class BartDenoising(_Seq2SeqObjective):
    """BART's pretraining (Lewis et al. 2020): reconstruct the window from a noised copy.

    Args:
        mask_ratio: share of the words text infilling hides (0.3 in BART).
        poisson_lambda: mean span length of the infilling (3).
        permute_sentences: shuffle the window's pieces (cut after each end-of-text / separator
            token: the documents packed into it).
        rotate: rotate the document to start at a random token (hurt in the paper; off).
        token_mask_ratio, delete_ratio: BART's other two transforms, token masking and token
            deletion (off; the paper's ablation rows).
    """

    name = "bart"
    salt = 61

    def __init__(self, special: SpecialTokens, mask_ratio: float = 0.3,
                 poisson_lambda: float = 3.0, permute_sentences: bool = True,
                 rotate: bool = False, token_mask_ratio: float = 0.0,
                 delete_ratio: float = 0.0, weight: float = 1.0):
        super().__init__(special, weight)
        from lmlab.objectives.bart_noise import BartNoise

        self.mask_id = special.require_mask()
        self.noise = BartNoise(infill_ratio=float(mask_ratio), poisson_lambda=float(poisson_lambda),
                               permute_sentences=bool(permute_sentences), rotate=bool(rotate),
                               mask_ratio=float(token_mask_ratio),
                               delete_ratio=float(delete_ratio))

    def corrupt(self, batch: dict[str, torch.Tensor],
                rng: torch.Generator) -> dict[str, torch.Tensor]:
        from lmlab.objectives.bart_noise import apply_noise

        ends = {i for i in (self.special.eos_id, self.special.sep_id) if i is not None}
        inputs, targets = [], []
        for ids, generator in zip(self._rows(batch), self.row_generators(batch, rng)):
            cuts = [i + 1 for i, token in enumerate(ids.tolist()) if token in ends]
            sentences = [part for part in np.split(ids, cuts) if len(part)] or [ids]
            noised = apply_noise(sentences, self.noise, self.mask_id, generator,
                                 vocab_size=self.special.vocab_size)
            inputs.append(np.concatenate([noised, self._end()]).astype(np.int64))
            targets.append(np.concatenate([ids, self._end()]).astype(np.int64))
        return pad_pairs(inputs, targets, self.special.pad_id)
