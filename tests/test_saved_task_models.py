"""What lmlab saves for a task model, another library reads the same, or refuses to read.

Every family that carries task heads (the decoder-only and encoder families of
``KNOWN_FAMILIES`` and the recurrent ``FAMILIES``; encoder-decoders learn tasks as text to text)
x every task head (``TASK_HEADS``) x every pooling (``POOLINGS``), enumerated from the library,
gets a tiny model with trained-looking head weights, saved as ``lmlab finetune`` saves it
(``save_model``). Then:

- transformers' ``AutoModelFor<head>`` either loads the folder as the exact class and gives
  lmlab's logits, or refuses it; which of the two is the table of docs/finetuning.md
  (``expected``), so a layout that silently turns into the other cannot pass;
- sentence-transformers refuses the folders transformers refuses;
- lmlab reloads every folder in a fresh process with the logits from before saving.

Folders that lmlab wrote before this (a transformers class whose head reads lmlab's mean or
concat pooling) still load in lmlab, with a warning that says how to re-save them.
"""

from __future__ import annotations

import io
import json
import subprocess
import sys
from contextlib import redirect_stdout

import pytest
import torch
from conftest import assert_close_rounding

from lmlab.interop.native import save_model
from lmlab.models.classes import OWN_CLASSES
from lmlab.models.core.image_embeddings import takes_images
from lmlab.models.families import KNOWN_FAMILIES, TOKEN_LAYOUTS, get_family
from lmlab.models.rnn.config import FAMILIES as RECURRENT_FAMILIES
from lmlab.models.task_heads import POOLINGS, TASK_HEADS, add_task_head, task_logits
from lmlab.utils.errors import LmlabError

transformers = pytest.importorskip("transformers")

HIDDEN, LAYERS, FFN, VOCAB = 32, 2, 64, 99
# one-stack text families (ViT: test_vit.py; CANINE builds its own class: test_canine.py)
TRANSFORMER_FAMILIES = tuple(f for f in KNOWN_FAMILIES
                             if not get_family(f).config().is_encoder_decoder
                             and not takes_images(get_family(f).config())
                             and f not in OWN_CLASSES)
COMBINATIONS = [(family, head, pooling) for family in TRANSFORMER_FAMILIES + RECURRENT_FAMILIES
                for head in TASK_HEADS for pooling in POOLINGS]
AUTO = {"sequence-classification": "AutoModelForSequenceClassification",
        "token-classification": "AutoModelForTokenClassification",
        "question-answering": "AutoModelForQuestionAnswering",
        "multiple-choice": "AutoModelForMultipleChoice"}
PER_TOKEN = ("token-classification", "question-answering")


def expected(family: str, head: str, pooling: str) -> str:
    """What transformers does with the folder, as docs/finetuning.md's table says: ``same``
    (the family's own class: [CLS] heads, or per-token heads whatever the pooling) or
    ``refused`` (lmlab's own format: mean/concat pooled heads, families transformers has no
    matching class for, recurrent models)."""
    layout = get_family(family).task_heads.get(head) if family in KNOWN_FAMILIES else None
    if layout is None:
        return "refused"
    return "same" if layout in TOKEN_LAYOUTS or pooling in ("family", "cls") else "refused"


def _model(family: str, head: str, pooling: str):
    """A tiny seeded ``family`` model with ``head`` on ``pooling``, head weights of size 0.3
    (trained-looking: the pooling decides the logits), in eval mode."""
    from lmlab.models.model import LanguageModel

    torch.manual_seed(0)
    if family in RECURRENT_FAMILIES:
        from lmlab.interop.recurrent import build_model
        from lmlab.models.rnn.char_cnn import char_table
        from lmlab.models.rnn.config import recurrent_preset

        config = recurrent_preset(family, "tiny", vocab_size=VOCAB)
        table = char_table([f"w{i}" for i in range(VOCAB)], set(), config.max_chars)
        model = build_model(config, [], char_table=table if family == "elmo" else None)
    else:
        last_token = get_family(family).task_heads.get(head) == "last-token"
        config = get_family(family).config(
            vocab_size=VOCAB, hidden_size=HIDDEN, num_hidden_layers=LAYERS,
            num_attention_heads=4, intermediate_size=FFN, max_position_embeddings=64,
            # GPT-Neo's classifier: transformers batches it only with a padding id
            **({"pad_token_id": 0} if last_token else {}))
        model = LanguageModel(config)
    add_task_head(model, head, None if head in ("question-answering", "multiple-choice") else 3,
                  pooling=pooling)
    with torch.no_grad():
        for parameter in model.heads[head].parameters():
            parameter.normal_(0.0, 0.3)
    return model.eval()


