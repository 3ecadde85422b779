"""The HTTP routes of ``lmlab serve`` (FastAPI): ``/v1/models``, ``/v1/completions``,
``/v1/chat/completions`` (the model's chat template) and ``/v1/embeddings``, OpenAI's shapes,
server-sent events for streams; every refusal an OpenAI-style error body."""

from __future__ import annotations

import asyncio
import base64
import hmac
import json
import random
import threading
import time
import uuid
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any

import torch
from fastapi import FastAPI
from fastapi import Request as HttpRequest
from fastapi.responses import JSONResponse, Response, StreamingResponse
from starlette.exceptions import HTTPException

from lmlab.generation.chat import apply_chat_template
from lmlab.generation.generate import check_context, context_length, make_config
from lmlab.serve import protocol
from lmlab.serve.engine import Engine, Event, QueueFull, Request
from lmlab.serve.protocol import ApiError
from lmlab.utils.errors import LmlabError


@dataclass
class Limits:
    """Who may call and how much: the bearer token (None: anyone who can reach the address),
    the largest request body, ``max_tokens``, ``n``, texts per embedding request, and embedding
    requests in flight."""

    api_key: str | None = None
    max_body_bytes: int = 1 << 20
    max_tokens: int = 4096
    max_n: int = 8
    max_inputs: int = 256
    max_embedding_requests: int = 64


@dataclass
class Served:
    """One loaded model: a decoder has an :class:`Engine`; an encoder an ``embed(texts)`` that
    gives (N, D) vectors."""

    name: str
    model: Any
    tokenizer: Any
    engine: Engine | None = None
    embed: Callable[[list[str]], torch.Tensor] | None = None
    created: int = field(default_factory=lambda: int(time.time()))
    lock: threading.Lock = field(default_factory=threading.Lock)
    in_flight: int = 0


def create_app(models: list[Served], limits: Limits) -> FastAPI:
    """The ASGI app serving ``models`` (by name) under ``limits``."""
    app = FastAPI(title="lmlab serve", docs_url=None, redoc_url=None, openapi_url=None)
    by_name = {m.name: m for m in models}

    @app.middleware("http")
    async def authorize(http: HttpRequest, call_next):
        if limits.api_key and http.url.path.startswith("/v1"):
            scheme, _, token = http.headers.get("authorization", "").partition(" ")
            if scheme.lower() != "bearer" or not hmac.compare_digest(token.encode(),
                                                                     limits.api_key.encode()):
                return _error(ApiError(401, "a valid API key is required (Authorization: "
                                       "Bearer KEY)", code="invalid_api_key"))
        return await call_next(http)

    @app.exception_handler(ApiError)
    async def api_error(http: HttpRequest, error: ApiError) -> JSONResponse:
        return _error(error)

    @app.exception_handler(HTTPException)
    async def http_error(http: HttpRequest, error: HTTPException) -> JSONResponse:
        return _error(ApiError(error.status_code, str(error.detail)))

    @app.exception_handler(Exception)
    async def server_error(http: HttpRequest, error: Exception) -> JSONResponse:
        return _error(ApiError(500, f"internal error: {error}", kind="server_error"))

    @app.get("/health")
    async def health() -> dict:
        return {"status": "ok"}

    @app.get("/v1/models")
    async def list_models() -> dict:
        return {"object": "list", "data": [_model_card(m) for m in models]}

    @app.get("/v1/models/{name:path}")
    async def one_model(name: str) -> dict:
        return _model_card(_pick(by_name, {"model": name}, None))

    @app.post("/v1/completions")
    async def completions(http: HttpRequest) -> Response:
        body = await _json(http, limits.max_body_bytes)
        return await _generate(_pick(by_name, body, "engine"), body, limits, chat=False)

    @app.post("/v1/chat/completions")
    async def chat_completions(http: HttpRequest) -> Response:
        body = await _json(http, limits.max_body_bytes)
        return await _generate(_pick(by_name, body, "engine"), body, limits, chat=True)

    @app.post("/v1/embeddings")
    async def embeddings(http: HttpRequest) -> Response:
        body = await _json(http, limits.max_body_bytes)
        return await _embeddings(_pick(by_name, body, "embed"), body, limits)

    return app


