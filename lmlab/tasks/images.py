"""Built-in image classification tasks: Fashion-MNIST (Xiao et al. 2017) from Debian's
``dataset-fashion-mnist`` idx files, and scikit-learn's bundled 8x8 digits (seconds, for tests).
Each example holds its image as a uint8 array (``Example.image``); docs/vision.md.
"""

from __future__ import annotations

import gzip
import hashlib
from collections.abc import Callable
from pathlib import Path

import numpy as np

from lmlab.tasks.builtin import cpu_subset, hash_splits
from lmlab.tasks.types import Example, Task
from lmlab.utils.checks import check_choice
from lmlab.utils.errors import LmlabError
from lmlab.utils.paths import find_system_path

FASHION_LABELS = ["T-shirt/top", "Trouser", "Pullover", "Dress", "Coat", "Sandal", "Shirt",
                  "Sneaker", "Bag", "Ankle boot"]
FASHION_DEV_FRACTION = 0.1  # of the 60k training images, by a hash of their pixels


def read_idx(path: str | Path) -> np.ndarray:
    """An idx file (gzip or not) as a uint8 array: (N,) labels or (N, rows, cols) images."""
    data = Path(path).read_bytes()
    data = gzip.decompress(data) if data[:2] == b"\x1f\x8b" else data
    if data[:2] != b"\0\0" or data[2] != 0x08:
        raise LmlabError(f"{path} is not an idx file of unsigned bytes",
                         "point at the idx files of dataset-fashion-mnist")
    dims = data[3]
    shape = tuple(int.from_bytes(data[4 + 4 * i:8 + 4 * i], "big") for i in range(dims))
    return np.frombuffer(data, np.uint8, offset=4 + 4 * dims).reshape(shape)


def fashion_mnist_dir() -> Path:
    """The folder of Fashion-MNIST's idx files (``/usr/share/datasets/fashion-mnist``)."""
    path = find_system_path("usr/share/datasets/fashion-mnist/train-images-idx3-ubyte.gz")
    if path is None:
        raise LmlabError("Fashion-MNIST's idx files are not installed",
                         "install the Debian package dataset-fashion-mnist "
                         "(apt-get install dataset-fashion-mnist)")
    return path.parent


def _examples(prefix: str, images: np.ndarray, labels: np.ndarray,
              names: list[str]) -> list[Example]:
    return [Example(id=f"{prefix}-{i}", label=names[int(y)], image=x,
                    extra={"key": hashlib.sha256(x.tobytes()).hexdigest()})
            for i, (x, y) in enumerate(zip(images, labels))]


def build_fashion_mnist() -> Task:
    """60k training images split into train and dev by a hash of their pixels (a duplicate
    image stays on one side); the 10k test images as test."""
    folder = fashion_mnist_dir()
    train = _examples("train", read_idx(folder / "train-images-idx3-ubyte.gz"),
                      read_idx(folder / "train-labels-idx1-ubyte.gz"), FASHION_LABELS)
    test = _examples("test", read_idx(folder / "t10k-images-idx3-ubyte.gz"),
                     read_idx(folder / "t10k-labels-idx1-ubyte.gz"), FASHION_LABELS)
    splits = hash_splits(train, lambda e: "split:" + e.extra["key"],
                         (1 - FASHION_DEV_FRACTION, FASHION_DEV_FRACTION, 0.0))
    splits["test"] = test
    return Task(name="fashion-mnist", type="image-classification", labels=FASHION_LABELS,
                metrics=["accuracy", "macro_f1"], splits=splits,
                description="28x28 grayscale photo of clothing -> one of 10 classes "
                            "(Fashion-MNIST)")


def build_digits() -> Task:
    """scikit-learn's 1,797 8x8 handwritten digits (0-16 scaled to 0-255), 80/10/10 by a hash
    of their pixels."""
    from sklearn.datasets import load_digits

    digits = load_digits()
    images = np.round(digits.images * 255 / 16).astype(np.uint8)
    names = [str(d) for d in range(10)]
    splits = hash_splits(_examples("digit", images, digits.target, names),
                         lambda e: "split:" + e.extra["key"])
    return Task(name="digits", type="image-classification", labels=names,
                metrics=["accuracy", "macro_f1"], splits=splits,
                description="8x8 grayscale handwritten digit -> 0-9 (scikit-learn's digits)")


IMAGE_TASKS: dict[str, Callable[[], Task]] = {"fashion-mnist": build_fashion_mnist,
                                              "digits": build_digits}
_LOADED: dict[str, Task] = {}  # built once per process (a second or two): treat as read-only


def load_image_task(name: str, size: str = "cpu") -> Task:
    """A built-in image task at ``size`` ``"cpu"`` (at most 4k/1k/1k, as the text tasks) or
    ``"full"``."""
    check_choice(name, IMAGE_TASKS, "task", "built-in image task")
    check_choice(size, ("cpu", "full"), "size", "task size")
    if name not in _LOADED:
        _LOADED[name] = IMAGE_TASKS[name]()
    full = _LOADED[name]
    return full if size == "full" else cpu_subset(full)
