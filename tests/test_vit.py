"""ViT: parity with transformers' ViTModel / ViTForImageClassification both ways on random
weights (several images; another resolution through interpolated positions), a fresh-process
reload, the presets, and the image-classification pipeline against transformers' on digits."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest
import torch
from conftest import assert_close_rounding

import lmlab
from lmlab.models.model import LanguageModel
from lmlab.models.presets import preset
from lmlab.utils.errors import LmlabError

transformers = pytest.importorskip("transformers")

SMALL = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=48)
HEAD = "image-classification"


def _perturb(model):
    """Move every weight off its initialisation (norms and biases too)."""
    generator = torch.Generator().manual_seed(3)
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.add_(0.2 * torch.randn(parameter.shape, generator=generator))
    return model.eval()


def _hf_model(cls, labels: int = 5):
    torch.manual_seed(0)
    config = transformers.ViTConfig(**SMALL, image_size=32, patch_size=8, num_labels=labels,
                                    hidden_dropout_prob=0.1, attention_probs_dropout_prob=0.1)
    return _perturb(getattr(transformers, cls)(config))


def _pixels(*shape: int) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(1))


def _close(ours: torch.Tensor, theirs: torch.Tensor) -> None:
    assert ours.shape == theirs.shape
    assert_close_rounding(ours, theirs, terms=SMALL["intermediate_size"], depth=3)
    assert float((ours - theirs).abs().max()) <= 1e-4  # tol: issue 31's parity bound on outputs


@pytest.mark.parametrize("cls", ["ViTForImageClassification", "ViTModel"])
def test_transformers_folder_loads_with_the_same_outputs(tmp_path, cls):
    theirs = _hf_model(cls)
    theirs.save_pretrained(tmp_path)
    ours = lmlab.from_pretrained(tmp_path)
    assert list(ours.heads) == ([HEAD] if cls != "ViTModel" else [])
    for pixels, interpolate in ((_pixels(4, 3, 32, 32), False), (_pixels(3, 3, 48, 40), True)):
        with torch.no_grad():
            want = theirs(pixel_values=pixels, interpolate_pos_encoding=interpolate,
                          output_hidden_states=True)
            got = ours(pixel_values=pixels, interpolate_pos_encoding=interpolate,
                       output_hidden_states=True)
        if cls == "ViTModel":
            _close(got.last_hidden_state, want.last_hidden_state)
            _close(got.pooler_output, want.pooler_output)
        else:
            _close(got.logits, want.logits)
            _close(got.hidden_states[1], want.hidden_states[1])


def test_lmlab_model_saves_for_transformers(tmp_path):
    """A preset-built ViT (a head, and a bare one with its pooler) written by
    lmlab.save_pretrained: transformers loads the same model; the loss agrees too."""
    config = preset("vit", "tiny", **SMALL, extra=dict(image_size=32, patch_size=8,
                                                        num_channels=3, num_labels=4))
    pixels, labels = _pixels(4, 3, 32, 32), torch.tensor([0, 3, 1, 3])
    for heads, cls in (([HEAD], "ViTForImageClassification"), ([], "ViTModel")):
        ours = _perturb(LanguageModel(config, heads=heads, with_pooler=not heads or None))
        folder = lmlab.save_pretrained(ours, tmp_path / cls)
        assert json.loads((folder / "config.json").read_text())["architectures"] == [cls]
        theirs = getattr(transformers, cls).from_pretrained(folder).eval()
        with torch.no_grad():
            want = theirs(pixel_values=pixels, **({"labels": labels} if heads else {}))
            got = ours(pixel_values=pixels, labels=labels if heads else None)
        if heads:
            _close(got.logits, want.logits)
            assert_close_rounding(got.loss, want.loss, terms=SMALL["intermediate_size"], depth=4)
        else:
            _close(got.pooler_output, want.pooler_output)


_RELOAD = """
import json, sys, torch, lmlab
model = lmlab.from_pretrained(sys.argv[1])
pixels = torch.tensor(json.loads(sys.argv[2]))
with torch.no_grad():
    print(json.dumps(model(pixel_values=pixels).logits.tolist()))
