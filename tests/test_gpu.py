"""The GPU paths: Hugging Face parity on CUDA, bf16 autocast, the fused attention kernels,
torch.compile and a trained model that reloads on a CPU in a fresh process.

Every test here needs a CUDA device and is skipped without one (CI has none); run them on a GPU
machine with ``python -m pytest tests/test_gpu.py``. They use random weights and token ids
only, so they need no tokenizer, corpus or checkpoint on that machine.

Tolerances (``conftest.rounding_tolerance``) follow from the dtype the computation ran in and
the size of the values: float32 on a GPU is float32 (PyTorch keeps TF32 off for matrix
products unless asked; a library that turned it on would fail the fp32 parity here), bf16
autocast is compared with an fp32 reference at bf16's rounding (8 bits of mantissa).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest
import torch
from conftest import assert_close_rounding, rounding_tolerance

import lmlab
from lmlab.models.model import LanguageModel
from lmlab.models.presets import preset

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
transformers = pytest.importorskip("transformers")

CUDA = torch.device("cuda")
TINY = dict(vocab_size=512, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
            intermediate_size=128, max_position_embeddings=64)


def _perturbed(model: torch.nn.Module) -> torch.nn.Module:
    """Random values on every weight (zero biases and unit norms would hide a swapped name)."""
    generator = torch.Generator().manual_seed(2)
    with torch.no_grad():
        for param in model.parameters():
            param.add_(torch.randn(param.shape, generator=generator) * 0.05)
    return model


def _batch(padded: bool) -> dict[str, torch.Tensor]:
    """Four rows of 48 token ids on the GPU; ``padded``: rows of 48, 40, 17 and 5 real tokens."""
    generator = torch.Generator().manual_seed(1)
    ids = torch.randint(3, TINY["vocab_size"], (4, 48), generator=generator)
    mask = torch.ones(4, 48, dtype=torch.long)
    if padded:
        for row, length in enumerate([48, 40, 17, 5]):
            mask[row, length:] = 0
        ids = ids.masked_fill(mask == 0, 0)
    return {"input_ids": ids.to(CUDA), "attention_mask": mask.to(CUDA)}


@pytest.fixture(scope="module")
def bert_pair(tmp_path_factory):
    """(transformers BertForMaskedLM, the same checkpoint loaded by lmlab), both on the GPU."""
    torch.manual_seed(0)
    theirs = _perturbed(transformers.BertForMaskedLM(transformers.BertConfig(**TINY)))
    folder = tmp_path_factory.mktemp("bert")
    theirs.save_pretrained(folder)
    theirs = transformers.BertForMaskedLM.from_pretrained(folder, attn_implementation="eager")
    ours = lmlab.from_pretrained(folder)
    return theirs.to(CUDA).eval(), ours.to(CUDA).eval()


def _real(values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """The rows of (B, T, ...) ``values`` at real tokens: padding positions carry no meaning."""
    return values[mask.bool()]


@pytest.mark.parametrize("padded", [False, True], ids=["full", "padded"])
def test_fp32_parity_with_transformers_on_cuda(bert_pair, padded):
    """Last hidden state and MLM logits on the GPU, our fused attention (SDPA) against
    transformers' eager attention: equal within float32 rounding."""
    theirs, ours = bert_pair
    batch = _batch(padded)
    with torch.no_grad():
        ref = theirs(**batch, output_hidden_states=True)
        got = ours(**batch)
    mask = batch["attention_mask"]
    for name, a, b in [("hidden", got.last_hidden_state, ref.hidden_states[-1]),
                       ("logits", got.head_logits["mlm"], ref.logits)]:
        assert_close_rounding(_real(a, mask), _real(b, mask), terms=128, depth=3,
                              msg=f"{name} ({'padded' if padded else 'full'} batch)")


@pytest.mark.parametrize("padded", [False, True], ids=["full", "padded"])
def test_bf16_autocast_stays_within_bf16_rounding_of_fp32(bert_pair, padded):
    """Under bf16 autocast (what ``--precision bf16`` runs), our logits and transformers' both
    stay within bf16 rounding of the fp32 reference, and ours is not the worse by more than
    twice (the same casts in the same places)."""
    theirs, ours = bert_pair
    batch = _batch(padded)
    mask = batch["attention_mask"]
    with torch.no_grad():
        reference = _real(theirs(**batch).logits, mask).float()
        with torch.autocast("cuda", dtype=torch.bfloat16):
            got = _real(ours(**batch).head_logits["mlm"], mask).float()
            hf = _real(theirs(**batch).logits, mask).float()
    tolerance = rounding_tolerance(torch.bfloat16, terms=128, depth=3,
                                   scale=float(reference.abs().max()))
    ours_error = (got - reference).abs().max().item()
    theirs_error = (hf - reference).abs().max().item()
    assert ours_error <= tolerance, (ours_error, tolerance)
    slack = rounding_tolerance(torch.bfloat16, scale=float(reference.abs().max()))
    assert ours_error <= 2 * theirs_error + slack, (ours_error, theirs_error)


