"""The Transformer core, written once and shared by every family: embeddings, positions, masks,
attention, feed-forward, layers and the stack (docs/architecture.md).
"""
