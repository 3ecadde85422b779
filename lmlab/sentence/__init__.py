"""Sentence encoders: Sentence-BERT bi-encoders, skip-thought and quick-thought, and their
evaluation. See docs/sentence-encoders.md."""

from lmlab.sentence.encoder import ConcatenatedEncoder, SentenceEncoder, embed_batch

__all__ = ["ConcatenatedEncoder", "SentenceEncoder", "embed_batch"]
