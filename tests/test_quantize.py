"""Dynamic int8 quantisation (lmlab.compress.quantize, lmlab quantize): the int8 layer against
torch's own dynamic quantised Linear (same weights rounded the same way, same kernel), its
error against the bound the rounding allows, a whole model, saving and loading in a fresh
process (also under another CPU's int8 instructions), and the refusals."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import warnings

import pytest
import torch
from torch import nn

import lmlab
from lmlab.compress.quantize import (
    Int8Linear,
    default_engine,
    load_quantized,
    quantizable_linears,
    quantize_int8,
    quantized_layers,
    save_quantized,
)
from lmlab.utils.errors import LmlabError
from tests.conftest import (
    TESTS_DIR,
    assert_clean_refusal,
    run_lmlab,
    run_lmlab_here,
    save_tiny_bert_folder,
    tiny_bert,
)

ENGINES = [e for e in ("x86", "onednn", "fbgemm") if e in torch.backends.quantized.supported_engines]
# How a developer makes any x86 CPU compute like an AVX2 one without VNNI (oneDNN and ATen)
AVX2_ENV = {"ONEDNN_MAX_CPU_ISA": "AVX2", "ATEN_CPU_CAPABILITY": "avx2"}


def _torch_reference(linear: nn.Linear, per_channel: bool) -> nn.Module:
    """torch.ao's dynamic quantised Linear of the same layer (a test-time reference)."""
    from torch.ao.quantization import (
        default_dynamic_qconfig,
        per_channel_dynamic_qconfig,
        quantize_dynamic,
    )

    qconfig = per_channel_dynamic_qconfig if per_channel else default_dynamic_qconfig
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        return quantize_dynamic(nn.Sequential(linear), {nn.Linear: qconfig}, dtype=torch.qint8)[0]


@pytest.mark.parametrize("granularity", ["per-tensor", "per-channel"])
def test_int8_linear_equals_torch_dynamic_linear(granularity):
    """Same int8 weights and scales as torch's MinMaxObserver gives, and (on the same engine,
    x86) the same outputs: the one kernel computes both."""
    torch.manual_seed(0)
    linear = nn.Linear(48, 40)
    x = torch.randn(3, 7, 48) * 2
    previous = torch.backends.quantized.engine
    torch.backends.quantized.engine = "x86"
    try:
        reference = _torch_reference(linear, granularity == "per-channel")
        ours = Int8Linear.from_linear(linear, "x86", granularity)
        theirs_w = reference.weight()
        state = ours.int8_state()
        assert torch.equal(state["weight_int8"], theirs_w.int_repr())
        if granularity == "per-channel":
            # tol: float32 scales from another formula for max|w| / 127: a few ulps apart
            torch.testing.assert_close(state["weight_scale"], theirs_w.q_per_channel_scales(),
                                       rtol=1e-6, atol=0)
        else:
            # tol: float32 scale from another formula for max|w| / 127: a few ulps apart
            assert state["weight_scale"].item() == pytest.approx(theirs_w.q_scale(), rel=1e-6)
        # exact: the same int8 kernel on the same int8 weights and input
        assert torch.equal(ours(x), reference(x))
    finally:
        torch.backends.quantized.engine = previous


def _rounding_bound(x: torch.Tensor, linear: nn.Linear, levels: int) -> torch.Tensor:
    """|y_int8 - y_fp32| allowed by rounding each weight to within s_w / 2 and each input to
    within s_x / 2 (s_x: the input's range including 0 over ``levels`` steps), per output."""
    w = linear.weight.detach()
    s_w = w.abs().amax() / 127.5
    s_x = (x.max().clamp(min=0) - x.min().clamp(max=0)) / levels
    k = w.shape[1]
    return (x.abs().sum(-1, keepdim=True) * s_w / 2 + w.abs().sum(1) * s_x / 2
            + k * s_w * s_x / 4) * 1.01 + 1e-6  # 1%: fp32 rounding of the rescaling itself


@pytest.mark.parametrize("engine", ENGINES)
def test_int8_linear_error_within_rounding_bound(engine):
    """Within the bound of the activation bits the layer uses on this CPU. oneDNN's kernels
    without VNNI (an AVX2 host, or ONEDNN_MAX_CPU_ISA=AVX2) saturate 16-bit sums of 8-bit
    activations: errors 5x the bound when it used them regardless."""
    torch.manual_seed(1)
    linear = nn.Linear(64, 32)
    x = torch.randn(5, 64) * 3 + 0.5
    layer = Int8Linear.from_linear(linear, engine)
    error = (layer(x) - linear(x)).abs().detach()
    levels = 127 if layer.reduce_range else 255
    assert (error <= _rounding_bound(x, linear, levels)).all()
    assert error.max() > 0  # it really computed in int8


