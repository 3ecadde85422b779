"""A truncated GGUF file (a cut download, an interrupted copy) is refused before any work, naming
the file, its size and the size its header, tensor table or tensor data needs: through the
library (LmlabError) at every kind of cut, and through the CLI (exit 2, no traceback) with
nothing written."""

from __future__ import annotations

import pytest
import torch
from conftest import assert_clean_refusal, disk_snapshot, run_lmlab_here

from lmlab.formats.gguf import read_metadata
from lmlab.interop.gguf import load_gguf_model
from lmlab.interop.gguf_writer import write_gguf
from lmlab.models.model import LanguageModel
from lmlab.models.presets import family_config
from lmlab.utils.errors import LmlabError


@pytest.fixture(scope="module")
def whole(tmp_path_factory, smollm2_gguf) -> bytes:
    """A random 2-layer Llama on SmolLM2's real tokenizer, written at Q8_0 by our writer."""
    from lmlab.tokenization.tokenizer import Tokenizer

    torch.manual_seed(0)
    config = family_config("llama", vocab_size=49152, hidden_size=64, num_hidden_layers=2,
                           num_attention_heads=4, num_key_value_heads=2, intermediate_size=96,
                           max_position_embeddings=256)
    model = LanguageModel(config, heads=("clm",)).eval()
    path = tmp_path_factory.mktemp("gguf") / "tiny.gguf"
    write_gguf(model, path, Tokenizer.from_pretrained(smollm2_gguf), "Q8_0",
               show_progress=False)
    return path.read_bytes()


def cuts(data: bytes) -> dict[str, tuple[int, str, str]]:
    """Where to cut the file -> (length kept, the part that is short, the size it needs): in the
    fixed header, in the tokenizer's vocabulary, in the tensor table (the first tensor's name),
    in the first tensor's data and one byte before the end."""
    vocabulary = data.index(b"tokenizer.ggml.tokens") + 1000
    table = data.index(b"token_embd.weight") + 5
    with_data = data.index(b"token_embd.weight") + 2000  # past the table, in the data
    return {"fixed header": (20, "header", "needs at least 24"),
            "vocabulary": (vocabulary, "header", "needs at least"),
            "tensor table": (table, "tensor table", "needs at least"),
            "tensor data": (with_data, "tensor data", f"needs {len(data):,}"),
            "last byte": (len(data) - 1, "tensor data", f"needs {len(data):,}")}


def cut_file(tmp_path, data: bytes, keep: int):
    path = tmp_path / "cut.gguf"
    path.write_bytes(data[:keep])
    return path


@pytest.mark.parametrize("where", ["fixed header", "vocabulary", "tensor table", "tensor data",
                                   "last byte"])
def test_the_library_refuses_a_cut_file(tmp_path, whole, where):
    assert load_gguf_model(cut_file(tmp_path, whole, len(whole))).config.num_hidden_layers == 2
    keep, part, needs = cuts(whole)[where]
    path = cut_file(tmp_path, whole, keep)
    with pytest.raises(LmlabError) as error:
        load_gguf_model(path)
    assert f"{path} is truncated: it has {keep:,} bytes but its {part} {needs}" in \
        error.value.problem
    assert "download it again" in error.value.fix
    if part == "header":
        with pytest.raises(LmlabError, match="is truncated"):
            read_metadata(path)
    else:  # the tokenizer reads only the key/value header, which is whole
        assert read_metadata(path)["general.architecture"] == "llama"


@pytest.mark.parametrize("where", ["vocabulary", "tensor table", "tensor data"])
def test_the_cli_refuses_a_cut_file_and_writes_nothing(tmp_path, whole, where):
    keep, part, needs = cuts(whole)[where]
    path = cut_file(tmp_path, whole, keep)
    before = disk_snapshot(tmp_path)
    assert_clean_refusal(run_lmlab_here("generate", path, "Hello", "--max-new-tokens", "2"),
                         str(path), f"it has {keep:,} bytes", f"its {part} {needs}",
                         fix="download it again")
    out = tmp_path / "out.gguf"
    assert_clean_refusal(run_lmlab_here("export", "gguf", path, out), str(path), "is truncated")
    assert disk_snapshot(tmp_path) == before
