"""GGUF weights kept in their Q4_0/Q4_1/Q8_0 blocks (lmlab.models.quantised): each block format
against gguf's dequantisation + matmul, tiny Llamas of each format and the real SmolLM2 Q4_1
file against the float32 reference path (``dequantize=True``), saving, a fresh process, and
the memory the blocks save."""

from __future__ import annotations

import json
import subprocess
import sys

import gguf
import numpy as np
import pytest
import torch
from conftest import assert_close_rounding, assert_greedy_agrees, rounding_tolerance
from test_gguf import gguf_dequantised, tiny_llama, write_tiny_gguf

from lmlab.formats.gguf import GGUFFile
from lmlab.interop.gguf import block_codes, load_gguf_model
from lmlab.models import quantised
from lmlab.models.quantised import BlockQuantEmbedding, BlockQuantLinear, dequantized

FORMATS = ("Q4_0", "Q4_1", "Q8_0")


@pytest.fixture(scope="module")
def block_file(tmp_path_factory):
    """One tensor of each format, 40 rows (not a multiple of the 16 interleaved) x 96 inputs,
    rows of very different sizes."""
    rng = np.random.default_rng(0)
    path = tmp_path_factory.mktemp("blocks") / "t.gguf"
    writer = gguf.GGUFWriter(str(path), "llama")
    for kind in FORMATS:
        values = rng.standard_normal((40, 96)) * rng.uniform(0.01, 10, (40, 1))
        data = gguf.quants.quantize(values.astype(np.float32), gguf.GGMLQuantizationType[kind])
        writer.add_tensor(kind, data, raw_shape=data.shape,
                          raw_dtype=gguf.GGMLQuantizationType[kind])
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


@pytest.mark.parametrize("kind", FORMATS)
@pytest.mark.parametrize("parallel", [False, True])
def test_each_block_format_against_dequantise_and_matmul(block_file, kind, parallel,
                                                          monkeypatch):
    """The codes stand for exactly gguf's dequantised weights; products of 1, 3 and 2 x 5 rows
    (serial and threaded kernel) equal x @ W.T up to float32 rounding of 96-term sums."""
    monkeypatch.setattr(quantised, "PARALLEL_WORK", 0 if parallel else 2 ** 62)
    torch.set_num_threads(2)  # the threaded kernel shares the rows (conftest restores threads)
    with GGUFFile(block_file) as file:
        expected = torch.from_numpy(gguf_dequantised(file, kind))
        linear = BlockQuantLinear(*block_codes(file, kind))
    assert (linear.bits, linear.out_features, linear.in_features) == \
        (8 if kind == "Q8_0" else 4, 40, 96)
    assert linear.scales.dtype == np.float16  # as the file stores them (Q4_0's -8 d too)
    assert torch.equal(linear.dequantize(), expected)  # exact: products of fp16 and small ints
    for shape in ((1, 96), (3, 96), (2, 5, 96)):
        x = torch.randn(shape)
        with torch.no_grad():
            got = linear(x)
        assert got.shape == (*shape[:-1], 40)
        assert_close_rounding(got, x @ expected.T, terms=96)


@pytest.mark.parametrize("bits", [4, 8])
def test_scales_float16_cannot_hold_stay_float32(bits):
    """Scales or minima that float16 would round are kept as float32, and the product is
    still x @ W.T of the weight they stand for (batch 1 and 8)."""
    rng = np.random.default_rng(1)
    codes = rng.integers(0, 256, (24, 3, 16), np.uint8) if bits == 4 else \
        rng.integers(-128, 128, (24, 3, 32), np.int8)
    scales = rng.uniform(0.01, 0.1, (24, 3)).astype(np.float32)
    mins = rng.uniform(-1, 0, (24, 3)).astype(np.float32) if bits == 4 else None
    linear = BlockQuantLinear(codes, scales, mins)
    assert linear.scales.dtype == np.float32
    weight = linear.dequantize()
    for batch in (1, 8):
        x = torch.randn(batch, 96)
        with torch.no_grad():
            assert_close_rounding(linear(x), x @ weight.T, terms=96)


def test_autograd_runs_through_the_dequantised_weight(block_file):
    """With an input that needs a gradient (an adapter on top), the product is x @ W.T with
    gradients to x; the codes have no parameters to train."""
    with GGUFFile(block_file) as file:
        linear = BlockQuantLinear(*block_codes(file, "Q4_1"))
    x = torch.randn(3, 96, requires_grad=True)
    linear(x).sum().backward()
    # the gradient is ones @ W (a GEMM) against W summed by a reduction: 40-term sums
    assert_close_rounding(x.grad, linear.dequantize().sum(0).expand(3, -1), terms=40)
    assert list(linear.parameters()) == []


def test_other_types_are_not_block_codes(block_file, tmp_path):
    """Only Q4_0/Q4_1/Q8_0 matrices become codes; another type loads as float32."""
    path = tmp_path / "k.gguf"
    writer = gguf.GGUFWriter(str(path), "llama")
    data = gguf.quants.quantize(np.ones((2, 64), np.float32), gguf.GGMLQuantizationType.Q5_0)
    writer.add_tensor("q5", data, raw_shape=data.shape, raw_dtype=gguf.GGMLQuantizationType.Q5_0)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    with GGUFFile(path) as file:
        assert block_codes(file, "q5") is None


