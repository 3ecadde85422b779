"""lmlab's decoders as an lm-evaluation-harness backend: ``lm_eval --model lmlab --model_args
pretrained=smollm2`` (docs/lm-eval.md). Requests are tokenised as the harness's ``hf`` backend
does (its TemplateLM and rolling windows); log-likelihoods come from
:func:`lmlab.evaluation.scoring.score_pairs` (each context once, its KV cache shared by its
continuations) and text from :func:`lmlab.generation.generate.generate` (left-padded batches).
"""

from __future__ import annotations

from typing import Any

import torch

from lmlab.utils.errors import LmlabError

try:
    import lm_eval.models  # noqa: F401  the built-in backends register first (hf, ...)
    from lm_eval import utils as harness_utils
    from lm_eval.api.model import TemplateLM
    from lm_eval.api.registry import register_model
    from lm_eval.models.utils import (
        handle_stop_sequences,
        normalize_gen_kwargs,
        postprocess_generated_text,
    )
except ImportError as error:  # tests/test_harness.py: a process without lm-eval
    raise LmlabError(f"lm-evaluation-harness is not installed ({error})",
                     "pip install 'lmlab[eval]' (or: pip install lm_eval==0.4.13)") from error

from lmlab.evaluation.scoring import score_pairs
from lmlab.generation.chat import apply_chat_template
from lmlab.generation.generate import check_causal_lm, context_length, generate, pad_left
from lmlab.load import load_model_and_tokenizer
from lmlab.utils.checks import check_at_least

DEFAULT_MAX_LENGTH = 2048  # the hf backend's, for models without a position limit
SAMPLING = ("temperature", "top_p", "top_k")
CONTINUE_TAG = "CONTINUE_FINAL_MESSAGE_TAG "  # transformers' marker of the message's end


def _device(name: str | None) -> str | None:
    """The device asked for; as the hf backend, the harness's default ``cuda:0`` (or any
    ``cuda:N`` beyond the GPUs there are) means CUDA when there is one, else the CPU."""
    name = None if name is None else str(name)
    if name is None or (name.startswith("cuda:") and name[5:].isdigit()
                        and int(name[5:]) >= torch.cuda.device_count()):
        return "cuda" if torch.cuda.is_available() else None
    return name


