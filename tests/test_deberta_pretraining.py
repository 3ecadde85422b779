"""DeBERTa's pretraining (issue 31): the enhanced mask decoder (the ``emd`` head) against a direct
transcription of the paper (He et al. 2021, Section 3.2 and eq. 4) and against microsoft's
procedure run on transformers' own DeBERTa-v2 layer (``query_states``); its folder round trip;
v3's replaced-token detection with gradient-disentangled embedding sharing (``electra``'s
``embedding_sharing``); a few pretraining steps with each option.

Tolerance: float32 rounding of the compared values' size and at most 1e-4 (tests/conftest.py).
"""

from __future__ import annotations

import json
import math

import pytest
import torch
from conftest import rounding_tolerance
from torch.nn import functional as F

import lmlab
from lmlab.models.heads import MaskedLMHead
from lmlab.models.model import LanguageModel
from lmlab.models.presets import preset
from lmlab.utils.errors import LmlabError

transformers = pytest.importorskip("transformers")

SMALL = dict(vocab_size=99, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
             intermediate_size=64, max_position_embeddings=64)


def _close(got: torch.Tensor, ref: torch.Tensor, what: str) -> float:
    diff = (got.float() - ref.float()).abs().max().item()
    tolerance = min(rounding_tolerance(terms=64, depth=8, scale=float(ref.abs().max())), 1e-4)
    assert diff <= tolerance, f"{what}: max |diff| {diff:.3g} > {tolerance:.3g}"
    return diff


def _model(heads=("emd",), seed: int = 0, **fields) -> LanguageModel:
    """A v3-shaped model with every weight moved off its initialisation."""
    torch.manual_seed(seed)
    model = LanguageModel(preset("deberta-v2", "xsmall", **{**SMALL, **fields}), heads=heads)
    generator = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        for param in model.parameters():
            param.add_(torch.randn(param.shape, generator=generator) * 0.05)
    return model.eval()


def _batch(length: int = 14) -> dict[str, torch.Tensor]:
    ids = torch.randint(5, 99, (3, length), generator=torch.Generator().manual_seed(3))
    mask = torch.ones(3, length, dtype=torch.long)
    mask[1, 9:] = 0
    mask[2, 5:] = 0
    return {"input_ids": ids.masked_fill(mask == 0, 0), "attention_mask": mask}


# -- the enhanced mask decoder ------------------------------------------------------------------
def _paper_emd(model: LanguageModel, batch: dict[str, torch.Tensor]) -> torch.Tensor:
    """The paper, written out: H = the last layer's input; I_0 = H + P (absolute positions);
    n = 2 steps of the last layer (shared weights) with queries from I and keys/values from H:
    A_ij = Q^c_i K^c_j + Q^c_i K^r_d(i,j) + K^c_j Q^r_d(i,j), softmax(A / sqrt(3d)) V^c,
    d(i,j) = clamp(i - j, -k, k - 1) + k; post-norm residuals on I; then the MLM head. The p2c
    term's index is d(i,j) as microsoft's code and transformers compute it (eq. 4 prints d(j,i);
    docs/deberta.md)."""
    w = {k: v.detach() for k, v in model.state_dict().items()}
    config, layer = model.config, "transformer.layers.1."
    nh, d = config.num_attention_heads, config.head_dim
    lin = lambda x, name: x @ w[name + ".weight"].T + w[name + ".bias"]  # noqa: E731
    norm = lambda x, name: F.layer_norm(x, (x.shape[-1],), w[name + ".weight"],  # noqa: E731
                                        w[name + ".bias"], config.norm_eps)
    split = lambda x: x.view(x.shape[0], -1, nh, d).transpose(1, 2)  # noqa: E731  (B, nh, T, d)
    with torch.no_grad():
        hidden = model(**batch, heads=[], output_hidden_states=True).hidden_states[-2]
    batch_size, length = hidden.shape[:2]
    k = config.max_relative_positions
    i = torch.arange(length)
    delta = (i[:, None] - i[None, :]).clamp(-k, k - 1) + k  # delta[i, j] = d(i, j)
    table = w["transformer.relative_positions.embeddings.weight"]  # (2k, H)
    k_r = lin(table, layer + "attention.disentangled.pos_key_proj").view(2 * k, nh, d)
    q_r = lin(table, layer + "attention.disentangled.pos_query_proj").view(2 * k, nh, d)
    keep = batch["attention_mask"].bool()[:, None, None, :]  # keys that are real tokens
    state = hidden + w["heads.emd.position_embeddings.weight"][:length]
    for _ in range(2):
        q_c = split(lin(state, layer + "attention.q_proj"))
        k_c = split(lin(hidden, layer + "attention.k_proj"))
        v_c = split(lin(hidden, layer + "attention.v_proj"))
        scores = torch.einsum("bhid,bhjd->bhij", q_c, k_c)
        scores = scores + torch.einsum("bhid,ijhd->bhij", q_c, k_r[delta])
        scores = scores + torch.einsum("bhjd,ijhd->bhij", k_c, q_r[delta])
        probs = torch.softmax((scores / math.sqrt(3 * d)).masked_fill(~keep, -1e30), -1)
        out = (probs @ v_c).transpose(1, 2).reshape(batch_size, length, nh * d)
        state = norm(state + lin(out, layer + "attention.o_proj"), layer + "attention_norm")
        inner = F.gelu(lin(state, layer + "feed_forward.up_proj"))
        state = norm(state + lin(inner, layer + "feed_forward.down_proj"), layer + "ffn_norm")
    x = norm(F.gelu(lin(state, "heads.emd.dense")), "heads.emd.norm")
    return x @ w["transformer.embeddings.word_embeddings.weight"].T + w["heads.emd.decoder.bias"]