"""


def test_saved_model_reloads_in_a_fresh_process(tmp_path):
    model = _perturb(LanguageModel(preset("vit", "tiny", **SMALL, extra=dict(
        image_size=16, patch_size=4, num_channels=3, num_labels=3)), heads=[HEAD]))
    folder = lmlab.save_pretrained(model, tmp_path / "vit")
    pixels = _pixels(2, 3, 16, 16)
    with torch.no_grad():
        expected = model(pixel_values=pixels).logits
    result = subprocess.run([sys.executable, "-c", _RELOAD, str(folder),
                             json.dumps(pixels.tolist())], capture_output=True, text=True,
                            check=True)
    logits = torch.tensor(json.loads(result.stdout.strip().splitlines()[-1]))
    # json carries each float32's shortest decimal, which reads back as the same float
    assert torch.equal(logits, expected)  # exact: same weights, same pixels, same ops


@pytest.mark.parametrize("size,hidden,heads", [("tiny", 192, 3), ("small", 384, 6),
                                               ("base", 768, 12)])
def test_presets_are_deit_and_vit_shapes(size, hidden, heads):
    config = preset("vit", size)
    assert (config.hidden_size, config.num_hidden_layers, config.num_attention_heads,
            config.intermediate_size) == (hidden, 12, heads, 4 * hidden)
    assert (config.extra["image_size"], config.extra["patch_size"]) == (224, 16)
    spec = lmlab.models.families.get_family("vit")
    hf_values = spec.config_to_hf(config)
    assert spec.config_from_hf(hf_values) == config
    with torch.device("meta"):
        theirs = transformers.ViTModel(transformers.ViTConfig(**hf_values), add_pooling_layer=False)
        ours = LanguageModel(config)
    count = sum(p.numel() for p in theirs.parameters())
    assert ours.num_parameters() == config.num_parameters() == count


def test_wrong_inputs_are_refused_before_any_work(tmp_path):
    model = LanguageModel(preset("vit", "tiny", **SMALL, extra=dict(
        image_size=32, patch_size=8, num_channels=3)), heads=[HEAD])
    with pytest.raises(LmlabError, match="positions were learned for 32x32"):
        model(pixel_values=_pixels(1, 3, 48, 48))
    with pytest.raises(LmlabError, match="takes pixel_values, not token ids"):
        model(input_ids=torch.tensor([[1, 2]]))
    with pytest.raises(LmlabError, match=r"takes \(batch, 3, height, width\)"):
        model(pixel_values=_pixels(1, 1, 32, 32))
    config = transformers.ViTConfig(**SMALL, qkv_bias=False)
    with pytest.raises(LmlabError, match="qkv_bias=false"):
        lmlab.models.families.get_family("vit").config_from_hf(config.to_dict())


def _digits(count: int = 6) -> list[np.ndarray]:
    """scikit-learn's bundled 8x8 digits as 40x40 RGB uint8 images (real images, offline)."""
    from sklearn.datasets import load_digits

    images = load_digits().images[:count]  # values 0..16
    return [np.repeat((np.kron(x, np.ones((5, 5))) * 255 / 16).astype(np.uint8)[..., None], 3, -1)
            for x in images]


def test_pipeline_equals_transformers_on_digits(tmp_path):
    from PIL import Image

    from lmlab.models.images import ImageProcessor

    theirs = _hf_model("ViTForImageClassification", labels=10)
    theirs.config.id2label = {i: f"digit {i}" for i in range(10)}
    theirs.save_pretrained(tmp_path)
    processor = transformers.ViTImageProcessor(size={"height": 32, "width": 32},
                                               image_mean=[0.4, 0.5, 0.6],
                                               image_std=[0.2, 0.3, 0.25])
    processor.save_pretrained(tmp_path)
    reference = transformers.pipeline("image-classification", model=str(tmp_path))
    ours = lmlab.pipeline("image-classification", model=tmp_path)
    arrays = _digits()
    for images in (arrays, [Image.fromarray(a) for a in arrays], [a / 255.0 for a in arrays],
                   [np.moveaxis(a, -1, 0) for a in arrays]):
        pixels = ImageProcessor.from_pretrained(tmp_path)(images)
        want = reference.image_processor(images=images, return_tensors="pt")["pixel_values"]
        assert_close_rounding(pixels, want, terms=1, depth=2)
        for got, expected in zip(ours(images, top_k=3), reference(images, top_k=3)):
            assert [r["label"] for r in got] == [r["label"] for r in expected]
            assert_close_rounding([r["score"] for r in got], [r["score"] for r in expected],
                                  terms=SMALL["intermediate_size"], depth=4)
    single = ours(arrays[0])
    assert len(single) == 5 and single[0]["score"] >= single[-1]["score"]


def test_processor_written_by_lmlab_is_read_by_transformers(tmp_path):
    from lmlab.models.images import ImageProcessor

    ImageProcessor(size={"height": 48, "width": 40}, image_mean=[0.1, 0.2, 0.3]).save_pretrained(
        tmp_path)
    theirs = transformers.AutoImageProcessor.from_pretrained(tmp_path)
    pixels = ImageProcessor.from_pretrained(tmp_path)(_digits(2))
    want = theirs(images=_digits(2), return_tensors="pt")["pixel_values"]
    assert pixels.shape == (2, 3, 48, 40)
    assert_close_rounding(pixels, want, terms=1, depth=2)
