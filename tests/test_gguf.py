"""GGUF reading: synthetic files (every layout detail, F32/F16/BF16/Q8_0/Q4_1) and the real
SmolLM2-135M-Instruct Q4_1 file against transformers' GGUF loader (tokenizer, logits,
greedy and beam continuations)."""

from __future__ import annotations

import re
import shutil
import subprocess

import numpy as np
import pytest
import torch
from conftest import assert_close_rounding

from lmlab.formats.gguf import GGUFFile
from lmlab.interop.gguf import (
    config_from_gguf,
    gguf_tensor_names,
    load_gguf_model,
)
from lmlab.models.core.positions import rotary_rows_from_pairs, rotary_rows_to_pairs
from lmlab.models.model import LanguageModel
from lmlab.models.presets import family_config


def assert_real_logits_close(ours: torch.Tensor, theirs: torch.Tensor) -> None:
    """Real SmolLM2: ours vs transformers in float32 on the same dequantised weights, other
    kernels on each side: the rounding of 30 layers of sums of up to 1536 terms."""
    assert_close_rounding(ours, theirs, terms=1536, depth=30)


def _permute(w: np.ndarray, heads: int) -> np.ndarray:
    """llama.cpp's convert_hf_to_gguf permutation of query/key rows."""
    return w.reshape(heads, 2, w.shape[0] // heads // 2, *w.shape[1:]).swapaxes(1, 2) \
        .reshape(w.shape)


def write_tiny_gguf(path, model: LanguageModel, qtype_name: str = "F32") -> None:
    """Write ``model`` (a Llama-style LanguageModel) as llama.cpp would."""
    import gguf

    config = model.config
    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_block_count(config.num_hidden_layers)
    writer.add_context_length(config.max_position_embeddings)
    writer.add_embedding_length(config.hidden_size)
    writer.add_feed_forward_length(config.intermediate_size)
    writer.add_head_count(config.num_attention_heads)
    writer.add_head_count_kv(config.num_key_value_heads)
    writer.add_rope_freq_base(config.rope_theta)
    writer.add_layer_norm_rms_eps(config.norm_eps)
    writer.add_vocab_size(config.vocab_size)
    qtype = gguf.GGMLQuantizationType[qtype_name]
    params = {k: v.detach().numpy() for k, v in model.named_parameters()}

    def add(name: str, value: np.ndarray, quantise: bool = True) -> None:
        value = np.ascontiguousarray(value, dtype=np.float32)
        if not quantise or qtype == gguf.GGMLQuantizationType.F32 or value.ndim == 1:
            writer.add_tensor(name, value)
        elif qtype == gguf.GGMLQuantizationType.F16:
            writer.add_tensor(name, value.astype(np.float16))
        else:
            data = gguf.quants.quantize(value, qtype)
            writer.add_tensor(name, data, raw_shape=data.shape, raw_dtype=qtype)

    add("token_embd.weight", params["transformer.embeddings.word_embeddings.weight"])
    add("output_norm.weight", params["transformer.final_norm.weight"])
    if not config.tie_word_embeddings:
        add("output.weight", params["heads.clm.decoder.weight"])
    for i in range(config.num_hidden_layers):
        p = f"transformer.layers.{i}."
        add(f"blk.{i}.attn_norm.weight", params[p + "attention_norm.weight"])
        add(f"blk.{i}.ffn_norm.weight", params[p + "ffn_norm.weight"])
        add(f"blk.{i}.attn_q.weight", _permute(params[p + "attention.q_proj.weight"],
                                               config.num_attention_heads))
        add(f"blk.{i}.attn_k.weight", _permute(params[p + "attention.k_proj.weight"],
                                               config.num_key_value_heads))
        add(f"blk.{i}.attn_v.weight", params[p + "attention.v_proj.weight"])
        add(f"blk.{i}.attn_output.weight", params[p + "attention.o_proj.weight"])
        for short in ("gate", "up", "down"):
            add(f"blk.{i}.ffn_{short}.weight", params[p + f"feed_forward.{short}_proj.weight"])
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def tiny_llama(tied: bool) -> LanguageModel:
    torch.manual_seed(0)
    config = family_config("llama", vocab_size=64, hidden_size=64, num_hidden_layers=2,
                            num_attention_heads=4, num_key_value_heads=2, intermediate_size=96,
                            max_position_embeddings=64, rope_theta=30000.0,
                            tie_word_embeddings=tied, initializer_range=0.2)
    return LanguageModel(config, heads=("clm",)).eval()


@pytest.mark.parametrize("tied", [True, False])
def test_every_llama_parameter_has_a_gguf_name(tied):
    """The GGUF tensor names are entries of the family's Rules and cover the whole model."""
    model = tiny_llama(tied)
    names = gguf_tensor_names(model.config)
    assert set(names.values()) == {name for name, _ in model.named_parameters()}
    assert ("output.weight" in names) == (not tied)


def test_gguf_metadata_through_the_rename_table():
    """Metadata written from the family's gguf_names reads back as the same config."""
    from lmlab.models.families import get_family
    from lmlab.utils.errors import LmlabError

    config = family_config("llama", vocab_size=64, hidden_size=64, num_hidden_layers=2,
                           num_attention_heads=4, num_key_value_heads=2, intermediate_size=96,
                           rope_theta=30000.0, norm_eps=1e-6)
    metadata = {f"llama.{key}": getattr(config, name)
                for key, name in get_family("llama").gguf_names.items()}
    metadata.update({"general.architecture": "llama", "tokenizer.ggml.bos_token_id": 1,
                     "tokenizer.ggml.eos_token_id": 2})
    assert config_from_gguf(metadata, tensor_names=set()) == config  # no output.weight: tied
    metadata["general.architecture"] = "qwen2"
    with pytest.raises(LmlabError, match="GGUF architecture 'qwen2' is not supported"):
        config_from_gguf(metadata)


def test_rotary_rows_invert_llama_cpp_permutation():
    w = np.arange(8 * 3 * 5, dtype=np.float32).reshape(8 * 3, 5)  # 3 heads of 8 dims
    permuted = torch.from_numpy(_permute(w, 3))
    # exact: rows moved, no arithmetic
    assert torch.equal(rotary_rows_from_pairs(permuted, head_dim=8), torch.from_numpy(w))
    # exact: rows moved, no arithmetic
    assert torch.equal(rotary_rows_to_pairs(torch.from_numpy(w), head_dim=8), permuted)
    assert not np.array_equal(_permute(w, 3), w)


# F32 is float32 rounding only (None: see below); F16 and Q8_0 add the weights' quantisation
# error, as a fraction of the largest logit.
@pytest.mark.parametrize("qtype,tol", [("F32", None), ("F16", 2e-2), ("Q8_0", 5e-2)])
@pytest.mark.parametrize("tied", [True, False])
def test_synthetic_gguf_round_trip(tmp_path, qtype, tol, tied):
    model = tiny_llama(tied)
    path = tmp_path / "tiny.gguf"
    write_tiny_gguf(path, model, qtype)
    loaded = load_gguf_model(path)
    assert loaded.config.tie_word_embeddings == tied
    assert loaded.config.num_key_value_heads == 2 and loaded.config.rope_theta == 30000.0
    ids = torch.tensor([[1, 5, 9, 33, 2, 17, 60]])
    with torch.no_grad():
        a, b = loaded(input_ids=ids).logits, model(input_ids=ids).logits
    if tol is None:  # the same float32 weights: 2 layers of sums of up to 96 terms
        assert_close_rounding(a, b, terms=96, depth=2)
    else:
        torch.testing.assert_close(a, b, atol=tol * float(b.abs().max()), rtol=0)
    with GGUFFile(path) as file:
        assert file.metadata["llama.block_count"] == 2
        assert file.tensors["blk.0.attn_q.weight"].shape == (64, 64)


def test_bf16_and_q4_1_dequantisation(tmp_path):
    import gguf

    rng = np.random.default_rng(0)
    values = rng.standard_normal((4, 64)).astype(np.float32)
    writer = gguf.GGUFWriter(str(tmp_path / "t.gguf"), "llama")
    bf16 = (values.view(np.uint32) >> 16).astype(np.uint16)
    writer.add_tensor("bf", bf16, raw_shape=bf16.shape, raw_dtype=gguf.GGMLQuantizationType.BF16)
    q41 = gguf.quants.quantize(values, gguf.GGMLQuantizationType.Q4_1)
    writer.add_tensor("q", q41, raw_shape=q41.shape, raw_dtype=gguf.GGMLQuantizationType.Q4_1)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    with GGUFFile(tmp_path / "t.gguf") as file:
        # tol: stored in bf16, 8 significant bits: relative rounding under 2^-8
        np.testing.assert_allclose(file.tensor("bf"), values, rtol=1e-2)
        # 4-bit: 16 levels between each block's min and max.
        span = np.ptp(values.reshape(4, 2, 32), axis=-1).max()
        assert np.abs(file.tensor("q") - values).max() <= span / 15 / 2 + 1e-3
        assert file.type_counts() == {"BF16": 1, "Q4_1": 1}


def test_loading_shows_a_progress_bar_naming_the_file(tmp_path, capsys, monkeypatch):
    """A bar on stderr says which file is loading and counts its tensors, unless
    LMLAB_NO_PROGRESS is set (as the test suite sets it)."""
    path = tmp_path / "tiny.gguf"
    write_tiny_gguf(path, tiny_llama(tied=True), "Q8_0")
    with GGUFFile(path) as file:
        count = len(file.tensors)
    monkeypatch.setenv("LMLAB_NO_PROGRESS", "0")
    load_gguf_model(path)
    err = capsys.readouterr().err
    assert "loading tiny.gguf: 100%" in err and f" {count}/{count} [" in err, err
    monkeypatch.setenv("LMLAB_NO_PROGRESS", "1")
    load_gguf_model(path)
    assert capsys.readouterr().err == ""


def gguf_dequantised(file: GGUFFile, name: str) -> np.ndarray:
    """``gguf.quants.dequantize`` of the tensor's stored bytes, copied out of the memory map."""
    import gguf

    info = file.tensors[name]
    stored = file.raw(name)[0].view(np.uint8)
    kind = gguf.GGMLQuantizationType(info.ggml_type)
    return np.array(gguf.quants.dequantize(stored, kind).reshape(info.shape), np.float32)


def test_block_dequantisation_is_the_gguf_packages_bit_for_bit(tmp_path):
    """Our in-place Q4_0/Q4_1/Q8_0 blocks (and gguf's own for Q5_0, plain F16/BF16) give exactly
    ``gguf.quants.dequantize``'s floats: 1-D, 3-D and a matrix of several 256 KB chunks, through
    ``tensor`` and ``tensor_into`` (also into a strided array, which takes a scratch copy)."""
    import gguf

    rng = np.random.default_rng(0)
    shapes = {"vec": (64,), "cube": (2, 3, 64), "mat": (700, 128)}  # mat: 512 rows a chunk
    writer = gguf.GGUFWriter(str(tmp_path / "t.gguf"), "llama")
    kinds = ("Q4_0", "Q4_1", "Q8_0", "Q5_0", "F16", "BF16")
    for kind in kinds:
        for label, shape in shapes.items():
            values = (rng.standard_normal(shape) * rng.uniform(0.01, 10, shape[:-1] + (1,)))
            data = gguf.quants.quantize(values.astype(np.float32),
                                        gguf.GGMLQuantizationType[kind])
            writer.add_tensor(f"{kind}.{label}", data, raw_shape=data.shape,
                              raw_dtype=gguf.GGMLQuantizationType[kind])
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    with GGUFFile(tmp_path / "t.gguf") as file:
        for name, info in file.tensors.items():
            expected = torch.from_numpy(gguf_dequantised(file, name))
            into = np.empty(info.shape, np.float32)
            strided = np.empty((*info.shape, 2), np.float32)[..., 0]  # every other float
            file.tensor_into(name, into)
            file.tensor_into(name, strided)
            for ours in (file.tensor(name), into, strided):
                assert torch.equal(torch.from_numpy(ours), expected), name  # exact: gguf's ops
        assert file.type_counts() == {kind: 3 for kind in kinds}


def test_real_weights_are_the_gguf_packages_dequantisation(smollm2_gguf):
    """Every parameter of SmolLM2 loaded as float32 (the reference path) is
    ``gguf.quants.dequantize`` of its tensor bit for bit (query/key rows un-permuted): the
    in-place dequantisers change no number, and the model, built without random
    initialisation, has no weight the file did not fill."""
    model = load_gguf_model(smollm2_gguf, dequantize=True)
    params = dict(model.named_parameters())
    with GGUFFile(smollm2_gguf) as file:
        names = gguf_tensor_names(model.config)
        assert set(names.values()) == set(params) and set(names) == set(file.tensors)
        for theirs, ours in names.items():
            values = torch.from_numpy(gguf_dequantised(file, theirs))
            if ".attn_q." in theirs or ".attn_k." in theirs:
                values = rotary_rows_from_pairs(values, model.config.head_dim)
            assert torch.equal(params[ours].detach(), values), theirs  # exact: gguf's ops


def test_not_a_gguf(tmp_path):
    from lmlab.utils.errors import LmlabError

    path = tmp_path / "x.gguf"
    path.write_bytes(b"NOPE" + bytes(40))
    with pytest.raises(LmlabError, match="not a GGUF"):
        load_gguf_model(path)


# ---------------------------------------------------------------------------- the real model
def transformers_gguf_model(path):
    """transformers' Llama from the GGUF file, through its own GGUF reader, dequantiser and
    query/key un-permutation (``load_gguf_checkpoint``). ``AutoModelForCausalLM.from_pretrained
    (gguf_file=...)`` does the same but insists on the ``accelerate`` package, which the test
    environment does not install."""
    import transformers
    from transformers.modeling_gguf_pytorch_utils import load_gguf_checkpoint

    config = transformers.AutoConfig.from_pretrained(str(path.parent), gguf_file=path.name)
    model = transformers.AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    tensors = load_gguf_checkpoint(str(path), return_tensors=True, model_to_load=model)["tensors"]
    result = model.load_state_dict({k: torch.as_tensor(v) for k, v in tensors.items()},
                                   strict=False)
    assert result.unexpected_keys == [] and set(result.missing_keys) <= {"lm_head.weight"}
    model.tie_weights()
    return model.eval()


@pytest.fixture(scope="module")
def ours_real(smollm2_gguf):
    import lmlab
    from lmlab.tokenization.tokenizer import Tokenizer

    return lmlab.from_pretrained(smollm2_gguf), Tokenizer.from_pretrained(smollm2_gguf)


@pytest.fixture(scope="module")
def hf_tokenizer(smollm2_gguf):
    import transformers

    return transformers.AutoTokenizer.from_pretrained(str(smollm2_gguf.parent),
                                                      gguf_file=smollm2_gguf.name)


@pytest.fixture(scope="module")
def real(ours_real, smollm2_gguf):
    """Ours and transformers' SmolLM2; transformers' is loaded once per session (~25 s idle,
    ~60 s on the loaded shared machine)."""
    model, tokenizer = ours_real
    return model, tokenizer, transformers_gguf_model(smollm2_gguf)


def _real_texts(limit_glosses: int = 3000, limit_verses: int = 2000) -> list[str]:
    from lmlab.utils.paths import find_system_path

    texts: list[str] = []
    for pos in ("noun", "verb", "adj", "adv"):
        path = find_system_path(f"usr/share/wordnet/data.{pos}")
        if path is None:
            continue
        with open(path, encoding="utf-8", errors="replace") as handle:
            for n, line in enumerate(handle):
                if "|" in line and not line.startswith("  ") and n % 7 == 0:
                    texts.append(line.split("|", 1)[1].strip())
    texts = texts[:limit_glosses]
    if shutil.which("bible"):
        dump = subprocess.run(["bible", "-l", "100000", "gen1:1-rev22:21"], capture_output=True,
                              text=True, check=False).stdout
        verses = [m.group(1) for m in re.finditer(r"^\s+\d+ (.*)$", dump, re.M)]
        texts += verses[::15][:limit_verses]
    return texts


SPECIAL_CASES = [
    "", " ", "  two  spaces", "\ttab\nnewline\r\n", "Hello, world!", "don't I'll we've",
    "<|im_start|>user\nHi there<|im_end|>\n<|im_start|>assistant\n", "<|endoftext|>x",
    "naïve café — “quotes” … 日本語 🙂👍🏽", "3.14159 12345678 1,000,000", "def f(x):\n    return x",
    "    leading", "trailing   ", "<repo_name>a/b<file_sep>", "ALL CAPS and MiXeD",
]


def test_real_tokenizer_equals_transformers(ours_real, hf_tokenizer):
    ours, theirs = ours_real[1], hf_tokenizer
    texts = _real_texts() + SPECIAL_CASES
    assert len(texts) > 4000
    a = ours(texts, add_special_tokens=True)["input_ids"]
    b = theirs(texts, add_special_tokens=True)["input_ids"]
    mismatches = [t for t, x, y in zip(texts, a, b) if x != y]
    assert not mismatches, mismatches[:3]
    for text, ids in zip(texts[-len(SPECIAL_CASES):], a[-len(SPECIAL_CASES):]):
        assert ours.decode(ids) == theirs.decode(ids), text
    assert ours.eos_token == theirs.eos_token and ours.bos_token == theirs.bos_token
    assert ours.pad_token == theirs.pad_token and len(ours) == len(theirs)
    assert ours.chat_template == theirs.chat_template


PROMPTS = ["The capital of France is", "Once upon a time, in a small village,",
           "def fibonacci(n):"]


def test_real_logits_equal_transformers(real):
    ours, tok, theirs = real
    assert ours.config.rope_theta == 100000.0 and ours.config.tie_word_embeddings
    assert (ours.config.num_hidden_layers, ours.config.num_key_value_heads) == (30, 3)
    for prompt in PROMPTS:
        ids = torch.tensor([tok.encode(prompt)])
        with torch.no_grad():
            a, b = ours(input_ids=ids).logits, theirs(input_ids=ids).logits
        assert_real_logits_close(a, b)
        if prompt == PROMPTS[0]:
            assert tok.decode(a[0, -1].argmax()) == " Paris"


@pytest.mark.slow
def test_real_greedy_equals_transformers(real):
    from lmlab.generation.generate import generate

    ours, tok, theirs = real
    for prompt in PROMPTS[:2]:
        ids = torch.tensor([tok.encode(prompt)])
        a = generate(ours, ids, max_new_tokens=20, eos_token_id=2)
        b = theirs.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=20,
                            do_sample=False, eos_token_id=2, pad_token_id=2)
        assert a.tolist() == b.tolist(), (tok.decode(a[0]), tok.decode(b[0]))


@pytest.mark.slow
def test_real_beam_equals_transformers(real):
    from lmlab.generation.generate import generate

    ours, tok, theirs = real
    for prompt in PROMPTS:
        ids = torch.tensor([tok.encode(prompt)])
        a = generate(ours, ids, max_new_tokens=20, num_beams=3, eos_token_id=2)
        b = theirs.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=20,
                            num_beams=3, do_sample=False, eos_token_id=2, pad_token_id=2)
        assert a.tolist() == b.tolist()


def test_real_chat_template(ours_real, hf_tokenizer):
    from lmlab.generation.chat import apply_chat_template

    tok, hf_tok = ours_real[1], hf_tokenizer
    messages = [{"role": "user", "content": "What is 2+2?"}]
    ours = apply_chat_template(tok, messages, add_generation_prompt=True)
    theirs = hf_tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    assert ours == theirs