def _batch(family: str, head: str) -> dict[str, torch.Tensor]:
    """Right-padded ids, (2, 9) or (2, 3, 9) for multiple choice; the first row (of every
    choice) has 3 padding positions; a Longformer's hold three separators."""
    generator = torch.Generator().manual_seed(1)
    shape = (2, 3, 9) if head == "multiple-choice" else (2, 9)
    ids = torch.randint(5, VOCAB, shape, generator=generator)
    mask = torch.ones(shape, dtype=torch.long)
    mask[0, ..., 6:] = 0
    pad = 1 if family in ("roberta", "longformer") else 0  # positions after the padding id
    if family == "longformer":  # <s> q </s></s> c </s>: its QA and choice classes find q
        ids[..., 2:4] = 2
        ids[0, ..., 5] = ids[1, ..., 8] = 2
    return {"input_ids": ids.masked_fill(mask == 0, pad), "attention_mask": mask}


def _compare(got: torch.Tensor, want: torch.Tensor, head: str, batch: dict, msg: str) -> None:
    """Equal within fp32 rounding; per-token heads on real tokens only (padding positions are
    not predictions). Sums of FFN-wide dot products through the layers and the head."""
    assert got.shape == want.shape, msg
    if head in PER_TOKEN:
        real = batch["attention_mask"].bool()  # (B, T)
        got, want = got[real], want[real]
    assert_close_rounding(got, want, terms=FFN, depth=LAYERS + 1,
                          scale=max(1.0, float(want.abs().max())), msg=msg)


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """Every combination saved once: name -> (folder, logits before saving, batch, what
    ``save_model`` wrote); the names of the combinations lmlab refused to build."""
    from safetensors.torch import save_file

    root = tmp_path_factory.mktemp("task-models")
    folders, unbuildable = {}, []
    for family, head, pooling in COMBINATIONS:
        name = f"{family}-{head}-{pooling}"
        try:
            model = _model(family, head, pooling)
        except LmlabError:
            unbuildable.append((family, head, pooling))
            continue
        batch = _batch(family, head)
        with torch.no_grad():
            logits = task_logits(model, head, batch)
        with redirect_stdout(io.StringIO()):  # save_model says when it writes lmlab's format
            _, kind = save_model(model, root / name)
        save_file({**batch, "logits": logits}, str(root / f"{name}.safetensors"))
        folders[name] = (root / name, logits, batch, kind)
    return root, folders, unbuildable


def test_lmlab_builds_every_combination_but_cls_on_a_recurrent_model(saved):
    """The only combinations the library refuses to build: [CLS] pooling of a pooled head on a
    model with no [CLS] token (AWD-LSTM, ELMo)."""
    _, folders, unbuildable = saved
    assert sorted(unbuildable) == sorted(
        (family, head, "cls") for family in RECURRENT_FAMILIES
        for head in ("sequence-classification", "multiple-choice"))
    assert len(folders) == len(COMBINATIONS) - len(unbuildable)