def _int8_products_exact_in_cpuinfo() -> bool | None:
    """Whether /proc/cpuinfo lists AVX512-VNNI or AMX-INT8 (int8 dot products summed in 32 bits,
    which oneDNN uses); None where there is no /proc/cpuinfo or it lists only AVX-VNNI."""
    try:
        flags = set(open("/proc/cpuinfo").read().split())
    except OSError:
        return None
    return True if flags & {"avx512_vnni", "amx_int8"} else None if "avx_vnni" in flags \
        else False


@pytest.mark.parametrize("save_env,load_env", [({}, AVX2_ENV), (AVX2_ENV, {})],
                         ids=["saved-here-run-on-avx2", "saved-on-avx2-run-here"])
def test_onednn_model_saved_under_one_isa_is_right_under_another(tmp_path, save_env, load_env):
    """A folder quantised with oneDNN by one process loads in another that sees other int8
    instructions, and every int8 layer there is within the rounding bound of the fp32 layer:
    the activation bits follow the CPU running the model (7 without VNNI, 8 with), nothing in
    the folder pins them. The old layer pinned 8 bits to oneDNN: 9x the bound under AVX2."""
    lmlab.save_pretrained(tiny_bert(), tmp_path / "fp32")  # both processes read the same fp32 weights

    def python(script: str, env: dict[str, str]) -> str:
        clean = {k: v for k, v in os.environ.items() if k not in AVX2_ENV}
        result = subprocess.run([sys.executable, "-c", textwrap.dedent(script)],
                                capture_output=True, text=True, timeout=120,
                                cwd=os.path.dirname(TESTS_DIR), env={**clean, **env})
        assert result.returncode == 0, result.stderr[-3000:]
        return result.stdout

    python(f"""
        import lmlab
        from lmlab.compress.quantize import quantize_int8, save_quantized
        model = quantize_int8(lmlab.from_pretrained({str(tmp_path / 'fp32')!r}), "onednn",
                              "per-tensor")
        save_quantized(model, {str(tmp_path / 'int8')!r})
    """, save_env)
    report = json.loads(python(f"""
        import json, torch, lmlab
        from lmlab.compress.quantize import Int8Linear
        from tests.test_quantize import _rounding_bound
        fp32, int8 = (lmlab.from_pretrained({str(tmp_path / 'fp32')!r}),
                      lmlab.from_pretrained({str(tmp_path / 'int8')!r}))
        torch.manual_seed(1)
        worst, reduced = 0.0, set()
        with torch.no_grad():
            for name, layer in int8.named_modules():
                if isinstance(layer, Int8Linear):
                    linear = fp32.get_submodule(name)
                    x = torch.randn(16, linear.in_features) * 3 + 0.5
                    bound = _rounding_bound(x, linear, 127 if layer.reduce_range else 255)
                    worst = max(worst, ((layer(x) - linear(x)).abs() / bound).max().item())
                    reduced.add(layer.reduce_range)
        print(json.dumps({{"worst": worst, "reduced": sorted(reduced)}}))
    """, load_env).splitlines()[-1])
    assert report["worst"] <= 1, report
    if load_env:  # oneDNN capped at AVX2 has no VNNI on any CPU: 7-bit activations
        assert report["reduced"] == [True], report
    elif _int8_products_exact_in_cpuinfo() is not None:  # 8 bits where the CPU sums them exactly
        assert report["reduced"] == [not _int8_products_exact_in_cpuinfo()], report


def test_quantize_model_every_linear_and_outputs_close():
    model = tiny_bert().eval()
    model.add_head("mlm")
    model.eval()
    linears = [n for n, m in model.named_modules() if isinstance(m, nn.Linear)]
    ids = torch.randint(5, 30000, (2, 12))
    with torch.no_grad():
        expected = model(input_ids=ids).last_hidden_state
        quantize_int8(model)
        got = model(input_ids=ids).last_hidden_state
    assert quantized_layers(model) == linears
    assert not any(type(m) is nn.Linear for m in model.modules())
    cosine = nn.functional.cosine_similarity(got.flatten(0, 1), expected.flatten(0, 1), dim=-1)
    assert cosine.min() > 0.98, cosine.min()
    assert not torch.equal(got, expected)


