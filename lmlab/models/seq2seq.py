"""Encoder-decoder Transformers (the original Transformer, BART, Marian, T5) on the shared core:
one config with ``is_encoder_decoder=True`` describes both stacks (:func:`stack_configs`), which
share one token table unless ``share_embeddings`` is off (docs/encoder-decoders.md).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

import torch
from torch import nn

from lmlab.models.config import TransformerConfig
from lmlab.models.core.cache import KVCache
from lmlab.models.core.transformer import Transformer
from lmlab.models.heads import IGNORE_INDEX, build_head, token_cross_entropy
from lmlab.models.model import HeadedModel, init_normal
from lmlab.models.outputs import ModelOutput
from lmlab.models.variants import build_low_rank_layout
from lmlab.utils.errors import LmlabError


def stack_configs(config: TransformerConfig) -> tuple[TransformerConfig, TransformerConfig]:
    """The encoder's and the decoder's configs of an encoder-decoder ``config``."""
    if not config.is_encoder_decoder:
        raise LmlabError(f"this {config.family} config is not an encoder-decoder",
                         "use LanguageModel for encoders and decoders")
    encoder = dataclasses.replace(config, is_encoder_decoder=False, causal=False,
                                  add_cross_attention=False, num_decoder_layers=None)
    decoder = dataclasses.replace(encoder, causal=True, add_cross_attention=True,
                                  num_hidden_layers=config.num_decoder_layers)
    return encoder, decoder


def require_encoder_decoder(model: nn.Module, what: str) -> None:
    """Refuse an encoder or a decoder where ``what`` (an objective, a kind of training) needs
    an encoder-decoder."""
    if not getattr(model.config, "is_encoder_decoder", False):
        raise LmlabError(f"{what} trains encoder-decoders, not a {model.config.family} "
                         f"{'decoder' if model.config.causal else 'encoder'}",
                         "use a t5, bart or marian model (--family t5, or --init one)")


def decoder_start_token(family: str, tokenizer: Any) -> int:
    """The token a family's decoder starts from, in ``tokenizer``'s vocabulary: BART's
    ``</s>``, the pad token for T5 and Marian."""
    role = "eos" if family == "bart" else "pad"
    start = getattr(tokenizer, f"{role}_token_id")
    if start is None:
        raise LmlabError(f"the tokenizer has no {role} token for the {family} decoder to start "
                         "from", "use a tokenizer with a t5 or roberta template")
    return int(start)


def shift_right(labels: torch.Tensor, start_id: int, pad_id: int) -> torch.Tensor:
    """Decoder inputs for teacher forcing: ``labels`` (B, T) moved one step right behind the
    decoder start token, with ignored positions (-100) read as padding."""
    shifted = labels.new_full(labels.shape, start_id)
    shifted[:, 1:] = labels[:, :-1]
    return shifted.masked_fill(shifted == IGNORE_INDEX, pad_id)


class EncoderDecoderModel(HeadedModel):
    """``encoder`` + ``decoder`` (two :class:`Transformer` stacks) + ``heads`` (``"seq2seq-lm"``);
    ``forward`` takes Hugging Face's argument names."""

    def __init__(self, config: TransformerConfig, heads: Sequence[str] = ("seq2seq-lm",),
                 with_pooler: bool | None = None):
        super().__init__()
        self.config = config
        encoder_config, decoder_config = stack_configs(config)
        self.encoder = Transformer(encoder_config)
        self.decoder = Transformer(decoder_config)
        if config.extra.get("low_rank"):  # factorised linear maps (lmlab.compress.lowrank)
            build_low_rank_layout(self, config.extra["low_rank"])
        self.pooler = None  # the interop layer asks every model for one
        self.heads = nn.ModuleDict({name: build_head(name, config) for name in heads})
        self.apply(self._init_weights)
        if config.share_embeddings:  # one table for both stacks (else the target side's own)
            self.decoder.embeddings.word_embeddings.weight = \
                self.encoder.embeddings.word_embeddings.weight
        self.tie_weights()

    def _init_weights(self, module: nn.Module) -> None:
        """BART's init (normal(0, initializer_range), zero biases), or T5's (below)."""
        if self.config.family in ("t5", "mt5"):
            self._init_t5(module)
        else:
            init_normal(module, self.config.initializer_range)

    def _init_t5(self, module: nn.Module) -> None:
        """T5's initialisation (Mesh TensorFlow's): unit-variance embeddings and output
        projection, other matrices std 1/sqrt(fan-in), the query's also / sqrt(head_dim) (the
        attention has no 1/sqrt(d) scale)."""
        config = self.config
        if isinstance(module, nn.Embedding):  # tokens, relative position buckets
            std = 1.0 if module.num_embeddings == config.vocab_size else config.hidden_size ** -0.5
            nn.init.normal_(module.weight, mean=0.0, std=std)
        elif isinstance(module, nn.Linear):
            fan_in = module.in_features
            std = fan_in ** -0.5
            if module.out_features == config.vocab_size:  # an untied output projection
                std = 1.0
            nn.init.normal_(module.weight, mean=0.0, std=std)
            if module.bias is not None:
                nn.init.zeros_(module.bias)
        elif hasattr(module, "q_proj"):  # attention (after its projections: apply() is
            query = module.q_proj  # post-order): the query also absorbs 1/sqrt(head_dim)
            nn.init.normal_(query.weight, mean=0.0,
                            std=(query.in_features * config.head_dim) ** -0.5)

    def get_input_embeddings(self) -> nn.Embedding:
        """The source side's token table (both sides' unless ``share_embeddings`` is off)."""
        return self.encoder.embeddings.word_embeddings

    def get_target_embeddings(self) -> nn.Embedding:
        """The target side's token table, which a tied output projection shares."""
        return self.decoder.embeddings.word_embeddings

    @property
    def max_length(self) -> int | None:
        """The longest source (and target, start token included) the position tables hold;
        None for relative positions (T5), which have no limit."""
        if self.config.position_embedding not in ("learned", "sinusoidal"):
            return None
        return self.config.max_position_embeddings - self.config.position_offset

    @property
    def decoder_start_token_id(self) -> int:
        start = self.config.extra.get("decoder_start_token_id")
        if start is None:
            raise LmlabError("the config names no decoder_start_token_id",
                             "set config.extra['decoder_start_token_id'] (BART: eos, T5 and "
                             "Marian: pad)")
        return int(start)

    def _positions(self, batch: int, length: int, past: int, device: torch.device
                   ) -> torch.Tensor | None:
        """Position ids ``past .. past + length`` (+ BART's offset of 2): every token,
        padding included, counts, as in fairseq's encoder-decoders."""
        limit = self.max_length
        if limit is None:
            return None
        if past + length > limit:
            raise LmlabError(f"a sequence of {past + length} tokens is longer than the "
                             f"{limit} positions this model has",
                             f"cut sources and targets to at most {limit} tokens (e.g. "
                             "--max-source-length / --max-target-length)")
        positions = torch.arange(past, past + length, device=device) + self.config.position_offset
        return positions.unsqueeze(0).expand(batch, length)

    def encode(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None,
               output_hidden_states: bool = False, output_attentions: bool = False):
        """The encoder's output for a source batch (B, S)."""
        return self.encoder(
            input_ids=input_ids, attention_mask=attention_mask,
            position_ids=self._positions(*input_ids.shape, 0, input_ids.device),
            output_hidden_states=output_hidden_states, output_attentions=output_attentions)

    def forward(
        self,
        input_ids: torch.Tensor | None = None,
        attention_mask: torch.Tensor | None = None,
        decoder_input_ids: torch.Tensor | None = None,
        decoder_attention_mask: torch.Tensor | None = None,
        labels: torch.Tensor | None = None,
        encoder_outputs: Any = None,
        past_key_values: KVCache | None = None,
        use_cache: bool = False,
        output_hidden_states: bool = False,
        output_attentions: bool = False,
        heads: Sequence[str] | None = None,
    ) -> ModelOutput:
        """Encode (unless ``encoder_outputs`` is given), decode, project; ``loss``: token
        cross-entropy on ``labels`` (in training, with ``config.extra["label_smoothing"]``)."""
        if encoder_outputs is None:
            if input_ids is None:
                raise LmlabError("an encoder-decoder needs input_ids (or encoder_outputs)",
                                 "pass the source token ids as input_ids")
            encoder_outputs = self.encode(input_ids, attention_mask, output_hidden_states,
                                          output_attentions)
        if decoder_input_ids is None:
            if labels is None:
                raise LmlabError("neither decoder_input_ids nor labels were given",
                                 "pass labels (training) or decoder_input_ids (decoding)")
            decoder_input_ids = shift_right(labels, self.decoder_start_token_id,
                                            self.config.pad_token_id or 0)
        past = past_key_values.seq_len() if past_key_values is not None else 0
        decoded = self.decoder(
            input_ids=decoder_input_ids, attention_mask=decoder_attention_mask,
            position_ids=self._positions(*decoder_input_ids.shape, past,
                                         decoder_input_ids.device),
            past_key_values=past_key_values, use_cache=use_cache,
            encoder_hidden_states=encoder_outputs.last_hidden_state,
            encoder_attention_mask=attention_mask,
            output_hidden_states=output_hidden_states, output_attentions=output_attentions)
        hidden = decoded.last_hidden_state
        head_logits, logits, loss = self.run_heads(heads, hidden, None, None, labels)
        return ModelOutput(
            last_hidden_state=hidden, logits=logits, loss=loss,
            hidden_states=decoded.hidden_states, attentions=decoded.attentions,
            past_key_values=decoded.past_key_values, head_logits=head_logits,
            encoder_last_hidden_state=encoder_outputs.last_hidden_state,
            encoder_attentions=getattr(encoder_outputs, "attentions", None),
            cross_attentions=decoded.cross_attentions,
        )


class Seq2SeqLMHead(nn.Module):
    """The decoder's projection to the vocabulary plus ``final_logits_bias`` (a zero buffer
    BART's checkpoints carry); T5 v1.0 first scales the states (``scale_decoder_outputs``)."""

    def __init__(self, config: TransformerConfig):
        super().__init__()
        self.decoder = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        self.register_buffer("final_logits_bias", torch.zeros(1, config.vocab_size))
        self.scale = (config.hidden_size ** -0.5 if config.extra.get("scale_decoder_outputs")
                      else 1.0)
        self.extra = config.extra  # label_smoothing may be set after the head is built

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        """Logits (B, T, V)."""
        if self.scale != 1.0:
            hidden = hidden * self.scale
        return self.decoder(hidden) + self.final_logits_bias.to(hidden.dtype)

    def loss(self, logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        """Token cross-entropy; label smoothing (``extra["label_smoothing"]``) shapes the
        training loss only: evaluated, the loss (and its perplexity) is the plain one."""
        smoothing = float(self.extra.get("label_smoothing", 0.0)) if self.training else 0.0
        return token_cross_entropy(logits, labels, smoothing)
