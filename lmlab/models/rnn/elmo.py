"""ELMo's bidirectional language model (Peters et al. 2018): the character CNN, then layers of a
forward and a backward projected LSTM sharing one softmax (``"bilm"``); ``hidden_states`` are
ELMo's layers, ``2 * projection_size`` wide (docs/recurrent.md).
"""

from __future__ import annotations

import warnings

import torch
from torch import nn
from torch.nn import functional as F

from lmlab.models.heads import IGNORE_INDEX
from lmlab.models.rnn.base import LMHead, RecurrentModel
from lmlab.models.rnn.char_cnn import CharCNNEncoder
from lmlab.models.rnn.config import RecurrentConfig
from lmlab.models.rnn.layers import WeightDropLSTM, reverse_padded
from lmlab.utils.errors import LmlabError

# torch's oneDNN path has no projected LSTM and warns on every model; its default CPU kernel
# runs instead, which is all the warning says
warnings.filterwarnings("ignore", message="LSTM with projections is not supported with oneDNN")


class BiLMHead(LMHead):
    """ELMo's softmax, shared by the two directions: (B, T, 2P) -> (B, T, 2, V) logits, index 0
    the forward LM's (predicting token t+1), 1 the backward LM's (predicting token t-1)."""

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        directions = hidden.view(*hidden.shape[:-1], 2, -1)  # (B, T, 2, P)
        return self.decoder(directions)  # (B, T, 2, V)

    @staticmethod
    def loss(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        """The mean of the forward and the backward LM's token cross-entropies (a position
        whose own label is ignored, padding, predicts nothing)."""
        vocab = logits.shape[-1]
        padded = labels == IGNORE_INDEX  # (B, T)
        forward = F.cross_entropy(logits[:, :-1, 0].reshape(-1, vocab).float(),
                                  labels[:, 1:].masked_fill(padded[:, :-1], IGNORE_INDEX)
                                  .reshape(-1), ignore_index=IGNORE_INDEX)
        backward = F.cross_entropy(logits[:, 1:, 1].reshape(-1, vocab).float(),
                                   labels[:, :-1].masked_fill(padded[:, 1:], IGNORE_INDEX)
                                   .reshape(-1), ignore_index=IGNORE_INDEX)
        return (forward + backward) / 2


class ElmoModel(RecurrentModel):
    """The ELMo biLM with named heads (``"bilm"``: the shared softmax; task heads)."""

    family = "elmo"
    lm_head = "bilm"

    def __init__(self, config: RecurrentConfig, heads: tuple[str, ...] | list[str] = (),
                 char_table: torch.Tensor | None = None):
        super().__init__(config)
        self.token_encoder = CharCNNEncoder(config)
        if char_table is not None:
            if tuple(char_table.shape) != tuple(self.token_encoder.char_table.shape):
                raise LmlabError(f"the character table is {tuple(char_table.shape)}, the model "
                                 f"needs {tuple(self.token_encoder.char_table.shape)} "
                                 "(vocab_size x max_chars)", "build it from the same tokenizer "
                                 "with the config's max_chars")
            self.token_encoder.char_table.copy_(char_table)
        p, c = config.projection_size, config.lstm_size
        clips = {"cell_clip": config.cell_clip, "proj_clip": config.proj_clip}
        self.forward_layers = nn.ModuleList(WeightDropLSTM(p, c, proj_size=p, **clips)
                                            for _ in range(config.num_layers))
        self.backward_layers = nn.ModuleList(WeightDropLSTM(p, c, proj_size=p, **clips)
                                             for _ in range(config.num_layers))
        self.dropout = nn.Dropout(config.dropout)
        for name in heads:
            self.add_head(name)

    def get_input_embeddings(self) -> None:
        """None: ELMo reads characters, it has no token table to tie."""
        return None

    @torch.no_grad()
    def token_vectors(self, chunk: int = 4096) -> torch.Tensor:
        """(V, P) context-free vector of every token (the character CNN's output), in chunks."""
        device = self.token_encoder.char_table.device
        ids = torch.arange(self.config.vocab_size, device=device)
        return torch.cat([self.token_encoder(part.unsqueeze(0))[0]  # (n, P)
                          for part in ids.split(chunk)])

    def _new_head(self, name: str) -> nn.Module:
        if name == self.lm_head:  # one direction's width: the softmax is shared
            return BiLMHead(self.config.projection_size, self.config.vocab_size)
        return super()._new_head(name)

    def encode(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None
               ) -> tuple[torch.Tensor, list[torch.Tensor]]:
        if attention_mask is None:
            attention_mask = torch.ones_like(input_ids)
        lengths = attention_mask.long().sum(1)  # (B,) real tokens per row (right padding)
        tokens = self.token_encoder(input_ids)  # (B, T, P)
        states = [torch.cat([tokens, tokens], dim=-1)]  # (B, T, 2P)
        forward_in, backward_in = tokens, reverse_padded(tokens, lengths)
        for index, (fwd, bwd) in enumerate(zip(self.forward_layers, self.backward_layers)):
            forward_out, _ = fwd(self.dropout(forward_in))  # (B, T, P)
            backward_out, _ = bwd(self.dropout(backward_in))  # (B, T, P), reversed rows
            if index > 0:  # residual connection from the second layer on
                forward_out = forward_out + forward_in
                backward_out = backward_out + backward_in
            states.append(torch.cat([forward_out, reverse_padded(backward_out, lengths)], -1))
            forward_in, backward_in = forward_out, backward_out
        return states[-1], states

    def layer_groups(self) -> list[list[nn.Module]]:
        """[heads], top biLSTM layer (both directions), ..., [character encoder]."""
        pairs = list(zip(self.forward_layers, self.backward_layers))
        return [list(self.heads.values())] + [list(pair) for pair in reversed(pairs)] + [
            [self.token_encoder]]
