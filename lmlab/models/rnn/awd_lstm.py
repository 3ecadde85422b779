"""AWD-LSTM (Merity et al. 2017), the language model under ULMFiT (Howard & Ruder 2018):
embeddings -> weight-dropped LSTMs -> a decoder tied to the embeddings (docs/recurrent.md).
"""

from __future__ import annotations

import torch
from torch import nn

from lmlab.models.rnn.base import RecurrentModel
from lmlab.models.rnn.config import RecurrentConfig
from lmlab.models.rnn.layers import LockedDropout, WeightDropLSTM, embedding_dropout


class AWDLSTMModel(RecurrentModel):
    """The AWD-LSTM stack with named heads (``"clm"``: the tied decoder; task heads)."""

    family = "awd-lstm"
    lm_head = "clm"

    def __init__(self, config: RecurrentConfig, heads: tuple[str, ...] | list[str] = ()):
        super().__init__(config)
        self.embeddings = nn.Embedding(config.vocab_size, config.embedding_size,
                                       padding_idx=config.pad_token_id)
        self.layers = nn.ModuleList(WeightDropLSTM(inp, out, config.weight_p)
                                    for inp, out in config.layer_sizes())
        self.input_dropout = LockedDropout(config.input_p)
        self.hidden_dropout = LockedDropout(config.hidden_p)
        self.output_dropout = LockedDropout(config.output_p)
        self.reset_parameters()
        for name in heads:
            self.add_head(name)

    def reset_parameters(self) -> None:
        """Embeddings uniform(-r, r) (the padding row zero), LSTMs torch's default."""
        r = self.config.initializer_range
        nn.init.uniform_(self.embeddings.weight, -r, r)
        if self.embeddings.padding_idx is not None:
            with torch.no_grad():
                self.embeddings.weight[self.embeddings.padding_idx].zero_()
        for layer in self.layers:
            layer.lstm.reset_parameters()

    def get_input_embeddings(self) -> nn.Embedding:
        return self.embeddings

    def token_vectors(self) -> torch.Tensor:
        """(V, E) context-free vector of every token: the embedding table."""
        return self.embeddings.weight

    def encode(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None
               ) -> tuple[torch.Tensor, list[torch.Tensor]]:
        """Left to right: right padding never changes a real position's vectors."""
        x = embedding_dropout(self.embeddings, input_ids, self.config.embed_p, self.training)
        x = self.input_dropout(x)  # (B, T, E)
        states = [x]
        for index, layer in enumerate(self.layers):
            x, _ = layer(x)  # (B, T, H_l)
            states.append(x)
            if index < len(self.layers) - 1:
                x = self.hidden_dropout(x)
        return self.output_dropout(x), states

    def layer_groups(self) -> list[list[nn.Module]]:
        """ULMFiT's groups: [heads], last LSTM, ..., first LSTM, [embeddings]."""
        return [list(self.heads.values())] + [[layer] for layer in reversed(self.layers)] + [
            [self.embeddings]]
