"""GGUF writing of GPT-2 (llama.cpp's ``gpt2`` architecture): a tiny random GPT-2 on SmolLM2's
real byte-level BPE, written with llama.cpp's gpt2 tensor names (the query, key and value
projections fused into ``attn_qkv`` as llama.cpp's converter fuses ``c_attn``), read back by
lmlab and by transformers' GGUF loader with the same weights, logits and greedy continuations
at F32; quantised matrices equal to the gguf package's own quantiser; the command line in a
fresh process."""

from __future__ import annotations

import pytest
import torch
from conftest import assert_close_rounding, run_lmlab
from test_gguf_writer import TEXT, dequantised_copy, logits

import lmlab
from lmlab.formats.gguf import GGUFFile
from lmlab.generation.generate import generate
from lmlab.interop.gguf import load_gguf_model
from lmlab.interop.gguf_writer import write_gguf
from lmlab.models.model import LanguageModel
from lmlab.models.presets import family_config
from lmlab.utils.errors import LmlabError


@pytest.fixture(scope="module")
def tokenizer(smollm2_gguf):
    from lmlab.tokenization.tokenizer import Tokenizer

    return Tokenizer.from_pretrained(smollm2_gguf)


def tiny_gpt2(tied: bool = True, **overrides) -> LanguageModel:
    """A random 2-layer GPT-2 (hidden 64, 4 heads) on SmolLM2's vocabulary. GPT-2's own 1,024
    positions and 4x feed-forward: what transformers' GGUF loader builds (see test below)."""
    torch.manual_seed(0)
    values = dict(vocab_size=49152, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                  intermediate_size=256, max_position_embeddings=1024, initializer_range=0.2,
                  tie_word_embeddings=tied, hidden_dropout_prob=0.0,
                  attention_probs_dropout_prob=0.0)
    return LanguageModel(family_config("gpt2", **{**values, **overrides}), heads=("clm",)).eval()


def llama_cpp_gpt2_names(layers: int, tied: bool) -> set[str]:
    """The tensor names llama.cpp's gpt2 graph reads, from the gguf package's tables."""
    from gguf.constants import MODEL_ARCH, MODEL_TENSORS, TENSOR_NAMES

    names = set()
    for tensor in MODEL_TENSORS[MODEL_ARCH.GPT2]:
        base = TENSOR_NAMES[tensor]
        if base == "output" and tied:
            continue
        kinds = ("weight",) if base in ("token_embd", "position_embd", "output") \
            else ("weight", "bias")
        for layer in range(layers if "{bid}" in base else 1):
            names |= {f"{base.format(bid=layer)}.{kind}" for kind in kinds}
    return names


@pytest.mark.parametrize("tied", [True, False])
def test_f32_round_trip_is_exact(tmp_path, tokenizer, tied):
    model = tiny_gpt2(tied, intermediate_size=96, max_position_embeddings=80)  # not 4x, not 1024
    path = write_gguf(model, tmp_path / "gpt2.gguf", tokenizer, "F32", show_progress=False)
    with GGUFFile(path) as file:
        assert set(file.tensors) == llama_cpp_gpt2_names(2, tied)
        assert file.metadata["general.architecture"] == "gpt2"
        assert file.tensors["blk.0.attn_qkv.weight"].shape == (3 * 64, 64)  # (3H, in)
        q_rows = file.tensor("blk.1.attn_qkv.weight")[64:128]  # the key rows follow the query's
        assert torch.equal(torch.from_numpy(q_rows.copy()),  # exact: F32 rows copied
                           model.transformer.layers[1].attention.k_proj.weight.detach())
        assert file.metadata["gpt2.feed_forward_length"] == 96
        assert file.metadata["gpt2.context_length"] == 80
    loaded = load_gguf_model(path)
    got = dict(loaded.named_parameters())
    for name, param in model.named_parameters():
        assert torch.equal(got[name], param), name  # exact: F32 copy
    for field in ("family", "vocab_size", "hidden_size", "num_hidden_layers",
                  "num_attention_heads", "intermediate_size", "max_position_embeddings",
                  "tie_word_embeddings", "attention_bias", "mlp_bias", "hidden_act",
                  "position_embedding", "norm_type"):
        assert getattr(loaded.config, field) == getattr(model.config, field), field
    # tol: stored as float32
    assert loaded.config.norm_eps == pytest.approx(model.config.norm_eps, rel=1e-7)
    ids = torch.tensor([tokenizer.encode(TEXT)])
    assert_close_rounding(logits(loaded, ids), logits(model, ids), terms=96, depth=2)
    prompt = ids[:, :8]
    assert torch.equal(generate(loaded, prompt, max_new_tokens=12, eos_token_id=2),
                       generate(model, prompt, max_new_tokens=12, eos_token_id=2))


