"""Log-likelihoods of token continuations after contexts, batched: each distinct context runs
once (left-padded with the others, :func:`lmlab.generation.generate.decoder_step`) and its
key/value cache is copied to every continuation that follows it, which then run as one
right-padded batch; a batch whose contexts own one continuation each (rolling windows) runs as
whole right-padded sequences instead. What lm-evaluation-harness's ``loglikelihood`` asks of a
backend (:mod:`lmlab.harness`), with its left truncation to a window of ``max_length`` tokens.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch.nn import functional as F
from torch.nn.utils.rnn import pad_sequence

from lmlab.generation.generate import check_causal_lm, decoder_step, pad_left
from lmlab.utils.checks import check_at_least
from lmlab.utils.errors import LmlabError

Pair = tuple[Sequence[int], Sequence[int]]


def fit_window(context: Sequence[int], continuation: Sequence[int], max_length: int
               ) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """The context cut on the left so that context + continuation minus its last token fits
    ``max_length`` positions (the harness's ``(context + continuation)[-(max_length + 1):]``)."""
    if not context or not continuation:
        raise LmlabError("a request has an empty context or continuation",
                         "give at least one context token (e.g. BOS) and one to score")
    if len(continuation) > max_length:
        raise LmlabError(f"a continuation of {len(continuation)} tokens does not fit a window "
                         f"of {max_length}", "score it in windows (loglikelihood_rolling)")
    keep = max_length + 1 - len(continuation)
    return tuple(context[-keep:]), tuple(continuation)


@torch.no_grad()
def score_pairs(model: Any, pairs: Sequence[Pair], max_length: int, batch_size: int = 8
                ) -> list[tuple[float, bool]]:
    """(total log-likelihood, whether every token is the greedy choice) of each continuation
    after its context, in the order given; ``batch_size`` distinct contexts run together."""
    check_causal_lm(model)
    check_at_least(batch_size, 1, "batch_size")
    fitted = [fit_window(context, continuation, max_length) for context, continuation in pairs]
    groups: dict[tuple[int, ...], list[int]] = {}  # context -> the requests that follow it
    for i, (context, _) in enumerate(fitted):
        groups.setdefault(context, []).append(i)
    order = sorted(groups, key=len, reverse=True)  # similar lengths share a batch
    results: list[tuple[float, bool]] = [(0.0, False)] * len(fitted)
    model.eval()
    for start in range(0, len(order), batch_size):
        contexts = order[start:start + batch_size]
        rows = [i for context in contexts for i in groups[context]]
        owner = [g for g, context in enumerate(contexts) for _ in groups[context]]
        continuations = [fitted[i][1] for i in rows]
        scores = (_score_whole(model, contexts, continuations) if len(rows) == len(contexts)
                  else _score_batch(model, contexts, continuations, owner))
        for i, score in zip(rows, scores, strict=True):
            results[i] = score
    return results


def _score_whole(model: Any, contexts: list[tuple[int, ...]],
                 continuations: list[tuple[int, ...]]) -> list[tuple[float, bool]]:
    """Contexts that each own one continuation (rolling windows): context + continuation as one
    right-padded sequence, no cache to copy. Right padding needs no mask in a causal model (no
    real token sees the padding after it), so attention takes its fast causal path."""
    device = next(model.parameters()).device
    rows = [context + continuation for context, continuation in zip(contexts, continuations)]
    width = max(len(row) for row in rows) - 1  # the last token predicts nothing
    ids = torch.zeros(len(rows), width, dtype=torch.long)
    targets = torch.zeros_like(ids)  # (N, width): the token each position predicts
    scored = torch.zeros(len(rows), width, dtype=torch.bool)  # the continuation's predictions
    for r, (row, context) in enumerate(zip(rows, contexts)):
        ids[r, :len(row) - 1] = torch.tensor(row[:-1])
        targets[r, :len(row) - 1] = torch.tensor(row[1:])
        scored[r, len(context) - 1:len(row) - 1] = True
    ids, targets, scored = ids.to(device), targets.to(device), scored.to(device)
    log_probs = F.log_softmax(model(input_ids=ids, heads=["clm"]).logits.float(), dim=-1)
    picked = log_probs.gather(2, targets[:, :, None]).squeeze(2).masked_fill(~scored, 0.0)
    greedy = ((log_probs.argmax(-1) == targets) | ~scored).all(dim=1)  # (N,)
    return [(float(s), bool(g)) for s, g in zip(picked.sum(1).tolist(), greedy.tolist(),
                                                strict=True)]


def _score_batch(model: Any, contexts: list[tuple[int, ...]], continuations: list[tuple[int, ...]],
                 owner: list[int]) -> list[tuple[float, bool]]:
    """The contexts once (left-padded), then every continuation on a copy of its context's
    (``owner``'s) cache."""
    device = next(model.parameters()).device
    ids, mask = (t.to(device) for t in pad_left(contexts, 0))
    out, last = decoder_step(model, ids, mask)  # last: (G, V) the first continuation token's
    index = torch.tensor(owner, device=device)
    targets = pad_sequence([torch.tensor(c) for c in continuations], batch_first=True).to(device)
    real = pad_sequence([torch.ones(len(c), dtype=torch.long) for c in continuations],
                        batch_first=True).to(device)  # (N, W), zeros after each continuation
    logits = last.float().index_select(0, index).unsqueeze(1)  # (N, 1, V)
    if targets.shape[1] > 1:
        cache = out.past_key_values
        cache.reorder(index)  # (N, ...) a copy of the context's keys and values per row
        fed = targets[:, :-1]  # (N, W-1): the tokens that predict a next one
        needed = real[:, 1:]  # (N, W-1): 1 where a next token exists (not a row's last one)
        full = torch.cat([mask.index_select(0, index), needed], dim=1)
        positions = mask.sum(1).index_select(0, index)[:, None] + torch.arange(
            fed.shape[1], device=device)  # (N, W-1) continuing each context's count
        positions = positions.masked_fill(needed == 0, 0)  # the rest: inside any table
        rest = model(input_ids=fed, attention_mask=full, position_ids=positions,
                     past_key_values=cache, use_cache=True, heads=["clm"]).logits
        logits = torch.cat([logits, rest.float()], dim=1)  # (N, W, V)
    log_probs = F.log_softmax(logits, dim=-1)
    picked = log_probs.gather(2, targets[:, :, None]).squeeze(2).masked_fill(real == 0, 0.0)
    greedy = ((log_probs.argmax(-1) == targets) | (real == 0)).all(dim=1)  # (N,)
    return [(float(s), bool(g)) for s, g in zip(picked.sum(1).tolist(), greedy.tolist(),
                                                strict=True)]
