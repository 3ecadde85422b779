"""RoPE scaling (linear, dynamic NTK, YaRN, Llama 3's) on Llama: frequencies as transformers
computes them, logits equal to transformers' at twice the trained context both ways (random
weights, a padded batch), dynamic NTK's cache steps and generation, a fresh-process reload."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import torch
from conftest import assert_close_rounding
from test_decoders import randomise
from test_gguf_writer import tiny_llama

import lmlab
from lmlab.models.core.rope import check_rope_scaling, rope_frequencies
from lmlab.models.model import LanguageModel
from lmlab.models.presets import family_config
from lmlab.utils.errors import LmlabError

MAX_POSITIONS = 32  # the trained context; the inputs are twice as long
SCALINGS = {  # head_dim 16 at theta 100: each type's regions (kept, ramped, scaled) all occur
    "linear": {"rope_type": "linear", "factor": 2.0},
    "dynamic": {"rope_type": "dynamic", "factor": 2.0},
    "yarn": {"rope_type": "yarn", "factor": 2.0, "original_max_position_embeddings": 16},
    "yarn-mscale": {"rope_type": "yarn", "factor": 2.0, "original_max_position_embeddings": 16,
                    "beta_fast": 16, "beta_slow": 2, "mscale": 0.8, "mscale_all_dim": 0.5,
                    "truncate": False},
    "llama3": {"rope_type": "llama3", "factor": 4.0, "low_freq_factor": 1.0,
               "high_freq_factor": 2.0, "original_max_position_embeddings": 16},
}


def hf_llama(scaling: dict, tmp_path):
    """A random-weight LlamaForCausalLM with ``scaling``, saved to ``tmp_path``."""
    import transformers

    config = transformers.LlamaConfig(
        vocab_size=97, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, intermediate_size=64, max_position_embeddings=MAX_POSITIONS,
        rope_parameters={"rope_theta": 100.0, **scaling}, tie_word_embeddings=False)
    model = randomise(transformers.LlamaForCausalLM(config))
    model.save_pretrained(tmp_path)
    return model


def padded_batch() -> tuple[torch.Tensor, torch.Tensor]:
    """Two rows of 2 x MAX_POSITIONS tokens, the second right-padded after 40."""
    ids = torch.randint(3, 97, (2, 2 * MAX_POSITIONS), generator=torch.Generator().manual_seed(0))
    mask = torch.ones_like(ids)
    mask[1, 40:] = 0
    return ids, mask


def assert_same_logits(actual: torch.Tensor, expected: torch.Tensor) -> None:
    """Ours vs transformers: other kernels through 2 layers of sums of up to 64 terms."""
    assert_close_rounding(actual, expected, terms=64, depth=2)


@pytest.mark.parametrize("name", list(SCALINGS))
def test_frequencies_equal_transformers(name):
    import transformers
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    scaling = SCALINGS[name]
    hf = transformers.LlamaConfig(hidden_size=64, num_attention_heads=4,
                                  max_position_embeddings=MAX_POSITIONS,
                                  rope_parameters={"rope_theta": 100.0, **scaling})
    ours = check_rope_scaling(scaling, MAX_POSITIONS)
    for seq_len in (None, torch.tensor(3 * MAX_POSITIONS)):  # dynamic NTK's moves with length
        expected, factor = ROPE_INIT_FUNCTIONS[scaling["rope_type"]](hf, None, seq_len=seq_len)
        actual, our_factor = rope_frequencies(16, 100.0, ours, MAX_POSITIONS, seq_len=seq_len)
        assert torch.equal(actual, expected) and our_factor == factor  # exact: the same ops


@pytest.mark.numerics
@pytest.mark.parametrize("name", list(SCALINGS))
def test_logits_at_twice_the_context_both_ways(tmp_path, name):
    import transformers

    theirs = hf_llama(SCALINGS[name], tmp_path / "theirs")
    ours = lmlab.from_pretrained(tmp_path / "theirs")
    assert ours.config.rope_scaling["rope_type"] == SCALINGS[name]["rope_type"]
    ids, mask = padded_batch()
    keep = mask.bool()
    with torch.no_grad():
        expected = theirs(input_ids=ids, attention_mask=mask).logits
        assert_same_logits(ours(input_ids=ids, attention_mask=mask).logits[keep], expected[keep])
    lmlab.save_pretrained(ours, tmp_path / "ours")  # and back: transformers builds the same
    saved = json.loads((tmp_path / "ours" / "config.json").read_text())["rope_parameters"]
    assert saved == {"rope_theta": 100.0, **ours.config.rope_scaling}
    again = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "ours").eval()
    with torch.no_grad():
        assert_same_logits(again(input_ids=ids, attention_mask=mask).logits[keep], expected[keep])


@pytest.mark.numerics
def test_dynamic_ntk_cache_steps_and_generation(tmp_path):
    """Dynamic NTK changes its frequencies as the sequence passes the trained context: each
    cached step (keys rotated at the frequencies of their time) equals transformers'."""
    from lmlab.generation.generate import generate

    theirs = hf_llama(SCALINGS["dynamic"], tmp_path)
    ours = lmlab.from_pretrained(tmp_path)
    ids = padded_batch()[0][:1]
    prompt = 24
    with torch.no_grad():
        out = ours(input_ids=ids[:, :prompt], use_cache=True)
        hf = theirs(input_ids=ids[:, :prompt], use_cache=True)
        steps, hf_steps = [out.logits], [hf.logits]
        for t in range(prompt, ids.shape[1]):
            out = ours(input_ids=ids[:, t:t + 1], past_key_values=out.past_key_values,
                       use_cache=True)
            hf = theirs(input_ids=ids[:, t:t + 1], past_key_values=hf.past_key_values,
                        use_cache=True)
            steps.append(out.logits)
            hf_steps.append(hf.logits)
        assert_same_logits(torch.cat(steps, dim=1), torch.cat(hf_steps, dim=1))
        ours_tokens = generate(ours, ids[:, :prompt], max_new_tokens=40, min_new_tokens=40)
        hf_tokens = theirs.generate(ids[:, :prompt], max_new_tokens=40, do_sample=False,
                                    min_new_tokens=40, pad_token_id=0)
    assert ours_tokens.tolist() == hf_tokens.tolist()  # tol: greedy argmax, margins >> rounding
    # transformers keeps the longest sequence's frequencies until one fits the trained context
    with torch.no_grad():
        for length in (40, 20, 40):  # kept from 64, reset, recomputed for 40
            assert_same_logits(ours(input_ids=ids[:, :length]).logits,
                               theirs(input_ids=ids[:, :length]).logits)


