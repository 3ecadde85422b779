"""Task examples -> tokenized features -> padded batches.

* classification / pair / regression: one sequence per example (``[CLS] a [SEP] b [SEP]``).
* tagging: words are tokenized with ``is_split_into_words``; the word's label goes on its FIRST
  sub-token, the other sub-tokens get -100 (ignored by the loss); predictions are read back at
  the first sub-tokens, so there is exactly one prediction per word.
* qa: question + context with ``truncation="only_second"``, ``return_overflowing_tokens`` and a
  ``stride``, so long contexts become overlapping windows; each window keeps its offsets and the
  start/end token of the answer (0 = [CLS] when the answer is not inside that window).
* multiple-choice: one (context, choice) sequence per choice.

Batches group examples of similar length (length-grouped sampling) so little padding is
computed; the model skips the rest (``skip_padding``, on by default).
"""

from __future__ import annotations

import random
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from lmlab.models.heads import IGNORE_INDEX
from lmlab.models.image_head import IMAGE_CLASSIFICATION
from lmlab.tasks.types import Example, Task
from lmlab.utils.errors import LmlabError

WORD_LABELS = "first-subtoken"
"""How a tagging task's word labels go onto sub-tokens (:func:`word_labels_to_tokens`). A
fine-tuned model records it as ``word_labels`` in its config, so the token-classification
pipeline reads each word's tag where training put it (its first sub-token) by default."""


@dataclass
class Feature:
    """One model input sequence (or, for multiple choice, one per choice)."""

    input_ids: list[Any]
    token_type_ids: list[Any] | None
    label: Any = None  # int, float, list[int] (tags) or (start, end) (qa)
    example_index: int = 0
    extra: dict[str, Any] = field(default_factory=dict)  # qa: offsets, sequence ids

    def __len__(self) -> int:
        if isinstance(self.input_ids[0], list):  # multiple choice: the longest choice
            return max(len(x) for x in self.input_ids)
        return len(self.input_ids)


#: task types whose examples carry one label of the task's label set
LABELLED = ("classification", "pair-classification", IMAGE_CLASSIFICATION)


def check_examples(task: Task, examples: Sequence[Example], split: str) -> None:
    """Raise a clear error for a label outside the label set, a pair task without pairs, an
    image task example without its image, or a tagging or QA example that does not add up."""
    if not examples:
        raise LmlabError(f"the {split} split of task {task.name!r} is empty",
                         f"give a {split} set with at least one example")
    valid = set(task.labels)
    for example in examples:
        if task.type in LABELLED and example.label is not None and example.label not in valid:
            raise LmlabError(f"{split} example {example.id}: label {example.label!r} is not in "
                             f"the label set of {task.name!r} ({len(valid)} labels)",
                             "fix the label or give the full label list")
        if task.type == IMAGE_CLASSIFICATION and example.image is None:
            raise LmlabError(f"{split} example {example.id} of {task.name!r} has no image",
                             "give every example of an image task its image")
        if task.type == "pair-classification" and not example.text_pair:
            raise LmlabError(f"{split} example {example.id}: the pair task {task.name!r} got a "
                             "single text", "give both texts of every pair "
                             "(--text-pair-column)")
        if task.type == "tagging":
            if not example.tokens or (example.tags is not None
                                      and len(example.tags) != len(example.tokens)):
                raise LmlabError(f"{split} example {example.id}: tokens and tags differ in "
                                 "length or are empty", "give one tag per token")
            bad = [t for t in (example.tags or []) if t not in valid]
            if bad:
                raise LmlabError(f"{split} example {example.id}: tag {bad[0]!r} is not in the "
                                 f"tag set {sorted(valid)}", "fix the tag or the tag set")
        if task.type == "qa":
            for answer in example.answers or []:
                start = int(answer.get("answer_start", -1))
                text = answer.get("text", "")
                if not example.context or example.context[start:start + len(text)] != text:
                    raise LmlabError(f"{split} question {example.id}: the answer {text!r} does "
                                     f"not occur in its context at {start}",
                                     "fix the answer text or its answer_start offset")


def encode_examples(task: Task, examples: Sequence[Example], tokenizer, max_length: int = 128,
                    stride: int = 32, split: str = "train") -> list[Feature]:
    """Tokenize ``examples`` of ``task`` into :class:`Feature` objects (see module doc)."""
    check_examples(task, examples, split)
    if task.type in ("classification", "pair-classification", "regression"):
        return _encode_sequences(task, examples, tokenizer, max_length)
    if task.type == "tagging":
        return _encode_tagging(task, examples, tokenizer, max_length)
    if task.type == "qa":
        return encode_qa(examples, tokenizer, max_length, stride)
    if task.type == "multiple-choice":
        return _encode_choices(examples, tokenizer, max_length)
    raise LmlabError(f"task type {task.type!r} cannot be fine-tuned", "use a supported task")


