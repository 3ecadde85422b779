"""Special-token templates of the model families: which special tokens a family has and where
they go around one text or a pair of texts (the table is in docs/tokenizers.md). The template
lives in the engine's post-processor, so a saved ``tokenizer.json`` carries it."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from tokenizers import processors

from lmlab.utils.checks import check_choice
from lmlab.utils.errors import LmlabError

SPECIAL_ROLES = ("bos_token", "eos_token", "unk_token", "sep_token", "pad_token", "cls_token",
                 "mask_token")


@dataclass(frozen=True)
class Family:
    """A family's special tokens (role -> token, in vocabulary order), its HF class name and
    the further ``tokenizer_config.json`` entries transformers' class of it reads."""

    name: str
    special_tokens: dict[str, str]
    tokenizer_class: str
    config: dict[str, Any] = field(default_factory=dict)

    def ordered_tokens(self) -> list[str]:
        """Distinct special tokens in the order they get ids when a tokenizer is trained."""
        return list(dict.fromkeys(self.special_tokens.values()))


FAMILIES: dict[str, Family] = {
    "bert": Family("bert", {"pad_token": "[PAD]", "unk_token": "[UNK]", "cls_token": "[CLS]",
                            "sep_token": "[SEP]", "mask_token": "[MASK]"}, "BertTokenizer",
                   {"tokenize_chinese_chars": True, "strip_accents": None}),
    # RoBERTa's order: <s>=0, <pad>=1, </s>=2, <unk>=3, then the vocabulary, <mask> last-ish.
    "roberta": Family("roberta", {"bos_token": "<s>", "pad_token": "<pad>", "eos_token": "</s>",
                                  "unk_token": "<unk>", "mask_token": "<mask>",
                                  "cls_token": "<s>", "sep_token": "</s>"}, "RobertaTokenizer",
                      {"add_prefix_space": False, "errors": "replace", "trim_offsets": True}),
    # XLM-R: RoBERTa's tokens and template over a SentencePiece Unigram. transformers 5's
    # XLMRobertaTokenizer rebuilds its own normaliser and pre-tokeniser from the vocabulary, so
    # saved folders name the generic fast class, which loads tokenizer.json as it is.
    "xlm-roberta": Family("xlm-roberta", {"bos_token": "<s>", "pad_token": "<pad>",
                                          "eos_token": "</s>", "unk_token": "<unk>",
                                          "mask_token": "<mask>", "cls_token": "<s>",
                                          "sep_token": "</s>"}, "PreTrainedTokenizerFast"),
    "gpt2": Family("gpt2", {"bos_token": "<|endoftext|>", "eos_token": "<|endoftext|>",
                            "unk_token": "<|endoftext|>"}, "GPT2Tokenizer",
                   {"add_prefix_space": False, "errors": "replace"}),
    # transformers' T5Tokenizer rebuilds its own normaliser (no lower-casing) instead of reading
    # tokenizer.json, so saved Unigram folders name the generic class that loads the file as is.
    "t5": Family("t5", {"pad_token": "<pad>", "eos_token": "</s>", "unk_token": "<unk>"},
                 "PreTrainedTokenizerFast"),
    # ByT5: T5's tokens and template over UTF-8 bytes (lmlab.tokenization.byte_level)
    "byt5": Family("byt5", {"pad_token": "<pad>", "eos_token": "</s>", "unk_token": "<unk>"},
                   "ByT5Tokenizer"),
}

# Hugging Face tokenizer_class names (slow and fast) -> our family.
CLASS_TO_FAMILY = {
    "BertTokenizer": "bert", "BertTokenizerFast": "bert", "DistilBertTokenizer": "bert",
    "DistilBertTokenizerFast": "bert", "ElectraTokenizer": "bert", "ElectraTokenizerFast": "bert",
    "MPNetTokenizer": "bert",
    "RobertaTokenizer": "roberta", "RobertaTokenizerFast": "roberta",
    "BartTokenizer": "roberta", "BartTokenizerFast": "roberta",
    "GPT2Tokenizer": "gpt2", "GPT2TokenizerFast": "gpt2",
    "XLMRobertaTokenizer": "xlm-roberta", "XLMRobertaTokenizerFast": "xlm-roberta",
    "T5Tokenizer": "t5", "T5TokenizerFast": "t5", "AlbertTokenizer": "t5",
    "ByT5Tokenizer": "byt5",
}

DEFAULT_FAMILY = {"wordpiece": "bert", "bpe": "roberta", "unigram": "t5"}


def get_family(name: str) -> Family:
    """The family called ``name``, or an LmlabError listing the known ones."""
    return FAMILIES[check_choice(name, FAMILIES, "template", "special-token template")]


def build_post_processor(family: str, special: dict[str, str], token_to_id: Any,
                         byte_level: bool = False):
    """The engine post-processor adding ``family``'s special tokens (``special``: role -> the
    tokenizer's token; ``token_to_id`` gives None for a missing one). ``byte_level``: a
    byte-level BPE, whose offsets then drop the leading space."""
    get_family(family)

    def ident(role: str) -> tuple[str, int]:
        token = special.get(role)
        token_id = None if token is None else token_to_id(token)
        if token_id is None:
            raise LmlabError(f"the {family} template needs a {role} but "
                             f"{token!r} is not in the vocabulary",
                             f"add {token!r} to the special tokens or pick another template")
        return token, token_id

    if family == "bert":
        cls, sep = ident("cls_token"), ident("sep_token")
        return processors.TemplateProcessing(
            single=f"{cls[0]} $A:0 {sep[0]}:0", pair=f"{cls[0]} $A:0 {sep[0]}:0 $B:1 {sep[0]}:1",
            special_tokens=[cls, sep])
    if family in ("roberta", "xlm-roberta"):
        return processors.RobertaProcessing(ident("sep_token"), ident("cls_token"),
                                            trim_offsets=True, add_prefix_space=False)
    if family in ("t5", "byt5"):
        eos = ident("eos_token")
        return processors.TemplateProcessing(single=f"$A:0 {eos[0]}:0",
                                             pair=f"$A:0 {eos[0]}:0 $B:0 {eos[0]}:0",
                                             special_tokens=[eos])
    return processors.ByteLevel(trim_offsets=False) if byte_level else None  # gpt2
