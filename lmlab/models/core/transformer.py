"""The Transformer stack shared by encoders and decoders."""

from __future__ import annotations

from functools import partial

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

from lmlab.models.config import TransformerConfig
from lmlab.models.core.cache import KVCache
from lmlab.models.core.disentangled import RelativePositions
from lmlab.models.core.embeddings import Embeddings
from lmlab.models.core.image_embeddings import ImageEmbeddings, takes_images
from lmlab.models.core.layer import TransformerLayer
from lmlab.models.core.local_attention import WindowInputs
from lmlab.models.core.masks import additive_mask, build_attention_mask
from lmlab.models.core.norms import make_norm
from lmlab.models.core.positions import RelativePositionBias, RotaryEmbedding
from lmlab.models.core.unpad import PaddingIndex
from lmlab.models.outputs import ModelOutput
from lmlab.utils.errors import LmlabError


class Transformer(nn.Module):
    """Embeddings, ``num_hidden_layers`` layers (one shared under ``share_layers``) and an
    optional final norm; ``forward`` takes the Hugging Face argument names.

    ``checkpoint_layers`` (off; a memory setting, not saved): while training with gradients and
    no cache, each layer's activations are recomputed in the backward pass instead of stored
    (``torch.utils.checkpoint``; dropout draws the same masks again)."""

    checkpoint_layers: bool = False

    def __init__(self, config: TransformerConfig):
        super().__init__()
        self.config = config
        self.embeddings = ImageEmbeddings(config) if takes_images(config) else Embeddings(config)
        count = 1 if config.share_layers else config.num_hidden_layers
        self.layers = nn.ModuleList(TransformerLayer(config, config.layer_window(i))
                                    for i in range(count))
        self.final_norm = (make_norm(config.norm_type, config.hidden_size, config.norm_eps)
                           if config.final_norm else None)
        self.rotary = (RotaryEmbedding(config.head_dim, config.rope_theta, config.rope_scaling,
                                       config.max_position_embeddings)
                       if config.position_embedding == "rotary" else None)
        self.relative_bias = (RelativePositionBias(config.relative_attention_num_buckets,
                                                   config.relative_attention_max_distance,
                                                   config.num_attention_heads,
                                                   bidirectional=not config.causal)
                              if config.position_embedding == "relative" else None)
        self.relative_positions = RelativePositions(config) if config.relative_attention else None

    def layer(self, index: int) -> TransformerLayer:
        """The module computing layer ``index`` (the same one for all under sharing)."""
        return self.layers[0 if self.config.share_layers else index]

    def embed(self, input_ids: torch.Tensor | None, token_type_ids: torch.Tensor | None,
              position_ids: torch.Tensor | None, inputs_embeds: torch.Tensor | None,
              past_length: int, pixel_values: torch.Tensor | None = None,
              interpolate_pos_encoding: bool = False) -> torch.Tensor:
        """The first hidden states (B, T, H): the tokens', or a ViT's [CLS] and image patches
        (positions resized to another image size with ``interpolate_pos_encoding``)."""
        images = takes_images(self.config)
        if images != (pixel_values is not None):
            raise LmlabError("this model takes " + ("pixel_values, not token ids" if images else
                                                    "token ids, not pixel_values"),
                             "pass " + ("pixel_values=" if images else "input_ids="))
        if images:
            return self.embeddings(pixel_values, interpolate_pos_encoding)
        if (input_ids is None) == (inputs_embeds is None):
            raise ValueError("pass exactly one of input_ids and inputs_embeds")
        return self.embeddings(input_ids, token_type_ids=token_type_ids,
                               position_ids=position_ids, inputs_embeds=inputs_embeds,
                               past_length=past_length)

    def forward(
        self,
        input_ids: torch.Tensor | None = None,
        attention_mask: torch.Tensor | None = None,
        token_type_ids: torch.Tensor | None = None,
        position_ids: torch.Tensor | None = None,
        inputs_embeds: torch.Tensor | None = None,
        past_key_values: KVCache | None = None,
        use_cache: bool = False,
        encoder_hidden_states: torch.Tensor | None = None,
        encoder_attention_mask: torch.Tensor | None = None,
        output_hidden_states: bool = False,
        output_attentions: bool = False,
        skip_padding: bool = True,
        pixel_values: torch.Tensor | None = None,
        interpolate_pos_encoding: bool = False,
        global_attention_mask: torch.Tensor | None = None,
    ) -> ModelOutput:
        """Embed and run the layers: the last hidden state (B, T, H) and, on request, every
        layer's hidden states, attention probabilities and the key/value cache. A ViT takes
        ``pixel_values`` (B, C, H, W) instead of ids (:meth:`embed`).

        ``skip_padding`` (a speed setting) computes only the real tokens of a right-padded batch
        (zeros at padding positions); it falls back by itself where it cannot give the same
        outputs: a cache being filled, probabilities requested, cross-attention, T5's bias, a
        3-D mask, left padding (docs/models.md). ``global_attention_mask`` (B, T), 1 at global
        tokens: they see and are seen by all tokens in windowed layers (``attention_window``).
        """
        cache = past_key_values if past_key_values is not None else (KVCache() if use_cache else None)
        past_length = cache.seq_len() if cache is not None else 0

        x = self.embed(input_ids, token_type_ids, position_ids, inputs_embeds, past_length,
                       pixel_values, interpolate_pos_encoding)
        batch, length = x.shape[:2]
        rotary = None
        if self.rotary is not None:
            if position_ids is None:
                position_ids = self.embeddings.default_position_ids(None, batch, length,
                                                                    past_length, x.device)
            rotary = self.rotary(position_ids)

        mask, is_causal = build_attention_mask(attention_mask, length, past_length + length,
                                               self.config.causal, x.device)
        if self.relative_bias is not None:  # T5: the bias, with the mask folded in as -inf
            mask = additive_mask(self.relative_bias(length, past_length + length, x.device),
                                 mask, is_causal, x.dtype)
            is_causal = False
        relative = (self.relative_positions(length, past_length + length, x.device)
                    if self.relative_positions is not None else None)  # DeBERTa's
        window_inputs = self._window_inputs(attention_mask, global_attention_mask, cache, length)
        encoder_mask = None
        if encoder_hidden_states is not None and encoder_attention_mask is not None:
            encoder_mask, _ = build_attention_mask(encoder_attention_mask, length,
                                                   encoder_hidden_states.shape[1], False, x.device)
        cross_cache = None
        if cache is not None and encoder_hidden_states is not None:
            cross_cache = cache.cross = cache.cross if cache.cross is not None else KVCache()

        padding = None
        new_mask = _new_tokens_mask(attention_mask, past_length, length)
        if (skip_padding and not use_cache and not output_attentions and self.relative_bias is None
                and encoder_hidden_states is None and _skippable_padding(new_mask)):
            padding = PaddingIndex.from_mask(new_mask)
            x = padding.unpad(x)  # (N, H): real tokens only
        repad = padding.pad if padding is not None else (lambda t: t)

        hidden_states = [repad(x)] if output_hidden_states else None
        attentions = [] if output_attentions else None
        cross_attentions = [] if output_attentions and encoder_hidden_states is not None else None
        recompute = (self.checkpoint_layers and self.training and torch.is_grad_enabled()
                     and cache is None)  # a cache is appended to: no second forward
        for index in range(self.config.num_hidden_layers):
            layer = self.layer(index)
            run = partial(checkpoint, layer, use_reentrant=False) if recompute else layer
            x, probs, cross_probs = run(
                x, mask=mask, is_causal=is_causal, rotary=rotary, cache=cache,
                layer_index=index, encoder_hidden_states=encoder_hidden_states,
                encoder_mask=encoder_mask, cross_cache=cross_cache,
                output_attentions=output_attentions, padding=padding, relative=relative,
                window_inputs=window_inputs,
            )
            if output_hidden_states:
                hidden_states.append(repad(x))
            if output_attentions:
                attentions.append(probs)
            if cross_attentions is not None:
                cross_attentions.append(cross_probs)
        if self.final_norm is not None:
            x = self.final_norm(x)
            if output_hidden_states:
                hidden_states[-1] = repad(x)
        x = repad(x)
        return ModelOutput(
            last_hidden_state=x,
            hidden_states=tuple(hidden_states) if output_hidden_states else None,
            attentions=tuple(attentions) if output_attentions else None,
            cross_attentions=tuple(cross_attentions) if cross_attentions is not None else None,
            past_key_values=cache if use_cache else None,
        )

    def _window_inputs(self, attention_mask: torch.Tensor | None,
                       global_attention_mask: torch.Tensor | None, cache: KVCache | None,
                       length: int) -> WindowInputs | None:
        """Real and global tokens for the windowed (or block-sparse) layers; the blocked path
        needs no cache and a (B, T) or no mask."""
        if not self.config.attention_window:
            if global_attention_mask is not None:
                raise LmlabError("global_attention_mask given to a model without an "
                                 "attention window", "set attention_window in the config")
            if not self.config.block_sparse:
                return None
        two_d = attention_mask is None or attention_mask.dim() == 2
        keys = attention_mask.shape[-1] if attention_mask is not None else length
        if global_attention_mask is not None and global_attention_mask.shape[-1] != keys:
            raise LmlabError(f"global_attention_mask has {global_attention_mask.shape[-1]} "
                             f"columns for {keys} tokens", "give one column per token")
        return WindowInputs(attention_mask if two_d else None, global_attention_mask,
                            blocked=two_d and cache is None)


def _new_tokens_mask(attention_mask: torch.Tensor | None, past_length: int, length: int
                     ) -> torch.Tensor | None:
    """The (B, T) padding mask of this call's tokens: a (B, past + T) mask's last T columns
    (the cached keys keep theirs, which attention still reads)."""
    if attention_mask is None or attention_mask.dim() != 2:
        return None
    if attention_mask.shape[1] != past_length + length:
        return None
    return attention_mask[:, past_length:]


def _skippable_padding(attention_mask: torch.Tensor | None) -> bool:
    """Whether ``attention_mask`` is (B, T) with some padding and a real first token in every
    row (where [CLS] poolers read)."""
    return (attention_mask is not None and attention_mask.dim() == 2
            and bool(attention_mask[:, 0].all()) and not bool(attention_mask.all()))