@pytest.mark.numerics
def test_emd_equals_the_papers_description():
    """Clamped distances (the paper's delta, k = 6 < 14 tokens), own position maps."""
    model = _model(position_buckets=-1, max_relative_positions=6, share_att_key=False,
                   norm_rel_ebd="none")
    batch = _batch()
    with torch.no_grad():
        got = model(**batch).logits
    real = batch["attention_mask"].bool()
    _close(got[real], _paper_emd(model, batch)[real], "emd logits vs the paper")
    with torch.no_grad():  # not the plain MLM head on the last layer's output
        last = model(**batch, heads=[]).last_hidden_state
        plain = MaskedLMHead.forward(model.heads["emd"], last)
    assert (plain - got)[real].abs().max() > 1e-2


@pytest.mark.numerics
@pytest.mark.parametrize("legacy", [True, False])
def test_emd_equals_microsofts_procedure_on_transformers_layers(legacy, tmp_path):
    """v3's attention (log buckets, shared maps, normalised table): transformers' DebertaV2
    loads the saved folder (as DebertaV2ForMaskedLM, skipping the absolute table); its last
    layer run as microsoft's EnhancedMaskDecoder runs it (``query_states``) gives our logits."""
    model = _model(position_buckets=8)
    model.config.extra["legacy"] = legacy  # the MLM head's names in the folder
    batch = _batch(20)
    folder = lmlab.save_pretrained(model, tmp_path / "emd")
    assert json.loads((folder / "config.json").read_text())["architectures"] == \
        ["DebertaV2ForMaskedLM"]
    theirs = transformers.DebertaV2ForMaskedLM.from_pretrained(folder).eval()
    encoder = theirs.deberta.encoder
    with torch.no_grad():
        hidden = theirs.deberta(**batch, output_hidden_states=True).hidden_states[-2]
        query = hidden + model.heads["emd"].position_embeddings.weight[:hidden.shape[1]]
        mask = encoder.get_attention_mask(batch["attention_mask"])
        relative = encoder.get_rel_pos(hidden)
        for layer in [encoder.layer[-1]] * 2:
            query = layer(hidden, mask, query_states=query, relative_pos=relative,
                          rel_embeddings=encoder.get_rel_embedding())[0]
        reference = (theirs.cls(query) if legacy else
                     theirs.lm_predictions(query, theirs.deberta.embeddings.word_embeddings))
        got = model(**batch).logits
    real = batch["attention_mask"].bool()
    _close(got[real], reference[real], "emd logits vs microsoft's procedure")

    plain = lmlab.from_pretrained(folder)  # off by default: the folder is an MLM checkpoint
    assert list(plain.heads) == ["mlm"]
    again = lmlab.from_pretrained(folder, head="emd")
    with torch.no_grad():
        assert torch.equal(again(**batch).logits, got)  # exact: same weights, same batch, same ops


def test_emd_refusals():
    with pytest.raises(LmlabError, match="position_biased_input"):
        _model(position_embedding="learned")
    bert = LanguageModel(preset("bert", "tiny", vocab_size=99))
    with pytest.raises(LmlabError, match="enhanced mask decoder"):
        bert.add_head("emd")
    model = _model(heads=("emd",))
    with pytest.raises(LmlabError, match="reruns the stack's last layer"):
        model.heads["emd"](torch.zeros(1, 3, 32))


# -- pretraining through the command line --------------------------------------------------------
@pytest.fixture(scope="module")
def shards(tmp_path_factory):
    from conftest import unigram_kjv_shards

    return unigram_kjv_shards(tmp_path_factory, "deberta-corpus")