def _encode_sequences(task: Task, examples: Sequence[Example], tokenizer,
                      max_length: int) -> list[Feature]:
    texts = [e.text or "" for e in examples]
    pairs = [e.text_pair or "" for e in examples] if task.is_pair else None
    encoded = tokenizer(texts, pairs, truncation=True, max_length=max_length)
    index = task.label_index()
    features = []
    type_ids = encoded.get("token_type_ids")
    for i, example in enumerate(examples):
        if example.label is None:
            label = None
        elif task.type == "regression":
            label = float(example.label)
        else:
            label = index[example.label]
        features.append(Feature(encoded["input_ids"][i], type_ids[i] if type_ids else None,
                                label, i))
    return features


def word_labels_to_tokens(word_ids: Sequence[int | None], labels: Sequence[int]) -> list[int]:
    """Token labels from word labels: the first sub-token of each word gets the word's label,
    every other position (special tokens, continuation sub-tokens) -100."""
    out, previous = [], None
    for word in word_ids:
        if word is None or word == previous:
            out.append(IGNORE_INDEX)
        else:
            out.append(int(labels[word]))
        previous = word
    return out


def first_subtoken_positions(word_ids: Sequence[int | None]) -> dict[int, int]:
    """word index -> position of its first sub-token."""
    positions: dict[int, int] = {}
    for position, word in enumerate(word_ids):
        if word is not None and word not in positions:
            positions[word] = position
    return positions


def _encode_tagging(task: Task, examples: Sequence[Example], tokenizer,
                    max_length: int) -> list[Feature]:
    encoded = tokenizer([e.tokens for e in examples], is_split_into_words=True, truncation=True,
                        max_length=max_length)
    index = task.label_index()
    type_ids = encoded.get("token_type_ids")
    features = []
    for i, example in enumerate(examples):
        word_ids = encoded.word_ids(i)
        labels = None
        if example.tags is not None:
            labels = word_labels_to_tokens(word_ids, [index[t] for t in example.tags])
        features.append(Feature(encoded["input_ids"][i], type_ids[i] if type_ids else None,
                                labels, i, extra={"word_ids": word_ids,
                                                  "num_words": len(example.tokens)}))
    return features


def encode_qa(examples: Sequence[Example], tokenizer, max_length: int = 384,
              stride: int = 128) -> list[Feature]:
    """Question + context windows with the answer's token span (or 0, 0 = [CLS] when the answer
    is absent from a window or the question is unanswerable)."""
    encoded = tokenizer([e.question or "" for e in examples], [e.context or "" for e in examples],
                        truncation="only_second", max_length=max_length, stride=stride,
                        return_overflowing_tokens=True, return_offsets_mapping=True)
    type_ids = encoded.get("token_type_ids")
    features = []
    for row, example_index in enumerate(encoded["overflow_to_sample_mapping"]):
        example = examples[example_index]
        sequence_ids = encoded.sequence_ids(row)
        offsets = [o if s == 1 else None for o, s in zip(encoded["offset_mapping"][row],
                                                         sequence_ids)]
        label = None
        if example.answers is not None:
            label = (0, 0)
            if example.answers:
                answer = example.answers[0]
                start_char = int(answer["answer_start"])
                end_char = start_char + len(answer["text"])
                context = [i for i, s in enumerate(sequence_ids) if s == 1]
                if context and offsets[context[0]][0] <= start_char and \
                        offsets[context[-1]][1] >= end_char:
                    start = next(i for i in context if offsets[i][1] > start_char)
                    end = next(i for i in reversed(context) if offsets[i][0] < end_char)
                    label = (start, end)
        features.append(Feature(encoded["input_ids"][row],
                                type_ids[row] if type_ids else None, label, example_index,
                                extra={"offsets": offsets}))
    return features


def _encode_choices(examples: Sequence[Example], tokenizer, max_length: int) -> list[Feature]:
    features = []
    for i, example in enumerate(examples):
        if not example.choices:
            raise LmlabError(f"multiple-choice example {example.id} has no choices",
                             "give the candidate answers in 'choices'")
        encoded = tokenizer([example.text or ""] * len(example.choices), list(example.choices),
                            truncation=True, max_length=max_length)
        type_ids = encoded.get("token_type_ids")
        label = int(example.label) if example.label is not None else None
        features.append(Feature(encoded["input_ids"], type_ids, label, i))
    return features


