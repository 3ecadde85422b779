"""XLM-RoBERTa (Conneau et al. 2020): RoBERTa's architecture, rules and task heads under
``model_type`` "xlm-roberta", with a SentencePiece vocabulary of 250,002 pieces (docs/models.md)."""

from __future__ import annotations

from dataclasses import replace

from lmlab.models.families import stack_size
from lmlab.models.families.roberta import FAMILY as ROBERTA

FAMILY = replace(
    ROBERTA,
    model_type="xlm-roberta",
    display_name="XLM-RoBERTa",
    defaults={**ROBERTA.defaults, "vocab_size": 250002},
    sizes={"base": stack_size(768, 12), "large": stack_size(1024, 24)},
    architectures={"XLMRobertaModel": (), "XLMRobertaForMaskedLM": ("mlm",)},
)
