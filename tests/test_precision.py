"""bf16 only where the CPU has bf16 instructions: detection from /proc/cpuinfo and a warning
(once) where bf16 would be emulated."""

from __future__ import annotations

import warnings

import pytest
import torch

from lmlab.cost import precision
from lmlab.cost.precision import SlowPrecisionWarning, native_bf16_from_cpuinfo

ZEN3 = "processor\t: 0\nflags\t\t: fpu sse2 avx avx2 fma bmi2\n"
SAPPHIRE_RAPIDS = "flags\t\t: avx2 avx512f avx512_bf16 amx_bf16 amx_tile\n"
GRAVITON3 = "Features\t: fp asimd sve bf16 i8mm\n"


def test_native_bf16_is_read_from_the_flags_line():
    assert native_bf16_from_cpuinfo(ZEN3) is False
    assert native_bf16_from_cpuinfo(SAPPHIRE_RAPIDS) is True
    assert native_bf16_from_cpuinfo(GRAVITON3) is True
    assert native_bf16_from_cpuinfo("model name : something\n") is None
    # a flag that merely contains the text does not count
    assert native_bf16_from_cpuinfo("flags : avx512_bf16x\n") is False


@pytest.fixture
def emulated_bf16(monkeypatch):
    monkeypatch.setattr(precision, "cpu_has_native_bf16", lambda: False)
    monkeypatch.setattr(precision, "_warned", False)


def test_warns_once_on_a_cpu_without_bf16(emulated_bf16):
    with pytest.warns(SlowPrecisionWarning, match="--precision fp32"):
        assert precision.warn_if_slow_bf16("cpu")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert precision.warn_if_slow_bf16("cpu")  # still slow, but said once already
        assert not precision.warn_if_slow_bf16("cuda")


def test_silent_where_bf16_is_native(monkeypatch):
    monkeypatch.setattr(precision, "cpu_has_native_bf16", lambda: True)
    monkeypatch.setattr(precision, "_warned", False)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert not precision.warn_if_slow_bf16("cpu")


def test_trainer_warns_before_running_bf16(emulated_bf16, tmp_path):
    """Pretraining and fine-tuning both run on the Trainer, which warns once."""
    from test_trainer import run

    with pytest.warns(SlowPrecisionWarning):
        run(tmp_path, precision="bf16", max_steps=1)
    assert precision._warned


def test_precision_autocast_enables_bf16_only_for_bf16(emulated_bf16):
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with precision.precision_autocast("fp32"):
            assert not torch.is_autocast_enabled("cpu")
    with pytest.warns(SlowPrecisionWarning):
        with precision.precision_autocast("bf16"):
            assert torch.is_autocast_enabled("cpu")
            assert torch.get_autocast_dtype("cpu") == torch.bfloat16
