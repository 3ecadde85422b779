"""CANINE: parity with transformers' CanineModel and its task classes both ways on random
weights (a padded multilingual batch whose lengths are no multiple of the blocks or the
downsampling rate, with blocks of padding only), a fresh-process reload, the presets, and the
codepoint tokenizer against CanineTokenizer."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import torch
from conftest import assert_close_rounding

import lmlab
from lmlab.models.canine import CanineModel
from lmlab.models.presets import preset
from lmlab.models.task_heads import task_logits
from lmlab.tokenization.characters import CharacterTokenizer
from lmlab.utils.errors import LmlabError

transformers = pytest.importorskip("transformers")

SMALL = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=48)
SETTINGS = dict(num_hash_functions=4, num_hash_buckets=97, local_transformer_stride=8,
                downsampling_rate=4, upsampling_kernel_size=4)
TEXTS = ["héllo wörld, 日本語のテキスト", "Привет", "مرحبا بالعالم and a few more words here",
         "abc", "🙂 emoji 👩‍👩‍👧 दुनिया"]
PAIRS = ["second", "ä", "Ελληνικά κείμενα", "x", "한국어"]


def _perturb(model):
    """Move every weight off its initialisation (norms, biases, convolutions too)."""
    generator = torch.Generator().manual_seed(3)
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.add_(0.2 * torch.randn(parameter.shape, generator=generator))
    return model.eval()


def _hf_model(cls: str, labels: int = 3):
    torch.manual_seed(0)
    config = transformers.CanineConfig(**SMALL, **SETTINGS, max_position_embeddings=64,
                                       num_labels=labels)
    return _perturb(getattr(transformers, cls)(config))


def _batch(pairs: bool = False) -> dict[str, torch.Tensor]:
    batch = CharacterTokenizer()(TEXTS, PAIRS if pairs else None, padding=True,
                                 return_tensors="pt")
    assert batch["input_ids"].shape[1] % 8 and (batch["attention_mask"] == 0).any()
    return dict(batch)


def _close(ours: torch.Tensor, theirs: torch.Tensor) -> None:
    assert ours.shape == theirs.shape
    assert_close_rounding(ours, theirs, terms=2 * SMALL["hidden_size"] * 4, depth=6)
    assert float((ours - theirs).abs().max()) <= 1e-4  # tol: issue 31's parity bound on outputs


def test_transformers_model_loads_with_the_same_outputs(tmp_path):
    theirs = _hf_model("CanineModel")
    theirs.save_pretrained(tmp_path)
    ours = lmlab.from_pretrained(tmp_path)
    assert isinstance(ours, CanineModel) and ours.pooler is not None and not ours.heads
    for pairs in (False, True):
        batch = _batch(pairs)
        with torch.no_grad():
            want = theirs(**batch, output_hidden_states=True, output_attentions=True)
            got = ours(**batch, output_hidden_states=True, output_attentions=True)
        _close(got.last_hidden_state, want.last_hidden_state)
        _close(got.pooler_output, want.pooler_output)
        assert len(got.hidden_states) == len(want.hidden_states) == 7
        for mine, reference in zip(got.hidden_states + got.attentions,
                                   want.hidden_states + want.attentions):
            _close(mine, reference)


@pytest.mark.parametrize("cls,head", [("CanineForSequenceClassification", "sequence-classification"),
                                      ("CanineForTokenClassification", "token-classification"),
                                      ("CanineForQuestionAnswering", "question-answering")])
def test_task_classes_load_with_the_same_logits(tmp_path, cls, head):
    theirs = _hf_model(cls, labels=2 if head == "question-answering" else 3)
    theirs.save_pretrained(tmp_path)
    ours = lmlab.from_pretrained(tmp_path)
    assert list(ours.heads) == [head]
    batch = _batch()
    with torch.no_grad():
        want, got = theirs(**batch), ours(**batch)
    if head == "question-answering":
        _close(got.logits[..., 0], want.start_logits)
        _close(got.logits[..., 1], want.end_logits)
    else:
        _close(got.logits, want.logits)


def test_multiple_choice_logits_equal_transformers(tmp_path):
    theirs = _hf_model("CanineForMultipleChoice")
    theirs.save_pretrained(tmp_path)
    ours = lmlab.from_pretrained(tmp_path)
    batch = {k: v.view(len(TEXTS) // 5, 5, -1) for k, v in _batch(pairs=True).items()}  # (B, C, T)
    with torch.no_grad():
        want, got = theirs(**batch).logits, task_logits(ours, "multiple-choice", batch)
    _close(got, want)


def test_lmlab_model_saves_for_transformers(tmp_path):
    """A preset-built CANINE (a classifier, and a bare one with its pooler) written by
    lmlab.save_pretrained: transformers loads the same model; the loss agrees too."""
    config = preset("canine", "small", **SMALL, max_position_embeddings=64,
                    extra=dict(SETTINGS, num_labels=4))
    batch, labels = _batch(pairs=True), torch.tensor([0, 3, 1, 3, 2])
    for heads, cls in ((["sequence-classification"], "CanineForSequenceClassification"),
                       ([], "CanineModel")):
        ours = _perturb(CanineModel(config, heads=heads, with_pooler=True))
        folder = lmlab.save_pretrained(ours, tmp_path / cls)
        assert json.loads((folder / "config.json").read_text())["architectures"] == [cls]
        theirs = getattr(transformers, cls).from_pretrained(folder).eval()
        with torch.no_grad():
            want = theirs(**batch, **({"labels": labels} if heads else {}))
            got = ours(**batch, labels=labels if heads else None)
        if heads:
            _close(got.logits, want.logits)
            assert_close_rounding(got.loss, want.loss, terms=SMALL["intermediate_size"], depth=6)
        else:
            _close(got.last_hidden_state, want.last_hidden_state)
            _close(got.pooler_output, want.pooler_output)


_RELOAD = """
import json, sys, torch, lmlab
model = lmlab.from_pretrained(sys.argv[1])
batch = {k: torch.tensor(v) for k, v in json.loads(sys.argv[2]).items()}
with torch.no_grad():
    print(json.dumps(model(**batch).logits.tolist()))
