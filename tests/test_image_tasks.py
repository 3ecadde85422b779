"""Image tasks end to end: the built-in digits and Fashion-MNIST tasks, the pixel baseline,
``lmlab finetune`` training a ViT from scratch on digits through the Trainer (accuracy well
above chance; the saved folder loads in transformers, in a fresh process, with our logits;
``lmlab evaluate`` scores it again), and the refusals of a text model on an image task and the
reverse before any work."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from lmlab.cli import main
from lmlab.finetune.runner import finetune
from lmlab.tasks import Example, Task, load_task, run_tfidf_baseline
from lmlab.tasks.images import fashion_mnist_dir
from lmlab.utils.errors import LmlabError

VIT = {"model_type": "vit", "hidden_size": 32, "num_hidden_layers": 1, "num_attention_heads": 2,
       "intermediate_size": 64, "image_size": 8, "patch_size": 4, "num_channels": 1}


def vit_config_folder(folder: Path) -> Path:
    """A folder holding only a ViT config.json: ``random:FOLDER`` trains it from scratch."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(VIT))
    return folder


@pytest.fixture(scope="module")
def digits_run(tmp_path_factory):
    """``lmlab finetune --task digits --model random:FOLDER`` (a tiny ViT, 8x8, 1 channel)."""
    root = tmp_path_factory.mktemp("vit-digits")
    out = root / "run"
    code = main(["finetune", "--task", "digits", "--model",
                 f"random:{vit_config_folder(root / 'vit')}", "--out", str(out), "--epochs", "6",
                 "--lr", "3e-3", "--batch-size", "32", "--precision", "fp32"])
    assert code == 0
    return out


def test_digits_task_and_its_pixel_baseline():
    task = load_task("digits")
    assert task.type == "image-classification" and task.labels == [str(d) for d in range(10)]
    assert sum(task.sizes().values()) == 1797 and min(task.sizes().values()) > 150
    image = task.split("train")[0].image
    assert image.shape == (8, 8) and image.dtype == np.uint8
    keys = {split: {e.extra["key"] for e in task.split(split)} for split in task.splits}
    assert not keys["train"] & keys["test"]  # split by a hash of the pixels
    result = run_tfidf_baseline(task)
    assert result["model"] == "pixels+logreg" and result["test"]["accuracy"] > 0.9


@pytest.mark.skipif(not Path("/usr/share/datasets/fashion-mnist").is_dir(),
                    reason="Debian's dataset-fashion-mnist is not installed (scripts/setup.sh)")
def test_fashion_mnist_task():
    full = load_task("fashion-mnist", size="full")
    assert full.sizes() == {"train": 53895, "dev": 6105, "test": 10000}
    assert fashion_mnist_dir().name == "fashion-mnist" and len(full.labels) == 10
    image = full.split("test")[0].image
    assert image.shape == (28, 28) and image.dtype == np.uint8
    assert full.split("test")[0].label == "Ankle boot"  # the first t10k label is 9
    cpu = load_task("fashion-mnist")
    assert cpu.sizes() == {"train": 4000, "dev": 1000, "test": 1000}
    assert {e.label for e in cpu.split("train")} == set(full.labels)


def test_finetune_trains_a_vit_that_transformers_loads(digits_run):
    metrics = json.loads((digits_run / "metrics.json").read_text())
    assert metrics["dev"]["accuracy"] > 0.5 and metrics["test"]["accuracy"] > 0.5  # chance 0.1
    history = json.loads((digits_run / "finetune.json").read_text())["history"]
    assert history[-1]["train_loss"] < 0.7 * history[0]["train_loss"]
    script = """
import json, sys, torch, transformers, lmlab
from lmlab.models.images import ImageProcessor
from lmlab.tasks import load_task
folder = sys.argv[1]
theirs = transformers.AutoModelForImageClassification.from_pretrained(folder).eval()
images = [e.image for e in load_task("digits").split("test")[:6]]
pixels = ImageProcessor.from_pretrained(folder)(images)
hf_pixels = transformers.AutoImageProcessor.from_pretrained(folder)(
    [i[..., None] for i in images], return_tensors="pt")["pixel_values"]
with torch.no_grad():
    ours = lmlab.from_pretrained(folder).eval()(pixel_values=pixels,
                                                heads=["image-classification"]).logits
    hf = theirs(pixel_values=pixels).logits
print(json.dumps([type(theirs).__name__, float((ours - hf).abs().max()),
                  float((pixels - hf_pixels).abs().max()), theirs.config.id2label[3]]))
"""
    done = subprocess.run([sys.executable, "-c", script, str(digits_run / "model")],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    name, logits_diff, pixels_diff, label = json.loads(done.stdout.strip().splitlines()[-1])
    assert name == "ViTForImageClassification" and label == "3"
    assert logits_diff <= 1e-5 and pixels_diff <= 1e-6


def test_evaluate_scores_the_saved_vit_again(digits_run, tmp_path):
    assert main(["evaluate", "--task", "digits", "--model", str(digits_run), "--splits", "dev",
                 "--out", str(tmp_path)]) == 0
    again = json.loads((tmp_path / "eval-metrics.json").read_text())["dev"]
    assert again == json.loads((digits_run / "metrics.json").read_text())["dev"]


def test_finetune_continues_from_a_trained_vit(digits_run, tmp_path):
    """A pretrained image model (the saved folder) fine-tunes with the default recipe."""
    task = load_task("digits")
    result = finetune(task, digits_run / "model", tmp_path / "again", epochs=1, lr=1e-3,
                      show_progress=False, precision="fp32")
    assert result["recipe"]["name"] == "bert" and not result["random_init"]
    assert result["dev"]["accuracy"] > 0.5


def _text_task() -> Task:
    rows = [Example(id=str(i), text=f"text {i}", label="ab"[i % 2]) for i in range(4)]
    return Task(name="texts", type="classification", labels=["a", "b"], metrics=["accuracy"],
                splits={"train": rows, "dev": rows})


def test_a_text_model_on_an_image_task_and_the_reverse_are_refused(tmp_path, tiny_bert_folder):
    vit = vit_config_folder(tmp_path / "vit")
    cases = [(load_task("digits"), tiny_bert_folder, {}, "is a text model"),
             (_text_task(), f"random:{vit}", {}, "is an image model"),
             (load_task("digits"), f"random:{vit}", {"recipe": "feature"}, "not built for image"),
             (load_task("digits"), str(tiny_bert_folder), {"method": "lora"}, "is a text model")]
    for task, model, options, message in cases:
        with pytest.raises(LmlabError, match=message):
            finetune(task, model, tmp_path / "run", show_progress=False, **options)
        assert not (tmp_path / "run").exists()  # refused before any work
