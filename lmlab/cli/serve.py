"""``lmlab serve``: an OpenAI-compatible HTTP server over loaded models (docs/serving.md)."""

from __future__ import annotations

import argparse


def register(commands) -> None:
    p = commands.command(
        "serve", help="serve models over an OpenAI-compatible HTTP API (completions, chat, "
                      "embeddings) with continuous batching",
        example="lmlab serve smollm2 minilm --port 8000",
        handler=_serve)
    p.add_argument("models", nargs="+", metavar="MODEL",
                   help="short name (smollm2, minilm), run or model folder, .gguf file or "
                        "adapter folder; a request's 'model' field names one as given here")
    p.add_argument("--host", default="127.0.0.1",
                   help="address to listen on (another than 127.0.0.1 without --api-key warns)")
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--api-key", help="require this bearer token (default: $LMLAB_API_KEY)")
    p.add_argument("--max-batch", type=int, default=16, help="rows decoded together per model")
    p.add_argument("--max-waiting", type=int, default=64,
                   help="requests waiting for a row per model; more are refused (503)")
    p.add_argument("--max-tokens", type=int, default=4096, help="largest max_tokens accepted")
    p.add_argument("--max-n", type=int, default=8, help="largest n (choices) accepted")
    p.add_argument("--max-body-bytes", type=int, default=1 << 20,
                   help="largest request body (413 beyond)")


def _serve(args: argparse.Namespace) -> int:
    from lmlab.serve.server import serve

    serve(args.models, host=args.host, port=args.port, api_key=args.api_key,
          max_batch=args.max_batch, max_waiting=args.max_waiting, max_tokens=args.max_tokens,
          max_n=args.max_n, max_body_bytes=args.max_body_bytes)
    return 0
