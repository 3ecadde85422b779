"""Named model sizes: shapes from the papers, parameter counts, the extensible table."""

from __future__ import annotations

import pytest
import torch

from lmlab.models import presets
from lmlab.models.config import TransformerConfig
from lmlab.models.presets import list_presets, preset, register_preset
from lmlab.utils.errors import LmlabError

ENCODERS = [(f, s) for f, s in list_presets()
            if f in ("bert", "roberta", "albert", "electra", "distilbert")]


@pytest.mark.parametrize("size,layers,hidden", [
    ("tiny", 2, 128), ("mini", 4, 256), ("small", 4, 512), ("medium", 8, 512),
    ("base", 12, 768), ("large", 24, 1024)])
def test_bert_sizes_follow_the_papers(size, layers, hidden):
    config = preset("bert", size)
    assert (config.num_hidden_layers, config.hidden_size) == (layers, hidden)
    assert config.num_attention_heads == hidden // 64
    assert config.intermediate_size == 4 * hidden


def test_family_presets_carry_the_family_specifics():
    roberta = preset("roberta", "base")
    assert (roberta.position_offset, roberta.pad_token_id, roberta.type_vocab_size) == (2, 1, 1)
    albert = preset("albert", "base")
    assert albert.share_layers and albert.embedding_size == 128
    assert albert.hidden_act == "gelu_new"
    small, generator = preset("electra", "small"), preset("electra", "small-generator")
    assert (small.hidden_size, small.embedding_size, small.num_attention_heads) == (256, 128, 4)
    assert generator.hidden_size == small.hidden_size // 4
    assert generator.intermediate_size == small.intermediate_size // 4
    assert preset("electra", "base-generator").hidden_size == 768 // 3
    distil = preset("distilbert", "base")
    assert (distil.num_hidden_layers, distil.type_vocab_size) == (6, 0)


def test_overrides_and_fresh_objects():
    config = preset("bert", "tiny", vocab_size=8000, num_attention_heads=4)
    assert config.vocab_size == 8000 and config.head_dim == 32
    assert preset("bert", "tiny").vocab_size == 30522  # overrides do not leak
    assert preset("bert", "tiny") is not preset("bert", "tiny")
    # RoBERTa's position offset follows a new pad id (a tokenizer with [PAD] = 0)
    assert preset("roberta", "base", pad_token_id=0).position_offset == 1


def test_unknown_names_are_clear_errors():
    with pytest.raises(LmlabError, match="no bert preset named 'huge'") as info:
        preset("bert", "huge")
    assert "tiny" in str(info.value)
    with pytest.raises(LmlabError, match="no presets for family 'reformer'"):
        preset("reformer", "base")
    with pytest.raises(LmlabError, match="callable or a dict"):
        register_preset("bert", "bad", 3)


def test_register_preset(monkeypatch):
    monkeypatch.setattr(presets, "_PRESETS", dict(presets._PRESETS))
    register_preset("bert", "4x64", lambda: TransformerConfig(hidden_size=64,
                                                              num_hidden_layers=4,
                                                              num_attention_heads=1))
    register_preset("bert", "dict", {"hidden_size": 32, "num_attention_heads": 2})
    assert ("bert", "4x64") in list_presets()
    assert preset("bert", "4x64").num_hidden_layers == 4
    assert preset("bert", "dict").head_dim == 16


def test_decoder_presets_listed():
    families = {family for family, _ in list_presets()}
    assert {"gpt2", "llama"} <= families


@pytest.mark.parametrize("family,size", ENCODERS)
def test_config_parameter_count_matches_the_model(family, size):
    """TransformerConfig.num_parameters equals the built model's count (meta device: no RAM)."""
    from lmlab.models.model import LanguageModel

    config = preset(family, size)
    with torch.device("meta"):
        model = LanguageModel(config, heads=[])
    assert model.num_parameters() == config.num_parameters()


@pytest.mark.parametrize("family,size", ENCODERS)
def test_presets_match_transformers(family, size):
    """The preset written as config.json builds a transformers model with as many parameters
    (pooler aside) as ours, and reads back to the same config."""
    transformers = pytest.importorskip("transformers")
    from lmlab.models.families import get_family
    from lmlab.models.model import LanguageModel

    config = preset(family, size)
    spec = get_family(family)
    hf_values = spec.config_to_hf(config)
    hf_config = transformers.AutoConfig.for_model(**hf_values)
    with torch.device("meta"):
        theirs = transformers.AutoModel.from_config(hf_config)
        ours = LanguageModel(config, heads=[])
    theirs_count = sum(p.numel() for n, p in theirs.named_parameters() if "pooler" not in n)
    assert ours.num_parameters() == theirs_count
    assert spec.config_from_hf(hf_values) == config


@pytest.mark.parametrize("family,size", list_presets())
def test_config_json_round_trip(family, size):
    """Every preset written through its family's rename table reads back unchanged."""
    from lmlab.models.families import get_family

    spec = get_family(family)
    config = preset(family, size)
    assert spec.config_from_hf(spec.config_to_hf(config)) == config


@pytest.mark.parametrize("family,field,value", [
    ("llama", "position_embedding", "learned"), ("gpt2", "causal", False),
    ("bert", "pre_norm", True), ("albert", "share_layers", False),
    ("distilbert", "type_vocab_size", 2)])
def test_config_json_refuses_other_shapes(family, field, value):
    """A config.json cannot express a field of the family's shape: such a config is refused
    rather than written as a checkpoint that loads as another model."""
    from lmlab.models.families import get_family

    spec = get_family(family)
    config = preset(family, next(iter(spec.sizes)), **{field: value})
    with pytest.raises(LmlabError, match=f"not {family} shaped: {field}="):
        spec.config_to_hf(config)


def test_config_json_without_sizes_is_refused():
    from lmlab.models.families import get_family

    with pytest.raises(LmlabError, match="lacks n_heads"):
        get_family("distilbert").config_from_hf({"vocab_size": 9, "dim": 8, "n_layers": 1})
    with pytest.raises(LmlabError, match="lacks vocab_size, intermediate_size"):
        get_family("llama").config_from_hf({"hidden_size": 8, "num_hidden_layers": 1,
                                            "num_attention_heads": 2})
    with pytest.raises(LmlabError, match="no model family 'reformer'"):
        get_family("reformer")