def test_runs_under_bf16_autocast():
    """`lmlab evaluate --precision bf16` runs the model under bf16 autocast, whose attention
    products hand bf16 to the int8 layers: they take it (fp32 holds it exactly) and give bf16
    back, as nn.Linear does under autocast (the kernels themselves refuse non-fp32 input)."""
    torch.manual_seed(2)
    layer = Int8Linear.from_linear(nn.Linear(48, 40), default_engine(), "per-channel")
    x = torch.randn(3, 48).to(torch.bfloat16)
    y = layer(x)
    assert y.dtype == torch.bfloat16
    assert torch.equal(y, layer(x.float()).to(torch.bfloat16))  # exact: one kernel, same input
    model = quantize_int8(tiny_bert().eval())
    ids = torch.randint(5, 30000, (2, 12))
    with torch.no_grad():
        fp32 = model(input_ids=ids).last_hidden_state
        with torch.autocast("cpu", dtype=torch.bfloat16):
            bf16 = model(input_ids=ids).last_hidden_state.float()
    # bf16 rounds to 2^-9 relative; cosine 0.999 allows a ~4% relative deviation per token
    cosine = nn.functional.cosine_similarity(bf16.flatten(0, 1), fp32.flatten(0, 1), dim=-1)
    assert cosine.min() > 0.999, cosine.min()


def test_saved_model_reloads_in_a_fresh_process(tmp_path):
    """Save a quantised model; a new Python process loads it with lmlab.from_pretrained and
    gives the same outputs bit for bit (same int8 weights, same kernels)."""
    model = tiny_bert().eval()
    quantize_int8(model, granularity="per-channel")
    out = save_quantized(model, tmp_path / "int8")
    info = json.loads((out / "quantization.json").read_text())
    assert info["layers"] == quantized_layers(model) and info["granularity"] == "per-channel"
    ids = torch.randint(5, 30000, (3, 9))
    mask = torch.ones_like(ids)
    mask[1, 5:] = 0
    with torch.no_grad():
        expected = model(input_ids=ids, attention_mask=mask).last_hidden_state
    torch.save({"ids": ids, "mask": mask}, tmp_path / "inputs.pt")
    script = textwrap.dedent(f"""
        import torch, lmlab
        from lmlab.compress.quantize import Int8Linear
        inputs = torch.load({str(tmp_path / 'inputs.pt')!r})
        model = lmlab.from_pretrained({str(out)!r})
        assert sum(isinstance(m, Int8Linear) for m in model.modules()) == {len(info['layers'])}
        with torch.no_grad():
            out = model(input_ids=inputs["ids"], attention_mask=inputs["mask"])
        torch.save(out.last_hidden_state, {str(tmp_path / 'out.pt')!r})
    """)
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                            timeout=120)
    assert result.returncode == 0, result.stderr[-3000:]
    # exact: the same int8 weights through the same kernels, on the same inputs and threads
    assert torch.equal(torch.load(tmp_path / "out.pt"), expected)


def test_cli_quantize_then_evaluate_format(tmp_path):
    folder = save_tiny_bert_folder(tmp_path / "bert")
    out = tmp_path / "int8"
    result = run_lmlab("quantize", folder, out, "--int8", "--engine", "x86")
    assert result.returncode == 0, result.stderr[-3000:]
    assert "linear layers int8" in result.stdout
    assert (out / "tokenizer.json").exists() and (out / "quantization.json").exists()
    model = load_quantized(out)
    assert quantized_layers(model) and model.get_submodule(quantized_layers(model)[0]).engine == "x86"
    # never over an existing folder without --overwrite, and nothing is rewritten
    before = (out / "model.safetensors").stat().st_mtime_ns
    again = run_lmlab_here("quantize", folder, out, "--int8")
    assert_clean_refusal(again, "already holds", fix="--overwrite")
    assert (out / "model.safetensors").stat().st_mtime_ns == before


# -- refusals, before any work ---------------------------------------------------------------------
class MaskedLinear(nn.Linear):
    def forward(self, x):
        return super().forward(x) * 0.5


def test_refuses_linear_subclass_and_changes_nothing():
    model = tiny_bert()
    model.transformer.layers[0].attention.q_proj = MaskedLinear(32, 32)
    with pytest.raises(LmlabError, match="MaskedLinear") as error:
        quantize_int8(model)
    assert error.value.fix and "plain nn.Linear" in error.value.fix
    assert not quantized_layers(model)  # refused before the first conversion


