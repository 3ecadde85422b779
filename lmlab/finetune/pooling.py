"""Which sentence vector a fine-tuned classifier reads: the one the checkpoint was trained to
give (docs/finetuning.md: why). ``pooling="auto"`` resolves to a sentence-transformers folder's
Pooling module (mean or [CLS]); else ``family`` ([CLS] + pooler) where the checkpoint has pooler
weights; else (no trained pooler, random initialisation) ``mean``.
"""

from __future__ import annotations

from pathlib import Path

from lmlab.utils.io import read_json

AUTO = "auto"


def _sentence_transformers_pooling(folder: Path) -> tuple[str, str] | None:
    """(pooling, reason) from a sentence-transformers folder's Pooling module, else None."""
    modules_file = folder / "modules.json"
    if not modules_file.is_file():
        return None
    try:
        modules = read_json(modules_file)
        pooling_module = next(m for m in modules if str(m.get("type", "")).endswith(".Pooling"))
        config_file = folder / pooling_module.get("path", "") / "config.json"
        config = read_json(config_file)
    except (OSError, ValueError, StopIteration, AttributeError):
        return None
    where = f"{config_file.relative_to(folder)}"
    if config.get("pooling_mode_mean_tokens"):
        return "mean", f"sentence-transformers checkpoint trained with mean pooling ({where})"
    if config.get("pooling_mode_cls_token"):
        return "family", f"sentence-transformers checkpoint trained with [CLS] pooling ({where})"
    modes = sorted(k.removeprefix("pooling_mode_") for k, v in config.items()
                   if k.startswith("pooling_mode_") and v)
    return "mean", (f"sentence-transformers checkpoint pooled by {', '.join(modes) or 'nothing'} "
                    f"({where}); lmlab has no such head, so the mean over tokens")


def resolve_pooling(requested: str | None, folder: str | Path | None, has_pooler: bool,
                    random_init: bool = False) -> tuple[str, str]:
    """(pooling, reason): ``requested`` unless it is ``"auto"``/None, else the rule of the
    module docstring for the checkpoint in ``folder`` whose loaded model ``has_pooler``."""
    if requested not in (None, AUTO):
        return requested, "chosen by the caller"
    if random_init:
        return "mean", "random initialisation: no trained pooler"
    if folder is not None:
        found = _sentence_transformers_pooling(Path(folder))
        if found is not None:
            return found
    if has_pooler:
        return "family", "the checkpoint has trained pooler weights ([CLS] + pooler, as BERT)"
    return "mean", "the checkpoint has no pooler weights: the mean over tokens"
