"""The OpenAI request fields ``lmlab serve`` reads, each checked before any work, and its
errors as OpenAI-style bodies (``{"error": {"message", "type", "param", "code"}}``)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

MAX_STOPS = 16
MAX_TOP_LOGPROBS = 20


class ApiError(Exception):
    """An HTTP error with an OpenAI-style body."""

    def __init__(self, status: int, message: str, param: str | None = None,
                 code: str | None = None, kind: str = "invalid_request_error"):
        super().__init__(message)
        self.status, self.message, self.param, self.code, self.kind = (status, message, param,
                                                                       code, kind)

    def body(self) -> dict[str, Any]:
        return {"error": {"message": self.message, "type": self.kind, "param": self.param,
                          "code": self.code}}


def _type_name(value: Any) -> str:
    return "null" if value is None else type(value).__name__


def get(body: dict, name: str, kinds: tuple[type, ...], default: Any = None) -> Any:
    """``body[name]`` if it has one of ``kinds`` (a bool is not a number here), else 400;
    ``default`` when absent or null."""
    value = body.get(name)
    if value is None:
        return default
    if not isinstance(value, kinds) or (isinstance(value, bool) and bool not in kinds):
        names = " or ".join("number" if k is float else k.__name__ for k in kinds)
        raise ApiError(400, f"'{name}' must be {names}, got {_type_name(value)} {value!r}"[:300],
                       name, "invalid_type")
    if isinstance(value, float) and not math.isfinite(value):
        raise ApiError(400, f"'{name}' must be a finite number, got {value!r}", name)
    return value


def in_range(name: str, value: float, low: float, high: float) -> None:
    if not low <= value <= high:
        raise ApiError(400, f"'{name}'={value!r} is outside [{low}, {high}]", name,
                       "invalid_value")


@dataclass
class Sampling:
    """The decoding fields of a completion or chat request."""

    max_tokens: int | None
    temperature: float
    top_p: float
    seed: int | None
    n: int
    stop: list[str]
    logprobs: int | None  # None: none; k >= 0: the chosen token's and the k most likely
    stream: bool
    include_usage: bool


def sampling(body: dict, chat: bool, max_n: int) -> Sampling:
    """Check the fields every decoder request shares; refuse those lmlab does not implement
    rather than ignore them (the answer would not be what the client asked for)."""
    for name, off in (("presence_penalty", 0), ("frequency_penalty", 0), ("best_of", 1),
                      ("logit_bias", None), ("suffix", None), ("tools", None),
                      ("functions", None)):
        value = body.get(name)
        if value not in (None, off) and value != {} and value != []:
            raise ApiError(400, f"'{name}' is not supported by lmlab serve", name,
                           "unsupported_parameter")
    fmt = get(body, "response_format", (dict,), {})
    if fmt.get("type", "text") != "text":
        raise ApiError(400, "only response_format {'type': 'text'} is supported",
                       "response_format", "unsupported_parameter")
    names = ("max_completion_tokens", "max_tokens") if chat else ("max_tokens",)
    max_tokens = next((get(body, n, (int,)) for n in names if body.get(n) is not None), None)
    temperature = float(get(body, "temperature", (int, float), 1.0))
    in_range("temperature", temperature, 0.0, 2.0)
    top_p = float(get(body, "top_p", (int, float), 1.0))
    if not 0.0 < top_p <= 1.0:
        raise ApiError(400, f"'top_p'={top_p!r} is outside (0, 1]", "top_p", "invalid_value")
    n = get(body, "n", (int,), 1)
    in_range("n", n, 1, max_n)
    stop = get(body, "stop", (str, list), [])
    stop = [stop] if isinstance(stop, str) else stop
    if len(stop) > MAX_STOPS or not all(isinstance(s, str) and s for s in stop):
        raise ApiError(400, f"'stop' must be up to {MAX_STOPS} non-empty strings", "stop",
                       "invalid_value")
    if chat:
        logprobs = 0 if get(body, "logprobs", (bool,), False) else None
        top = get(body, "top_logprobs", (int,))
        if top is not None:
            in_range("top_logprobs", top, 0, MAX_TOP_LOGPROBS)
            if logprobs is None:
                raise ApiError(400, "'top_logprobs' needs 'logprobs': true", "top_logprobs")
            logprobs = top
    else:
        logprobs = get(body, "logprobs", (int,))
        if logprobs is not None:
            in_range("logprobs", logprobs, 0, MAX_TOP_LOGPROBS)
    options = get(body, "stream_options", (dict,), {})
    seed = get(body, "seed", (int,))
    if seed is not None:
        in_range("seed", seed, 0, 2 ** 63 - 1 - max_n)
    return Sampling(max_tokens, temperature, top_p, seed, n, stop,
                    logprobs, bool(get(body, "stream", (bool,), False)),
                    bool(options.get("include_usage")))


def prompts(body: dict) -> list[str | list[int]]:
    """A completion's ``prompt``: a text, token ids, or a list of either."""
    value = body.get("prompt")
    if isinstance(value, str) or (isinstance(value, list) and value and
                                  all(_is_id(t) for t in value)):
        return [value]
    if isinstance(value, list) and value and all(
            isinstance(p, str) or (isinstance(p, list) and p and all(_is_id(t) for t in p))
            for p in value):
        return list(value)
    raise ApiError(400, "'prompt' must be a string, a list of token ids, or a non-empty list "
                        f"of either; got {_type_name(value)}", "prompt", "invalid_type")


def _is_id(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def messages(body: dict) -> list[dict[str, str]]:
    """A chat's ``messages`` as the role/content pairs a chat template reads (a content given
    as parts keeps its text parts)."""
    value = body.get("messages")
    if not isinstance(value, list) or not value:
        raise ApiError(400, "'messages' must be a non-empty list of {'role', 'content'}",
                       "messages", "invalid_type")
    out = []
    for i, message in enumerate(value):
        role = message.get("role") if isinstance(message, dict) else None
        content = message.get("content") if isinstance(message, dict) else None
        if isinstance(content, list) and all(isinstance(p, dict) and p.get("type") == "text"
                                             and isinstance(p.get("text"), str)
                                             for p in content):
            content = "".join(p["text"] for p in content)
        if not isinstance(role, str) or not isinstance(content, str):
            raise ApiError(400, f"messages[{i}] needs a string 'role' and a text 'content'",
                           f"messages[{i}]", "invalid_type")
        out.append({"role": role, "content": content})
    return out


def texts(body: dict, max_inputs: int) -> list[str]:
    """An embedding request's ``input``: a text or a list of texts."""
    value = body.get("input")
    items = [value] if isinstance(value, str) else value
    if not isinstance(items, list) or not items or not all(isinstance(t, str) and t
                                                           for t in items):
        raise ApiError(400, "'input' must be a non-empty string or a list of them (token-id "
                            "input is not supported)", "input", "invalid_type")
    if len(items) > max_inputs:
        raise ApiError(400, f"'input' has {len(items)} texts, more than {max_inputs}", "input",
                       "invalid_value")
    return items
