"""ONNX export (lmlab.export.onnx, lmlab export onnx): the file, run by onnxruntime, equals
lmlab's outputs within 1e-4 (relative to the largest output, at real tokens) on the real MiniLM
with a task head and on decoders (a tiny Llama through the CLI; SmolLM2-135M, slow), at batch
shapes other than the traced one (dynamic axes); refusals before any work."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from lmlab.utils.errors import LmlabError
from tests.conftest import assert_clean_refusal, run_lmlab, run_lmlab_here, tiny_bert

pytest.importorskip("onnxruntime")
pytest.importorskip("onnxscript")

from lmlab.export.onnx import OnnxModel, export_onnx, real_token_diff  # noqa: E402

TOLERANCE = 1e-4  # the bound, relative to the largest output (at least 1)


def _batches(vocab: int, seed: int = 3):
    """Padded batches of shapes unlike the traced (2, 8): one row, several rows, long rows."""
    generator = torch.Generator().manual_seed(seed)
    for batch, length in ((1, 5), (4, 19), (2, 64)):
        ids = torch.randint(5, vocab, (batch, length), generator=generator)
        mask = torch.ones_like(ids)
        if batch > 1:
            mask[1, length // 3:] = 0
        yield ids, mask


def _assert_matches(onnx_model: OnnxModel, reference, vocab: int, with_types: bool):
    for ids, mask in _batches(vocab):
        inputs = {"input_ids": ids, "attention_mask": mask}
        if with_types:
            inputs["token_type_ids"] = torch.zeros_like(ids)
        with torch.no_grad():
            expected = reference(**inputs).numpy()
        got = onnx_model.run(**{k: v.numpy() for k, v in inputs.items()})
        assert got.shape == expected.shape
        diff = real_token_diff(got, expected, mask.numpy())
        assert diff <= TOLERANCE * max(1.0, float(np.abs(expected).max())), (ids.shape, diff)


@pytest.fixture(scope="module")
def minilm_classifier(minilm_dir, tmp_path_factory):
    import lmlab

    model = lmlab.from_pretrained(minilm_dir)
    model.config.extra["num_labels"] = 7
    torch.manual_seed(0)
    model.add_head("sequence-classification")
    model.eval()
    out = tmp_path_factory.mktemp("onnx") / "minilm"
    export_onnx(model, out)
    return model, out


def test_minilm_with_task_head_equals_lmlab(minilm_classifier):
    model, out = minilm_classifier
    info = json.loads((out / "onnx-export.json").read_text())
    assert info["inputs"] == ["input_ids", "attention_mask", "token_type_ids"]
    assert info["head"] == "sequence-classification" and info["output"] == "logits"
    assert info["check_max_abs_diff"] <= TOLERANCE

    def reference(**inputs):  # lmlab's ordinary forward pass (skipping padding, 2-D mask)
        return model(**inputs).logits

    _assert_matches(OnnxModel(out, threads=2), reference, model.config.vocab_size, True)


def test_padding_changes_the_onnx_output(minilm_classifier):
    """The file reads the mask: the same ids with and without padding give other logits."""
    _, out = minilm_classifier
    onnx_model = OnnxModel(out)
    ids = np.random.default_rng(0).integers(5, 30000, (1, 12))
    full = onnx_model.run(input_ids=ids, attention_mask=np.ones_like(ids),
                          token_type_ids=np.zeros_like(ids))
    half = np.ones_like(ids)
    half[0, 6:] = 0
    padded = onnx_model.run(input_ids=ids, attention_mask=half, token_type_ids=np.zeros_like(ids))
    assert np.abs(full - padded).max() > 1e-3


@pytest.fixture(scope="module")
def tiny_llama(tmp_path_factory):
    """A random 2-layer Llama (GQA, rotary, RMSNorm, SwiGLU) saved as a folder, exported by
    `lmlab export onnx` in a fresh process."""
    from lmlab.interop.native import save_model
    from lmlab.models.config import TransformerConfig
    from lmlab.models.model import LanguageModel

    torch.manual_seed(0)
    config = TransformerConfig(
        family="llama", vocab_size=320, hidden_size=64, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, intermediate_size=96, hidden_act="silu",
        ffn_type="glu", position_embedding="rotary", norm_type="rmsnorm", norm_eps=1e-6,
        pre_norm=True, final_norm=True, embedding_norm=False, causal=True, attention_bias=False,
        mlp_bias=False, type_vocab_size=0, tie_word_embeddings=False,
        hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
    model = LanguageModel(config, heads=["clm"])
    with torch.no_grad():  # logits of a useful size (the random init's are ~0.02)
        model.heads["clm"].decoder.weight.mul_(50)
    root = tmp_path_factory.mktemp("llama")
    save_model(model, root / "model")
    result = run_lmlab("export", "onnx", root / "model", root / "onnx")
    assert result.returncode == 0, result.stderr[-3000:]
    return root / "model", root / "onnx"


def test_decoder_logits_equal_lmlab(tiny_llama):
    import lmlab

    folder, out = tiny_llama
    model = lmlab.from_pretrained(folder).eval()
    info = json.loads((out / "onnx-export.json").read_text())
    assert info["inputs"] == ["input_ids", "attention_mask"] and info["kv_cache"] is False

    def reference(**inputs):
        return model(**inputs).logits

    _assert_matches(OnnxModel(out), reference, model.config.vocab_size, False)


def test_cli_refuses_existing_output_and_unknown_head(tiny_llama, tmp_path):
    folder, out = tiny_llama
    assert_clean_refusal(run_lmlab_here("export", "onnx", folder, out), "already holds",
                         fix="--overwrite")
    assert_clean_refusal(run_lmlab_here("export", "onnx", folder, tmp_path / "x", "--task-head",
                                   "sequence-classification"), "no head")
    assert not (tmp_path / "x").exists()


def test_refusals_before_any_work(tmp_path):
    from lmlab.compress.quantize import quantize_int8
    from lmlab.models.config import TransformerConfig
    from lmlab.models.model import LanguageModel
    from lmlab.models.seq2seq import EncoderDecoderModel

    model = tiny_bert()
    model.add_head("multiple-choice")
    with pytest.raises(LmlabError, match="multiple-choice"):
        export_onnx(model, tmp_path / "a")
    with pytest.raises(LmlabError, match="no head 'mlm'"):
        export_onnx(model, tmp_path / "a", head="mlm")
    with pytest.raises(LmlabError, match="bfloat16"):
        export_onnx(tiny_bert().to(torch.bfloat16), tmp_path / "a")
    with pytest.raises(LmlabError, match="int8"):
        export_onnx(quantize_int8(tiny_bert(), "x86"), tmp_path / "a")
    config = TransformerConfig(hidden_size=32, num_hidden_layers=1, num_attention_heads=4,
                               intermediate_size=64, vocab_size=100, is_encoder_decoder=True)
    with pytest.raises(LmlabError, match="EncoderDecoderModel"):
        export_onnx(EncoderDecoderModel(config), tmp_path / "a")
    dynamic = LanguageModel(TransformerConfig(
        hidden_size=32, num_hidden_layers=1, num_attention_heads=4, intermediate_size=64,
        vocab_size=100, position_embedding="rotary", causal=True, max_position_embeddings=32,
        rope_scaling={"rope_type": "dynamic", "factor": 2.0}), heads=["clm"])
    with pytest.raises(LmlabError, match="dynamic NTK"):
        export_onnx(dynamic, tmp_path / "a")
    assert not (tmp_path / "a").exists()


def test_real_token_diff_masks_per_token_outputs_only():
    """Padding positions are skipped in (B, T, ...) outputs; a pooled (B, C) output is compared
    whole, also when its class count equals the sequence length."""
    mask = np.array([[1, 1, 0], [1, 0, 0]])
    ref = np.zeros((2, 3, 4))
    got = ref.copy()
    got[0, 2] = 5.0  # padding position
    assert real_token_diff(got, ref, mask) == 0.0
    got[1, 0, 3] = 0.5  # real token
    assert real_token_diff(got, ref, mask) == 0.5
    pooled = np.zeros((2, 3))
    wrong = pooled.copy()
    wrong[1, 2] = 2.0  # class 2 of row 1: not a padding position
    assert real_token_diff(wrong, pooled, mask) == 2.0


def test_a_file_that_fails_its_check_is_not_left_behind(tmp_path, monkeypatch):
    """An export whose onnxruntime outputs disagree with lmlab's raises and leaves neither the
    file nor (over an earlier export) the earlier export's record of a passed check."""
    import lmlab.export.onnx as onnx_export

    model = tiny_bert().eval()
    out = tmp_path / "onnx"
    export_onnx(model, out)
    assert (out / "model.onnx").is_file() and (out / "onnx-export.json").is_file()
    run = onnx_export.OnnxModel.run
    monkeypatch.setattr(onnx_export.OnnxModel, "run", lambda self, **inputs: run(self, **inputs) + 1.0)
    with pytest.raises(LmlabError, match="differ from lmlab's"):
        export_onnx(model, out, overwrite=True)
    assert not (out / "model.onnx").exists() and not (out / "onnx-export.json").exists()


@pytest.mark.slow
def test_smollm2_logits_equal_lmlab(smollm2_gguf, tmp_path):
    """The real 135M decoder (30 layers, GQA, tied embeddings): logits of prompts."""
    import lmlab

    model = lmlab.from_pretrained(smollm2_gguf).eval()
    export_onnx(model, tmp_path / "smollm2")

    def reference(**inputs):
        return model(**inputs).logits

    _assert_matches(OnnxModel(tmp_path / "smollm2"), reference, model.config.vocab_size, False)