@pytest.mark.parametrize("kind", FORMATS)
@pytest.mark.parametrize("tied", [True, False])
def test_tiny_llama_quantised_equals_the_float32_path(tmp_path, kind, tied):
    """A random tiny Llama written in each format: every matrix runs from its blocks, the
    logits equal the dequantised float32 model's up to rounding, greedy continuations agree."""
    from lmlab.generation.generate import generate

    path = tmp_path / "tiny.gguf"
    write_tiny_gguf(path, tiny_llama(tied), kind)
    ours, reference = load_gguf_model(path), load_gguf_model(path, dequantize=True)
    layer = ours.transformer.layers[0]
    assert isinstance(layer.attention.q_proj, BlockQuantLinear)
    assert isinstance(layer.feed_forward.down_proj, BlockQuantLinear)
    assert isinstance(ours.transformer.embeddings.word_embeddings, BlockQuantEmbedding)
    assert isinstance(ours.heads["clm"].decoder, BlockQuantLinear)
    assert (ours.heads["clm"].decoder is ours.transformer.embeddings.word_embeddings.table) \
        == tied
    ids = torch.tensor([[1, 5, 9, 33, 2, 17, 60], [3, 3, 8, 0, 63, 40, 12]])
    with torch.no_grad():
        a, b = ours(input_ids=ids).logits, reference(input_ids=ids).logits
    assert_close_rounding(a, b, terms=96, depth=2)
    greedy = generate(ours, ids[:1], max_new_tokens=8, eos_token_id=None)
    both_sides = 2 * rounding_tolerance(terms=96, depth=2, scale=float(b.abs().max()))
    assert_greedy_agrees(greedy, reference, ids.shape[1], both_sides)


