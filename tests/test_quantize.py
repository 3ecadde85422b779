"""Dynamic int8 quantisation (lmlab.compress.quantize, lmlab quantize): the int8 layer against
torch's own dynamic quantised Linear (same weights rounded the same way, same kernel), its
error against the bound the rounding allows (per call and per token), MiniLM's sentence vectors
against fp32's, the engine measured per layer shape, a whole model, saving and loading in a
fresh process (also under another CPU's int8 instructions), and the refusals."""

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
    full_range_exact,
    int8_engines,
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
# How a developer makes any x86 CPU compute like an AVX2 one without VNNI (oneDNN, fbgemm, ATen)
AVX2_ENV = {"ONEDNN_MAX_CPU_ISA": "AVX2", "ATEN_CPU_CAPABILITY": "avx2",
            "FBGEMM_ENABLE_INSTRUCTIONS": "AVX2"}


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
    """Same int8 weights and scales as torch's MinMaxObserver gives where the kernels take 8-bit
    weights, and with per-call activation ranges (on the same engine, x86) the same outputs as
    that kernel with 8-bit activations: the one kernel computes both."""
    if not full_range_exact("x86"):
        pytest.skip("x86's kernels saturate 8-bit weights on this CPU: lmlab rounds to 7 bits")
    torch.manual_seed(0)
    linear = nn.Linear(48, 40)
    x = torch.randn(3, 7, 48) * 2
    previous = torch.backends.quantized.engine
    torch.backends.quantized.engine = "x86"
    try:
        reference = _torch_reference(linear, granularity == "per-channel")
        ours = Int8Linear.from_linear(linear, "x86", granularity, "per-tensor")
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
        # torch.ao passes 7-bit activations (reduce_range=True) to x86 on every CPU; lmlab 8
        packed = reference._packed_params._packed_params
        theirs = torch.ops.quantized.linear_dynamic(x, packed, False)
        assert torch.equal(ours(x), theirs)  # exact: one int8 kernel, same int8 weights and input
    finally:
        torch.backends.quantized.engine = previous


def _rounding_bound(x: torch.Tensor, linear: nn.Linear, layer: Int8Linear) -> torch.Tensor:
    """|y_int8 - y_fp32| allowed by rounding each weight to within s_w / 2 (the layer's largest
    weight scale) and each input to within s_x / 2 (255 steps over the range of the whole input
    including 0, or over each row's own range for per-token activations), per output."""
    w = linear.weight.detach()
    s_w = layer.int8_state()["weight_scale"].max().float()
    if layer.activations == "per-token":
        s_x = (x.amax(-1, keepdim=True) - x.amin(-1, keepdim=True)) / 255  # (N, 1)
    else:
        s_x = (x.max().clamp(min=0) - x.min().clamp(max=0)) / 255
    k = w.shape[1]
    return (x.abs().sum(-1, keepdim=True) * s_w / 2 + w.abs().sum(1) * s_x / 2
            + k * s_w * s_x / 4) * 1.01 + 1e-6  # 1%: fp32 rounding of the rescaling itself


@pytest.mark.parametrize("activations", ["per-token", "per-tensor"])
@pytest.mark.parametrize("engine", ENGINES)
def test_int8_linear_error_within_rounding_bound(engine, activations):
    """Within the bound of its rounding on this CPU: 8-bit activations, and weights of 7 bits
    where the kernels would saturate 16-bit sums of 8-bit products (no VNNI: an AVX2 host, or
    the AVX2 caps); errors 5x the bound when 8 bits were used regardless."""
    torch.manual_seed(1)
    linear = nn.Linear(64, 32)
    x = torch.randn(5, 64) * 3 + 0.5
    x[2] *= 20  # one token with a far larger range than the others
    layer = Int8Linear.from_linear(linear, engine, "per-tensor", activations)
    error = (layer(x) - linear(x)).abs().detach()
    assert (error <= _rounding_bound(x, linear, layer)).all()
    assert error.max() > 0  # it really computed in int8
    largest = int(layer.int8_state()["weight_int8"].abs().max())
    assert largest in ((127, 128) if full_range_exact(engine) else (64,))


