"""Encoder-decoder pretraining on packed windows: ``"t5"`` (:mod:`~lmlab.objectives.t5_spans`)
and ``"bart"`` (:mod:`~lmlab.objectives.bart_noise`) make each window an (inputs, targets)
pair; the loss is teacher-forced cross-entropy on the targets."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

from lmlab.data.pretraining import pad_rows
from lmlab.models.heads import IGNORE_INDEX
from lmlab.models.seq2seq import require_encoder_decoder
from lmlab.objectives.bart_noise import BartNoise, apply_noise
from lmlab.objectives.base import Objective, ObjectiveResult
from lmlab.objectives.special_tokens import SpecialTokens
from lmlab.objectives.t5_spans import Tokens, get_objective
from lmlab.utils.errors import LmlabError


def pad_pairs(inputs: Sequence[Sequence[int]], targets: Sequence[Sequence[int]], pad_id: int
              ) -> dict[str, torch.Tensor]:
    """Right-padded ``input_ids``/``attention_mask`` (B, S) and ``labels`` (B, T) (-100 after
    each target), from token id sequences (lists or numpy arrays)."""
    arrays = {"input_ids": pad_rows(inputs, pad_id),
              "attention_mask": pad_rows([np.ones(len(x)) for x in inputs], 0),
              "labels": pad_rows(targets, IGNORE_INDEX)}
    return {key: torch.from_numpy(array) for key, array in arrays.items()}


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
    """Shared parts: the encoder-decoder check, the head, the padded pairs and the loss."""

    head_names = ("seq2seq-lm",)
    corrupts_tokens = True
    flops_head = "clm"
    reports_perplexity = True
    cls_sep_packing = False

    def prepare(self, model: torch.nn.Module) -> None:
        require_encoder_decoder(model, f"the {self.name!r} objective")
        super().prepare(model)

    def pair(self, ids: np.ndarray, rng: np.random.Generator,
             word_starts: np.ndarray | None = None,
             sentence_starts: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
        """(inputs, targets) token ids of one window's real tokens; ``word_starts`` and
        ``sentence_starts`` flag the tokens that begin a word or a sentence (where the batch
        has them)."""
        raise NotImplementedError

    def corrupt(self, batch: dict[str, torch.Tensor],
                rng: torch.Generator) -> dict[str, torch.Tensor]:
        """Each window's :meth:`pair`, both ending with the end-of-sequence token, padded."""
        end = [self.special.eos_id] if self.special.eos_id is not None else []
        mask = batch.get("attention_mask")
        inputs, targets = [], []
        for i, generator in enumerate(self.row_generators(batch, rng)):
            real = mask[i].bool() if mask is not None else slice(None)
            words, sentences = (batch[key][i][real].numpy() if key in batch else None
                                for key in ("word_starts", "sentence_starts"))
            x, y = self.pair(batch["input_ids"][i][real].numpy(), generator, words, sentences)
            inputs.append(np.concatenate([x, end]).astype(np.int64))
            targets.append(np.concatenate([y, end]).astype(np.int64))
        return pad_pairs(inputs, targets, self.special.pad_id)

    def compute_loss(self, model: torch.nn.Module, batch: dict[str, torch.Tensor]
                     ) -> ObjectiveResult:
        return seq2seq_loss(model, batch, self.weight)


MASKING_VARIANTS = ("bert_style", "mass_style")  # the rows that replace tokens by one mask


