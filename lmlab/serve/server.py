"""``lmlab serve``: load the models, build the app, run uvicorn; the checks before any of it
(the optional server stack installed, who may call)."""

from __future__ import annotations

import ipaddress
import os
import sys
from pathlib import Path
from typing import Any

from lmlab.utils.errors import LmlabError

API_KEY_ENV = "LMLAB_API_KEY"


def require_server_stack() -> None:
    """Refuse clearly when FastAPI or uvicorn (the extra ``serve``) is missing."""
    try:
        import fastapi  # noqa: F401
        import uvicorn  # noqa: F401
    except ImportError as error:
        raise LmlabError(f"lmlab serve needs FastAPI and uvicorn ({error})",
                         "pip install 'lmlab[serve]' (make test and make demo install it)"
                         ) from None


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def exposure_warning(host: str, api_key: str | None) -> str | None:
    """The warning for a server that listens beyond this machine with no key (anyone who
    reaches the address can use the models), else None."""
    if api_key or is_loopback(host):
        return None
    return (f"lmlab serve listens on {host} with no API key: anyone who can reach this address "
            f"can use the models. Set --api-key or {API_KEY_ENV}, or bind 127.0.0.1.")


def load_served(name: str, max_batch: int = 16, max_waiting: int = 64, dtype: Any = None):
    """One model by name (a catalogue name, run or model folder, .gguf file or adapter
    folder): a decoder gets a continuous-batching engine, an encoder its embedding function
    (the folder's sentence-transformers pooling and normalisation, else mean pooling as
    ``lmlab embed``)."""
    from lmlab.generation.generate import check_can_generate, is_encoder_decoder
    from lmlab.load import load_model_and_tokenizer
    from lmlab.serve.api import Served
    from lmlab.serve.engine import Engine
    from lmlab.utils.catalog import resolve_model_dir

    model, tokenizer = load_model_and_tokenizer(name, dtype=dtype)
    if is_encoder_decoder(model):
        raise LmlabError(f"{name} is an encoder-decoder; lmlab serve serves decoders "
                         "(completions, chat) and encoders (embeddings)",
                         "use lmlab seq2seq for it, or serve a decoder or an encoder")
    if getattr(model.config, "causal", False):
        check_can_generate(model)
        return Served(name, model, tokenizer, engine=Engine(model, tokenizer, max_batch,
                                                              max_waiting))
    return Served(name, model, tokenizer,
                  embed=embedder(model, tokenizer, Path(resolve_model_dir(name))))


def embedder(model: Any, tokenizer: Any, source: Path):
    """``embed(texts)`` -> (N, D): the feature-extraction pipeline of ``lmlab embed`` with the
    pooling and normalisation ``source``'s sentence-transformers modules record."""
    from lmlab.finetune.pooling import resolve_pooling
    from lmlab.pipelines.feature_extraction import FeatureExtractionPipeline
    from lmlab.sentence.encoder import _sentence_transformers_settings

    folder = source if source.is_dir() else None
    pooling, _ = resolve_pooling(None, folder, has_pooler=False)
    pooling = "cls" if pooling == "family" else pooling
    normalize = _sentence_transformers_settings(folder)[1] if folder else False
    pipe = FeatureExtractionPipeline(model, tokenizer)
    embed = lambda texts: pipe(texts, pooling=pooling, normalize=normalize)  # noqa: E731
    embed.pooling, embed.normalize = pooling, normalize
    return embed


def server_limits(api_key: str | None = None, **limits: Any):
    """The checked :class:`lmlab.serve.api.Limits`; the key from ``$LMLAB_API_KEY`` unless
    given."""
    from lmlab.serve.api import Limits
    from lmlab.utils.checks import check_at_least

    settings = Limits(api_key=api_key or os.environ.get(API_KEY_ENV) or None, **limits)
    for name in ("max_body_bytes", "max_tokens", "max_n"):
        check_at_least(getattr(settings, name), 1, "--" + name.replace("_", "-"))
    return settings


def serve(models: list[str], host: str = "127.0.0.1", port: int = 8000,
          api_key: str | None = None, max_batch: int = 16, max_waiting: int = 64,
          **limits: Any) -> None:
    """Load ``models`` and serve them until interrupted (``limits``: fields of
    :class:`lmlab.serve.api.Limits`)."""
    require_server_stack()
    import uvicorn

    from lmlab.serve.api import create_app
    from lmlab.utils.checks import check_at_least

    check_at_least(max_batch, 1, "--max-batch")
    check_at_least(max_waiting, 1, "--max-waiting")
    if len(set(models)) != len(models):
        raise LmlabError(f"a model is named twice: {models}", "name each model once")
    settings = server_limits(api_key, **limits)
    warning = exposure_warning(host, settings.api_key)
    if warning:
        print(f"lmlab: warning: {warning}", file=sys.stderr, flush=True)
    served = [load_served(m, max_batch, max_waiting) for m in models]
    try:
        uvicorn.run(create_app(served, settings), host=host, port=port, log_level="info")
    finally:
        for one in served:
            if one.engine is not None:
                one.engine.close()