def test_per_token_ranges_spare_the_other_tokens():
    """One outlier token coarsens every token's steps with one range per call; per token, the
    ordinary tokens' error shrinks by about the ratio of the ranges."""
    torch.manual_seed(3)
    linear = nn.Linear(64, 32)
    x = torch.randn(6, 64)
    x[0, 0] = 60.0  # an outlier dimension on one token, as MiniLM's [CLS]/[SEP] have
    errors = {}
    for activations in ("per-token", "per-tensor"):
        layer = Int8Linear.from_linear(linear, ENGINES[0], "per-channel", activations)
        errors[activations] = (layer(x) - linear(x))[1:].abs().max().item()
    assert errors["per-token"] < errors["per-tensor"] / 5, errors


def _int8_products_exact_in_cpuinfo() -> bool | None:
    """Whether /proc/cpuinfo lists AVX512-VNNI or AMX-INT8 (int8 dot products summed in 32 bits,
    which oneDNN uses); None where there is no /proc/cpuinfo or it lists only AVX-VNNI."""
    try:
        flags = set(open("/proc/cpuinfo").read().split())
    except OSError:
        return None
    return True if flags & {"avx512_vnni", "amx_int8"} else None if "avx_vnni" in flags \
        else False


@pytest.mark.parametrize("engine", [pytest.param(e, marks=[pytest.mark.slow] if e == "x86" else [])
                                    for e in ("onednn", "x86") if e in ENGINES])
@pytest.mark.parametrize("save_env,load_env", [({}, AVX2_ENV), (AVX2_ENV, {})],
                         ids=["saved-here-run-on-avx2", "saved-on-avx2-run-here"])
