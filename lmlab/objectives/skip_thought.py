"""Skip-thought (Kiros et al. 2015): the model's mean-pooled vector of a sentence conditions
two GRU decoders (held here, dropped after training) of the previous and the next sentence
(docs/sentence-encoders.md)."""

from __future__ import annotations

import torch
from torch import nn

from lmlab.objectives.base import ObjectiveResult, sentence_vectors
from lmlab.utils.errors import LmlabError


class ConditionedGRUDecoder(nn.Module):
    """A GRU language model of a sentence given a sentence vector ``context`` (B, C)."""

    def __init__(self, embedding_dim: int, context_dim: int, hidden: int):
        super().__init__()
        self.start = nn.Linear(context_dim, hidden)
        self.gru = nn.GRU(embedding_dim + context_dim, hidden, batch_first=True)
        self.project = nn.Linear(hidden, embedding_dim)

    def forward(self, words: torch.Tensor, context: torch.Tensor) -> torch.Tensor:
        """(B, T, E) input word vectors, (B, C) -> (B, T, E) output vectors (to score against
        the embedding table)."""
        steps = words.shape[1]
        inputs = torch.cat([words, context[:, None, :].expand(-1, steps, -1)], dim=-1)  # (B,T,E+C)
        state = torch.tanh(self.start(context))[None]  # (1, B, hidden)
        outputs, _ = self.gru(inputs, state)  # (B, T, hidden)
        return self.project(outputs)


class SkipThought(nn.Module):
    """The skip-thought loss on (previous, sentence, next) batches: decoders over the
    tokenizer's ``vocab_size`` words, conditioned on the encoder's ``context_dim``-wide vector,
    with ``embedding_dim``-wide word vectors and ``decoder_hidden``-wide GRU states."""

    name = "skip-thought"
    flops_head = "none"
    reports_perplexity = True  # the loss is a mean per-token LM loss of the two decoders
    predicted_fraction = None

    def __init__(self, vocab_size: int, context_dim: int, embedding_dim: int = 128,
                 decoder_hidden: int = 256):
        super().__init__()
        self.embedding = nn.Embedding(vocab_size, embedding_dim)
        self.previous = ConditionedGRUDecoder(embedding_dim, context_dim, decoder_hidden)
        self.following = ConditionedGRUDecoder(embedding_dim, context_dim, decoder_hidden)

    def prepare(self, model: nn.Module) -> None:
        """Nothing to add to the encoder."""

    def decoder_loss(self, decoder: ConditionedGRUDecoder, ids: torch.Tensor, mask: torch.Tensor,
                     context: torch.Tensor) -> tuple[torch.Tensor, int]:
        """(summed token cross-entropy, target tokens) of one sentence batch (B, T)."""
        inputs, targets = ids[:, :-1], ids[:, 1:]  # (B, T-1): predict token t+1 from <= t
        keep = mask[:, 1:].bool()
        outputs = decoder(self.embedding(inputs), context)  # (B, T-1, E)
        logits = outputs[keep] @ self.embedding.weight.T  # (N, V): only the real targets
        loss = nn.functional.cross_entropy(logits.float(), targets[keep], reduction="sum")
        return loss, int(keep.sum())

    def compute_loss(self, model: nn.Module, batch: dict[str, torch.Tensor]) -> ObjectiveResult:
        missing = [k for k in ("prev_ids", "prev_mask", "next_ids", "next_mask") if k not in batch]
        if missing:
            raise LmlabError(f"the batch has no {', '.join(missing)} for skip-thought",
                             "build batches with lmlab.sentence.data.TripleStream")
        context = sentence_vectors(model, batch)  # (B, H)
        prev_loss, prev_count = self.decoder_loss(self.previous, batch["prev_ids"],
                                                  batch["prev_mask"], context)
        next_loss, next_count = self.decoder_loss(self.following, batch["next_ids"],
                                                  batch["next_mask"], context)
        count = prev_count + next_count
        if count == 0:
            raise LmlabError("the previous and next sentences have no tokens to predict",
                             "tokenize them with their start and end tokens")
        loss = (prev_loss + next_loss) / count
        metrics = {"loss": float(loss.detach()),
                   "prev_loss": float(prev_loss.detach()) / max(prev_count, 1),
                   "next_loss": float(next_loss.detach()) / max(next_count, 1)}
        return ObjectiveResult(loss, metrics, count)