def _pretrain(shards, out, objective: str, objective_args: dict, steps: int = 30,
              *more: object) -> list[dict]:
    """`lmlab pretrain --family deberta-v2` at a tiny size; returns the metrics rows."""
    from conftest import run_lmlab

    settings = {"hparams": {"objective_args": objective_args,
                            "model_args": {"hidden_size": 64, "num_hidden_layers": 2,
                                           "num_attention_heads": 4, "intermediate_size": 128,
                                           "position_buckets": 16}}}
    (out.parent / f"{out.name}.json").write_text(json.dumps(settings))
    result = run_lmlab("pretrain", "--config", out.parent / f"{out.name}.json", "--family",
                       "deberta-v2", "--size", "xsmall", "--objective", objective, "--shards",
                       shards, "--out", out, "--seq-len", 64, "--batch-size", 8, "--lr", 3e-3,
                       "--steps", steps, "--log-every", 10, "--eval-every", steps, "--seed", 0,
                       "--threads", 1, *more)
    assert result.returncode == 0, result.stderr[-2000:]
    return [json.loads(line) for line in (out / "metrics.jsonl").open()]


def test_mlm_pretraining_with_the_enhanced_mask_decoder(shards, tmp_path):
    """`--objective mlm` with ``enhanced_mask_decoder``: the loss falls and the run's folder is
    an MLM checkpoint with the absolute table (transformers loads it; lmlab reads the decoder
    back with head="emd")."""
    rows = _pretrain(shards, tmp_path / "run", "mlm", {"enhanced_mask_decoder": True})
    losses = [r["loss"] for r in rows if r["kind"] == "train"]
    assert losses[-1] < losses[0] - 0.5, losses
    model_dir = tmp_path / "run" / "model"
    assert json.loads((model_dir / "config.json").read_text())["architectures"] == \
        ["DebertaV2ForMaskedLM"]
    transformers.DebertaV2ForMaskedLM.from_pretrained(model_dir)
    model = lmlab.from_pretrained(model_dir, head="emd")
    batch = {"input_ids": torch.tensor([[2, 40, 41, 42, 3]])}
    with torch.no_grad():
        emd, plain = model(**batch).logits, lmlab.from_pretrained(model_dir)(**batch).logits
    assert emd.shape == plain.shape == (1, 5, model.config.vocab_size)
    assert not torch.allclose(emd, plain)  # the decoder, not the plain head, predicts


def test_emd_does_not_share_a_forward_pass():
    from lmlab.objectives import SpecialTokens, build_objective

    special = SpecialTokens(vocab_size=99, pad_id=0, cls_id=2, sep_id=3, mask_id=4)
    with pytest.raises(LmlabError, match="cannot share a forward pass"):
        build_objective("mlm,sop", special, enhanced_mask_decoder=True)


# -- DeBERTa-v3's gradient-disentangled embedding sharing ---------------------------------------
def _electra(sharing: str, **fields):
    """A v3-shaped discriminator with token types, its ELECTRA objective prepared, a batch."""
    from lmlab.objectives import SpecialTokens, build_objective

    special = SpecialTokens(vocab_size=99, pad_id=0, cls_id=2, sep_id=3, mask_id=4)
    objective = build_objective("electra", special, embedding_sharing=sharing,
                                generator_size=0.5, mask_prob=0.3)
    model = _model(heads=(), type_vocab_size=2, **fields).train()
    objective.prepare(model)
    batch = objective.corrupt(dict(_batch(), token_type_ids=torch.zeros(3, 14, dtype=torch.long)),
                              torch.Generator().manual_seed(0))
    return objective, model, batch


