"""A Transformer stack with named heads: the model class every family and objective uses."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch import nn

from lmlab.models.config import TransformerConfig
from lmlab.models.core.transformer import Transformer
from lmlab.models.heads import IGNORE_INDEX, Pooler, build_head, needs_pooler
from lmlab.models.outputs import ModelOutput
from lmlab.models.task_heads import default_global_tokens, keeps_pooler, question_mask
from lmlab.models.variants import build_low_rank_layout, build_pruned_layout
from lmlab.utils.errors import LmlabError


class HeadedModel(nn.Module):
    """What every lmlab model shares: ``heads`` (a ModuleDict by name), the first the primary
    one, whose logits are ``output.logits`` and whose loss ``labels`` give."""

    def num_parameters(self, trainable_only: bool = False) -> int:
        return count_parameters(self, trainable_only)

    def add_head(self, name: str) -> nn.Module:
        """Add head ``name`` (fresh weights, tied where configured) unless present; returns it."""
        if name not in self.heads:
            self.heads[name] = self._new_head(name)
            self.tie_weights()
        return self.heads[name]

    def _new_head(self, name: str) -> nn.Module:
        head = build_head(name, self.config)
        head.apply(self._init_weights)
        return head

    def get_target_embeddings(self) -> nn.Embedding | None:
        """The token table a tied vocabulary projection shares (an encoder-decoder's target
        side; ``get_input_embeddings`` otherwise)."""
        return self.get_input_embeddings()

    def tie_weights(self) -> None:
        """Share that table with the heads' vocabulary projections (``decoder``) when
        ``config.tie_word_embeddings`` is set."""
        table = self.get_target_embeddings()
        if not self.config.tie_word_embeddings or table is None:
            return
        for head in self.heads.values():
            decoder = getattr(head, "decoder", None)
            if isinstance(decoder, nn.Linear) and decoder.weight.shape == table.weight.shape:
                decoder.weight = table.weight

    def run_head(self, name: str, hidden: torch.Tensor, pooled: torch.Tensor | None,
                 attention_mask: torch.Tensor | None = None,
                 inputs: dict[str, Any] | None = None, **kwargs: Any) -> torch.Tensor:
        """Logits of head ``name`` from the stack's last hidden state (or pooled vector);
        ``inputs``: model inputs, of which the head gets those it names in ``head_inputs``."""
        head = self.heads[name]
        kwargs.update(head_inputs(head, inputs))
        if getattr(head, "takes_attention_mask", False):
            kwargs["attention_mask"] = attention_mask
        if getattr(head, "reruns_last_layer", False):  # DeBERTa's EMD: ``hidden`` = its input
            kwargs["stack"] = self.transformer
        if not getattr(head, "needs_pooler", False):
            return head(hidden, **kwargs)
        if getattr(head, "takes_hidden", False):
            return head(hidden, pooled=pooled, **kwargs)
        return head(pooled, **kwargs)

    def run_heads(self, heads: Sequence[str] | None, hidden: torch.Tensor,
                  pooled: torch.Tensor | None, attention_mask: torch.Tensor | None,
                  labels: torch.Tensor | None, layer_input: torch.Tensor | None = None,
                  inputs: dict[str, Any] | None = None
                  ) -> tuple[dict[str, torch.Tensor], torch.Tensor | None, torch.Tensor | None]:
        """(every named head's logits, the primary head's, its loss on ``labels`` or None);
        ``layer_input``: the last layer's input, which a head that reruns that layer reads;
        ``inputs``: see :meth:`run_head`. A head with ``loss_reads_hidden`` (XLNet's beam QA,
        whose end logits depend on the labelled start) takes the states in its loss."""
        names = list(self.heads.keys()) if heads is None else list(heads)
        head_logits = {name: self.run_head(
            name, layer_input if _reruns_last_layer(self, [name]) else hidden, pooled,
            attention_mask, inputs) for name in names}
        logits = head_logits[names[0]] if names else None
        if labels is None:
            return head_logits, logits, None
        if not names:
            raise LmlabError("labels were given but the model has no head to train",
                             "add a head first (model.add_head(name))")
        head = self.heads[names[0]]
        if getattr(head, "loss_reads_hidden", False):
            return head_logits, logits, head.loss(hidden, labels, attention_mask,
                                                  **head_inputs(head, inputs))
        if getattr(head, "loss_takes_attention_mask", False):
            return head_logits, logits, head.loss(logits, labels, attention_mask)
        return head_logits, logits, head.loss(logits, labels)


def head_inputs(head: nn.Module, inputs: dict[str, Any] | None) -> dict[str, Any]:
    """The model inputs (given, not None) that ``head`` names in ``head_inputs`` (BigBird's
    QA: the question mask; XLNet's beam QA: ``p_mask``, ``cls_index``)."""
    return {name: inputs[name] for name in getattr(head, "head_inputs", ())
            if inputs and inputs.get(name) is not None}


class LanguageModel(HeadedModel):
    """``transformer`` + optional ``pooler`` + ``heads``. Objectives that combine heads (MLM +
    SOP, ELECTRA) read ``output.head_logits`` and compute their own losses."""

    def __init__(self, config: TransformerConfig, heads: Sequence[str] = (),
                 with_pooler: bool | None = None):
        super().__init__()
        self.config = config
        self.transformer = Transformer(config)
        if config.extra.get("attention_heads_per_layer"):  # heads pruned (lmlab.compress.heads)
            build_pruned_layout(self.transformer, config.extra["attention_heads_per_layer"])
        if config.extra.get("low_rank"):  # factorised linear maps (lmlab.compress.lowrank)
            build_low_rank_layout(self, config.extra["low_rank"])
        pooled = any(needs_pooler(name) or keeps_pooler(config, name) for name in heads)
        self.pooler = Pooler(config) if (with_pooler or pooled) else None
        self.heads = nn.ModuleDict({name: build_head(name, config) for name in heads})
        self.apply(self._init_weights)
        self.tie_weights()

    # -- construction ---------------------------------------------------------------------------
    def _init_weights(self, module: nn.Module) -> None:
        init_normal(module, self.config.initializer_range)

    def get_input_embeddings(self) -> nn.Embedding | None:
        """The token embedding table (what a tied vocabulary projection shares); None for a
        ViT, which embeds image patches."""
        return getattr(self.transformer.embeddings, "word_embeddings", None)

    def _new_head(self, name: str) -> nn.Module:
        """The head, and the pooler it reads if the model has none yet."""
        head = super()._new_head(name)
        if (needs_pooler(name) or keeps_pooler(self.config, name)) and self.pooler is None:
            self.pooler = Pooler(self.config)
            self.pooler.apply(self._init_weights)
        return head

    def forward(
        self,
        input_ids: torch.Tensor | None = None,
        attention_mask: torch.Tensor | None = None,
        token_type_ids: torch.Tensor | None = None,
        position_ids: torch.Tensor | None = None,
        inputs_embeds: torch.Tensor | None = None,
        labels: torch.Tensor | None = None,
        past_key_values: Any = None,
        use_cache: bool = False,
        output_hidden_states: bool = False,
        output_attentions: bool = False,
        heads: Sequence[str] | None = None,
        skip_padding: bool = True,
        pixel_values: torch.Tensor | None = None,
        interpolate_pos_encoding: bool = False,
        global_attention_mask: torch.Tensor | None = None,
        question_lengths: torch.Tensor | None = None,
    ) -> ModelOutput:
        """Run the stack and the heads (all, or those named in ``heads``). ``skip_padding``:
        see :meth:`Transformer.forward`; labels that count a padding position switch it off.
        A ViT takes ``pixel_values`` (B, C, H, W) instead of ids; ``global_attention_mask``: the
        global tokens of windowed attention; ``question_lengths`` (B, 1): the question a QA head
        that masks it (BigBird's) leaves out, else found by the first separator."""
        if skip_padding and _labels_read_padding(labels, attention_mask):
            skip_padding = False
        rerun = _reruns_last_layer(self, heads)  # a head reads the last layer's input
        if global_attention_mask is None and self.config.attention_window:  # Longformer's tasks
            primary = next(iter(self.heads if heads is None else heads), None)
            global_attention_mask = default_global_tokens(self.config, primary, input_ids)
        question = None
        if any(getattr(self.heads[n], "masks_question", False)
               for n in (self.heads if heads is None else heads)):
            question = question_mask(self.config, input_ids, question_lengths,
                                     None if inputs_embeds is None else inputs_embeds.shape[1])
            if token_type_ids is None and question is not None:  # BigBird's QA class's types
                token_type_ids = 1 - question
        out = self.transformer(
            input_ids=input_ids, attention_mask=attention_mask, token_type_ids=token_type_ids,
            position_ids=position_ids, inputs_embeds=inputs_embeds,
            past_key_values=past_key_values, use_cache=use_cache,
            output_hidden_states=output_hidden_states or rerun, output_attentions=output_attentions,
            skip_padding=skip_padding, pixel_values=pixel_values,
            interpolate_pos_encoding=interpolate_pos_encoding,
            global_attention_mask=global_attention_mask,
        )
        hidden = out.last_hidden_state
        pooled = self.pooler(hidden) if self.pooler is not None else None
        head_logits, logits, loss = self.run_heads(heads, hidden, pooled, attention_mask, labels,
                                                   out.hidden_states[-2] if rerun else None,
                                                   {"question_mask": question})
        return ModelOutput(
            last_hidden_state=hidden, logits=logits, loss=loss, pooler_output=pooled,
            hidden_states=out.hidden_states if output_hidden_states else None,
            attentions=out.attentions,
            past_key_values=out.past_key_values, head_logits=head_logits,
        )


def _reruns_last_layer(model: HeadedModel, heads: Sequence[str] | None) -> bool:
    """Whether a head among ``heads`` (None: all) reruns the last layer (DeBERTa's EMD)."""
    names = model.heads.keys() if heads is None else heads
    return any(getattr(model.heads[n], "reruns_last_layer", False) for n in names if n in model.heads)


def count_parameters(module: nn.Module, trainable_only: bool = False) -> int:
    """Parameters of ``module``, a tied tensor counted once (``parameters()`` yields each
    tensor once), trainable ones only on request."""
    return sum(p.numel() for p in module.parameters() if p.requires_grad or not trainable_only)


def init_normal(module: nn.Module, std: float) -> None:
    """BERT/GPT-2/BART initialisation of one module: normal(0, std) weights and embeddings
    (the padding row zero), zero biases; norms keep their unit init."""
    if isinstance(module, nn.Linear):
        nn.init.normal_(module.weight, mean=0.0, std=std)
        if module.bias is not None:
            nn.init.zeros_(module.bias)
    elif isinstance(module, nn.Embedding):
        nn.init.normal_(module.weight, mean=0.0, std=std)
        if module.padding_idx is not None:
            with torch.no_grad():
                module.weight[module.padding_idx].zero_()


def _labels_read_padding(labels: torch.Tensor | None, attention_mask: torch.Tensor | None) -> bool:
    """Whether per-token ``labels`` (B, T) give a padding position a target (not -100): the
    loss then reads the padding's logits, which skipping the padding would change."""
    if labels is None or attention_mask is None or labels.shape != attention_mask.shape:
        return False
    return bool((labels[attention_mask == 0] != IGNORE_INDEX).any())