def test_refuses_hooks_multihead_attention_and_no_linear():
    hooked = nn.Sequential(nn.Linear(4, 4))
    from torch.nn.utils import prune

    prune.l1_unstructured(hooked[0], "weight", amount=0.5)
    with pytest.raises(LmlabError, match="hooks or parametrisations"):
        quantizable_linears(hooked)
    with pytest.raises(LmlabError, match="NonDynamicallyQuantizableLinear"):
        quantize_int8(nn.MultiheadAttention(8, 2))
    with pytest.raises(LmlabError, match="no nn.Linear"):
        quantize_int8(nn.Sequential(nn.Embedding(10, 4), nn.LayerNorm(4)))


def test_refuses_bf16_already_quantised_and_bad_options():
    with pytest.raises(LmlabError, match="bfloat16"):
        quantize_int8(nn.Sequential(nn.Linear(4, 4)).to(torch.bfloat16))
    model = quantize_int8(nn.Sequential(nn.Linear(4, 4)))
    with pytest.raises(LmlabError, match="already int8"):
        quantize_int8(model)
    with pytest.raises(LmlabError, match="engine 'tpu'"):
        quantize_int8(nn.Sequential(nn.Linear(4, 4)), engine="tpu")
    with pytest.raises(LmlabError, match="granularity"):
        quantize_int8(nn.Sequential(nn.Linear(4, 4)), granularity="per-row")
    with pytest.raises(LmlabError, match="no int8 layer"):
        save_quantized(tiny_bert(), "never-written")


def test_cli_refuses_unsupported_model_cleanly(tmp_path):
    """A bf16 cast is not asked for by the CLI; an unknown engine is refused before loading."""
    result = run_lmlab_here("quantize", tmp_path / "missing", tmp_path / "out", "--int8",
                       "--engine", "tpu")
    assert_clean_refusal(result, "engine 'tpu'")
    assert not (tmp_path / "out").exists()


def test_finetuning_an_int8_model_is_refused_before_any_work(tmp_path):
    """Its Int8Linear layers have no trainable weights: fine-tuning trained the rest silently,
    then failed to save the model (KeyError) after the whole run."""
    from lmlab.finetune.runner import finetune
    from lmlab.tasks import load_builtin_task

    out = save_quantized(quantize_int8(tiny_bert().eval()), tmp_path / "int8")
    with pytest.raises(LmlabError, match="int8-quantised") as error:
        finetune(load_builtin_task("fortunes-topic"), out, tmp_path / "run", epochs=1,
                 show_progress=False)
    assert "fp32" in error.value.fix
    assert not (tmp_path / "run").exists()


def test_pretraining_from_an_int8_model_is_refused_before_any_work(tmp_path, tmp_path_factory):
    """`lmlab pretrain --init INT8` and `lmlab distil --teacher INT8` (whose student copies the
    teacher's weights) are refused by the config's validation, before the run folder."""
    from lmlab.training.config import TrainingConfig
    from lmlab.training.pretrain import DataSettings, ModelSettings, PretrainConfig
    from tests.conftest import kjv_shards

    shards = kjv_shards(tmp_path_factory, train=4, validation=2)
    out = save_quantized(quantize_int8(tiny_bert().eval()), tmp_path / "int8")
    config = PretrainConfig(out=tmp_path / "run", training=TrainingConfig(seq_len=16, max_steps=1),
                            model=ModelSettings(init=str(out)),
                            data=DataSettings(shards, None, 1), track_cost=False)
    with pytest.raises(LmlabError, match="int8-quantised"):
        config.validate()
    result = run_lmlab_here("pretrain", "--init", out, "--objective", "mlm", "--shards", shards,
                       "--steps", 1, "--out", tmp_path / "run")
    assert_clean_refusal(result, "int8-quantised")
    assert not (tmp_path / "run").exists()


def test_a_model_whose_folder_would_not_load_is_not_saved(tmp_path):
    """Prompt tuning's virtual tokens are not rebuilt from config.json: such a folder was
    written, then refused on loading ("unexpected transformer.prompt_embeddings.weight")."""
    from lmlab.adapt import apply_method

    model = tiny_bert().eval()
    apply_method(model, "prompt")
    quantize_int8(model)
    with pytest.raises(LmlabError, match="prompt_embeddings"):
        save_quantized(model, tmp_path / "int8")
    assert not (tmp_path / "int8").exists()


def test_damaged_folder_is_refused(tmp_path):
    model = quantize_int8(tiny_bert().eval())
    out = save_quantized(model, tmp_path / "int8")
    info = json.loads((out / "quantization.json").read_text())
    info["layers"] = info["layers"][1:]  # one int8 layer no longer declared
    (out / "quantization.json").write_text(json.dumps(info))
    with pytest.raises(LmlabError, match="do not match"):
        load_quantized(out)


def test_default_engine_is_available():
    assert default_engine() in torch.backends.quantized.supported_engines
