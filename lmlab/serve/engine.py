"""Continuous batching: one thread runs a decoder for every request in flight. A new request's
prompt is run alone (its prefill), then its row joins the running batch between two decoding
steps; a finished or abandoned row leaves at once. Each row keeps its own keys and values in the
batch's cache, left-padded to the longest row and masked, so a row decodes as it would alone.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
from torch.nn import functional as F

from lmlab.generation.generate import GenerationConfig, TextStreamer, decoder_step, process_logits
from lmlab.models.core.cache import KVCache
from lmlab.utils.errors import LmlabError


@dataclass
class Event:
    """What one decoding step gave a request: its token, the text that token settles (pieces
    joined = ``generate_text``'s result), log-probabilities on request, and the finish reason
    (``"stop"``, ``"length"``) or an error on its last event."""

    token: int | None = None
    text: str = ""
    logprob: float | None = None
    top_logprobs: list[tuple[int, float]] | None = None
    finish: str | None = None
    error: str | None = None


@dataclass
class Request:
    """One sequence to continue: ``emit`` is called from the engine's thread with each
    :class:`Event`; setting ``cancelled`` (a client gone) drops the row at the next step."""

    prompt: list[int]
    config: GenerationConfig
    emit: Callable[[Event], None]
    generator: torch.Generator | None = None
    logprobs: int | None = None  # None: none; k: the chosen token's and the k most likely
    cancelled: bool = False
    tokens: list[int] = field(default_factory=list)
    streamer: TextStreamer | None = None


class QueueFull(LmlabError):
    """The waiting queue is full: the server answers 503."""


class Engine:
    """The decoding thread of one model: at most ``max_batch`` rows decode together and
    ``max_waiting`` requests wait for a row (beyond that :meth:`submit` refuses)."""

    def __init__(self, model: Any, tokenizer: Any, max_batch: int = 16, max_waiting: int = 64):
        self.model, self.tokenizer = model, tokenizer
        self.max_batch = max_batch
        self.waiting: queue.Queue[Request] = queue.Queue(max_waiting)
        self.rows: list[Request] = []
        self.cache: KVCache | None = None
        self.mask: torch.Tensor | None = None  # (B, L) the cache's real-token columns
        self.next: torch.Tensor | None = None  # (B,) each row's newest token, not yet fed
        self.steps = 0  # batched decoding steps run (tests read how many rows shared them)
        self.shared_steps = 0  # of which with more than one row
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="lmlab-serve-engine", daemon=True)
        self._thread.start()

    def submit(self, request: Request) -> None:
        request.streamer = TextStreamer(self.tokenizer, lambda piece: None,
                                        stop_strings=request.config.stop_strings)
        try:
            self.waiting.put_nowait(request)
        except queue.Full:
            raise QueueFull(f"{self.waiting.maxsize} requests are already waiting for this "
                            "model", "retry in a moment, or start the server with a larger "
                            "--max-waiting") from None

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=10)

    @property
    def busy(self) -> int:
        """Requests decoding or waiting."""
        return len(self.rows) + self.waiting.qsize()

    def _run(self) -> None:
        with torch.inference_mode():
            while not self._stop.is_set():
                try:
                    if not self.rows:
                        self._admit(self.waiting.get(timeout=0.05))
                    while len(self.rows) < self.max_batch and not self.waiting.empty():
                        self._admit(self.waiting.get_nowait())
                    if self.rows:
                        self._step()
                except queue.Empty:
                    continue
                except Exception as error:  # noqa: BLE001 -- the rows fail, the thread goes on
                    self._fail(error)

    def _fail(self, error: Exception) -> None:
        """End every row with ``error`` and empty the batch."""
        for request in self.rows:
            request.emit(Event(finish="error", error=str(error)))
        self.rows, self.cache, self.mask, self.next = [], None, None, None

    def _admit(self, request: Request) -> None:
        """Run the request's prompt alone, choose its first token, and add its row."""
        if request.cancelled:
            return
        try:
            ids = torch.tensor([request.prompt], device=next(self.model.parameters()).device)
            mask = torch.ones_like(ids)
            out, logits = decoder_step(self.model, ids, mask, None)
            cache = out.past_key_values
            if not isinstance(cache, KVCache):
                raise LmlabError("this model keeps no key/value cache", "serve a Transformer "
                                 "decoder")
            token, done = self._choose(request, logits.float())
        except Exception as error:  # noqa: BLE001 -- the request fails, the server goes on
            request.emit(Event(finish="error", error=str(error)))
            return
        if not done:
            self._join(request, cache, mask, token)

    def _join(self, request: Request, cache: KVCache, mask: torch.Tensor, token: int) -> None:
        """Add one row (cache of 1 row, mask (1, T)) to the batch, the shorter side left-padded
        after the virtual tokens a prompt- or prefix-tuned model keeps at the cache's front."""
        next_token = mask.new_tensor([token])
        if not self.rows:
            self.rows, self.cache, self.mask, self.next = [request], cache, mask, next_token
            return
        width = max(self.mask.shape[1], mask.shape[1])
        self.cache, cache = _pad(self.cache, self.mask, width), _pad(cache, mask, width)
        self.mask, mask = _pad_mask(self.mask, width), _pad_mask(mask, width)
        for store in ("keys", "values"):
            setattr(self.cache, store, [torch.cat([a, b]) for a, b in
                                        zip(getattr(self.cache, store), getattr(cache, store))])
        self.mask = torch.cat([self.mask, mask])
        self.next = torch.cat([self.next, next_token])
        self.rows.append(request)

    def _step(self) -> None:
        """One forward pass for every row; rows that finish (or were abandoned) leave."""
        self._leave([i for i, r in enumerate(self.rows) if r.cancelled])
        if not self.rows:
            return
        try:
            mask = torch.cat([self.mask, self.mask.new_ones(len(self.rows), 1)], dim=1)
            out, logits = decoder_step(self.model, self.next[:, None], mask, self.cache)
            self.cache, self.mask = out.past_key_values, mask
            self.steps += 1
            self.shared_steps += len(self.rows) > 1
            chosen = [self._choose(r, logits[i:i + 1].float()) for i, r in enumerate(self.rows)]
        except Exception as error:  # noqa: BLE001 -- these rows fail, the server goes on
            self._fail(error)
            return
        self.next = self.next.new_tensor([token for token, _ in chosen])
        self._leave([i for i, (_, done) in enumerate(chosen) if done])

    def _choose(self, request: Request, logits: torch.Tensor) -> tuple[int, bool]:
        """The request's next token from its logits (1, V) under its own settings (generate's
        processors and sampler); emits it; (token, finished)."""
        config, step = request.config, len(request.tokens)
        so_far = torch.tensor([request.prompt + request.tokens], device=logits.device)
        log_probs = F.log_softmax(logits, dim=-1)[0] if request.logprobs is not None else None
        scores = process_logits(logits, so_far, torch.ones_like(so_far), config, step)
        if config.do_sample:
            token = int(torch.multinomial(F.softmax(scores, dim=-1), 1,
                                          generator=request.generator))
        else:
            token = int(scores.argmax(dim=-1))
        request.tokens.append(token)
        pieces: list[str] = []
        streamer = request.streamer
        streamer.on_text = pieces.append
        streamer(torch.tensor([token]))
        finish = ("stop" if token in config.eos_ids or streamer.stopped else
                  "length" if len(request.tokens) >= config.max_new_tokens else None)
        if finish is not None:
            streamer.end()
        event = Event(token, "".join(pieces), finish=finish)
        if log_probs is not None:
            event.logprob = float(log_probs[token])
            if request.logprobs:
                top = torch.topk(log_probs, request.logprobs)
                event.top_logprobs = list(zip(top.indices.tolist(), top.values.tolist()))
        request.emit(event)
        return token, finish is not None

    def _leave(self, gone: list[int]) -> None:
        """Drop rows ``gone``; then the columns no remaining row uses."""
        if not gone:
            return
        keep = [i for i in range(len(self.rows)) if i not in set(gone)]
        self.rows = [self.rows[i] for i in keep]
        if not keep:
            self.cache = self.mask = self.next = None
            return
        index = torch.tensor(keep, device=self.mask.device)
        self.cache.reorder(index)
        self.mask, self.next = self.mask[index], self.next[index]
        used = self.mask.any(dim=0).nonzero()
        first = int(used[0]) if len(used) else 0  # leading columns padding in every row
        if first:
            lead = self.cache.seq_len() - self.mask.shape[1]
            for store in ("keys", "values"):
                setattr(self.cache, store, [torch.cat([t[:, :, :lead], t[:, :, lead + first:]],
                                                      dim=2) for t in getattr(self.cache, store)])
            self.mask = self.mask[:, first:]


def _pad(cache: KVCache, mask: torch.Tensor, width: int) -> KVCache:
    """``cache`` with ``width - L`` empty columns before its L real-token columns (after the
    virtual tokens of prompt or prefix tuning, which the model's own hooks place first)."""
    extra = width - mask.shape[1]
    if extra == 0:
        return cache
    lead = cache.seq_len() - mask.shape[1]

    def padded(t: torch.Tensor) -> torch.Tensor:  # (B, n_kv, lead + L, hd) -> (.., lead + width, ..)
        gap = t.new_zeros(t.shape[0], t.shape[1], extra, t.shape[3])
        return torch.cat([t[:, :, :lead], gap, t[:, :, lead:]], dim=2)

    cache.keys = [padded(t) for t in cache.keys]
    cache.values = [padded(t) for t in cache.values]
    return cache


def _pad_mask(mask: torch.Tensor, width: int) -> torch.Tensor:
    """(B, L) -> (B, width), zeros on the left."""
    return torch.cat([mask.new_zeros(mask.shape[0], width - mask.shape[1]), mask], dim=1)