@pytest.mark.parametrize("family,padded,backend", [
    ("bert", False, "FLASH_ATTENTION"),
    ("bert", True, "EFFICIENT_ATTENTION"),
    ("gpt2", False, "FLASH_ATTENTION"),
])
def test_attention_runs_on_the_fused_kernels(family, padded, backend):
    """With only one SDPA backend allowed, the model still runs (PyTorch raises "No available
    kernel" when our call does not fit it: a mask where none is needed, a layout, a dtype) and
    agrees with the explicit math path at bf16 rounding. Flash attention takes no mask, so an
    unpadded encoder batch must reach SDPA with ``attn_mask=None`` and a decoder with
    ``is_causal=True``; a padded batch needs the memory-efficient kernel."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    torch.manual_seed(0)
    size = {"bert": "tiny", "gpt2": "2x128"}[family]
    model = LanguageModel(preset(family, size, vocab_size=TINY["vocab_size"])).to(CUDA).eval()
    batch = _batch(padded)
    mask = batch["attention_mask"]
    with torch.no_grad(), torch.autocast("cuda", dtype=torch.bfloat16):
        with sdpa_kernel([getattr(SDPBackend, backend)]):
            fused = _real(model(**batch).last_hidden_state, mask).float()
        with sdpa_kernel([SDPBackend.MATH]):
            math_path = _real(model(**batch).last_hidden_state, mask).float()
    assert_close_rounding(fused, math_path, terms=64, depth=2 * model.config.num_hidden_layers,
                          dtype=torch.bfloat16)


def _repeated_batch_stream(vocab: int, batch: int, length: int):
    """An endless stream of one (batch, length) MLM batch, corrupted afresh each step by the
    real objective: the loss must fall quickly when the model learns that batch."""
    from lmlab.objectives.registry import build_objective
    from lmlab.objectives.special_tokens import SpecialTokens

    special = SpecialTokens(vocab_size=vocab, pad_id=0, cls_id=1, sep_id=2, mask_id=3,
                            special_ids=(0, 1, 2, 3))
    objective = build_objective("mlm", special)
    generator = torch.Generator().manual_seed(0)
    ids = torch.randint(4, vocab, (batch, length), generator=generator)
    ids[:, 0], ids[:, -1] = 1, 2

    class Stream:
        def __iter__(self):
            rng = torch.Generator().manual_seed(1)
            while True:
                rows = {"input_ids": ids.clone(), "attention_mask": torch.ones_like(ids),
                        "token_type_ids": torch.zeros_like(ids)}
                yield objective.corrupt(rows, rng)

    return objective, Stream()


@pytest.mark.parametrize("compiled", [False, True], ids=["eager", "compiled"])
def test_trainer_on_cuda_bf16_learns_and_the_model_reloads_on_cpu(tmp_path, compiled):
    """The Trainer on the GPU in bf16 (and under torch.compile): the loss falls on a batch it
    sees again and again, and the saved model loads in a fresh CPU process with the GPU model's
    fp32 outputs (float32 rounding: two devices, two sets of kernels)."""
    from lmlab.training.config import TrainingConfig
    from lmlab.training.metrics_log import read_metrics
    from lmlab.training.trainer import Trainer

    torch.manual_seed(0)
    model = LanguageModel(preset("bert", "tiny", vocab_size=512), heads=["mlm"])
    objective, stream = _repeated_batch_stream(512, batch=16, length=32)
    cfg = TrainingConfig(lr=3e-3, warmup_steps=5, max_steps=60, batch_size=16, seq_len=32,
                         precision="bf16", compile=compiled, device="cuda", log_every=1,
                         progress=False, keep_last=1)
    result = Trainer(model, objective, stream, cfg, tmp_path / "run", track_cost=False).train()
    losses = [r["loss"] for r in read_metrics(tmp_path / "run" / "metrics.jsonl")
              if r["kind"] == "train"]
    assert result.stop_reason == "max_steps" and len(losses) == 60
    # a random model scores ln(512) = 6.2 nats; one that learns the batch drops well below
    assert sum(losses[-5:]) / 5 < sum(losses[:5]) / 5 - 1.0, losses

    ids = torch.randint(4, 512, (2, 20), generator=torch.Generator().manual_seed(3))
    trained = lmlab.from_pretrained(tmp_path / "run" / "model").to(CUDA).eval()
    with torch.no_grad():
        expected = trained(input_ids=ids.to(CUDA)).head_logits["mlm"].float().cpu()
    torch.save({"ids": ids}, tmp_path / "ids.pt")
    script = textwrap.dedent(f"""
        import json, torch, lmlab
        assert not torch.cuda.is_initialized()
        ids = torch.load({str(tmp_path / 'ids.pt')!r})["ids"]
        model = lmlab.from_pretrained({str(tmp_path / 'run' / 'model')!r}).eval()
        with torch.no_grad():
            print(json.dumps(model(input_ids=ids).head_logits["mlm"].tolist()))
    """)
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          env=dict(os.environ, CUDA_VISIBLE_DEVICES=""), timeout=300)
    assert done.returncode == 0, done.stderr
    on_cpu = torch.tensor(json.loads(done.stdout))
    assert_close_rounding(on_cpu, expected, terms=128, depth=3)


def test_compiled_forward_matches_eager_on_cuda(bert_pair):
    """``torch.compile`` (what ``--compile`` turns on) changes kernels, not the function: the
    compiled model's logits equal the eager ones within float32 rounding, padded batch too."""
    _, ours = bert_pair
    batch = _batch(padded=True)
    mask = batch["attention_mask"]
    with torch.no_grad():
        eager = _real(ours(**batch).head_logits["mlm"], mask)
        compiled = torch.compile(ours)
        fused = _real(compiled(**batch).head_logits["mlm"], mask)
    assert_close_rounding(fused, eager, terms=128, depth=3)
