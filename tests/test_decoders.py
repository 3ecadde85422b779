"""GPT-2 and Llama on the shared core: config.json + safetensors both ways, outputs equal to
transformers' (random weights, tiny configs), the key/value cache, presets, the clm objective."""

from __future__ import annotations

import pytest
import torch
from conftest import assert_close_rounding, write_kjv_corpus

import lmlab
from lmlab.models.config import TransformerConfig
from lmlab.models.model import LanguageModel


def assert_same_outputs(actual: torch.Tensor, expected: torch.Tensor) -> None:
    """Ours vs transformers, or the cache vs the full sequence, on the same weights: other
    kernels and summation orders through 2 layers of sums of up to 64 terms (intermediate
    size). A swapped or missing tensor changes outputs by about their own size."""
    assert_close_rounding(actual, expected, terms=64, depth=2)


def tiny_config(family: str, **overrides) -> TransformerConfig:
    from lmlab.models.presets import family_config

    values = dict(vocab_size=97, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                  intermediate_size=64, max_position_embeddings=64)
    if family == "llama":
        values.update(num_key_value_heads=2, tie_word_embeddings=False, rope_theta=5000.0)
    values.update(overrides)
    return family_config(family, **values)


def randomise(model: torch.nn.Module) -> torch.nn.Module:
    """Random norms and biases too, so a swapped or missing tensor cannot go unnoticed."""
    generator = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "norm" in name and name.endswith("weight"):
                param.copy_(1 + 0.2 * torch.randn(param.shape, generator=generator))
            else:
                param.copy_(0.1 * torch.randn(param.shape, generator=generator))
    return model.eval()


def _inputs():
    ids = torch.tensor([[5, 17, 33, 2, 60, 71, 9, 44], [8, 90, 12, 3, 3, 3, 3, 3]])
    mask = torch.tensor([[1] * 8, [1] * 3 + [0] * 5])
    return ids, mask


@pytest.mark.numerics
@pytest.mark.parametrize("family", ["gpt2", "llama"])
@pytest.mark.parametrize("heads", [(), ("clm",)])
def test_save_matches_transformers(tmp_path, family, heads):
    import transformers

    config = tiny_config(family)
    ours = randomise(LanguageModel(config, heads=heads))
    lmlab.save_pretrained(ours, tmp_path)
    auto = transformers.AutoModelForCausalLM if heads else transformers.AutoModel
    theirs = auto.from_pretrained(tmp_path).eval()
    ids, mask = _inputs()
    with torch.no_grad():
        a = ours(input_ids=ids, attention_mask=mask, output_hidden_states=True)
        b = theirs(input_ids=ids, attention_mask=mask, output_hidden_states=True)
    keep = mask.bool()
    if heads:
        assert_same_outputs(a.logits[keep], b.logits[keep])
    else:
        assert_same_outputs(a.last_hidden_state[keep], b.last_hidden_state[keep])
    hidden_b = b.hidden_states
    assert len(a.hidden_states) == len(hidden_b) == config.num_hidden_layers + 1
    for x, y in zip(a.hidden_states, hidden_b):
        assert_same_outputs(x[keep], y[keep])


@pytest.mark.numerics
@pytest.mark.parametrize("family", ["gpt2", "llama"])
def test_load_from_transformers(tmp_path, family):
    import transformers

    import lmlab

    if family == "gpt2":
        hf_config = transformers.GPT2Config(vocab_size=97, n_embd=32, n_layer=2, n_head=4,
                                            n_positions=64, n_inner=48)
    else:
        hf_config = transformers.LlamaConfig(vocab_size=97, hidden_size=32, num_hidden_layers=2,
                                             num_attention_heads=4, num_key_value_heads=1,
                                             intermediate_size=48, max_position_embeddings=64,
                                             rope_theta=20000.0, tie_word_embeddings=True)
    theirs = randomise(transformers.AutoModelForCausalLM.from_config(hf_config))
    theirs.save_pretrained(tmp_path)
    ours = lmlab.from_pretrained(tmp_path)
    assert list(ours.heads) == ["clm"]
    assert ours.config.family == family
    ids, mask = _inputs()
    with torch.no_grad():
        a = ours(input_ids=ids, attention_mask=mask).logits
        b = theirs(input_ids=ids, attention_mask=mask).logits
    keep = mask.bool()
    assert_same_outputs(a[keep], b[keep])


