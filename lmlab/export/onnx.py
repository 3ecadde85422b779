"""ONNX export of encoders (with a task head) and decoders, and running the file with onnxruntime.

``torch.onnx.export(..., dynamo=True)`` with dynamic batch and sequence axes; the padding mask is
a boolean (B, 1, Tq, Tk) mask without padding skipping (read real tokens only), decoders have no
key/value cache, and every file is checked against lmlab's outputs as it is written.
docs/compression-inference.md ("Exporting to ONNX") tells the story.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from lmlab.utils.errors import LmlabError

MODEL_FILE = "model.onnx"
INFO_FILE = "onnx-export.json"
HIDDEN = "none"  # --task-head none: export the stack's last hidden state
EXTRA_HINT = "install the export extra: pip install 'lmlab[export]'"
_EXTERNAL_DATA_BYTES = 1_500_000_000  # protobuf's 2 GB limit: larger weights go beside the file


def require(module: str) -> Any:
    """Import an optional export dependency, or say how to install it."""
    import importlib

    try:
        return importlib.import_module(module)
    except ImportError as error:
        raise LmlabError(f"{module} is not installed ({error})", EXTRA_HINT) from None


class ExportGraph(nn.Module):
    """What the ONNX file computes: the inputs -> one head's output (or the last hidden state),
    the mask built without data-dependent branches."""

    def __init__(self, model: nn.Module, head: str):
        super().__init__()
        self.model, self.head = model, head
        self.causal = bool(model.config.causal)

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                token_type_ids: torch.Tensor | None = None) -> torch.Tensor:
        from lmlab.models.core.masks import causal_mask

        length = input_ids.shape[1]
        mask = attention_mask.bool()[:, None, None, :]  # (B, 1, 1, T): padding keys hidden
        if self.causal:
            mask = mask & causal_mask(length, length, input_ids.device)[None, None]  # (B, 1, T, T)
        out = self.model(input_ids=input_ids, attention_mask=mask, token_type_ids=token_type_ids,
                         heads=[], skip_padding=False)
        if self.head == HIDDEN:
            return out.last_hidden_state
        question = None  # BigBird's QA head leaves the question (to the first separator) out
        if getattr(self.model.heads[self.head], "masks_question", False):
            from lmlab.models.task_heads import question_mask

            question = question_mask(self.model.config, input_ids)
        return self.model.run_head(self.head, out.last_hidden_state, out.pooler_output,
                                   attention_mask, inputs={"question_mask": question})


def input_names(model: nn.Module) -> list[str]:
    """The file's inputs: ids, padding mask, and segment ids for an encoder that has them."""
    names = ["input_ids", "attention_mask"]
    if not model.config.causal and model.config.type_vocab_size > 0:
        names.append("token_type_ids")
    return names


def check_exportable(model: nn.Module, head: str | None) -> str:
    """The head to export (``head``, else the first head, else ``"none"``), after refusing what
    the export cannot express."""
    from lmlab.compress.quantize import quantized_layers
    from lmlab.models.core.rope import rope_type_of
    from lmlab.models.model import LanguageModel
    from lmlab.models.task_heads import MULTIPLE_CHOICE

    if not isinstance(model, LanguageModel):
        raise LmlabError(f"ONNX export takes an encoder or a decoder (lmlab's LanguageModel), "
                         f"not a {type(model).__name__}",
                         "export an encoder with its task head or a decoder; encoder-decoders "
                         "and feature-based runs are not supported")
    if quantized_layers(model):
        raise LmlabError("the model has int8 layers (lmlab quantize); their kernels have no "
                         "ONNX form here", "export the fp32 model")
    if rope_type_of(model.config.rope_scaling) == "dynamic":
        raise LmlabError("dynamic NTK RoPE scaling recomputes its frequencies from each input's "
                         "length, which an exported graph would freeze at one length",
                         "export a model with linear, yarn or llama3 scaling, or none")
    if next(model.parameters()).dtype != torch.float32:
        raise LmlabError(f"the model holds {next(model.parameters()).dtype} weights",
                         "export in fp32: load without dtype=... or call model.float()")
    if head is None:
        head = next(iter(model.heads), HIDDEN)
    if head != HIDDEN and head not in model.heads:
        raise LmlabError(f"the model has no head {head!r}",
                         f"use one of: {', '.join([*model.heads, HIDDEN])}")
    if head == MULTIPLE_CHOICE:
        raise LmlabError("a multiple-choice head reads (B, choices, T) inputs, which this "
                         "export does not lay out", f"export --task-head {HIDDEN} (or another "
                         "head) instead")
    return head