def test_model_saved_under_one_isa_is_right_under_another(tmp_path, save_env, load_env, engine):
    """A folder quantised by one process loads in another that sees other int8 instructions,
    and every int8 layer there is within the rounding bound of the fp32 layer: 8-bit weights
    saved where the kernels take them are halved to 7 bits where they would saturate (the old
    layer pinned 8-bit oneDNN activations: 9x the bound under AVX2), and 7-bit ones stay 7."""
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
        model = quantize_int8(lmlab.from_pretrained({str(tmp_path / 'fp32')!r}), {engine!r},
                              "per-tensor")
        save_quantized(model, {str(tmp_path / 'int8')!r})
    """, save_env)
    report = json.loads(python(f"""
        import json, torch, lmlab
        from lmlab.compress.quantize import Int8Linear, full_range_exact
        from tests.test_quantize import _rounding_bound
        fp32, int8 = (lmlab.from_pretrained({str(tmp_path / 'fp32')!r}),
                      lmlab.from_pretrained({str(tmp_path / 'int8')!r}))
        torch.manual_seed(1)
        worst, largest = 0.0, set()
        with torch.no_grad():
            for name, layer in int8.named_modules():
                if isinstance(layer, Int8Linear):
                    linear = fp32.get_submodule(name)
                    x = torch.randn(16, linear.in_features) * 3 + 0.5
                    bound = _rounding_bound(x, linear, layer)
                    worst = max(worst, ((layer(x) - linear(x)).abs() / bound).max().item())
                    largest.add(int(layer.int8_state()["weight_int8"].abs().max()) > 64)
        print(json.dumps({{"worst": worst, "eight_bits": sorted(largest),
                           "exact": full_range_exact({engine!r})}}))
    """, load_env).splitlines()[-1])
    assert report["worst"] <= 1, report
    if load_env:  # capped at AVX2, no engine has VNNI on any CPU: 7-bit weights
        assert report["eight_bits"] == [False] and not report["exact"], report
    elif save_env:  # quantised without VNNI: 7 bits, kept
        assert report["eight_bits"] == [False], report
    elif _int8_products_exact_in_cpuinfo() is not None:  # 8 bits where the CPU sums them exactly
        assert report["eight_bits"] == [_int8_products_exact_in_cpuinfo()], report


def test_quantize_model_every_linear_and_outputs_close():
    model = tiny_bert().eval()
    model.add_head("mlm")
    model.eval()
    linears = [n for n, m in model.named_modules() if isinstance(m, nn.Linear)]
    ids = torch.randint(5, 30000, (2, 12))
    with torch.no_grad():
        expected = model(input_ids=ids).last_hidden_state
        quantize_int8(model, ENGINES[0])
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
    layer = Int8Linear.from_linear(nn.Linear(48, 40), ENGINES[0], "per-channel")
    x = torch.randn(3, 48).to(torch.bfloat16)
    y = layer(x)
    assert y.dtype == torch.bfloat16
    assert torch.equal(y, layer(x.float()).to(torch.bfloat16))  # exact: one kernel, same input
    model = quantize_int8(tiny_bert().eval(), ENGINES[0])
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
    quantize_int8(model, ENGINES[0], granularity="per-channel")
    out = save_quantized(model, tmp_path / "int8")
    info = json.loads((out / "quantization.json").read_text())
    assert info["layers"] == quantized_layers(model) and info["granularity"] == "per-channel"
    assert info["engines"] == dict.fromkeys(info["layers"], ENGINES[0])
    assert info["activation_ranges"] == "per-token"
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
    model = quantize_int8(nn.Sequential(nn.Linear(4, 4)), ENGINES[0])
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

    out = save_quantized(quantize_int8(tiny_bert().eval(), ENGINES[0]), tmp_path / "int8")
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
    out = save_quantized(quantize_int8(tiny_bert().eval(), ENGINES[0]), tmp_path / "int8")
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
    quantize_int8(model, ENGINES[0])
    with pytest.raises(LmlabError, match="prompt_embeddings"):
        save_quantized(model, tmp_path / "int8")
    assert not (tmp_path / "int8").exists()


def test_folder_from_before_per_token_ranges_loads_as_it_ran(tmp_path, monkeypatch):
    """A folder without activation_ranges or per-layer engines (written before them) runs with
    one range per call, on its one engine; engine="auto" measures this host's per shape."""
    out = save_quantized(quantize_int8(tiny_bert().eval(), ENGINES[0],
                                       activations="per-tensor"), tmp_path / "int8")
    info = json.loads((out / "quantization.json").read_text())
    del info["activation_ranges"], info["engines"]
    (out / "quantization.json").write_text(json.dumps(info))
    layers = [m for m in load_quantized(out).modules() if isinstance(m, Int8Linear)]
    assert {(m.activations, m.engine) for m in layers} == {("per-tensor", ENGINES[0])}
    monkeypatch.setenv("LMLAB_CACHE", str(tmp_path / "cache"))  # measured afresh
    layers = [m for m in load_quantized(out, engine="auto").modules()
              if isinstance(m, Int8Linear)]
    assert layers and all(m.engine in int8_engines() for m in layers)


def test_damaged_folder_is_refused(tmp_path):
    model = quantize_int8(tiny_bert().eval(), ENGINES[0])
    out = save_quantized(model, tmp_path / "int8")
    info = json.loads((out / "quantization.json").read_text())
    info["layers"] = info["layers"][1:]  # one int8 layer no longer declared
    (out / "quantization.json").write_text(json.dumps(info))
    with pytest.raises(LmlabError, match="do not match"):
        load_quantized(out)


