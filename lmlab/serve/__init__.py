"""``lmlab serve``: an OpenAI-compatible HTTP server (``/v1/models``, ``/v1/completions``,
``/v1/chat/completions``, ``/v1/embeddings``) with continuous batching; docs/serving.md.
"""