def test_gdes_stops_the_discriminators_gradient_at_the_generators_embeddings():
    """E_D = sg(E_G) + E_Delta: the discriminator's loss reaches E_Delta, not E_G, while with
    ELECTRA's sharing it reaches the one table; the generator's loss reaches E_G only."""
    objective, model, batch = _electra("gdes")
    own = objective.generator.transformer.embeddings
    assert set(objective.embedding_delta) == {"word_embeddings", "token_type_embeddings"}
    assert all(not d.any() for d in objective.embedding_delta.values())  # zero at the start
    assert torch.equal(own.word_embeddings.weight, model.transformer.embeddings.word_embeddings
                       .weight)  # exact: a copy
    assert own.word_embeddings.weight is not model.transformer.embeddings.word_embeddings.weight
    inputs = dict(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"], heads=[])
    with torch.no_grad():  # zero delta: the discriminator is the model as it was
        model.eval()
        plain = model(**inputs).last_hidden_state
        split = torch.func.functional_call(model, objective.discriminator_tables(), (), inputs)
        model.train()
    assert torch.equal(split.last_hidden_state, plain)  # exact: E_G + 0 is E_G's copy, same ops
    torch.manual_seed(0)
    objective.generator_weight = 0.0  # the discriminator's loss alone
    objective.compute_loss(model, batch).loss.backward()
    assert own.word_embeddings.weight.grad is None or not own.word_embeddings.weight.grad.any()
    assert objective.embedding_delta["word_embeddings"].grad.abs().sum() > 0
    assert model.transformer.embeddings.word_embeddings.weight.grad is None  # frozen: folded
    delta = objective.embedding_delta["word_embeddings"]
    with torch.no_grad():  # an optimiser step on the delta; reading the state folds it in
        delta.sub_(delta.grad)
    table = model.state_dict()["transformer.embeddings.word_embeddings.weight"]
    assert torch.equal(table, own.word_embeddings.weight + delta)  # exact: the fold is this sum
    objective.zero_grad()
    objective.generator_weight, objective.discriminator_weight = 1.0, 0.0
    objective.compute_loss(model, batch).loss.backward()
    assert own.word_embeddings.weight.grad.abs().sum() > 0
    assert not objective.embedding_delta["word_embeddings"].grad.any()

    shared, model, batch = _electra("shared")
    shared.generator_weight = 0.0
    shared.compute_loss(model, batch).loss.backward()
    assert shared.generator.transformer.embeddings.word_embeddings.weight.grad.abs().sum() > 0


def test_embedding_sharing_choices():
    objective, model, _ = _electra("none")
    own = objective.generator.transformer.embeddings.word_embeddings.weight
    assert own is not model.transformer.embeddings.word_embeddings.weight
    assert not objective.embedding_delta and model.transformer.embeddings.word_embeddings \
        .weight.requires_grad
    with pytest.raises(LmlabError, match="embedding_sharing"):
        _electra("partial")


# gdes (DeBERTa-v3's own) in the default suite; shared and none are ELECTRA's
# (test_objectives_training.py)
@pytest.mark.parametrize("sharing", [pytest.param("shared", marks=pytest.mark.slow), "gdes",
                                     pytest.param("none", marks=pytest.mark.slow)])
def test_electra_pretraining_with_each_embedding_sharing(sharing, shards, tmp_path):
    """`--objective electra` with ``embedding_sharing``: the loss falls; the run's model is a
    plain DebertaV2Model folder, under gdes holding E_G + E_Delta from the last checkpoint."""
    from safetensors.torch import load_file

    rows = _pretrain(shards, tmp_path / "run", "electra",
                     {"embedding_sharing": sharing, "generator_size": 0.5})
    losses = [r["loss"] for r in rows if r["kind"] == "train"]
    assert losses[-1] < losses[0] - 1.0, losses
    model_dir = tmp_path / "run" / "model"
    theirs = transformers.AutoModel.from_pretrained(model_dir)
    assert type(theirs).__name__ == "DebertaV2Model"
    if sharing != "gdes":
        return
    state = load_file(tmp_path / "run" / "checkpoints" / "step-30" / "objective.safetensors")
    folded = (state["generator.transformer.embeddings.word_embeddings.weight"]
              + state["embedding_delta.word_embeddings"])
    assert state["embedding_delta.word_embeddings"].abs().max() > 0  # the delta trained
    # exact: the same float32 sum the run wrote into the model's table before saving
    assert torch.equal(theirs.embeddings.word_embeddings.weight.detach(), folded)


def test_a_gdes_run_resumes_exactly(shards, tmp_path):
    """E_G and E_Delta live in the objective's checkpoint, the folded table in the model's: a
    run stopped at step 4 and resumed ends as the run that never stopped."""
    from safetensors.torch import load_file

    same = ("--save-every", 4, "--schedule", "constant", "--log-every", 1)
    args = {"embedding_sharing": "gdes", "generator_size": 0.5}
    whole = _pretrain(shards, tmp_path / "whole", "electra", args, 8, *same)
    _pretrain(shards, tmp_path / "split", "electra", args, 4, *same)
    split = _pretrain(shards, tmp_path / "split", "electra", args, 8, *same)  # resumes
    losses = lambda rows: [r["loss"] for r in rows if r["kind"] == "train"]  # noqa: E731
    assert losses(split) == losses(whole)
    a = load_file(tmp_path / "whole" / "model" / "model.safetensors")
    b = load_file(tmp_path / "split" / "model" / "model.safetensors")
    assert all(torch.equal(a[k], b[k]) for k in a)  # exact: a resumed run repeats the run's ops