class T5SpanCorruption(_Seq2SeqObjective):
    """T5's pretraining (Raffel et al. 2020): span corruption, or the row of the objective
    study named by ``variant`` (:data:`lmlab.objectives.t5_spans.OBJECTIVES`);
    ``noise_density`` (0.15) is every variant's rate, ``mean_span`` (3) the spans' mean length.
    """

    name = "t5"
    salt = 57

    def __init__(self, special: SpecialTokens, variant: str = "span_corruption",
                 noise_density: float = 0.15, mean_span: float = 3.0, weight: float = 1.0):
        super().__init__(special, weight)
        self.variant = variant
        self.function = get_objective(variant)
        uses_sentinels = variant in ("span_corruption", "replace_spans")
        if uses_sentinels and not special.sentinel_ids:
            raise LmlabError(f"the tokenizer has no sentinel tokens (<extra_id_0>, ...), which "
                             f"T5's {variant} needs",
                             "train the tokenizer with sentinels (lmlab tokenizer train "
                             "--extra-ids 100) or use a T5 checkpoint's own tokenizer")
        # bert_style/mass_style's mask: the first sentinel, as T5's code (its sentinel_id, the
        # vocabulary's last id, is <extra_id_0>); a tokenizer without sentinels: its mask token
        mask_id = special.sentinel_ids[0] if special.sentinel_ids else special.mask_id
        if variant in MASKING_VARIANTS and mask_id is None:
            raise LmlabError(f"the tokenizer has neither sentinel tokens (<extra_id_0>, ...) nor "
                             f"a mask token, one of which T5's {variant} masks with",
                             "train the tokenizer with sentinels (lmlab tokenizer train "
                             "--extra-ids 100) or use a T5 checkpoint's own tokenizer")
        self.tokens = Tokens(sentinels=special.sentinel_ids, mask_id=mask_id,
                             vocab_size=special.vocab_size)
        # every variant takes both (each reads the ones its rule has)
        self.options = {"noise_density": float(noise_density), "mean_span": float(mean_span)}

    def pair(self, ids: np.ndarray, rng: np.random.Generator,
             word_starts: np.ndarray | None = None,
             sentence_starts: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
        example = self.function(ids, self.tokens, rng, **self.options)
        return example.inputs, example.targets


class BartDenoising(_Seq2SeqObjective):
    """BART's pretraining (Lewis et al. 2020): reconstruct the window from a noised copy. The
    arguments set :class:`~lmlab.objectives.bart_noise.BartNoise` (docs/objectives.md): text
    infilling's ``mask_ratio`` (0.3) and ``poisson_lambda`` (3) over whole words (the shards'
    word starts), sentence permutation (the shards' sentences; without them in the batch, the
    window cut after each end-of-text/separator token), rotation, token masking, deletion."""

    name = "bart"
    salt = 61
    uses_sentence_starts = True  # the stream adds ``sentence_starts`` (B, T) to its batches

    def __init__(self, special: SpecialTokens, mask_ratio: float = 0.3,
                 poisson_lambda: float = 3.0, permute_sentences: bool = True,
                 rotate: bool = False, token_mask_ratio: float = 0.0,
                 delete_ratio: float = 0.0, weight: float = 1.0):
        super().__init__(special, weight)
        self.mask_id = special.require_mask()
        self.noise = BartNoise(infill_ratio=float(mask_ratio), poisson_lambda=float(poisson_lambda),
                               permute_sentences=bool(permute_sentences), rotate=bool(rotate),
                               mask_ratio=float(token_mask_ratio),
                               delete_ratio=float(delete_ratio))
        self.ends = {i for i in (special.eos_id, special.sep_id) if i is not None}

    def pair(self, ids: np.ndarray, rng: np.random.Generator,
             word_starts: np.ndarray | None = None,
             sentence_starts: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
        if sentence_starts is not None:
            cuts = np.flatnonzero(sentence_starts[1:]) + 1
        else:
            cuts = [i + 1 for i, token in enumerate(ids.tolist()) if token in self.ends]
        sentences = [part for part in np.split(ids, cuts) if len(part)] or [ids]
        starts = None
        if word_starts is not None:
            starts = [part for part in np.split(word_starts, cuts) if len(part)] or [word_starts]
        return apply_noise(sentences, self.noise, self.mask_id, rng,
                           vocab_size=self.special.vocab_size, word_starts=starts), ids