def test_auto_engine_follows_the_measured_times_per_shape(monkeypatch, tmp_path):
    """engine="auto" takes each layer shape's fastest path as measured (once per host and
    shape, cached); a shape faster in fp32 stays nn.Linear; all-fp32 is refused."""
    import lmlab.compress.quantize as quantize

    calls = []

    def measure(fan_in, fan_out, activations, tokens):
        calls.append((fan_in, fan_out))
        if fan_out > fan_in:  # the 32 -> 64 (up) projections: fp32 wins
            return {"fp32": 1.0, "x86": 2.0, "onednn": 3.0}
        return {"fp32": 3.0, "x86": 2.0, "onednn": 1.0}

    monkeypatch.setattr(quantize, "measure_int8_times", measure)
    monkeypatch.setenv("LMLAB_CACHE", str(tmp_path))  # nothing cached yet
    model = quantize_int8(tiny_bert().eval())
    engines = {name: type(m).__name__ if not isinstance(m, Int8Linear) else m.engine
               for name, m in model.named_modules() if isinstance(m, (nn.Linear, Int8Linear))}
    if "onednn" in int8_engines():
        assert set(engines.values()) == {"Linear", "onednn"}, engines
    assert all(v == "Linear" for k, v in engines.items() if k.endswith("up_proj")), engines
    assert len(calls) == len({(m.in_features, m.out_features) for m in tiny_bert().modules()
                              if isinstance(m, nn.Linear)})  # one measurement per shape
    with pytest.raises(LmlabError, match="faster in fp32") as error:
        quantize_int8(nn.Sequential(nn.Linear(8, 16)))
    assert "x86" in error.value.fix


def test_engine_times_are_measured_and_cached(monkeypatch, tmp_path):
    from lmlab.compress.quantize import fastest_engine, int8_times

    monkeypatch.setenv("LMLAB_CACHE", str(tmp_path))
    times = int8_times(16, 24, "per-token", tokens=8)
    assert set(times) == {"fp32", *[e for e in ("x86", "onednn") if e in int8_engines()]}
    assert all(v > 0 for v in times.values())
    assert int8_times(16, 24, "per-token", tokens=8) == times  # the cache, not a new timing
    assert fastest_engine(16, 24) in int8_engines()


def test_minilm_sentence_vectors_within_cosine_099_of_fp32(minilm_dir):
    """Issue 33's bound on the MiniLM checkpoint, with the default per-token activations on
    both engines, here and under the AVX2 caps (7-bit weights; a fresh process, since the caps
    are read at start-up). Per-call ranges gave 0.95 on x86 with 7-bit activations."""
    script = textwrap.dedent(f"""
        import copy, json, torch
        from lmlab.compress.quantize import quantize_int8
        from lmlab.sentence.encoder import SentenceEncoder
        from tests.test_quantize import SENTENCES
        encoder = SentenceEncoder.load({str(minilm_dir)!r})
        fp32, model = encoder.encode(SENTENCES), encoder.model
        worst = {{}}
        for engine in {[e for e in ("x86", "onednn") if e in ENGINES]!r}:
            encoder.model = quantize_int8(copy.deepcopy(model), engine)
            cosine = torch.nn.functional.cosine_similarity(encoder.encode(SENTENCES), fp32)
            worst[engine] = cosine.min().item()
        print(json.dumps(worst))
    """)
    for env in ({}, AVX2_ENV):
        clean = {k: v for k, v in os.environ.items() if k not in AVX2_ENV}
        result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                                timeout=300, cwd=os.path.dirname(TESTS_DIR), env={**clean, **env})
        assert result.returncode == 0, result.stderr[-3000:]
        worst = json.loads(result.stdout.splitlines()[-1])
        assert worst and min(worst.values()) >= 0.99, (env, worst)


SENTENCES = ["The cat sat on the mat.", "A quick brown fox jumps over the lazy dog.",
             "Quantisation makes inference faster on CPUs.", "I love pizza with extra cheese",
             "The stock market fell sharply on Monday after the announcement.", "Hello world",
             "This is a test sentence.", "What is the capital of France?",
             'He said: "no, never!" and left; the door slammed (loudly).']