@pytest.mark.numerics
@pytest.mark.parametrize("family", ["gpt2", "llama"])
def test_cache_steps_equal_full_sequence_and_transformers(tmp_path, family):
    import transformers

    config = tiny_config(family)
    ours = randomise(LanguageModel(config, heads=("clm",)))
    lmlab.save_pretrained(ours, tmp_path)
    theirs = transformers.AutoModelForCausalLM.from_pretrained(tmp_path).eval()
    ids = torch.tensor([[5, 17, 33, 2, 60, 71, 9, 44]])
    with torch.no_grad():
        full = ours(input_ids=ids).logits
        out = ours(input_ids=ids[:, :3], use_cache=True)
        steps, cache = [out.logits], out.past_key_values
        hf = theirs(input_ids=ids[:, :3], use_cache=True)
        hf_steps, hf_cache = [hf.logits], hf.past_key_values
        for t in range(3, ids.shape[1]):
            out = ours(input_ids=ids[:, t:t + 1], past_key_values=cache, use_cache=True)
            steps.append(out.logits)
            hf = theirs(input_ids=ids[:, t:t + 1], past_key_values=hf_cache, use_cache=True)
            hf_steps.append(hf.logits)
    stepped = torch.cat(steps, dim=1)
    assert_same_outputs(stepped, full)
    assert_same_outputs(stepped, torch.cat(hf_steps, dim=1))


def test_gpt2_config_round_trip_and_names(tmp_path):
    import json

    from lmlab.interop.hf import load_config

    config = tiny_config("gpt2")
    lmlab.save_pretrained(LanguageModel(config, heads=("clm",)), tmp_path)
    hf = json.loads((tmp_path / "config.json").read_text())
    assert hf["architectures"] == ["GPT2LMHeadModel"] and hf["activation_function"] == "gelu_new"
    from safetensors import safe_open

    with safe_open(str(tmp_path / "model.safetensors"), "pt") as handle:
        keys = set(handle.keys())
        assert tuple(handle.get_tensor("transformer.h.0.attn.c_attn.weight").shape) == (32, 96)
    assert "lm_head.weight" not in keys  # tied: transformers re-ties it
    assert {"transformer.wte.weight", "transformer.wpe.weight", "transformer.ln_f.weight",
            "transformer.h.1.mlp.c_fc.weight"} <= keys
    loaded, _, _ = load_config(tmp_path)
    for name in ("hidden_size", "num_hidden_layers", "norm_eps", "type_vocab_size", "causal",
                 "pre_norm", "final_norm", "embedding_norm", "hidden_act"):
        assert getattr(loaded, name) == getattr(config, name), name


def test_presets():
    from lmlab.models.presets import list_presets, preset

    small = preset("gpt2", "small")
    assert (small.num_hidden_layers, small.hidden_size, small.vocab_size) == (12, 768, 50257)
    # GPT-2 small has 124M parameters with its tied head.
    assert abs(small.num_parameters() - 124_439_808) < 1000  # tol: an integer count
    cpu = preset("gpt2", "6x384")
    assert (cpu.num_hidden_layers, cpu.hidden_size, cpu.num_attention_heads) == (6, 384, 6)
    smol = preset("llama", "smollm2-135m")
    assert (smol.num_hidden_layers, smol.hidden_size, smol.num_attention_heads,
            smol.num_key_value_heads, smol.intermediate_size) == (30, 576, 9, 3, 1536)
    assert abs(smol.num_parameters() - 134_515_008) < 1000  # tol: an integer count
    assert ("gpt2", "medium") in list_presets()


# ---------------------------------------------------------------------------- objectives
def _special(vocab: int = 97):
    from lmlab.objectives.special_tokens import SpecialTokens

    return SpecialTokens(vocab_size=vocab, pad_id=0, cls_id=1, sep_id=2, bos_id=1, eos_id=2)


@pytest.mark.numerics
@pytest.mark.parametrize("family", ["gpt2", "llama"])
def test_clm_objective_loss_and_registry(family):
    from lmlab.objectives.registry import available_objectives, build_objective

    assert {"clm", "prefix-lm"} <= set(available_objectives())
    objective = build_objective("clm", _special())
    model = randomise(LanguageModel(tiny_config(family), heads=()))
    objective.prepare(model)
    assert "clm" in model.heads
    ids = torch.tensor([[5, 17, 33, 2, 60, 71, 9, 44]])
    batch = objective.corrupt({"input_ids": ids, "attention_mask": torch.ones_like(ids)},
                              torch.Generator().manual_seed(0))
    result = objective.compute_loss(model, batch)
    expected = model(input_ids=ids, labels=ids).loss
    # The fused, chunked loss vs logits + cross-entropy: other sums over the 97-word vocabulary.
    assert_close_rounding(result.loss, expected, terms=97, depth=2)
    assert result.num_predictions == 7 and 0.0 <= result.metrics["clm_accuracy"] <= 1.0
    result.loss.backward()
    assert model.transformer.embeddings.word_embeddings.weight.grad is not None