def _error(error: ApiError) -> JSONResponse:
    return JSONResponse(error.body(), status_code=error.status,
                        headers={"Retry-After": "1"} if error.status == 503 else None)


def _model_card(served: Served) -> dict:
    return {"id": served.name, "object": "model", "created": served.created,
            "owned_by": "lmlab"}


async def _json(http: HttpRequest, limit: int) -> dict:
    """The request's JSON object, read up to ``limit`` bytes (413 beyond)."""
    declared = http.headers.get("content-length", "")
    too_large = ApiError(413, f"the request body is larger than {limit} bytes",
                         code="request_too_large")
    if declared.isdigit() and int(declared) > limit:
        raise too_large
    chunks, size = [], 0
    async for chunk in http.stream():
        size += len(chunk)
        if size > limit:
            raise too_large
        chunks.append(chunk)
    try:
        body = json.loads(b"".join(chunks))
    except (ValueError, UnicodeDecodeError) as error:
        raise ApiError(400, f"the request body is not valid JSON: {error}",
                       code="invalid_json") from None
    if not isinstance(body, dict):
        raise ApiError(400, "the request body must be a JSON object", code="invalid_json")
    return body


def _pick(by_name: dict[str, Served], body: dict, needs: str | None) -> Served:
    """The loaded model the request names, able to do what the route needs."""
    name = body.get("model")
    if not isinstance(name, str):
        raise ApiError(400, f"'model' must be the name of a loaded model: {sorted(by_name)}",
                       "model", "invalid_type")
    if name not in by_name:
        raise ApiError(404, f"the model {name!r} is not loaded; this server has "
                            f"{sorted(by_name)}", "model", "model_not_found")
    served = by_name[name]
    if needs is not None and getattr(served, needs) is None:
        what = ("an encoder: it gives embeddings (/v1/embeddings), not text" if needs == "engine"
                else "a decoder: it continues text; embeddings come from an encoder (minilm)")
        raise ApiError(400, f"{name!r} is {what}", "model", "wrong_model_kind")
    return served


def _encode_prompt(served: Served, prompt: str | list[int]) -> list[int]:
    """Token ids of a prompt as ``generate_text`` makes them (an empty one: the bos token)."""
    tokenizer = served.tokenizer
    ids = tokenizer.encode(prompt) if isinstance(prompt, str) else list(prompt)
    vocab = served.model.config.vocab_size
    if any(i >= vocab for i in ids):
        raise ApiError(400, f"the prompt holds token ids beyond the vocabulary ({vocab})",
                       "prompt", "invalid_value")
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else \
        tokenizer.eos_token_id
    fallback = tokenizer.bos_token_id if tokenizer.bos_token_id is not None else pad
    return ids or [fallback or 0]


def _requests(served: Served, body: dict, limits: Limits, chat: bool
              ) -> tuple[protocol.Sampling, list[list[int]], list[Request]]:
    """The checked sampling fields, the prompts' ids and one engine request per choice (emit
    left to the caller)."""
    sampling = protocol.sampling(body, chat, limits.max_n)
    if chat:
        try:
            text = apply_chat_template(served.tokenizer, protocol.messages(body))
        except LmlabError as error:
            raise ApiError(400, f"{error.problem} ({error.fix})", "messages") from None
        prompts = [_encode_prompt(served, text)]
    else:
        prompts = [_encode_prompt(served, p) for p in protocol.prompts(body)]
    tokenizer, model = served.tokenizer, served.model
    greedy = sampling.temperature == 0.0
    requests = []
    for prompt in prompts:
        max_tokens = sampling.max_tokens
        if max_tokens is None:  # OpenAI's defaults: 16 for a completion, a chat the room left
            room = (context_length(model) or limits.max_tokens) - len(prompt)
            max_tokens = max(1, min(limits.max_tokens, room)) if chat else 16
        protocol.in_range("max_tokens", max_tokens, 1, limits.max_tokens)
        try:
            check_context(model, len(prompt), max_tokens)
        except LmlabError as error:
            raise ApiError(400, error.problem, "max_tokens" if chat else "prompt",
                           "context_length_exceeded") from None
        config = make_config(None, model, max_new_tokens=max_tokens, do_sample=not greedy,
                             temperature=1.0 if greedy else sampling.temperature,
                             top_p=1.0 if greedy else sampling.top_p, stop_strings=sampling.stop,
                             eos_token_id=tokenizer.eos_token_id,
                             pad_token_id=tokenizer.pad_token_id)
        for choice in range(sampling.n):
            seed = sampling.seed + choice if sampling.seed is not None else \
                random.randrange(2 ** 63)
            generator = None if greedy else torch.Generator().manual_seed(seed)
            requests.append(Request(prompt, config, emit=lambda event: None,
                                    generator=generator, logprobs=sampling.logprobs))
    return sampling, prompts, requests