def test_a_quantised_model_saves_as_float32_and_loads_in_a_fresh_process(tmp_path):
    """save_pretrained writes the weights the blocks stand for (the model itself keeps its
    blocks); a fresh process loads the folder and gets the reference path's logits."""
    import lmlab

    path = tmp_path / "tiny.gguf"
    write_tiny_gguf(path, tiny_llama(True), "Q4_1")
    model = load_gguf_model(path)
    lmlab.save_pretrained(model, tmp_path / "saved")
    assert isinstance(model.heads["clm"].decoder, BlockQuantLinear)
    plain = dequantized(model)
    assert plain.heads["clm"].decoder.weight is plain.get_input_embeddings().weight
    ids = [[1, 5, 9, 33, 2, 17, 60]]
    code = ("import json, sys, torch, lmlab\n"
            f"m = lmlab.from_pretrained({str(tmp_path / 'saved')!r})\n"
            f"print(json.dumps(m(input_ids=torch.tensor({ids})).logits.tolist()))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True).stdout
    with torch.no_grad():
        expected = load_gguf_model(path, dequantize=True)(input_ids=torch.tensor(ids)).logits
    # exact: the same float32 weights through the same float32 model
    assert torch.equal(torch.tensor(json.loads(out.splitlines()[-1])), expected)


# ---------------------------------------------------------------------------- the real model
PROMPT = "The capital of France is"


@pytest.fixture(scope="module")
def real_pair(smollm2_gguf):
    from lmlab.tokenization.tokenizer import Tokenizer

    return (load_gguf_model(smollm2_gguf), load_gguf_model(smollm2_gguf, dequantize=True),
            Tokenizer.from_pretrained(smollm2_gguf))


def test_real_smollm2_runs_from_its_blocks(real_pair, smollm2_gguf):
    """Every Q4_1 matrix and the Q8_0 table run from their codes, which are gguf's
    dequantisation bit for bit (query/key rows un-permuted)."""
    from lmlab.models.core.positions import rotary_rows_from_pairs

    model = real_pair[0]
    modules = dict(model.named_modules())
    kinds = {m.bits for m in modules.values() if isinstance(m, BlockQuantLinear)}
    assert kinds == {4, 8} and sum(isinstance(m, BlockQuantLinear) for m in modules.values()) \
        == 30 * 7 + 1
    assert not any(p.ndim == 2 for p in model.parameters())  # no float32 matrix left
    with GGUFFile(smollm2_gguf) as file:
        for name in ("blk.3.attn_k.weight", "blk.29.ffn_down.weight", "token_embd.weight"):
            values = torch.from_numpy(gguf_dequantised(file, name))
            if ".attn_k." in name:
                values = rotary_rows_from_pairs(values, model.config.head_dim)
            ours = {"blk.3.attn_k.weight": "transformer.layers.3.attention.k_proj",
                    "blk.29.ffn_down.weight": "transformer.layers.29.feed_forward.down_proj",
                    "token_embd.weight": "heads.clm.decoder"}[name]
            assert torch.equal(modules[ours].dequantize(), values), name  # exact: gguf's ops


def test_real_smollm2_logits_and_greedy_equal_the_float32_path(real_pair):
    """Logits within float32 rounding of 30 layers of 1536-term sums of the dequantised model's,
    batch of two padded prompts included; a greedy continuation of the float32 path too (up to
    ties within that rounding)."""
    from lmlab.generation.generate import generate, pad_left

    ours, reference, tok = real_pair
    ids, mask = pad_left([tok.encode(PROMPT), tok.encode("Once upon a time,")], 2)
    with torch.no_grad():
        a = ours(input_ids=ids, attention_mask=mask).logits
        b = reference(input_ids=ids, attention_mask=mask).logits
    real = mask.bool()
    assert_close_rounding(a[real], b[real], terms=1536, depth=30)
    prompt = torch.tensor([tok.encode(PROMPT)])
    greedy = generate(ours, prompt, max_new_tokens=8, eos_token_id=2)
    both_sides = 2 * rounding_tolerance(terms=1536, depth=30, scale=float(b[real].abs().max()))
    assert_greedy_agrees(greedy, reference, prompt.shape[1], both_sides)
    assert tok.decode(greedy[0, prompt.shape[1]:]).startswith(" Paris")


@pytest.mark.parametrize("parallel", [False, True])
def test_real_shapes_every_batch_size_against_the_dequantised_product(real_pair, parallel,
                                                                      monkeypatch):
    """The real file's matrix shapes (query 576x576, key 192x576, gate 1536x576, down 576x1536
    in Q4_1, the 49152x576 Q8_0 table) at batch 1-9 and 17 (register tiles of 8, 4, 2, 1 and
    their remainders) equal x @ W.T of the dequantised weight up to float32 rounding."""
    monkeypatch.setattr(quantised, "PARALLEL_WORK", 0 if parallel else 2 ** 62)
    torch.set_num_threads(2)  # the threaded kernel shares the row groups
    layer = real_pair[0].transformer.layers[0]
    linears = [layer.attention.q_proj, layer.attention.k_proj, layer.feed_forward.gate_proj,
               layer.feed_forward.down_proj, real_pair[0].heads["clm"].decoder]
    generator = torch.Generator().manual_seed(0)
    for linear in linears:
        weight = linear.dequantize()
        for batch in (*range(1, 10), 17):
            x = torch.randn(batch, linear.in_features, generator=generator)
            with torch.no_grad():
                got = linear(x)
            assert_close_rounding(got, x @ weight.T, terms=linear.in_features,
                                  msg=f"{tuple(weight.shape)}, batch {batch}")


def test_real_smollm2_batch_of_eight_padded_generates_as_the_float32_path(real_pair):
    """Eight left-padded prompts generated together (each decoding step a batch of 8 rows
    through the register tiles): step logits within rounding of the float32 path's, and
    greedy continuations of the float32 path too (up to ties within that rounding)."""
    from lmlab.generation.generate import generate, pad_left

    ours, reference, tok = real_pair
    prompts = [PROMPT, "Once upon a time,", "def add(a, b):", "The largest planet is",
               "1, 2, 3,", "Water boils at", "Hello", "The quick brown fox jumps over the"]
    ids, mask = pad_left([tok.encode(p) for p in prompts], 2)
    with torch.no_grad():
        a = ours(input_ids=ids, attention_mask=mask).logits[:, -1]
        b = reference(input_ids=ids, attention_mask=mask).logits[:, -1]
    assert_close_rounding(a, b, terms=1536, depth=30)
    greedy = generate(ours, ids, attention_mask=mask, max_new_tokens=4, eos_token_id=None)
    both_sides = 2 * rounding_tolerance(terms=1536, depth=30, scale=float(b.abs().max()))
    assert_greedy_agrees(greedy, reference, ids.shape[1], both_sides, attention_mask=mask)


def test_real_smollm2_loads_in_a_fresh_process_with_the_bytes_it_holds(smollm2_gguf, real_pair):
    """A fresh process loads the file's blocks, holding about the file's bytes (peak resident
    memory grows by under twice the file, against 540 MB for its float32 weights) and computes
    the same logits as this one."""
    code = ("import json, resource, sys, torch\n"
            "from lmlab.interop.gguf import load_gguf_model\n"
            "from lmlab.models.quantised import load_kernels\n"
            "load_kernels()  # numba and its kernels: ~150 MB whatever the model\n"
            "before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss\n"
            f"m = load_gguf_model({str(smollm2_gguf)!r})\n"
            "grown = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) * 1024\n"
            f"ids = torch.tensor([{real_pair[2].encode(PROMPT)}])\n"
            "with torch.no_grad():\n"
            "    logits = m(input_ids=ids).logits[0, -1]\n"
            "print(json.dumps([grown, logits.tolist()]))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True).stdout
    grown, logits = json.loads(out.splitlines()[-1])
    size = smollm2_gguf.stat().st_size
    assert grown < 2 * size, (grown, size)  # float32 weights: 5.5x the file
    ids = torch.tensor([real_pair[2].encode(PROMPT)])
    with torch.no_grad():
        expected = real_pair[0](input_ids=ids).logits[0, -1]
    # exact: the same codes and kernels on the same input, in another process
    assert torch.equal(torch.tensor(logits), expected)
