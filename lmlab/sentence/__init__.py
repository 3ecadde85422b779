"""Sentence encoders: Sentence-BERT bi-encoders (contrastive and classification objectives on
WordNet pairs), skip-thought and quick-thought on a corpus's sentence order, and their
evaluation (Lee document similarity, WiC, gloss retrieval). See docs/sentence-encoders.md."""

from lmlab.sentence.encoder import ConcatenatedEncoder, SentenceEncoder, embed_batch

__all__ = ["ConcatenatedEncoder", "SentenceEncoder", "embed_batch"]
