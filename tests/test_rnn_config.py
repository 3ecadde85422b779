"""The model configs' shared reading of config.json (lmlab.models.config.config_fields): unknown
fields refused with the config's name, id2label's JSON string keys read back as int ids, for
both TransformerConfig and RecurrentConfig, through a saved folder of each format."""

from __future__ import annotations

import json

import pytest

import lmlab
from lmlab.models.config import TransformerConfig
from lmlab.models.rnn.config import RecurrentConfig, recurrent_preset
from lmlab.utils.errors import LmlabError

LABELS = {"extra": {"num_labels": 2, "id2label": {"0": "neg", "1": "pos"}}}


@pytest.mark.parametrize("cls, what", [(TransformerConfig, "unknown config fields"),
                                       (RecurrentConfig, "unknown recurrent config fields")])
def test_from_dict_refuses_unknown_fields_and_reads_label_ids_as_ints(cls, what):
    with pytest.raises(LmlabError, match=f"{what}: hiden_size") as error:
        cls.from_dict({"hiden_size": 8})
    assert "vocab_size" in error.value.fix
    values = json.loads(json.dumps({"vocab_size": 40, **LABELS}))  # as config.json holds it
    config = cls.from_dict(values)
    assert config.extra["id2label"] == {0: "neg", 1: "pos"}
    assert values["extra"]["id2label"] == {"0": "neg", "1": "pos"}  # the caller's dict untouched


def test_saved_folders_of_both_formats_give_int_label_ids(tmp_path):
    from lmlab.interop.native import read_native_config, save_native
    from lmlab.interop.recurrent import build_model, read_recurrent_config
    from lmlab.models.model import LanguageModel

    extra = {**LABELS["extra"], "pooling": "concat"}  # ULMFiT's head
    recurrent = build_model(recurrent_preset("awd-lstm", "tiny", vocab_size=40, extra=extra),
                            ["sequence-classification"])
    lmlab.save_pretrained(recurrent, tmp_path / "awd")
    transformer = LanguageModel(TransformerConfig(vocab_size=40, hidden_size=16,
                                                  num_hidden_layers=1, num_attention_heads=2,
                                                  intermediate_size=32, **LABELS),
                                heads=["sequence-classification"])
    save_native(transformer, tmp_path / "bert")  # lmlab's own format
    for config, _ in (read_recurrent_config(tmp_path / "awd"),
                      read_native_config(tmp_path / "bert")):
        assert config.extra["id2label"] == {0: "neg", 1: "pos"}