def collate(features: Sequence[Feature], pad_id: int) -> dict[str, Any]:
    """Pad a list of features into tensors (right padding; labels padded with -100)."""
    import torch
    from torch.nn.utils.rnn import pad_sequence

    def padded(rows: Sequence[Sequence[int]], value: int) -> torch.Tensor:  # (N, longest)
        return pad_sequence([torch.tensor(row, dtype=torch.long) for row in rows],
                            batch_first=True, padding_value=value)

    choices = isinstance(features[0].input_ids[0], list)
    rows = [f.input_ids for f in features]
    types = [f.token_type_ids for f in features]
    if choices:  # (B, C, T) flattened to rows, padded, then reshaped
        count = len(rows[0])
        rows = [r for f in rows for r in f]
        types = [t for f in types for t in (f or [None] * count)]
    batch: dict[str, Any] = {"input_ids": padded(rows, pad_id),
                             "attention_mask": padded([[1] * len(row) for row in rows], 0)}
    if any(t is not None for t in types):
        batch["token_type_ids"] = padded([[0] * len(row) if t is None else t
                                          for t, row in zip(types, rows)], 0)
    if choices:  # (B, C, T)
        batch = {k: v.view(len(features), count, -1) for k, v in batch.items()}
    labels = [f.label for f in features]
    if all(label is not None for label in labels):
        first = labels[0]
        if isinstance(first, list):  # tags: one per token, -100 past the end
            batch["labels"] = padded(labels, IGNORE_INDEX)
        elif isinstance(first, tuple):
            batch["labels"] = torch.tensor(labels, dtype=torch.long)  # (B, 2)
        elif isinstance(first, float):
            batch["labels"] = torch.tensor(labels, dtype=torch.float)
        else:
            batch["labels"] = torch.tensor(labels, dtype=torch.long)
    return batch


def length_grouped_order(lengths: Sequence[int], batch_size: int, rng: random.Random,
                         mega: int = 50) -> list[list[int]]:
    """Batches of indices: shuffle, cut into mega-batches of ``mega * batch_size``, sort each by
    length (longest first), cut into batches, shuffle the batches (Hugging Face's
    ``group_by_length``). Similar lengths share a batch, so padding is small."""
    order = list(range(len(lengths)))
    rng.shuffle(order)
    batches = []
    size = mega * batch_size
    for start in range(0, len(order), size):
        chunk = sorted(order[start:start + size], key=lambda i: -lengths[i])
        batches += [chunk[i:i + batch_size] for i in range(0, len(chunk), batch_size)]
    rng.shuffle(batches)
    return batches


class ResumableBatches:
    """Endless epochs of batches with an exact position (epoch, batch), which the Trainer
    checkpoints and restores: a subclass says which batches an epoch has
    (``epoch_batches``, deterministic in the seed and the epoch) and how to build one
    (``make_batch``)."""

    seed = 0
    epoch = 0
    position = 0

    def epoch_batches(self, epoch: int) -> list[list[int]]:
        raise NotImplementedError

    def make_batch(self, indices: list[int]) -> dict[str, Any]:
        raise NotImplementedError

    def __iter__(self) -> Iterator[dict[str, Any]]:
        while True:
            batches = self.epoch_batches(self.epoch)
            while self.position < len(batches):
                indices = batches[self.position]
                self.position += 1
                yield self.make_batch(indices)
            self.epoch += 1
            self.position = 0

    def state_dict(self) -> dict[str, int]:
        return {"epoch": self.epoch, "position": self.position, "seed": self.seed}

    def load_state_dict(self, state: dict[str, int]) -> None:
        self.epoch, self.position = int(state["epoch"]), int(state["position"])
        self.seed = int(state.get("seed", self.seed))


class TaskStream(ResumableBatches):
    """Endless training batches over task features: epochs of length-grouped, shuffled batches.

    ``state_dict``/``load_state_dict`` give the exact position (epoch, batch), so the Trainer
    can checkpoint and resume a fine-tuning run like a pretraining one.
    """

    def __init__(self, features: Sequence[Feature], batch_size: int, pad_id: int, seed: int = 0,
                 group_by_length: bool = True):
        if len(features) == 0:
            raise LmlabError("no training examples to fine-tune on",
                             "give a non-empty training split")
        self.features = features
        self.batch_size = batch_size
        self.pad_id = pad_id
        self.seed = seed
        self.group_by_length = group_by_length

    def epoch_batches(self, epoch: int) -> list[list[int]]:
        rng = random.Random(f"{self.seed}:{epoch}")
        if self.group_by_length:
            return length_grouped_order([len(f) for f in self.features], self.batch_size, rng)
        order = list(range(len(self.features)))
        rng.shuffle(order)
        return [order[i:i + self.batch_size] for i in range(0, len(order), self.batch_size)]

    def __len__(self) -> int:
        """Batches per epoch."""
        return -(-len(self.features) // self.batch_size)

    def make_batch(self, indices: list[int]) -> dict[str, Any]:
        """The batch of the features at ``indices``."""
        return collate([self.features[i] for i in indices], self.pad_id)

    def examples_seen(self) -> int:
        """Training examples the stream has yielded (all epochs, from its position)."""
        done = self.epoch_batches(self.epoch)[:self.position]
        return self.epoch * len(self.features) + sum(len(batch) for batch in done)


def pad_id_of(tokenizer: Any) -> int:
    """The tokenizer's padding id (0 when it has none)."""
    return tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0


def eval_batches(features: Sequence[Feature], batch_size: int,
                 pad_id: int) -> Iterator[tuple[list[int], dict[str, Any]]]:
    """(feature indices, batch) in length order (fast: little padding), covering every feature."""
    order = sorted(range(len(features)), key=lambda i: len(features[i]))
    for start in range(0, len(order), batch_size):
        indices = order[start:start + batch_size]
        yield indices, collate([features[i] for i in indices], pad_id)
