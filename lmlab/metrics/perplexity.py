"""Perplexity, ``exp(mean NLL per token)`` with the NLL in nats. Average over tokens, not batches
(short batches would weigh too much): :func:`perplexity_from_sums` over an evaluation set.
"""

from __future__ import annotations

import math

from lmlab.utils.errors import LmlabError


def perplexity(mean_nll: float) -> float:
    """``exp(mean_nll)``; ``inf`` when that overflows a float (a diverged model)."""
    if math.isnan(mean_nll):
        raise LmlabError("the mean negative log-likelihood is NaN",
                         "check the loss for NaN (diverged training, empty batches)")
    if mean_nll < 0:
        raise LmlabError(f"mean negative log-likelihood {mean_nll} is below 0",
                         "pass the NLL (the cross-entropy loss), not the log-likelihood")
    try:
        return math.exp(mean_nll)
    except OverflowError:
        return math.inf


def perplexity_from_sums(total_nll: float, n_tokens: int) -> float:
    """Perplexity of an evaluation set from its summed NLL (nats) and its token count."""
    if n_tokens <= 0:
        raise LmlabError("no tokens were scored (the evaluation set is empty)",
                         "evaluate on a split that has at least one target token")
    return perplexity(total_nll / n_tokens)


def bits_per_token(mean_nll: float) -> float:
    """The mean NLL in bits (``mean_nll / ln 2``), i.e. ``log2(perplexity)``."""
    return mean_nll / math.log(2)