async def _generate(served: Served, body: dict, limits: Limits, chat: bool) -> Response:
    """A completion or chat completion: every choice decoded by the model's engine (joining the
    running batch), answered whole or as server-sent events."""
    sampling, prompts, requests = _requests(served, body, limits, chat)
    loop, events = asyncio.get_running_loop(), asyncio.Queue()
    for index, request in enumerate(requests):
        request.emit = lambda event, i=index: loop.call_soon_threadsafe(events.put_nowait,
                                                                        (i, event))
    try:
        for request in requests:
            served.engine.submit(request)
    except QueueFull as error:
        _cancel(requests)
        raise ApiError(503, f"{error.problem}: {error.fix}", code="server_busy",
                       kind="server_error") from None
    reply = _Reply(served, chat, sampling, prompts, requests, body.get("echo") is True)
    if sampling.stream:
        return StreamingResponse(reply.stream(events), media_type="text/event-stream")
    try:
        collected: list[list[Event]] = [[] for _ in requests]
        open_choices = len(requests)
        while open_choices:
            index, event = await events.get()
            if event.error is not None:
                raise ApiError(500, f"generation failed: {event.error}", kind="server_error")
            collected[index].append(event)
            open_choices -= event.finish is not None
        return JSONResponse(reply.whole(collected))
    finally:
        _cancel(requests)


def _cancel(requests: list[Request]) -> None:
    for request in requests:
        request.cancelled = True  # a finished row has left already; a running one leaves now