@pytest.mark.parametrize("family,head,pooling", COMBINATIONS)
def test_transformers_reads_the_same_or_refuses(saved, family, head, pooling):
    """The folder loads in transformers as the family's class with lmlab's logits, or
    transformers refuses it; never another model (mean pooling read as [CLS] + pooler, a head
    left out of the file)."""
    _, folders, _ = saved
    name = f"{family}-{head}-{pooling}"
    if name not in folders:
        pytest.skip("lmlab refuses to build it (test above)")
    folder, logits, batch, kind = folders[name]
    auto = getattr(transformers, AUTO[head])
    if expected(family, head, pooling) == "refused":
        with pytest.raises((ValueError, OSError), match="lmlab-(native|recurrent)"):
            auto.from_pretrained(folder)
        assert kind == "lmlab"
        return
    assert kind == "huggingface"
    theirs, info = auto.from_pretrained(folder, output_loading_info=True)
    assert not info["missing_keys"] and not info["mismatched_keys"], info  # none left random
    prefix = get_family(family).architecture_for(()).removesuffix("Model")
    assert type(theirs).__name__ == prefix + AUTO[head].removeprefix("AutoModel")
    with torch.no_grad():
        out = theirs.eval()(**batch)
    got = (torch.stack([out.start_logits, out.end_logits], -1) if head == "question-answering"
           else out.logits)
    _compare(got, logits, head, batch, name)


def test_sentence_transformers_refuses_what_transformers_refuses(saved):
    """sentence-transformers builds its models on transformers' AutoConfig: a bi-encoder
    (SentenceTransformer) or a cross-encoder of a refused folder is refused the same way."""
    st = pytest.importorskip("sentence_transformers")
    _, folders, _ = saved
    refused = [name for name, (_, _, _, kind) in folders.items() if kind == "lmlab"]
    assert refused
    for name in refused:
        for loader in (st.SentenceTransformer, st.CrossEncoder):
            with pytest.raises((ValueError, OSError), match="lmlab-(native|recurrent)"):
                loader(str(folders[name][0]), device="cpu")


RELOAD = """
import sys
from pathlib import Path
from safetensors.torch import load_file, save_file
import torch
import lmlab
from lmlab.models.task_heads import task_logits

root, out = Path(sys.argv[1]), {}
for name in sys.argv[2:]:
    model = lmlab.from_pretrained(root / name)
    head, = model.heads
    assert getattr(model, "fresh_heads", []) == [], (name, model.fresh_heads)
    batch = load_file(str(root / f"{name}.safetensors"))
    batch.pop("logits")
    with torch.no_grad():
        out[name] = task_logits(model, head, batch).contiguous()
save_file(out, str(root / "reloaded.safetensors"))
"""


