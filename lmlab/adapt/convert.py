"""What ``lmlab adapter`` does: merge a LoRA (or BitFit) adapter into its base model, or convert
an adapter between lmlab's folder (``adapter.json``) and PEFT's (``adapter_config.json``)."""

from __future__ import annotations

from pathlib import Path

from lmlab.adapt import load_adapter, merge, read_adapter_config, save_adapter
from lmlab.adapt.peft_format import PEFT_CONFIG, load_peft, read_peft_config, save_peft
from lmlab.interop.folders import adapter_folder
from lmlab.interop.native import save_model
from lmlab.tokenization.tokenizer import Tokenizer
from lmlab.utils.catalog import resolve_model_dir
from lmlab.utils.checks import check_choice, check_output_folder
from lmlab.utils.errors import LmlabError

ACTIONS = ("merge", "to-peft", "from-peft")


def convert_adapter(action: str, source: str | Path, out: str | Path,
                    base: str | Path | None = None, overwrite: bool = False) -> Path:
    """``merge``: a plain model folder; ``to-peft``: an lmlab adapter as a PEFT folder;
    ``from-peft``: a PEFT folder as an lmlab adapter. ``source`` is a run fine-tuned with
    ``--method`` (or its model/ folder) or a PEFT folder; ``base`` overrides the base model the
    adapter names. Returns ``out``."""
    check_choice(action, ACTIONS, "ACTION", "adapter action")
    out, source = Path(out), Path(source)
    check_output_folder(out, overwrite, f"adapter {action} output")
    lmlab_folder = adapter_folder(source)
    is_peft = (source / PEFT_CONFIG).is_file()
    if action == "from-peft" and not is_peft or action == "to-peft" and \
            lmlab_folder is None or lmlab_folder is None and not is_peft:
        wanted = "a PEFT folder" if action == "from-peft" else "an lmlab adapter"
        raise LmlabError(f"{source} is not {wanted} (no adapter.json or {PEFT_CONFIG})",
                         "give a run fine-tuned with --method, its model/ folder, or a folder "
                         "written by PeftModel.save_pretrained")
    if lmlab_folder is not None:
        named_base = base or read_adapter_config(lmlab_folder).get("base_model")
        model = load_adapter(lmlab_folder, base)
    else:
        named_base = base or read_peft_config(source).get("base_model_name_or_path")
        model = load_peft(source, base)
    if action == "merge":
        save_model(merge(model), out)
    elif action == "to-peft":
        save_peft(model, out, base_model=named_base, overwrite=overwrite)
    else:
        save_adapter(model, out, base_model=named_base, overwrite=overwrite)
    if action != "to-peft":  # what lmlab loads from the folder needs the tokenizer too
        _copy_tokenizer(out, lmlab_folder, named_base)
    return out


def _copy_tokenizer(out: Path, *sources: str | Path | None) -> None:
    """The first tokenizer found among ``sources`` (folders or None), saved into ``out``."""
    for folder in sources:
        if folder is None:
            continue
        try:
            Tokenizer.from_pretrained(resolve_model_dir(folder)).save_pretrained(out)
            return
        except (LmlabError, OSError):
            continue
