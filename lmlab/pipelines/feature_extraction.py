"""Feature extraction: token, word or sentence vectors from any layer."""

from __future__ import annotations

import torch

from lmlab.analysis.features import FeatureExtractor


class FeatureExtractionPipeline:
    """``embed(texts, pooling="mean")`` -> (N, D) sentence vectors; ``pooling=None`` -> one
    (T, D) tensor of token vectors per text. ``layer`` is a layer index or a strategy name of
    :data:`lmlab.models.pooling.STRATEGIES`."""

    head = None  # any model: the vectors come from its body, not a head

    def __init__(self, model, tokenizer, layer: int | str = "last", batch_size: int = 32):
        self.extractor = FeatureExtractor(model, tokenizer, layer=layer, batch_size=batch_size)

    def __call__(self, texts: str | list[str], pooling: str | None = "mean",
                 normalize: bool = False):
        single = isinstance(texts, str)
        texts = [texts] if single else list(texts)
        if pooling is None:
            vectors = [e.vectors for e in self.extractor.encode(texts)]
            return vectors[0] if single else vectors
        vectors = self.extractor.sentence_vectors(texts, pooling=pooling)
        if normalize:
            vectors = torch.nn.functional.normalize(vectors, dim=-1)
        return vectors[0] if single else vectors