def test_lmlab_reloads_every_folder_in_a_fresh_process(saved):
    from safetensors.torch import load_file

    root, folders, _ = saved
    result = subprocess.run([sys.executable, "-c", RELOAD, str(root), *folders],
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stdout + result.stderr
    reloaded = load_file(str(root / "reloaded.safetensors"))
    for name, (_, logits, batch, _) in folders.items():
        head = next(head for head in TASK_HEADS if f"-{head}-" in name)
        _compare(reloaded[name], logits, head, batch, name)


def test_folders_saved_before_still_load(tmp_path, monkeypatch):
    """What lmlab wrote before: a transformers class whose head reads the mean or concat pooling
    loads in lmlab as trained, with a warning; re-saved, it is lmlab's own format, which
    transformers refuses. lmlab's own folders from before they named a model_type load too."""
    import lmlab
    from lmlab.interop import hf
    from lmlab.interop.native import save_native
    from lmlab.interop.recurrent import save_recurrent

    head = "sequence-classification"
    for family, pooling in (("bert", "mean"), ("roberta", "concat")):
        model, batch = _model(family, head, pooling), _batch(family, head)
        with torch.no_grad():
            want = task_logits(model, head, batch)
        old = tmp_path / f"{family}-{pooling}"
        with monkeypatch.context() as patch:  # the writer as it was: no refusal of the head
            patch.setattr(hf, "_refuse_task_heads", lambda model, family: None)
            hf.save_pretrained(model, old)
        config = json.loads((old / "config.json").read_text())
        assert config["lmlab_pooling"] == pooling
        assert config["architectures"][0].endswith("ForSequenceClassification")
        with pytest.warns(UserWarning, match="transformers would pool \\[CLS\\]"):
            loaded = lmlab.from_pretrained(old)
        with torch.no_grad():
            _compare(task_logits(loaded, head, batch), want, head, batch, str(old))
        with redirect_stdout(io.StringIO()):  # the fix the warning gives
            _, kind = save_model(loaded, tmp_path / f"{family}-{pooling}-resaved")
        assert kind == "lmlab"
        with pytest.raises(ValueError, match="lmlab-native"):
            transformers.AutoModelForSequenceClassification.from_pretrained(
                tmp_path / f"{family}-{pooling}-resaved")

    for family, save in (("gpt2", save_native), ("awd-lstm", save_recurrent)):
        model, batch = _model(family, head, "mean"), _batch(family, head)
        folder = save(model, tmp_path / f"{family}-unnamed")
        config = json.loads((folder / "config.json").read_text())
        del config["model_type"]
        (folder / "config.json").write_text(json.dumps(config))
        with torch.no_grad():
            _compare(task_logits(lmlab.from_pretrained(folder), head, batch),
                     task_logits(model, head, batch), head, batch, family)


def test_feature_runs_load_as_their_encoder_or_are_refused(tmp_path):
    """A feature-based run's folder is its frozen encoder plus lmlab's head file: transformers'
    AutoModel gives the encoder's hidden states and its classifier classes say the classifier
    is newly initialised (not a silent model); an encoder no transformers family maps (pre-norm)
    is saved in lmlab's format, which transformers refuses. lmlab reloads both in a fresh
    process with the same logits."""
    from safetensors.torch import load_file, save_file

    from lmlab.finetune.feature_based import FeatureClassifier, FeatureHead
    from lmlab.models.model import LanguageModel

    head, expected_logits = "sequence-classification", {}
    batch = _batch("bert", head)
    real = batch["attention_mask"].bool()
    for pooling in ("mean", "cls"):
        for pre_norm in (False, True):
            torch.manual_seed(0)
            encoder = LanguageModel(get_family("bert").config(
                vocab_size=VOCAB, hidden_size=HIDDEN, num_hidden_layers=LAYERS,
                num_attention_heads=4, intermediate_size=FFN, max_position_embeddings=64,
                pre_norm=pre_norm)).eval()
            model = FeatureClassifier(encoder, FeatureHead(LAYERS + 1, HIDDEN, 3, None),
                                      pooling, ["a", "b", "c"]).eval()
            name = f"feature-{pooling}-{'prenorm' if pre_norm else 'bert'}"
            with torch.no_grad():
                expected_logits[name] = task_logits(model, head, batch)
                hidden = encoder(**batch).last_hidden_state
            with redirect_stdout(io.StringIO()):
                model.save_pretrained(tmp_path / name)
            save_file({**batch, "logits": expected_logits[name]},
                      str(tmp_path / f"{name}.safetensors"))
            if pre_norm:
                for auto in (transformers.AutoModel,
                             transformers.AutoModelForSequenceClassification):
                    with pytest.raises(ValueError, match="lmlab-native"):
                        auto.from_pretrained(tmp_path / name)
                continue
            theirs = transformers.AutoModel.from_pretrained(tmp_path / name).eval()
            with torch.no_grad():
                _compare(theirs(**batch).last_hidden_state[real], hidden[real], head, batch, name)
            _, info = transformers.AutoModelForSequenceClassification.from_pretrained(
                tmp_path / name, output_loading_info=True)
            assert {"classifier.weight", "classifier.bias"} <= set(info["missing_keys"]), info

    result = subprocess.run([sys.executable, "-c", RELOAD, str(tmp_path), *expected_logits],
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stdout + result.stderr
    reloaded = load_file(str(tmp_path / "reloaded.safetensors"))
    for name, logits in expected_logits.items():
        _compare(reloaded[name], logits, head, batch, name)