def _example_inputs(model: nn.Module, batch: int, length: int, seed: int
                    ) -> dict[str, torch.Tensor]:
    """Token ids drawn from the vocabulary, the last row right-padded to about half its length."""
    generator = torch.Generator().manual_seed(seed)
    ids = torch.randint(min(5, model.config.vocab_size - 1), model.config.vocab_size,
                        (batch, length), generator=generator)
    mask = torch.ones_like(ids)
    mask[-1, max(1, length // 2):] = 0
    inputs = {"input_ids": ids, "attention_mask": mask}
    if "token_type_ids" in input_names(model):
        inputs["token_type_ids"] = torch.zeros_like(ids)
    return inputs


def export_onnx(model: nn.Module, out: str | Path, head: str | None = None,
                tokenizer: Any = None, overwrite: bool = False, check: bool = True,
                source: str | None = None) -> Path:
    """Write ``model`` to ``out/model.onnx`` (with ``onnx-export.json`` and the tokenizer's
    files); returns the file's path. ``head``: a head, ``"none"`` (last hidden state) or None
    (the first head); ``check`` compares onnxruntime's outputs with lmlab's (:func:`check_export`).

    Example:
        >>> import lmlab
        >>> from lmlab.export.onnx import export_onnx
        >>> export_onnx(lmlab.from_pretrained("minilm"), "minilm-onnx")
    """
    from lmlab.models.quantised import dequantized
    from lmlab.utils.checks import check_output_folder
    from lmlab.utils.io import atomic_path, atomic_write_json

    head = check_exportable(model, head)
    model = dequantized(model)  # block-quantised GGUF layers run a numba kernel ONNX cannot hold
    out = Path(out)
    check_output_folder(out, overwrite, "ONNX export", ignore=(".*.tmp",))
    for module in ("onnx", "onnxscript", "onnxruntime"):
        require(module)
    model = model.eval()
    names = input_names(model)
    limit = model.config.max_position_embeddings - model.config.position_offset
    sequence = (torch.export.Dim("sequence", max=limit)
                if model.config.position_embedding in ("learned", "sinusoidal")
                else torch.export.Dim("sequence"))
    batch = torch.export.Dim("batch")
    example = _example_inputs(model, 2, min(8, limit), seed=0)
    graph = ExportGraph(model, head)
    output = "last_hidden_state" if head == HIDDEN else "logits"
    with torch.no_grad():
        program = torch.onnx.export(
            graph, tuple(example[name] for name in names), input_names=names,
            output_names=[output], dynamic_shapes={name: {0: batch, 1: sequence} for name in names},
            dynamo=True, optimize=True, verbose=False)
    out.mkdir(parents=True, exist_ok=True)
    weight_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
    if weight_bytes > _EXTERNAL_DATA_BYTES:  # weights in model.onnx.data beside the graph
        program.save(str(out / MODEL_FILE), external_data=True)
    else:
        with atomic_path(out / MODEL_FILE) as tmp:
            program.save(str(tmp), external_data=False)
    info = {"inputs": names, "output": output, "head": head, "causal": model.config.causal,
            "dynamic_axes": {"0": "batch", "1": "sequence"}, "max_sequence": limit,
            "kv_cache": False, "opset": program.model_proto.opset_import[0].version,
            "source": source, "labels": model.config.extra.get("id2label"),
            "padding_positions": "computed, not zeroed: read real tokens only"}
    if check:
        try:
            info["check_max_abs_diff"] = check_export(model, out, head)
        except LmlabError:  # a file that disagrees is not left behind (nor an older record)
            for name in (MODEL_FILE, MODEL_FILE + ".data", INFO_FILE):
                (out / name).unlink(missing_ok=True)
            raise
    atomic_write_json(out / INFO_FILE, info)
    if tokenizer is not None:
        tokenizer.save_pretrained(out)
    return out / MODEL_FILE


def check_export(model: nn.Module, folder: str | Path, head: str, rtol: float = 1e-4) -> float:
    """The largest difference at real tokens between onnxruntime and lmlab on a padded batch of
    another shape; raises beyond ``rtol`` times the largest output (at least 1)."""
    limit = model.config.max_position_embeddings - model.config.position_offset
    inputs = _example_inputs(model, 3, min(13, limit), seed=1)
    with torch.no_grad():
        ref = ExportGraph(model, head)(**inputs).numpy()
    got = OnnxModel(folder).run(**{k: v.numpy() for k, v in inputs.items()})
    diff = float(real_token_diff(got, ref, inputs["attention_mask"].numpy()))
    tolerance = rtol * max(1.0, float(np.abs(ref).max()))
    if not diff <= tolerance:
        raise LmlabError(f"the exported file's outputs differ from lmlab's by {diff:.3g} "
                         f"(tolerance {tolerance:.3g})",
                         "this is a bug in the export: report it with the model's config.json")
    return diff


def real_token_diff(got: np.ndarray, ref: np.ndarray, attention_mask: np.ndarray) -> float:
    """Largest |got - ref| over real tokens (per-token outputs) or over all (pooled outputs)."""
    diff = np.abs(got - ref)
    # per-token outputs are (B, T, ...); a pooled (B, C) output is not masked even when C == T
    if diff.ndim >= 3 and diff.shape[:2] == attention_mask.shape:
        diff = diff[attention_mask.astype(bool)]
    return float(diff.max())


class OnnxModel:
    """An exported folder run by onnxruntime on the CPU (``threads``: intra-op threads);
    ``run(input_ids=..., attention_mask=...)`` returns the output as a numpy array."""

    def __init__(self, folder: str | Path, threads: int | None = None):
        from lmlab.utils.io import read_json

        folder = Path(folder)
        if not (folder / MODEL_FILE).is_file():
            raise LmlabError(f"{folder} has no {MODEL_FILE}",
                             "export one first: lmlab export onnx MODEL OUT")
        ort = require("onnxruntime")
        options = ort.SessionOptions()
        if threads:
            options.intra_op_num_threads = threads
        self.session = ort.InferenceSession(str(folder / MODEL_FILE), options,
                                            providers=["CPUExecutionProvider"])
        self.info = read_json(folder / INFO_FILE) if (folder / INFO_FILE).is_file() else {}
        self.inputs = [i.name for i in self.session.get_inputs()]

    def run(self, **inputs: np.ndarray) -> np.ndarray:
        missing = [name for name in self.inputs if name not in inputs]
        if missing:
            raise LmlabError(f"the ONNX model needs inputs {missing}",
                             f"pass {', '.join(self.inputs)} (int64 arrays of shape (B, T))")
        feed = {name: np.asarray(inputs[name], dtype=np.int64) for name in self.inputs}
        return self.session.run(None, feed)[0]