@pytest.mark.numerics
@pytest.mark.parametrize("family", ["gpt2", "llama"])
def test_clm_document_mask_isolates_packed_documents(family):
    from lmlab.objectives.causal import CausalLM

    objective = CausalLM(_special(), separate_documents=True)
    model = randomise(LanguageModel(tiny_config(family), heads=("clm",)))
    ids = torch.tensor([[5, 17, 33, 2, 60, 71, 9, 44]])  # doc A = 5 17 33 </s>, doc B = rest
    batch = objective.corrupt({"input_ids": ids}, torch.Generator())
    assert batch["document_ids"].tolist() == [[0, 0, 0, 0, 1, 1, 1, 1]]
    assert batch["labels"].tolist() == [[5, 17, 33, 2, -100, 71, 9, 44]]
    positions = torch.arange(8)[None]
    with torch.no_grad():
        packed = model(input_ids=ids, attention_mask=batch["attention_mask"],
                       position_ids=positions).last_hidden_state
        alone = model(input_ids=ids[:, 4:], position_ids=positions[:, 4:]).last_hidden_state
        first = model(input_ids=ids[:, :4]).last_hidden_state
    assert_same_outputs(packed[:, 4:], alone)
    assert_same_outputs(packed[:, :4], first)


@pytest.mark.numerics
def test_prefix_lm_sees_prefix_both_ways():
    from lmlab.objectives.causal import PrefixLM

    objective = PrefixLM(_special(), min_prefix=0.5, max_prefix=0.5)
    model = randomise(LanguageModel(tiny_config("llama"), heads=("clm",)))
    ids = torch.tensor([[5, 17, 33, 3, 60, 71, 9, 44]])
    batch = objective.corrupt({"input_ids": ids}, torch.Generator().manual_seed(0))
    assert batch["prefix_lengths"].tolist() == [4]
    assert batch["labels"].tolist() == [[-100] * 4 + [60, 71, 9, 44]]
    changed_prefix, changed_target = ids.clone(), ids.clone()
    changed_prefix[0, 3] = 50
    changed_target[0, 6] = 50
    with torch.no_grad():
        run = lambda x: model(input_ids=x, attention_mask=batch["attention_mask"]  # noqa: E731
                              ).last_hidden_state
        base = run(ids)
        assert not torch.allclose(run(changed_prefix)[0, 0], base[0, 0])  # bidirectional
        assert_close_rounding(run(changed_target)[0, :6], base[0, :6], terms=64,
                              depth=2)  # causal after the prefix
    assert float(objective.compute_loss(model, batch).loss.detach()) > 0



def test_pretrain_cli_gpt2_clm(tmp_path, minilm_dir):
    """`lmlab pretrain --family gpt2 --objective clm` for a few steps on real KJV shards."""

    import lmlab
    from lmlab.cli import main
    from lmlab.data.shards import build_shards
    from lmlab.tokenization.tokenizer import Tokenizer
    from lmlab.training.metrics_log import read_metrics

    corpus = write_kjv_corpus(tmp_path / "corpus", train=10, validation=2)
    shards = tmp_path / "shards"
    build_shards(Tokenizer.from_pretrained(minilm_dir), corpus, shards, shard_tokens=8192,
                 show_progress=False)
    out = tmp_path / "run"
    args = ["pretrain", "--family", "gpt2", "--size", "2x128", "--objective", "clm",
            "--shards", str(shards), "--seq-len", "32", "--batch-size", "4", "--lr", "1e-3",
            "--warmup", "1", "--steps", "3", "--eval-every", "3", "--eval-batches", "1",
            "--log-every", "1", "--out", str(out), "--no-cost"]
    assert main(args) == 0
    records = list(read_metrics(out / "metrics.jsonl"))
    train = [r for r in records if r["kind"] == "train"]
    assert [r["step"] for r in train] == [1, 2, 3]
    model = lmlab.from_pretrained(out / "model")
    assert model.config.family == "gpt2" and model.config.causal and "clm" in model.heads


@pytest.mark.numerics
def test_clm_loss_equals_transformers_with_padding_labels(tmp_path):
    """The causal-LM loss (labels shifted, -100 ignored) equals GPT2LMHeadModel's."""
    import transformers

    import lmlab

    config = transformers.GPT2Config(vocab_size=101, n_embd=32, n_layer=2, n_head=4,
                                     n_positions=32)
    reference = transformers.GPT2LMHeadModel(config).eval()
    reference.save_pretrained(tmp_path)
    ours = lmlab.from_pretrained(tmp_path)
    ids = torch.randint(0, 101, (3, 11))
    labels = ids.clone()
    labels[1, 7:] = -100
    with torch.no_grad():
        theirs = reference(input_ids=ids, labels=labels).loss
        mine = ours(input_ids=ids, labels=labels).loss
    # Mean of 28 token losses, each a log-sum-exp over 101 logits: rounding of the loss's size.
    assert_close_rounding(float(mine), float(theirs), terms=101, depth=3)
