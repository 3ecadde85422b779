"""Learned virtual tokens: prompt tuning (Lester et al. 2021: ``n`` input embeddings before the
tokens) and prefix tuning (Li & Liang 2021: ``n`` keys and values in every layer, stored as
PEFT's table). Both are hooks on ``model.transformer`` that grow the attention mask and shift
positions; prompt tuning's post-hook drops the virtual positions from the hidden states.
docs/adaptation.md ("How it is built") tells the story."""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

import torch
from torch import nn

from lmlab.models.core.cache import KVCache
from lmlab.utils.errors import LmlabError


@dataclass(frozen=True)
class VirtualTokenSettings:
    num_virtual_tokens: int = 20

    def check(self) -> None:
        n = self.num_virtual_tokens
        if int(n) != n or n < 1:
            raise LmlabError(f"the number of virtual tokens must be a positive integer, got "
                             f"{n!r}", "pass num_virtual_tokens (--virtual-tokens) >= 1")


class PromptEmbeddings(nn.Module):
    """``n`` learned input embeddings (n, H), initialised from random vocabulary tokens'."""

    def __init__(self, n: int, word_embeddings: nn.Embedding):
        super().__init__()
        rows = torch.randint(0, word_embeddings.num_embeddings, (n,))
        self.weight = nn.Parameter(word_embeddings.weight.detach()[rows].clone())

    @property
    def num_virtual_tokens(self) -> int:
        return self.weight.shape[0]


class PrefixKeyValues(nn.Module):
    """Every layer's ``n`` learned keys and values, ``weight``: (n, L * 2 * n_kv * head_dim),
    each row laid out [layer 0 keys, layer 0 values, layer 1 keys, ...] as PEFT's table."""

    def __init__(self, n: int, layers: int, kv_heads: int, head_dim: int, std: float):
        super().__init__()
        self.layers, self.kv_heads, self.head_dim = layers, kv_heads, head_dim
        self.weight = nn.Parameter(torch.randn(n, layers * 2 * kv_heads * head_dim) * std)

    @property
    def num_virtual_tokens(self) -> int:
        return self.weight.shape[0]

    def cache(self, batch: int, dtype: torch.dtype) -> KVCache:
        """A cache holding the prefix for ``batch`` rows: keys and values (B, n_kv, n, hd)."""
        n = self.num_virtual_tokens
        table = self.weight.to(dtype).view(n, self.layers * 2, self.kv_heads, self.head_dim)
        table = table.permute(1, 2, 0, 3)  # (L*2, n_kv, n, hd)
        cache = KVCache()
        for layer in range(self.layers):
            keys = table[2 * layer].unsqueeze(0).expand(batch, -1, -1, -1)  # (B, n_kv, n, hd)
            values = table[2 * layer + 1].unsqueeze(0).expand(batch, -1, -1, -1)
            cache.update(layer, keys, values)
        return cache


def _start(args: tuple, kwargs: dict[str, Any], n: int, method: str) -> tuple[int, torch.device]:
    """What both methods' pre-hooks do first: refuse positional inputs and prepend ``n`` ones
    to a (B, T) attention mask (the virtual tokens are always seen); (batch, device)."""
    if args:
        raise LmlabError(f"{method} tuning needs keyword arguments (input_ids=...)",
                         "call the model with input_ids= and attention_mask=")
    ids = kwargs.get("input_ids")
    reference = ids if ids is not None else kwargs["inputs_embeds"]
    batch, device = reference.shape[0], reference.device
    mask = kwargs.get("attention_mask")
    if mask is not None:
        if mask.dim() != 2:
            raise LmlabError("virtual tokens need a (B, T) padding mask, got a "
                             f"{mask.dim()}-D attention mask", "pass a (B, T) attention_mask")
        ones = torch.ones(batch, n, dtype=mask.dtype, device=device)
        kwargs["attention_mask"] = torch.cat([ones, mask], dim=1)
    return batch, device


