"""Recurrent language models beside the Transformers: AWD-LSTM (ULMFiT's body) and ELMo.

They plug into lmlab where a :class:`~lmlab.models.model.LanguageModel` does (the Trainer,
``lmlab pretrain --family awd-lstm|elmo``, ``lmlab finetune``, feature extraction) by answering
the same calls (:mod:`lmlab.models.rnn.base`), without touching the Transformer core.

Modules: ``config`` (sizes; torch-free), ``layers`` (weight drop, locked and embedding
dropout), ``char_cnn`` (ELMo's token encoder), ``base``, ``awd_lstm``, ``elmo`` (the models),
``io`` (build, save, load), ``ulmfit`` (the three stages).
"""

from lmlab.models.rnn.config import FAMILIES, RecurrentConfig, recurrent_preset

__all__ = ["FAMILIES", "RecurrentConfig", "recurrent_preset"]
