"""Recurrent language models beside the Transformers: AWD-LSTM (ULMFiT's body) and ELMo
(docs/recurrent.md).
"""

from lmlab.models.rnn.config import FAMILIES, RecurrentConfig, recurrent_preset

__all__ = ["FAMILIES", "RecurrentConfig", "recurrent_preset"]