"""


def test_saved_model_reloads_in_a_fresh_process(tmp_path):
    config = preset("canine", "small", **SMALL, max_position_embeddings=64,
                    extra=dict(SETTINGS, num_labels=3))
    model = _perturb(CanineModel(config, heads=["sequence-classification"]))
    folder = lmlab.save_pretrained(model, tmp_path / "canine")
    batch = _batch()
    with torch.no_grad():
        expected = model(**batch).logits
    result = subprocess.run([sys.executable, "-c", _RELOAD, str(folder),
                             json.dumps({k: v.tolist() for k, v in batch.items()})],
                            capture_output=True, text=True, check=True)
    logits = torch.tensor(json.loads(result.stdout.strip().splitlines()[-1]))
    assert torch.equal(logits, expected)  # exact: same weights, same inputs, same ops


@pytest.mark.parametrize("size", ["s", "c"])
def test_presets_are_canine_s_and_c_shapes(size):
    config = preset("canine", size)
    spec = lmlab.models.families.get_family("canine")
    hf_values = spec.config_to_hf(config)
    assert spec.config_from_hf(hf_values) == config
    reference = transformers.CanineConfig()  # google/canine-s and -c share this shape
    assert {k: hf_values[k] for k in reference.to_dict() if k in hf_values} == {
        k: v for k, v in reference.to_dict().items() if k in hf_values}
    with torch.device("meta"):
        theirs = transformers.CanineModel(reference)
        ours = CanineModel(config, with_pooler=True)
    pooler = 768 * 768 + 768
    assert ours.num_parameters() == sum(p.numel() for p in theirs.parameters()) \
        == config.num_parameters() + pooler


def test_wrong_inputs_are_refused_before_any_work():
    config = preset("canine", "small", **SMALL, max_position_embeddings=64, extra=SETTINGS)
    model = CanineModel(config)
    with pytest.raises(LmlabError, match="fewer than the downsampling rate 4"):
        model(input_ids=torch.tensor([[0xE000, 97, 0xE001]]))
    with pytest.raises(LmlabError, match="more than the 64 positions"):
        model(input_ids=torch.full((1, 65), 97))
    with pytest.raises(LmlabError, match="num_hash_functions 5"):
        CanineModel(preset("canine", "small", **SMALL, extra=dict(SETTINGS,
                                                                   num_hash_functions=5)))


def test_tokenizer_ids_equal_canine_tokenizers(tmp_path):
    theirs, ours = transformers.CanineTokenizer(), CharacterTokenizer()
    texts = [*TEXTS, "", "x\x00y \ue003 z", "a\tb\nc  "]
    pairs = [*PAIRS, "z", "ok", "Ω"]
    for options in ({}, {"padding": True}, {"padding": "max_length", "max_length": 48},
                    {"truncation": True, "max_length": 9},
                    {"padding": True, "pad_to_multiple_of": 8},
                    {"padding": True, "padding_side": "left"}):
        for second in (None, pairs):
            assert dict(ours(texts, second, **options)) == dict(theirs(texts, second, **options))
    short, longer = ["abc", "Привет"], ["Ελληνικά κείμενα", "한국어 텍스트"]
    assert dict(ours(short, longer, truncation="only_second", max_length=12)) == \
        dict(theirs(short, longer, truncation="only_second", max_length=12))
    for text in texts:
        ids = theirs(text)["input_ids"]
        assert ours(text)["input_ids"] == ids
        for skip in (False, True):
            assert ours.decode(ids, skip_special_tokens=skip) == \
                theirs.decode(ids, skip_special_tokens=skip)
    ours.save_pretrained(tmp_path / "ours")
    assert type(transformers.AutoTokenizer.from_pretrained(tmp_path / "ours")).__name__ == \
        "CanineTokenizer"
    theirs.save_pretrained(tmp_path / "theirs")
    loaded = CharacterTokenizer.from_pretrained(tmp_path / "theirs")
    assert loaded(texts, padding=True) == ours(texts, padding=True)
    with pytest.raises(LmlabError, match="cannot cut to max_length=3"):
        ours("abc", "def", truncation="only_first", max_length=3)


def test_finetune_through_the_cli(tmp_path):
    """`lmlab finetune` on a CANINE folder (its codepoint tokenizer beside it): the classifier
    trains (loss falls) and the saved model is CanineForSequenceClassification."""
    from conftest import finetune_kinds

    torch.manual_seed(0)
    model = CanineModel(preset("canine", "small", **SMALL, max_position_embeddings=64,
                               extra=SETTINGS), with_pooler=True)
    folder = lmlab.save_pretrained(model, tmp_path / "canine")
    CharacterTokenizer(model_max_length=64).save_pretrained(folder)
    words = (("chien", "animal"), ("marteau", "tool"), ("кошка", "animal"), ("пила", "tool"),
             ("馬", "animal"), ("ドリル", "tool"))
    saved = finetune_kinds(folder, tmp_path / "run", sentence="{w} ici", words=words)
    assert saved["architectures"] == ["CanineForSequenceClassification"]
    transformers.CanineForSequenceClassification.from_pretrained(tmp_path / "run" / "model")


def test_lmlab_format_folder_rebuilds_a_canine(tmp_path):
    """lmlab's own format (written where a config.json for transformers cannot say the model,
    e.g. after compression) rebuilds CANINE's own class, not the one-stack LanguageModel."""
    from lmlab.interop.native import save_native

    config = preset("canine", "small", **SMALL, max_position_embeddings=64,
                    extra=dict(SETTINGS, num_labels=4))
    ours = _perturb(CanineModel(config, heads=["sequence-classification"], with_pooler=True))
    folder = save_native(ours, tmp_path / "native")
    again = lmlab.from_pretrained(folder)
    assert type(again) is CanineModel
    batch = _batch(pairs=True)
    with torch.no_grad():
        torch.testing.assert_close(again(**batch).logits, ours.eval()(**batch).logits,
                                   rtol=0, atol=0)  # exact: the same weights, the same ops
