"""Files lmlab writes get the permissions the user's umask gives any new file (0666 less the
umask), not the private 0600 of the temporary files they are written through: a model folder,
an adapter, a quantised model or a vectors file must be readable by the server process or the
colleague the umask lets read it."""

from __future__ import annotations

import stat
import subprocess
import sys
import textwrap

from conftest import save_tiny_bert_folder

WRITER = textwrap.dedent("""
    import os, sys
    from pathlib import Path
    os.umask(0o027)
    import numpy as np
    from lmlab.adapt import apply_method, save_adapter
    from lmlab.compress.quantize import quantize_int8, save_quantized
    from lmlab.interop.native import save_pretrained
    from lmlab.load import from_pretrained as load_model
    from lmlab.tokenization.tokenizer import Tokenizer
    from lmlab.vectors.keyed import WordVectors, save_vectors

    source, out = Path(sys.argv[1]), Path(sys.argv[2])
    model = load_model(source)
    save_pretrained(model, out / "model")
    Tokenizer.from_pretrained(source).save_pretrained(out / "model")
    save_quantized(quantize_int8(load_model(source), "x86"), out / "int8")
    adapted = load_model(source)
    apply_method(adapted, "lora")
    save_adapter(adapted, out / "adapter", base_model=source)
    save_vectors(WordVectors(["a", "b"], np.ones((2, 3), dtype=np.float32)), out / "v.txt",
                 format="glove")
""")


def test_written_files_follow_the_umask(tmp_path):
    source = save_tiny_bert_folder(tmp_path / "source")
    out = tmp_path / "out"
    result = subprocess.run([sys.executable, "-c", WRITER, str(source), str(out)],
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    files = [p for p in out.rglob("*") if p.is_file()]
    assert {"model.safetensors", "config.json", "tokenizer.json", "adapter.safetensors",
            "v.txt"} <= {p.name for p in files}
    assert len({p.parent for p in files}) == 4
    for path in out.rglob("*"):
        expected = 0o750 if path.is_dir() else 0o640  # 0777 / 0666 less the umask 027
        assert stat.S_IMODE(path.stat().st_mode) == expected, (path, oct(path.stat().st_mode))