@pytest.mark.parametrize("qtype", ["Q8_0", "Q4_0"])
def test_quantised_gpt2_equals_the_gguf_quantiser(tmp_path, tokenizer, qtype):
    """A block never spans two rows, so quantising the fused attn_qkv equals quantising the
    query, key and value matrices one by one: every weight read back (float32 path) is the gguf
    package's quantise -> dequantise of ours. Kept in blocks, the fused rows split into three
    block-quantised maps with their biases, and the logits are the float32 path's."""
    from lmlab.models.quantised import BlockQuantLinear

    model = tiny_gpt2()
    path = write_gguf(model, tmp_path / f"gpt2-{qtype}.gguf", tokenizer, qtype,
                      show_progress=False)
    loaded = load_gguf_model(path, dequantize=True)
    got = dict(loaded.named_parameters())
    for name, param in dequantised_copy(model, qtype).named_parameters():
        assert torch.equal(got[name], param), name  # exact: gguf's ops on both sides
    blocks = load_gguf_model(path)
    key = blocks.transformer.layers[1].attention.k_proj
    assert isinstance(key, BlockQuantLinear) and key.bias is not None
    ids = torch.tensor([tokenizer.encode(TEXT)])
    assert_close_rounding(logits(blocks, ids), logits(loaded, ids), terms=256, depth=2)


def test_transformers_reads_the_gpt2_file_with_the_same_continuation(tmp_path, tokenizer):
    transformers = pytest.importorskip("transformers")
    model = tiny_gpt2()
    write_gguf(model, tmp_path / "gpt2.gguf", tokenizer, "F32", show_progress=False)
    theirs = transformers.AutoModelForCausalLM.from_pretrained(
        str(tmp_path), gguf_file="gpt2.gguf", dtype=torch.float32).eval()
    assert type(theirs).__name__ == "GPT2LMHeadModel"
    ids = torch.tensor([tokenizer.encode(TEXT)])
    assert_close_rounding(logits(theirs, ids), logits(model, ids), terms=96, depth=2)
    prompt = ids[:, :8]
    ours = generate(model, prompt, max_new_tokens=20, eos_token_id=2)
    hf = theirs.generate(prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=20,
                         do_sample=False, eos_token_id=2, pad_token_id=2)
    assert hf.tolist() == ours.tolist()
    assert ours.shape[1] > prompt.shape[1] + 5  # a real continuation, not an early EOS


def test_gpt2_settings_a_gguf_cannot_say_are_refused(tmp_path, tokenizer):
    out = tmp_path / "x.gguf"
    with pytest.raises(LmlabError, match="hidden_act='gelu'"):  # llama.cpp's gpt2: tanh GELU
        write_gguf(tiny_gpt2(hidden_act="gelu"), out, tokenizer)
    model = tiny_gpt2()
    attention = model.transformer.layers[0].attention
    attention.v_proj.weight = torch.nn.Parameter(attention.v_proj.weight[:32].clone())
    with pytest.raises(LmlabError, match="not those of a plain gpt2"):
        write_gguf(model, out, tokenizer)
    # heads pruned alike in every layer: gpt2's GGUF has no head width, readers take hidden /
    # heads (16 * 2 != 64), so the file would not load
    from lmlab.compress.heads import prune_heads

    pruned = prune_heads(tiny_gpt2(), {0: [1, 3], 1: [0, 2]})
    assert (pruned.config.num_attention_heads, pruned.config.head_dim) == (2, 16)
    with pytest.raises(LmlabError, match="head_dim=16 with 2 heads"):
        write_gguf(pruned, out, tokenizer)
    assert not out.exists()


@pytest.mark.slow  # a fresh process (the Llama CLI test runs by default)
def test_cli_writes_a_gpt2_file_another_process_reads(tmp_path, tokenizer):
    model = tiny_gpt2(tied=False)
    folder = tmp_path / "tiny-gpt2"
    lmlab.save_pretrained(model, folder)
    tokenizer.save_pretrained(folder)
    out = tmp_path / "tiny-gpt2-f32.gguf"
    result = run_lmlab("export", "gguf", folder, out, "--type", "f32")
    assert result.returncode == 0, result.stderr[-2000:]
    loaded = load_gguf_model(out)
    for name, param in model.named_parameters():
        assert torch.equal(dict(loaded.named_parameters())[name], param), name  # exact: F32 copy