def _prompt_pre_hook(transformer: nn.Module, args: tuple, kwargs: dict[str, Any]):
    n = transformer.prompt_embeddings.num_virtual_tokens
    transformer.prompt_prepended = False
    batch, device = _start(args, kwargs, n, "prompt")
    positions = kwargs.get("position_ids")
    cache = kwargs.get("past_key_values")
    if cache is not None and cache.seq_len() > 0:  # the cache holds the virtual tokens already
        if positions is not None:  # the caller counts real tokens; they follow the n virtual
            kwargs["position_ids"] = positions + n
        return args, kwargs
    embeddings, embeds = transformer.embeddings, kwargs.get("inputs_embeds")
    if embeds is None:
        embeds = embeddings.word_embeddings(kwargs["input_ids"]) * embeddings.scale
    virtual = transformer.prompt_embeddings.weight.to(embeds.dtype).unsqueeze(0).expand(
        batch, -1, -1)  # (B, n, H)
    kwargs["inputs_embeds"] = torch.cat([virtual, embeds], dim=1)  # (B, n + T, H)
    kwargs["input_ids"] = None
    types = kwargs.get("token_type_ids")
    if types is not None:
        kwargs["token_type_ids"] = torch.cat(
            [torch.zeros(batch, n, dtype=types.dtype, device=device), types], dim=1)
    if positions is not None:
        front = torch.arange(n, device=device).expand(batch, n)
        kwargs["position_ids"] = torch.cat([front, positions + n], dim=1)
    transformer.prompt_prepended = True
    return args, kwargs


def _prompt_post_hook(transformer: nn.Module, args: tuple, kwargs: dict[str, Any], output):
    if not transformer.prompt_prepended:
        return output
    n = transformer.prompt_embeddings.num_virtual_tokens
    hidden = output.hidden_states
    return replace(output, last_hidden_state=output.last_hidden_state[:, n:],
                   hidden_states=tuple(h[:, n:] for h in hidden) if hidden is not None else None)


def _prefix_pre_hook(transformer: nn.Module, args: tuple, kwargs: dict[str, Any]):
    prefix: PrefixKeyValues = transformer.prefix_key_values
    batch, device = _start(args, kwargs, prefix.num_virtual_tokens, "prefix")
    if kwargs.get("position_ids") is not None:  # real tokens' positions follow the prefix, as
        kwargs["position_ids"] = kwargs["position_ids"] + prefix.num_virtual_tokens  # default
    cache = kwargs.get("past_key_values")
    if cache is None or cache.seq_len() == 0:
        dtype = transformer.embeddings.word_embeddings.weight.dtype
        if torch.is_autocast_enabled(device.type):
            dtype = torch.get_autocast_dtype(device.type)
        kwargs["past_key_values"] = prefix.cache(batch, dtype)
    return args, kwargs


def apply_prompt_tuning(model: nn.Module, settings: VirtualTokenSettings) -> list[str]:
    """Add ``n`` learned input embeddings; no base parameter trains."""
    settings.check()
    transformer = model.transformer
    _refuse_twice(transformer)
    transformer.prompt_embeddings = PromptEmbeddings(int(settings.num_virtual_tokens),
                                                     transformer.embeddings.word_embeddings)
    transformer.prompt_prepended = False
    transformer.register_forward_pre_hook(_prompt_pre_hook, with_kwargs=True)
    transformer.register_forward_hook(_prompt_post_hook, with_kwargs=True)
    return []


def apply_prefix_tuning(model: nn.Module, settings: VirtualTokenSettings) -> list[str]:
    """Add ``n`` learned keys and values to every layer; no base parameter trains."""
    settings.check()
    transformer = model.transformer
    _refuse_twice(transformer)
    config = model.config
    if config.share_layers:
        raise LmlabError("prefix tuning of a model with one shared layer (ALBERT) is not "
                         "supported", "use --method prompt or lora")
    weight = transformer.embeddings.word_embeddings.weight
    transformer.prefix_key_values = PrefixKeyValues(
        int(settings.num_virtual_tokens), config.num_hidden_layers, config.num_key_value_heads,
        config.head_dim, config.initializer_range).to(weight.device, weight.dtype)
    transformer.register_forward_pre_hook(_prefix_pre_hook, with_kwargs=True)
    return []


def _refuse_twice(transformer: nn.Module) -> None:
    if hasattr(transformer, "prompt_embeddings") or hasattr(transformer, "prefix_key_values"):
        raise LmlabError("this model already has virtual tokens", "apply one method once")
