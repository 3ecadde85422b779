"""ELMo's character-aware token encoder (Peters et al. 2018, after Kim et al. 2016): character
convolutions, max-pooled, highway layers, a projection. The characters are those of each token
id's string (a word piece), a buffer of the model (docs/recurrent.md).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn
from torch.nn import functional as F

from lmlab.models.rnn.config import NUM_CHARS, RecurrentConfig

PAD, BOW, EOW, BOC, SPECIAL = 0, 257, 258, 259, 260  # 1..256 are the bytes 0..255


def token_chars(token: str | None, special: bool, max_chars: int,
                marked_words: bool = False) -> list[int]:
    """The character ids of one vocabulary entry, padded to ``max_chars``: a begin marker (word,
    continuation, special), the bytes, end-of-word. ``marked_words``: the vocabulary marks word
    starts (``\u0120``, ``\u2581``), so an unmarked piece continues a word."""
    if token is None:
        return [PAD] * max_chars
    begin = SPECIAL if special else BOW
    if not special and token.startswith("##") and len(token) > 2:
        begin, token = BOC, token[2:]
    elif not special and token[:1] in ("\u0120", "\u2581") and len(token) > 1:
        token = token[1:]  # byte-level BPE's / SentencePiece's word-start marker
    elif not special and marked_words:
        begin = BOC
    body = [byte + 1 for byte in token.encode("utf-8")][:max_chars - 2]
    ids = [begin, *body, EOW]
    return ids + [PAD] * (max_chars - len(ids))


def char_table(tokens: Sequence[str | None], special_tokens: set[str],
               max_chars: int) -> torch.Tensor:
    """(V, max_chars) int16 character ids of every vocabulary entry (id order)."""
    marked = any(t is not None and t[:1] in ("\u0120", "\u2581") and len(t) > 1
                 and t not in special_tokens for t in tokens)
    rows = [token_chars(t, t in special_tokens, max_chars, marked) for t in tokens]
    return torch.tensor(rows, dtype=torch.int16)


def tokenizer_char_table(tokenizer, max_chars: int) -> torch.Tensor:
    """:func:`char_table` of a :class:`~lmlab.tokenization.tokenizer.Tokenizer`'s vocabulary."""
    tokens = tokenizer.convert_ids_to_tokens(list(range(len(tokenizer))))
    return char_table(tokens, set(tokenizer.all_special_tokens), max_chars)


class Highway(nn.Module):
    """Highway layers (Srivastava et al. 2015): ``g * x + (1 - g) * relu(transform)``, the
    carry gate ``g`` the second half of each layer's output. ``init``: ``"allennlp"`` (AllenNLP's
    Highway: torch's Linear init, the gate's bias 1) or ``"bilm-tf"`` (weights N(0, 1/width),
    transform bias 0, gate bias 2: bilm-tf's carry bias -2 on its gate, which scales the
    transform)."""

    def __init__(self, width: int, num_layers: int, init: str = "allennlp"):
        super().__init__()
        self.width = width
        self.layers = nn.ModuleList(nn.Linear(width, 2 * width) for _ in range(num_layers))
        with torch.no_grad():
            for layer in self.layers:
                if init == "bilm-tf":
                    nn.init.normal_(layer.weight, std=(1.0 / width) ** 0.5)
                    nn.init.zeros_(layer.bias)
                layer.bias[self.width:].fill_(2.0 if init == "bilm-tf" else 1.0)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.layers:
            transform, gate = layer(x).chunk(2, dim=-1)  # (N, W) each
            gate = torch.sigmoid(gate)
            x = gate * x + (1 - gate) * F.relu(transform)
        return x


class CharCNNEncoder(nn.Module):
    """Token ids -> (B, T, projection_size) vectors from their characters (module docstring)."""

    def __init__(self, config: RecurrentConfig):
        super().__init__()
        self.register_buffer("char_table", torch.zeros(config.vocab_size, config.max_chars,
                                                       dtype=torch.int16))
        self.char_embeddings = nn.Embedding(NUM_CHARS, config.char_embedding_size,
                                            padding_idx=PAD)
        self.convolutions = nn.ModuleList(
            nn.Conv1d(config.char_embedding_size, count, kernel_size=width)
            for width, count in config.char_filters)
        width = sum(count for _, count in config.char_filters)
        self.highway = Highway(width, config.num_highway, config.highway_init)
        self.projection = nn.Linear(width, config.projection_size)

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        chars = self.char_table[input_ids].long()  # (B, T, C)
        batch, length, count = chars.shape
        x = self.char_embeddings(chars.view(-1, count)).transpose(1, 2)  # (B*T, d, C)
        pooled = [F.relu(conv(x).max(dim=-1).values) for conv in self.convolutions]  # (B*T, n)
        x = self.highway(torch.cat(pooled, dim=-1))  # (B*T, sum n)
        return self.projection(x).view(batch, length, -1)  # (B, T, P)