@register_model("lmlab")
class LmlabLM(TemplateLM):
    """An lmlab decoder (a short name, a folder or a ``.gguf`` file: ``pretrained=``) for the
    harness. ``max_length`` defaults to the model's context, ``batch_size`` counts contexts;
    ``max_batch_size`` (which the harness's command line always passes) is not used."""

    def __init__(self, pretrained: str, batch_size: int | str = 8, device: str | None = None,
                 dtype: str | None = None, max_length: int | None = None,
                 add_bos_token: bool | None = None, max_batch_size: int | None = None,
                 **unused: Any) -> None:
        super().__init__()
        if unused:
            raise LmlabError(f"unknown lmlab model_args: {', '.join(sorted(unused))}",
                             "use pretrained, batch_size, device, dtype, max_length, "
                             "add_bos_token")
        size = "8" if str(batch_size).startswith("auto") else str(batch_size)
        if not size.isdigit() or int(size) < 1:
            raise LmlabError(f"batch_size={batch_size!r}", "use a positive whole number, e.g. 8")
        self.batch_size = int(size)
        check_at_least(max_length, 2, "max_length")
        torch_dtype = None if dtype in (None, "auto") else getattr(torch, str(dtype), None)
        if dtype not in (None, "auto") and not isinstance(torch_dtype, torch.dtype):
            raise LmlabError(f"dtype={dtype!r}", "use float32, bfloat16 or float16")
        self.model, self.tokenizer = load_model_and_tokenizer(
            str(pretrained), dtype=torch_dtype, device=_device(device))
        check_causal_lm(self.model)
        limit = context_length(self.model)
        if max_length and limit and max_length > limit:
            raise LmlabError(f"max_length={max_length} exceeds the model's {limit} positions",
                             f"use max_length={limit} or less (the default)")
        self._max_length = int(max_length or limit or DEFAULT_MAX_LENGTH)
        self.add_bos_token = add_bos_token
        self._device = next(self.model.parameters()).device
        self._name = str(pretrained)

    @property
    def eot_token_id(self) -> int:
        return self.tokenizer.eos_token_id

    @property
    def prefix_token_id(self) -> int:
        bos = self.tokenizer.bos_token_id
        return bos if bos is not None else self.tokenizer.eos_token_id

    @property
    def max_length(self) -> int:
        return self._max_length

    @property
    def device(self) -> torch.device:
        return self._device

    @property
    def tokenizer_name(self) -> str:
        return self._name.replace("/", "__")

    def apply_chat_template(self, chat_history: list[dict[str, str]],
                            add_generation_prompt: bool = True) -> str:
        """``--apply_chat_template``: the model's chat template; without a generation prompt
        the last (assistant) message is left open to be continued, cut where transformers'
        ``continue_final_message`` cuts it (at a tag appended to its content)."""
        if add_generation_prompt or not chat_history:
            return apply_chat_template(self.tokenizer, chat_history, add_generation_prompt)
        last = dict(chat_history[-1], content=chat_history[-1]["content"] + CONTINUE_TAG)
        text = apply_chat_template(self.tokenizer, [*chat_history[:-1], last], False)
        cut = text.rindex(CONTINUE_TAG.strip())
        return text[:cut] if text[cut:].startswith(CONTINUE_TAG) else text[:cut].rstrip()

    def tok_encode(self, string: str, add_special_tokens: bool | None = None,
                   **kwargs: Any) -> list[int]:
        """As the hf backend: the tokenizer's own special tokens unless told (or the text
        already starts with the prefix token)."""
        if add_special_tokens is None:
            add_special_tokens = self.add_bos_token
            if string.startswith(self.tokenizer.decode([self.prefix_token_id])):
                add_special_tokens = False
        if add_special_tokens is None:
            return self.tokenizer.encode(string)
        return self.tokenizer.encode(string, add_special_tokens=add_special_tokens)

    def _loglikelihood_tokens(self, requests: list, disable_tqdm: bool = False,
                              **kwargs: Any) -> list[tuple[float, bool]]:
        results = score_pairs(self.model, [(context, continuation)
                                           for _, context, continuation in requests],
                              self.max_length, self.batch_size)
        for (key, _, _), result in zip(requests, results, strict=True):
            if key is not None:
                self.cache_hook.add_partial("loglikelihood", key, result)
        return results

    def loglikelihood_rolling(self, requests: list, disable_tqdm: bool = False) -> list[float]:
        """Each text scored whole in the harness's disjoint windows of ``max_length``; the
        windows of all texts share batches."""
        owners, windows = [], []
        for i, (text,) in enumerate(request.args for request in requests):
            for window in harness_utils.get_rolling_token_windows(
                    token_list=self.tok_encode(text), prefix_token=self.prefix_token_id,
                    max_seq_len=self.max_length, context_len=1):
                owners.append(i)
                windows.append(harness_utils.make_disjoint_window(window))
        totals = [0.0] * len(requests)
        for i, (score, _) in zip(owners, score_pairs(self.model, windows, self.max_length,
                                                     self.batch_size), strict=True):
            totals[i] += score
        for request, total in zip(requests, totals, strict=True):
            self.cache_hook.add_partial("loglikelihood_rolling", request.args, total)
        return totals

    def generate_until(self, requests: list, disable_tqdm: bool = False) -> list[str]:
        """Greedy (or sampled, with ``do_sample``) continuations, cut at the first ``until``
        string; requests with the same settings run as left-padded batches."""
        results: list[str | None] = [None] * len(requests)
        groups: dict[str, list[int]] = {}
        for i, request in enumerate(requests):
            groups.setdefault(repr(sorted(request.args[1].items())), []).append(i)
        for rows in groups.values():
            settings = requests[rows[0]].args[1]
            rows.sort(key=lambda i: -len(requests[i].args[0]))  # similar lengths: less padding
            for start in range(0, len(rows), self.batch_size):
                chunk = rows[start:start + self.batch_size]
                texts = self._generate([requests[i].args[0] for i in chunk], settings)
                for i, text in zip(chunk, texts, strict=True):
                    results[i] = text
                    self.cache_hook.add_partial("generate_until", requests[i].args, text)
        return results

    def _generate(self, contexts: list[str], settings: dict) -> list[str]:
        kwargs = normalize_gen_kwargs(settings, 256)
        eos = self.tokenizer.decode([self.eot_token_id])
        until = handle_stop_sequences(kwargs.pop("until", None), eos=eos)
        new_tokens = kwargs.pop("max_gen_toks")
        sample = bool(kwargs.pop("do_sample", False))
        options = {name: kwargs.pop(name) for name in SAMPLING if name in kwargs}
        if kwargs:
            raise LmlabError(f"generation settings lmlab does not read: {sorted(kwargs)}",
                             "use until, max_gen_toks, do_sample, temperature, top_p, top_k")
        if not sample:
            options = {}
        room = self.max_length - new_tokens
        if room < 1:
            raise LmlabError(f"max_gen_toks {new_tokens} leaves no room for a context in "
                             f"{self.max_length} positions", "ask for fewer new tokens")
        encoded = [self.tok_encode(context)[-room:] for context in contexts]
        pad = self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None \
            else self.eot_token_id
        ids, mask = pad_left(encoded, pad)
        width = ids.shape[1]
        out = generate(self.model, ids.to(self.device), mask.to(self.device),
                       max_new_tokens=new_tokens, do_sample=sample, eos_token_id=self.eot_token_id,
                       pad_token_id=pad, stop_strings=[s for s in until if s],
                       tokenizer=self.tokenizer, **options)
        return [postprocess_generated_text(self.tokenizer.decode(row[width:].tolist(),
                                                                 skip_special_tokens=True),
                                           until, None) for row in out]
