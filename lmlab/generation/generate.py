"""Text generation with a decoder or an encoder-decoder: greedy, sampling (temperature, top-k,
top-p), repetition penalty, n-gram blocking, beam search, stop tokens and strings, left-padded
batches, the key/value cache and streaming. Conventions follow Hugging Face's ``generate``, so
results compare token for token (docs/decoders.md lists them).
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, fields, replace
from typing import Any

import torch
from torch.nn import functional as F

from lmlab.utils.checks import check_at_least, check_names
from lmlab.utils.errors import LmlabError

TokenCallback = Callable[[torch.Tensor], None]


@dataclass
class GenerationConfig:
    """How to generate. ``top_k=0`` and ``top_p=1.0`` switch those filters off. ``temperature``,
    ``top_k`` and ``top_p`` shape sampling: set without ``do_sample`` they are refused (greedy
    decoding would ignore them)."""

    max_new_tokens: int = 20
    min_new_tokens: int = 0
    do_sample: bool = False
    temperature: float = 1.0
    top_k: int = 0
    top_p: float = 1.0
    repetition_penalty: float = 1.0
    no_repeat_ngram_size: int = 0  # never repeat an n-gram of this size (0 = off; BART: 3)
    num_beams: int = 1
    num_return_sequences: int = 1  # beam search: the best n hypotheses of each input
    length_penalty: float = 1.0
    early_stopping: bool | str = False
    eos_token_id: int | list[int] | None = None
    pad_token_id: int | None = None
    stop_strings: list[str] = field(default_factory=list)
    use_cache: bool = True
    forced_bos_token_id: int | None = None  # the first generated token (mBART-style language ids)
    forced_eos_token_id: int | None = None  # the last token when max_new_tokens is reached (BART)
    suppress_token_ids: list[int] = field(default_factory=list)  # never generated (Marian: pad)

    def validate(self) -> None:
        check_at_least(self.max_new_tokens, 1, "max_new_tokens")
        if not 0.0 < self.temperature < float("inf"):
            raise LmlabError(f"temperature={self.temperature} is not a positive finite number",
                             "use e.g. temperature=0.7 (--temperature 0.7); 1.0 leaves the "
                             "model's probabilities as they are")
        if not 0.0 < self.top_p <= 1.0:
            raise LmlabError(f"top_p={self.top_p} is outside (0, 1]", "use e.g. top_p=0.9")
        check_at_least(self.top_k, 0, "top_k")
        ignored = [f"{name}={value}" for name, value, off in (
            ("temperature", self.temperature, 1.0), ("top_k", self.top_k, 0),
            ("top_p", self.top_p, 1.0)) if value != off]
        if ignored and not self.do_sample:  # they would be silently ignored
            raise LmlabError(f"sampling options ({', '.join(ignored)}) were given without "
                             "sampling: greedy decoding (do_sample off) ignores them",
                             "add --sample (do_sample=True) to sample with them, or leave them "
                             "out for greedy decoding")
        if not 0.0 < self.repetition_penalty < float("inf"):
            raise LmlabError(f"repetition_penalty={self.repetition_penalty} is not a positive "
                             "finite number", "use 1.0 (off) or e.g. 1.2")
        if not math.isfinite(self.length_penalty):
            raise LmlabError(f"length_penalty={self.length_penalty} is not a finite number",
                             "use 1.0 (the default) or e.g. 0.6 for shorter hypotheses")
        check_at_least(self.no_repeat_ngram_size, 0, "no_repeat_ngram_size")
        check_at_least(self.num_beams, 1, "num_beams")
        if not 1 <= self.num_return_sequences <= self.num_beams:
            raise LmlabError(f"num_return_sequences={self.num_return_sequences} with "
                             f"num_beams={self.num_beams}",
                             "ask for 1 .. num_beams hypotheses (several need beam search)")
        if self.num_beams > 1 and self.do_sample:
            raise LmlabError("beam sampling is not implemented",
                             "use num_beams > 1 with do_sample=False, or sampling with 1 beam")
        if self.early_stopping not in (True, False, "never"):
            raise LmlabError(f"early_stopping={self.early_stopping!r}",
                             "use True, False or 'never'")
        if isinstance(self.stop_strings, str):
            raise LmlabError(f"stop_strings={self.stop_strings!r} is one string, not a list",
                             f"pass a list: stop_strings=[{self.stop_strings!r}]")
        if any(not isinstance(stop, str) or not stop for stop in self.stop_strings):
            raise LmlabError(f"stop_strings={self.stop_strings!r} holds an empty or non-text "
                             "entry (an empty string would stop before the first token)",
                             "give non-empty strings, e.g. stop_strings=['\\n']")

    @property
    def eos_ids(self) -> list[int]:
        if self.eos_token_id is None:
            return []
        if isinstance(self.eos_token_id, int):
            return [self.eos_token_id]
        return [int(i) for i in self.eos_token_id]


# -- logits processing ---------------------------------------------------------------------------
def apply_repetition_penalty(scores: torch.Tensor, sequences: torch.Tensor, penalty: float,
                             mask: torch.Tensor | None = None) -> torch.Tensor:
    """CTRL's penalty on tokens already present: ``s / p`` if ``s > 0`` else ``s * p``.

    scores (B, V); sequences (B, T); mask (B, T) 1 for tokens that count (padding excluded).
    """
    if penalty == 1.0:
        return scores
    counts = torch.zeros_like(scores)
    weights = torch.ones_like(sequences, dtype=scores.dtype) if mask is None else \
        mask.to(scores.dtype)
    counts.scatter_add_(1, sequences, weights)  # (B, V): occurrences of each token
    penalised = torch.where(scores < 0, scores * penalty, scores / penalty)
    return torch.where(counts > 0, penalised, scores)


def block_repeated_ngrams(scores: torch.Tensor, sequences: torch.Tensor, n: int) -> torch.Tensor:
    """Ban every token that would complete an n-gram already in its row (Paulus et al. 2018;
    BART's summarisation default, n = 3): where the last n-1 tokens occurred before, the tokens
    that followed them there go to -inf. Rows are whole sequences as transformers reads them
    (prompt or decoder start included). scores (B, V); sequences (B, T)."""
    length = sequences.shape[1]
    if n <= 0 or length + 1 < n:
        return scores
    for row, tokens in enumerate(sequences.tolist()):
        prefix = tokens[length - n + 1:]  # the last n-1 tokens ([] for n = 1: ban every token)
        banned = [tokens[i + n - 1] for i in range(length - n + 1)
                  if tokens[i:i + n - 1] == prefix]
        if banned:
            scores[row, banned] = float("-inf")
    return scores


def top_k_filter(scores: torch.Tensor, k: int) -> torch.Tensor:
    """Keep the ``k`` largest scores per row (ties at the k-th kept), others to -inf."""
    if k <= 0 or k >= scores.shape[-1]:
        return scores
    threshold = torch.topk(scores, k, dim=-1).values[..., -1:]  # (B, 1)
    return scores.masked_fill(scores < threshold, float("-inf"))


def top_p_filter(scores: torch.Tensor, p: float) -> torch.Tensor:
    """Nucleus filter (Holtzman et al. 2020): keep the smallest set of most likely tokens whose
    probability reaches ``p``; the rest to -inf."""
    if p >= 1.0:
        return scores
    sorted_scores, order = torch.sort(scores, descending=False)
    cumulative = sorted_scores.softmax(dim=-1).cumsum(dim=-1)
    remove = cumulative <= (1 - p)
    remove[..., -1:] = False  # the most likely token always stays
    return scores.masked_fill(remove.scatter(1, order, remove), float("-inf"))


def force_token(scores: torch.Tensor, token: int) -> torch.Tensor:
    """Every score -inf but ``token``'s, which becomes 0 (as transformers' forced-token
    processors do: in beam search the forced step adds nothing to a hypothesis' score)."""
    forced = torch.full_like(scores, float("-inf"))
    forced[:, token] = 0.0
    return forced


def process_logits(scores: torch.Tensor, sequences: torch.Tensor, mask: torch.Tensor,
                   config: GenerationConfig, step: int) -> torch.Tensor:
    """All of ``config``'s logit processors, in Hugging Face's order."""
    scores = apply_repetition_penalty(scores, sequences, config.repetition_penalty, mask)
    scores = block_repeated_ngrams(scores, sequences, config.no_repeat_ngram_size)
    if config.suppress_token_ids:
        scores[:, config.suppress_token_ids] = float("-inf")
    if step < config.min_new_tokens and config.eos_ids:
        scores[:, config.eos_ids] = float("-inf")
    if step == 0 and config.forced_bos_token_id is not None:
        scores = force_token(scores, config.forced_bos_token_id)
    if step == config.max_new_tokens - 1 and config.forced_eos_token_id is not None:
        scores = force_token(scores, config.forced_eos_token_id)
    if config.do_sample:
        if config.temperature != 1.0:
            scores = scores / config.temperature
        scores = top_k_filter(scores, config.top_k)
        scores = top_p_filter(scores, config.top_p)
    return scores


# -- the model loop ------------------------------------------------------------------------------
def _positions(mask: torch.Tensor) -> torch.Tensor:
    """Position ids that count only real tokens (left padding gets position 1, unused)."""
    positions = mask.long().cumsum(-1) - 1
    return positions.masked_fill(mask == 0, 1)


def pad_left(sequences: Sequence[Sequence[int]], pad_id: int
             ) -> tuple[torch.Tensor, torch.Tensor]:
    """Token lists as a decoder batch: ids (B, T) left-padded with ``pad_id`` to the longest,
    and the (B, T) mask of real tokens."""
    width = max(len(ids) for ids in sequences)
    ids = torch.full((len(sequences), width), pad_id, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for row, tokens in enumerate(sequences):
        ids[row, width - len(tokens):] = torch.tensor(tokens, dtype=torch.long)
        mask[row, width - len(tokens):] = 1
    return ids, mask


def decoder_step(model: Any, new_ids: torch.Tensor, mask: torch.Tensor, cache: Any = None,
                 use_cache: bool = True) -> tuple[Any, torch.Tensor]:
    """A decoder on ``new_ids`` (B, n), the tokens after the ``past`` its ``cache`` holds, under
    the (B, past + n) left-padded ``mask``: its output (with the grown cache) and the last
    position's logits (B, V) (the vocabulary projection runs there only: nobody reads the
    prompt's). Also the step of ``lmlab serve``'s continuous batching."""
    past = mask.shape[1] - new_ids.shape[1]
    out = model(input_ids=new_ids, attention_mask=mask, position_ids=_positions(mask)[:, past:],
                past_key_values=cache, use_cache=use_cache, heads=[])
    last = out.last_hidden_state[:, -1:]  # (B, 1, H)
    return out, model.run_head("clm", last, None, mask[:, -1:])[:, -1]


class _Decoder:
    """Runs the model on a growing sequence, with or without the key/value cache (with it, only
    the tokens the cache has not seen are fed)."""

    def __init__(self, model: Any, use_cache: bool):
        self.model = model
        self.use_cache = use_cache
        self.cache = None
        self.fed = 0  # tokens of the sequences in the cache (it may hold more: virtual tokens)

    def logits(self, sequences: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """Next-token logits (B, V) in float32 for the sequences so far."""
        past = self.fed if self.use_cache and self.cache is not None else 0
        out, logits = self._forward(sequences, mask, past)
        if self.use_cache:
            self.cache = out.past_key_values
            self.fed = sequences.shape[1]
        return logits.float()

    def _forward(self, sequences: torch.Tensor, mask: torch.Tensor, past: int
                 ) -> tuple[Any, torch.Tensor]:
        return decoder_step(self.model, sequences[:, past:], mask, self.cache, self.use_cache)

    def reorder(self, index: torch.Tensor) -> None:
        if self.cache is not None:
            self.cache.reorder(index)


class _Seq2SeqDecoder(_Decoder):
    """The decoder of an encoder-decoder on a growing target sequence: the source is encoded
    once, its states (and the cross-attention keys, in the cache) reused at every step;
    ``copies`` of each source's states, one per beam."""

    def __init__(self, model: Any, use_cache: bool, input_ids: torch.Tensor,
                 attention_mask: torch.Tensor, copies: int):
        super().__init__(model, use_cache)
        encoded = model.encode(input_ids, attention_mask)
        hidden = encoded.last_hidden_state.repeat_interleave(copies, dim=0)
        self.encoded = replace(encoded, last_hidden_state=hidden)
        self.source_mask = attention_mask.repeat_interleave(copies, dim=0)

    def _forward(self, sequences: torch.Tensor, mask: torch.Tensor, past: int
                 ) -> tuple[Any, torch.Tensor]:
        out = self.model(attention_mask=self.source_mask, encoder_outputs=self.encoded,
                         decoder_input_ids=sequences[:, past:], past_key_values=self.cache,
                         use_cache=self.use_cache, heads=[])
        return out, self.model.heads["seq2seq-lm"](out.last_hidden_state[:, -1:])[:, -1]


def is_encoder_decoder(model: Any) -> bool:
    return bool(getattr(model.config, "is_encoder_decoder", False))


def check_can_generate(model: Any) -> None:
    """Refuse a model that cannot generate: a decoder with a ``"clm"`` head, or an
    encoder-decoder with its ``"seq2seq-lm"`` head."""
    if not is_encoder_decoder(model):
        check_causal_lm(model)
    elif "seq2seq-lm" not in model.heads:
        raise LmlabError("the encoder-decoder has no 'seq2seq-lm' head",
                         "load it with head='seq2seq-lm' (or from a ...ForConditional"
                         "Generation / ...MTModel checkpoint)")


def check_causal_lm(model: Any) -> None:
    """Refuse a model that cannot continue text: the LM evaluations of
    :mod:`lmlab.evaluation.lm` (and a decoder's generation) need a decoder with a ``"clm"``
    head."""
    if is_encoder_decoder(model):
        raise LmlabError("perplexity and few-shot scoring read a decoder's own next-token "
                         "predictions; an encoder-decoder predicts a target from a source",
                         "use a GPT-2 or Llama-style model here; score an encoder-decoder on a "
                         "text-to-text task with lmlab seq2seq evaluate")
    if not getattr(model.config, "causal", False):
        raise LmlabError("generation and LM evaluation need a decoder (causal) model",
                         "load a GPT-2 or Llama-style checkpoint, e.g. a .gguf file")
    if "clm" not in model.heads:
        raise LmlabError("the model has no 'clm' (causal LM) head",
                         "load it with head='clm' or add one: model.add_head('clm')")


def context_length(model: Any) -> int | None:
    """The positions a sequence may use: the rows of a learned or sinusoidal table (beyond them
    the lookup fails) or the context a rotary model was trained on (beyond it its output is
    untested); None for relative positions (T5) or none (recurrent models): no limit."""
    config = model.config
    if getattr(config, "position_embedding", None) not in ("learned", "sinusoidal", "rotary"):
        return None
    scaling = getattr(config, "rope_scaling", None) or {}  # dynamic NTK: max positions is the
    stretch = scaling["factor"] if scaling.get("rope_type") == "dynamic" else 1  # trained context
    return int((config.max_position_embeddings - config.position_offset) * stretch)


def check_context(model: Any, prompt_tokens: int, max_new_tokens: int) -> None:
    """Refuse, before any decoding, a prompt (a source, for an encoder-decoder) of
    ``prompt_tokens`` that cannot be continued by ``max_new_tokens`` within the model's
    :func:`context_length`: every token of the result needs a position."""
    limit = context_length(model)
    if limit is None:
        return
    if is_encoder_decoder(model):  # the source fills the encoder; the target starts with a token
        if prompt_tokens > limit:
            raise LmlabError(f"the source has {prompt_tokens} tokens, more than the model's "
                             f"{limit} positions", "shorten it, or keep its end with "
                             "--truncate left (generate_text(..., truncate='left'))")
        if 1 + max_new_tokens > limit:
            raise LmlabError(f"max_new_tokens={max_new_tokens} and the start token exceed the "
                             f"decoder's {limit} positions",
                             f"ask for at most {limit - 1} new tokens (--max-new-tokens)")
        return
    if prompt_tokens + max_new_tokens <= limit:
        return
    room = limit - max_new_tokens  # for the prompt
    fixes = [f"shorten the prompt to {room} tokens, or keep its last {room} with --truncate "
             "left (generate_text(..., truncate='left'))"] if room > 0 else []
    if prompt_tokens < limit:
        fixes.append(f"ask for at most {limit - prompt_tokens} new tokens (--max-new-tokens)")
    fixes = fixes or [f"ask for fewer than {limit} new tokens (--max-new-tokens) and shorten "
                      "the prompt to fit beside them (or add --truncate left)"]
    raise LmlabError(f"the prompt has {prompt_tokens} tokens; with max_new_tokens="
                     f"{max_new_tokens} that is {prompt_tokens + max_new_tokens} positions, "
                     f"more than the model's context of {limit}", ", or ".join(fixes))


def make_config(config: GenerationConfig | None, model: Any, **overrides: Any) -> GenerationConfig:
    """``config`` (or the defaults) with ``overrides``; eos/pad default to the model's."""
    config = GenerationConfig() if config is None else replace(config)  # a copy: ours to change
    check_names(list(overrides), sorted(f.name for f in fields(GenerationConfig)), "generate",
                "generation option")
    for key, value in overrides.items():
        if value is not None:
            setattr(config, key, value)
    if config.eos_token_id is None:
        config.eos_token_id = model.config.eos_token_id
    extra = model.config.extra  # a checkpoint's own generation settings (BART, Marian)
    for name in ("forced_bos_token_id", "forced_eos_token_id"):
        if name not in overrides and getattr(config, name) is None:
            setattr(config, name, extra.get(name))
    if "suppress_token_ids" not in overrides and not config.suppress_token_ids:
        config.suppress_token_ids = [ids[0] for ids in extra.get("bad_words_ids") or []
                                     if len(ids) == 1]
    if config.pad_token_id is None:
        config.pad_token_id = model.config.pad_token_id
    if config.pad_token_id is None and config.eos_ids:
        config.pad_token_id = config.eos_ids[0]
    if not isinstance(config.stop_strings, str):
        config.stop_strings = list(config.stop_strings or [])
    config.validate()
    return config


@torch.no_grad()
def generate(model: Any, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None,
             config: GenerationConfig | None = None, *, generator: torch.Generator | None = None,
             streamer: TokenCallback | None = None, tokenizer: Any = None,
             **options: Any) -> torch.Tensor:
    """Continue ``input_ids`` (B, T), left-padded where ``attention_mask`` has zeros, with a
    decoder's ``"clm"`` head; or translate it (a right-padded source) with an encoder-decoder's
    ``"seq2seq-lm"`` head, the output starting with the decoder start token as transformers'.

    Args:
        config / options: a :class:`GenerationConfig` and/or its fields as keywords.
        generator: the random generator for sampling (seeded: reproducible output).
        streamer: called after every step with the new tokens (B,); not with beam search.
        tokenizer: needed for ``stop_strings`` (decodes the generated text).

    Returns:
        (B, T + n) prompt plus generated tokens, rows that stopped early padded with the pad id;
        beam search: the best ``num_return_sequences`` per prompt, best first ((B * n, T + n)).
    """
    check_can_generate(model)
    config = make_config(config, model, **options)
    if input_ids.dim() != 2:
        raise LmlabError(f"input_ids has shape {tuple(input_ids.shape)}",
                         "pass a (batch, length) tensor of token ids")
    if attention_mask is None:
        attention_mask = torch.ones_like(input_ids)
    seq2seq = is_encoder_decoder(model)
    if not seq2seq and bool((attention_mask[:, -1] == 0).any()):
        raise LmlabError("prompts are right-padded", "pad prompts on the left for generation "
                         "(tokenizer.padding_side = 'left')")
    # decoder positions count real tokens (left padding excluded), encoder ones every token
    check_context(model, input_ids.shape[1] if seq2seq else int(attention_mask.sum(1).max()),
                  config.max_new_tokens)
    if config.stop_strings and tokenizer is None:
        raise LmlabError("stop_strings need a tokenizer to decode the text",
                         "pass tokenizer=... to generate()")
    if streamer is not None and config.num_beams > 1:
        raise LmlabError("a streamer cannot follow beam search: the best hypothesis is known "
                         "only when the search ends",
                         "drop streamer=..., or use generate_text(..., on_text=...), which "
                         "hands over the best hypothesis's text at the end")
    was_training = model.training
    model.eval()
    try:
        if seq2seq:  # the source is encoded; the target starts from the decoder start token
            decoder: _Decoder = _Seq2SeqDecoder(model, config.use_cache, input_ids,
                                                attention_mask, config.num_beams)
            input_ids = input_ids.new_full((input_ids.shape[0], 1),
                                           model.decoder_start_token_id)
            attention_mask = torch.ones_like(input_ids)
        else:
            decoder = _Decoder(model, config.use_cache)
        if config.num_beams > 1:
            return _beam_search(decoder, input_ids, attention_mask, config, tokenizer)
        return _sample(decoder, input_ids, attention_mask, config, generator, streamer,
                       tokenizer)
    finally:
        model.train(was_training)


def _sample(decoder: _Decoder, input_ids: torch.Tensor, mask: torch.Tensor,
            config: GenerationConfig, generator: torch.Generator | None,
            streamer: TokenCallback | None, tokenizer: Any) -> torch.Tensor:
    """Greedy decoding or sampling, one token per step for every row."""
    sequences, prompt_len = input_ids, input_ids.shape[1]
    unfinished = torch.ones(input_ids.shape[0], dtype=torch.bool, device=input_ids.device)
    eos = torch.tensor(config.eos_ids, dtype=torch.long, device=input_ids.device)
    pad = config.pad_token_id if config.pad_token_id is not None else 0
    for step in range(config.max_new_tokens):
        scores = decoder.logits(sequences, mask)
        scores = process_logits(scores, sequences, mask, config, step)
        if config.do_sample:
            probs = F.softmax(scores, dim=-1)
            next_tokens = torch.multinomial(probs, 1, generator=generator).squeeze(1)
        else:
            next_tokens = scores.argmax(dim=-1)
        next_tokens = torch.where(unfinished, next_tokens, next_tokens.new_full((), pad))
        sequences = torch.cat([sequences, next_tokens[:, None]], dim=1)
        mask = torch.cat([mask, unfinished.long()[:, None].to(mask.dtype)], dim=1)
        if streamer is not None:
            streamer(next_tokens)
        unfinished &= ~_stopped(next_tokens, sequences[:, prompt_len:], eos, config, tokenizer)
        if not bool(unfinished.any()):
            break
    return sequences


def _stopped(tokens: torch.Tensor, generated: torch.Tensor, eos: torch.Tensor,
             config: GenerationConfig, tokenizer: Any) -> torch.Tensor:
    """(N,) whether each row ends with its new token: the token is an eos id, or the row's
    generated text (new token included) now contains a stop string. tokens (N,); generated
    (N, n)."""
    stops = torch.isin(tokens, eos) if len(eos) else torch.zeros_like(tokens, dtype=torch.bool)
    if config.stop_strings:
        texts = tokenizer.batch_decode(generated, skip_special_tokens=True)
        stops |= torch.tensor([any(s in text for s in config.stop_strings) for text in texts],
                              device=generated.device)
    return stops


def cut_at_stop_strings(text: str, stops: Sequence[str]) -> str:
    """``text`` up to (not including) the first stop string it contains."""
    return text[:min((text.find(stop) for stop in stops if stop in text), default=len(text))]


# -- beam search ---------------------------------------------------------------------------------
def _beam_search(decoder: _Decoder, input_ids: torch.Tensor, mask: torch.Tensor,
                 config: GenerationConfig, tokenizer: Any) -> torch.Tensor:
    """Beam search with Hugging Face's candidate selection, scoring and stopping rules; a
    candidate whose text contains a stop string finishes as if it had produced eos."""
    batch, prompt_len = input_ids.shape
    beams, device = config.num_beams, input_ids.device
    max_len = prompt_len + config.max_new_tokens
    eos = torch.tensor(config.eos_ids, dtype=torch.long, device=device)
    keep = max(2, 1 + len(eos)) * beams  # candidates kept per prompt and step
    # (make_config has already put the eos id in pad_token_id when the model has no pad id)
    fill = config.pad_token_id if config.pad_token_id is not None else 0
    lp, early = config.length_penalty, config.early_stopping
    neg = -1.0e9

    running = input_ids.new_full((batch, beams, max_len), fill)  # (B, nb, L)
    running[:, :, :prompt_len] = input_ids[:, None]
    finished_seqs = running.clone()
    running_scores = torch.zeros(batch, beams, device=device)
    running_scores[:, 1:] = neg  # only the first copy of the prompt expands at step one
    finished_scores = torch.full((batch, beams), neg, device=device)
    is_finished = torch.zeros(batch, beams, dtype=torch.bool, device=device)
    undecided = torch.ones(batch, 1, dtype=torch.bool, device=device)
    generated = torch.zeros(batch, beams, dtype=torch.long, device=device)  # tokens per beam
    finished_len = torch.zeros(batch, beams, dtype=torch.long, device=device)
    top_mask = torch.arange(keep, device=device) < beams  # (keep,)
    flat_mask = mask.repeat_interleave(beams, dim=0)  # (B*nb, T)
    offsets = torch.arange(batch, device=device)[:, None] * beams  # (B, 1)

    cur = prompt_len
    for step in range(config.max_new_tokens):
        flat = running[:, :, :cur].reshape(batch * beams, cur)  # (B*nb, cur)
        logits = decoder.logits(flat, flat_mask)
        log_probs = F.log_softmax(logits, dim=-1)
        log_probs = process_logits(log_probs, flat, flat_mask, config, step)
        vocab = log_probs.shape[-1]
        total = (log_probs.view(batch, beams, vocab) + running_scores[:, :, None]).view(batch, -1)
        top_scores, top_index = torch.topk(total, keep, dim=-1)  # (B, keep)
        source = top_index // vocab  # beam each candidate extends
        tokens = top_index % vocab
        cand = torch.take_along_dim(running, source[:, :, None], dim=1)  # (B, keep, L)
        cand[:, :, cur] = tokens
        cand_len = torch.take_along_dim(generated, source, dim=1) + 1

        texts = cand[:, :, prompt_len:cur + 1].reshape(batch * keep, -1)  # (B*keep, n)
        stops = _stopped(tokens.reshape(-1), texts, eos, config, tokenizer).view(batch, keep)
        if cur + 1 >= max_len:
            stops = torch.ones_like(stops)

        # Next running beams: the best candidates that did not stop.
        alive_scores = top_scores + stops.float() * neg
        pick = torch.topk(alive_scores, beams, dim=-1).indices  # (B, nb)
        running = torch.take_along_dim(cand, pick[:, :, None], dim=1)
        running_scores = torch.take_along_dim(alive_scores, pick, dim=1)
        generated = torch.take_along_dim(cand_len, pick, dim=1)
        beam_source = torch.take_along_dim(source, pick, dim=1)

        # Finished hypotheses: stopped candidates among the top ``beams``, length-normalised.
        just_finished = stops & top_mask[None, :]
        normalised = top_scores / float(cur + 1 - prompt_len) ** lp
        full = is_finished.all(dim=-1, keepdim=True) & (early is True)
        normalised = normalised + full.float() * neg + (~undecided).float() * neg
        normalised = normalised + (~just_finished).float() * neg
        merged_seqs = torch.cat([finished_seqs, cand], dim=1)
        merged_scores = torch.cat([finished_scores, normalised], dim=1)
        merged_done = torch.cat([is_finished, just_finished], dim=1)
        merged_len = torch.cat([finished_len, cand_len], dim=1)
        best = torch.topk(merged_scores, beams, dim=-1).indices
        finished_seqs = torch.take_along_dim(merged_seqs, best[:, :, None], dim=1)
        finished_scores = torch.take_along_dim(merged_scores, best, dim=1)
        is_finished = torch.take_along_dim(merged_done, best, dim=1)
        finished_len = torch.take_along_dim(merged_len, best, dim=1)

        decoder.reorder((beam_source + offsets).reshape(-1))
        flat_mask = torch.cat([flat_mask, flat_mask.new_ones(batch * beams, 1)], dim=1)
        cur += 1

        # Can a running beam still beat the worst finished hypothesis?
        length = (max_len if early == "never" and lp > 0.0 else cur) - prompt_len
        best_running = running_scores[:, :1] / float(length) ** lp
        worst = torch.where(is_finished, finished_scores.min(dim=1, keepdim=True).values,
                            torch.full_like(finished_scores, neg))
        undecided = undecided & (best_running > worst).any(dim=-1, keepdim=True)
        open_beams = not (bool(is_finished.all()) and early is True)
        if not (bool(undecided.any()) and open_beams and not bool(stops.all())):
            break

    keep_n = config.num_return_sequences
    out_len = prompt_len + int(finished_len[:, :keep_n].max())
    return finished_seqs[:, :keep_n, :out_len].reshape(batch * keep_n, out_len)  # (B*n, L)


# -- text in, text out ---------------------------------------------------------------------------
def generate_text(model: Any, tokenizer: Any, prompts: str | Sequence[str],
                  config: GenerationConfig | None = None, *,
                  generator: torch.Generator | None = None, seed: int | None = None,
                  on_text: Callable[[str], None] | None = None,
                  skip_special_tokens: bool = True, truncate: str | None = None,
                  **options: Any) -> list[str]:
    """The new text of each prompt (stop strings cut; for an encoder-decoder, the output for
    each source), generated as one padded batch; ``seed`` seeds a fresh generator. ``on_text``
    gets a single prompt's text in pieces as it is generated (beam search: the best hypothesis,
    once). A prompt too long for the context is refused, or cut with ``truncate="left"``."""
    if truncate not in (None, "left"):
        raise LmlabError(f"truncate={truncate!r}", "use truncate='left' (keep the end of a "
                         "prompt that is too long) or None (refuse it)")
    texts = [prompts] if isinstance(prompts, str) else list(prompts)
    if not texts:
        return []
    if generator is None and seed is not None:
        generator = torch.Generator().manual_seed(seed)
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else \
        tokenizer.eos_token_id
    eos = options.pop("eos_token_id", None)
    if eos is None:
        eos = tokenizer.eos_token_id
    config = make_config(config, model, eos_token_id=eos, pad_token_id=pad_id, **options)
    encoded = [tokenizer.encode(t) for t in texts]
    if any(not ids for ids in encoded):
        bos = tokenizer.bos_token_id if tokenizer.bos_token_id is not None else pad_id
        encoded = [ids or [bos] for ids in encoded]
    seq2seq = is_encoder_decoder(model)  # sources are right-padded, prompts left-padded
    limit = context_length(model)
    if truncate == "left" and limit is not None:
        keep = limit if seq2seq else limit - config.max_new_tokens  # new tokens share a decoder's
        room = "" if seq2seq else f" beside {config.max_new_tokens} new tokens"
        for i, ids in enumerate(encoded):
            if len(ids) > keep > 0:
                warnings.warn(f"the prompt has {len(ids)} tokens, more than the {keep} that fit"
                              f"{room} in the model's {limit} positions: kept its last {keep}",
                              UserWarning, stacklevel=2)
                encoded[i] = ids[-keep:]
    device = next(model.parameters()).device
    if seq2seq:
        width = max(len(ids) for ids in encoded)
        input_ids = torch.tensor([ids + [pad_id or 0] * (width - len(ids)) for ids in encoded])
        mask = torch.tensor([[int(i < len(ids)) for i in range(width)] for ids in encoded])
    else:
        input_ids, mask = pad_left(encoded, pad_id or 0)
    input_ids, mask = input_ids.to(device), mask.to(device)
    if config.num_return_sequences > 1:
        raise LmlabError("generate_text returns one text per prompt",
                         "for several hypotheses per input use generate() (token ids) or "
                         "lmlab.finetune.text_to_text.predict_texts")
    streamer = None
    if on_text is not None:
        if len(texts) != 1:
            raise LmlabError("streaming text works for one prompt at a time",
                             "call generate_text once per prompt when streaming")
        if config.num_beams == 1:
            streamer = TextStreamer(tokenizer, on_text, skip_special_tokens=skip_special_tokens,
                                    stop_strings=config.stop_strings)
    out = generate(model, input_ids, mask, config, generator=generator, streamer=streamer,
                   tokenizer=tokenizer)
    results = []
    new_tokens = out[:, 1:] if seq2seq else out[:, input_ids.shape[1]:]  # after the start / prompt
    for row in new_tokens.tolist():
        text = tokenizer.decode(row, skip_special_tokens=skip_special_tokens)
        results.append(cut_at_stop_strings(text, config.stop_strings))
    if streamer is not None:
        streamer.end()
    elif on_text is not None and results[0]:
        on_text(results[0])  # beam search: the best hypothesis, once it is known
    return results


class TextStreamer:
    """Turns the per-step token callback into text pieces for one sequence, holding back an
    incomplete UTF-8 character and any ending that could start a stop string until the next
    tokens settle it; the pieces joined equal :func:`generate_text`'s result."""

    def __init__(self, tokenizer: Any, on_text: Callable[[str], None],
                 skip_special_tokens: bool = True, stop_strings: Sequence[str] = ()):
        self.tokenizer = tokenizer
        self.on_text = on_text
        self.skip_special_tokens = skip_special_tokens
        self.stop_strings = list(stop_strings)
        self.tokens: list[int] = []
        self.emitted = 0  # characters of the decoded text already handed to on_text
        self.stopped = False

    def __call__(self, next_tokens: torch.Tensor) -> None:
        if self.stopped:
            return
        self.tokens.append(int(next_tokens.reshape(-1)[0]))
        self._flush(final=False)

    def end(self) -> None:
        """Emit what was held back (generation is over: nothing can complete it now)."""
        if not self.stopped:
            self._flush(final=True)

    def _flush(self, final: bool) -> None:
        text = self.tokenizer.decode(self.tokens, skip_special_tokens=self.skip_special_tokens)
        cut = cut_at_stop_strings(text, self.stop_strings)
        if len(cut) < len(text):
            self.stopped, ready = True, len(cut)
        elif final:
            ready = len(text)
        elif text.endswith("\ufffd"):
            return
        else:
            ready = len(text) - partial_stop_length(text, self.stop_strings)
        if ready > self.emitted:
            self.on_text(text[self.emitted:ready])
            self.emitted = ready


def partial_stop_length(text: str, stops: Sequence[str]) -> int:
    """Length of the longest suffix of ``text`` that is a proper prefix of a stop string.

    >>> partial_stop_length("The end. Q", ["Question:"])
    1
    """
    longest = 0
    for stop in stops:
        for size in range(min(len(stop) - 1, len(text)), longest, -1):
            if text.endswith(stop[:size]):
                longest = size
                break
    return longest
