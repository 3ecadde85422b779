"""The Transformer core, written once and shared by every family (see ARCHITECTURE.md, principle 1).

- :mod:`.activations` — GELU (exact and tanh), ReLU, SiLU by name.
- :mod:`.norms` — LayerNorm and RMSNorm.
- :mod:`.positions` — sinusoidal tables and rotary embeddings (RoPE).
- :mod:`.embeddings` — token + segment + position embeddings, ALBERT/ELECTRA factorisation.
- :mod:`.masks` — padding, causal, prefix and block-diagonal (per-document) attention masks.
- :mod:`.attention` — multi-head / grouped-query attention: fused SDPA path and a math path that
  returns the attention probabilities; self- and cross-attention; key/value cache.
- :mod:`.feedforward` — MLP and gated (SwiGLU/GeGLU) feed-forward blocks.
- :mod:`.layer` — one Transformer layer, pre- or post-norm.
- :mod:`.transformer` — the stack: embeddings, layers (optionally shared), final norm.
"""