class _Reply:
    """The response bodies of one completion or chat request."""

    def __init__(self, served: Served, chat: bool, sampling: protocol.Sampling,
                 prompts: list[list[int]], requests: list[Request], echo: bool):
        self.served, self.chat, self.sampling, self.requests = served, chat, sampling, requests
        self.prompts = prompts
        self.echo = [served.tokenizer.decode(p, skip_special_tokens=True) if echo else ""
                     for p in prompts]
        self.id = ("chatcmpl-" if chat else "cmpl-") + uuid.uuid4().hex
        self.created = int(time.time())
        self.object = "chat.completion" if chat else "text_completion"

    def usage(self, completion_tokens: int) -> dict:
        prompt_tokens = sum(len(p) for p in self.prompts)
        return {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
                "total_tokens": prompt_tokens + completion_tokens}

    def envelope(self, choices: list[dict], suffix: str = "") -> dict:
        return {"id": self.id, "object": self.object + suffix, "created": self.created,
                "model": self.served.name, "choices": choices}

    def choice(self, index: int, events: list[Event], whole: bool) -> dict:
        text = "".join(e.text for e in events)
        finish = events[-1].finish if events else None
        logprobs = self.logprobs(events) if self.sampling.logprobs is not None else None
        if not self.chat:
            if whole:
                text = self.echo[index // self.sampling.n] + text
            return {"index": index, "text": text, "logprobs": logprobs, "finish_reason": finish}
        key, message = ("message", {"role": "assistant", "content": text}) if whole else \
            ("delta", {"content": text} if text else {})
        return {"index": index, key: message, "logprobs": logprobs, "finish_reason": finish}

    def logprobs(self, events: list[Event]) -> dict:
        decode = self.served.tokenizer.decode
        steps = [e for e in events if e.token is not None]
        if self.chat:
            def entry(token: int, logprob: float) -> dict:
                text = decode([token])
                return {"token": text, "logprob": logprob, "bytes": list(text.encode())}

            return {"content": [{**entry(e.token, e.logprob), "top_logprobs": [
                entry(t, lp) for t, lp in e.top_logprobs or []]} for e in steps]}
        offsets, at = [], 0
        for e in steps:
            offsets.append(at)
            at += len(decode([e.token]))
        return {"tokens": [decode([e.token]) for e in steps],
                "token_logprobs": [e.logprob for e in steps],
                "top_logprobs": [{decode([t]): lp for t, lp in e.top_logprobs or []}
                                 for e in steps] if self.sampling.logprobs else None,
                "text_offset": offsets}

    def whole(self, collected: list[list[Event]]) -> dict:
        choices = [self.choice(i, events, whole=True) for i, events in enumerate(collected)]
        body = self.envelope(choices)
        body["usage"] = self.usage(sum(len(events) for events in collected))
        return body

    async def stream(self, events: asyncio.Queue) -> AsyncIterator[str]:
        """Server-sent events: a chunk per token that settles text (and the last of each
        choice), an error chunk if decoding fails, ``[DONE]``; an abandoned stream's rows leave
        the batch."""
        try:
            if self.chat:
                for index in range(len(self.requests)):
                    first = {"index": index, "delta": {"role": "assistant", "content": ""},
                             "logprobs": None, "finish_reason": None}
                    yield _sse(self.envelope([first], ".chunk"))
            open_choices, tokens = len(self.requests), 0
            while open_choices:
                index, event = await events.get()
                if event.error is not None:
                    yield _sse(ApiError(500, f"generation failed: {event.error}",
                                        kind="server_error").body())
                    break
                tokens += 1
                open_choices -= event.finish is not None
                if event.text or event.finish or self.sampling.logprobs is not None:
                    yield _sse(self.envelope([self.choice(index, [event], whole=False)],
                                             ".chunk" if self.chat else ""))
            if self.sampling.include_usage:
                yield _sse({**self.envelope([], ".chunk" if self.chat else ""),
                            "usage": self.usage(tokens)})
            yield "data: [DONE]\n\n"
        finally:
            _cancel(self.requests)


def _sse(payload: dict) -> str:
    return f"data: {json.dumps(payload, ensure_ascii=False)}\n\n"


async def _embeddings(served: Served, body: dict, limits: Limits) -> Response:
    """Vectors of the request's texts with the model's pooling (as ``lmlab embed``)."""
    texts = protocol.texts(body, limits.max_inputs)
    fmt = protocol.get(body, "encoding_format", (str,), "float")
    if fmt not in ("float", "base64"):
        raise ApiError(400, f"'encoding_format'={fmt!r}: use 'float' or 'base64'",
                       "encoding_format", "invalid_value")
    dimensions = protocol.get(body, "dimensions", (int,))
    if dimensions is not None and dimensions != served.model.config.hidden_size:
        raise ApiError(400, f"'dimensions'={dimensions}: this model's vectors have "
                            f"{served.model.config.hidden_size}", "dimensions", "invalid_value")
    if served.in_flight >= limits.max_embedding_requests:
        raise ApiError(503, f"{served.in_flight} embedding requests are already running for "
                            "this model; retry in a moment", code="server_busy",
                       kind="server_error")
    served.in_flight += 1
    try:
        vectors, tokens = await asyncio.to_thread(_embed_locked, served, texts)
    finally:
        served.in_flight -= 1
    data = []
    for index, vector in enumerate(vectors.float().numpy()):
        value = (base64.b64encode(vector.astype("<f4").tobytes()).decode("ascii")
                 if fmt == "base64" else vector.tolist())
        data.append({"object": "embedding", "index": index, "embedding": value})
    return JSONResponse({"object": "list", "data": data, "model": served.name,
                         "usage": {"prompt_tokens": tokens, "total_tokens": tokens}})


def _embed_locked(served: Served, texts: list[str]) -> tuple[torch.Tensor, int]:
    with served.lock:  # one batch at a time on a model
        tokens = sum(len(served.tokenizer.encode(t)) for t in texts)
        return served.embed(texts), tokens