@pytest.mark.numerics
def test_fresh_process_reload(tmp_path):
    config = family_config(
        "llama", vocab_size=97, hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
        intermediate_size=32, max_position_embeddings=16, rope_scaling=SCALINGS["yarn"])
    model = randomise(LanguageModel(config, heads=("clm",)))
    lmlab.save_pretrained(model, tmp_path)
    ids = torch.arange(3, 35).unsqueeze(0)  # 2 x 16 positions
    with torch.no_grad():
        expected = model(input_ids=ids).logits
    torch.save(ids, tmp_path / "ids.pt")
    code = ("import sys, torch, lmlab; m = lmlab.from_pretrained(sys.argv[1]); "
            "ids = torch.load(sys.argv[1] + '/ids.pt'); print(m.config.rope_scaling); "
            "torch.save(m(input_ids=ids).logits.detach(), sys.argv[1] + '/logits.pt')")
    result = subprocess.run([sys.executable, "-c", code, str(tmp_path)], capture_output=True,
                            text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert "'yarn'" in result.stdout
    assert torch.equal(torch.load(tmp_path / "logits.pt"), expected)  # exact: same ops, same weights


def test_refusals():
    from lmlab.models.families import get_family

    hf = {"vocab_size": 10, "hidden_size": 8, "num_hidden_layers": 1, "num_attention_heads": 2,
          "intermediate_size": 16}
    with pytest.raises(LmlabError, match="'longrope' is not supported") as error:
        get_family("llama").config_from_hf({**hf, "rope_scaling": {"type": "longrope"}})
    assert "linear, dynamic, yarn, llama3" in error.value.fix
    with pytest.raises(LmlabError, match="missing high_freq_factor"):
        check_rope_scaling({"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0}, 64)
    with pytest.raises(LmlabError, match="unknown keys low_freq_factor"):
        check_rope_scaling({"rope_type": "linear", "factor": 2.0, "low_freq_factor": 1.0}, 64)
    with pytest.raises(LmlabError, match="not a positive number"):
        check_rope_scaling({"rope_type": "dynamic", "factor": "2"}, 64)
    with pytest.raises(LmlabError, match="needs position_embedding='rotary'"):
        family_config("gpt2", rope_scaling={"rope_type": "linear",
                                                                 "factor": 2.0})
    # transformers 4's spelling ("type", rope_theta at the top) reads the same
    config = get_family("llama").config_from_hf(
        {**hf, "rope_theta": 500.0, "rope_scaling": {"type": "linear", "factor": 2.0}})
    assert (config.rope_theta, config.rope_scaling) == (500.0, {"rope_type": "linear",
                                                                "factor": 2.0})


@pytest.fixture(scope="module")
def tokenizer(smollm2_gguf):
    from lmlab.tokenization.tokenizer import Tokenizer

    return Tokenizer.from_pretrained(smollm2_gguf)


@pytest.mark.parametrize("name", ["linear", "yarn"])
def test_gguf_round_trip(tmp_path, tokenizer, name):
    """llama.cpp's rope.scaling keys (type, factor, original_context_length, YaRN's betas):
    written, read back as the same rope_scaling, the same logits (past YaRN's original 16)."""
    from lmlab.formats.gguf import read_metadata
    from lmlab.interop.gguf import load_gguf_model
    from lmlab.interop.gguf_writer import write_gguf

    scaling = {**SCALINGS[name], "beta_fast": 16.0, "beta_slow": 2.0} if name == "yarn" \
        else SCALINGS[name]
    model = tiny_llama(False, rope_scaling=scaling)
    path = write_gguf(model, tmp_path / "tiny.gguf", tokenizer, "F32", show_progress=False)
    assert read_metadata(path)["llama.rope.scaling.type"] == name
    loaded = load_gguf_model(path)
    assert loaded.config.rope_scaling == model.config.rope_scaling
    ids = torch.arange(3, 3 + 2 * MAX_POSITIONS).unsqueeze(0)
    with torch.no_grad():
        assert torch.equal(loaded(input_ids=ids).logits,
                           model(input_ids=ids).logits)  # exact: F32 copies, the same ops


@pytest.mark.parametrize("name", ["dynamic", "llama3", "yarn-mscale"])
def test_gguf_refuses_what_llama_cpp_cannot_say(tmp_path, tokenizer, name):
    from lmlab.interop.gguf import config_from_gguf
    from lmlab.interop.gguf_writer import write_gguf

    model = tiny_llama(False, rope_scaling=SCALINGS[name])
    with pytest.raises(LmlabError, match="no GGUF keys"):
        write_gguf(model, tmp_path / "tiny.gguf", tokenizer, "F32", show_progress=False)
    assert not (tmp_path / "tiny.gguf").exists()
    metadata = {"general.architecture": "llama", "llama.vocab_size": 97,
                "llama.embedding_length": 64, "llama.block_count": 1,
                "llama.attention.head_count": 4, "llama.feed_forward_length": 64}
    with pytest.raises(LmlabError, match="rope_freqs tensor"):  # Llama 3.1's, converted
        config_from_gguf(metadata, {"rope_freqs.weight", "token_embd.weight"})
    with pytest.raises(LmlabError, match="yarn_log_multiplier"):
        config_from_gguf({**metadata, "llama.rope.scaling.type": "yarn",
                          "llama.rope.scaling.yarn_log_multiplier": 0.1})


def test_a_family_without_rope_scaling_saves_in_lmlab_format(tmp_path):
    """A rotary encoder (RoFormer's config.json has no RoPE scaling) with llama3 scaling: not
    written as a RoFormer that would load as another model, but in lmlab's own format."""
    config = family_config("roformer", vocab_size=50, hidden_size=32, num_hidden_layers=1,
                           num_attention_heads=2, intermediate_size=32,
                           max_position_embeddings=32, rope_scaling=SCALINGS["llama3"])
    from lmlab.interop.native import save_model

    model = randomise(LanguageModel(config, heads=("mlm",)))
    assert save_model(model, tmp_path)[1] == "lmlab"
    ids = torch.arange(1, 49).unsqueeze(0)  # 1.5 x 32 positions
    with torch.no_grad():
        assert torch.equal(lmlab.from_pretrained(tmp_path)(input_ids=ids).logits,
                           model(input_ids=ids).logits)  # exact: same weights and ops
