"""Recurrent language models beside the Transformers: AWD-LSTM (ULMFiT's body) and ELMo
(docs/recurrent.md).
"""
