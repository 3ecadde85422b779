"""Task heads against transformers: for every family x head, random-weight checkpoints load both
ways and give the same logits (within float32 rounding: tests/conftest.py, rounding_tolerance)."""

from __future__ import annotations

import pytest
import torch
from conftest import assert_close_rounding

transformers = pytest.importorskip("transformers")

import lmlab  # noqa: E402
from lmlab.interop.hf import load_pretrained  # noqa: E402
from lmlab.models.task_heads import add_task_head, task_logits  # noqa: E402

FAMILIES = ("bert", "roberta", "albert", "electra", "distilbert")
HEADS = {
    "sequence-classification": "ForSequenceClassification",
    "token-classification": "ForTokenClassification",
    "question-answering": "ForQuestionAnswering",
    "multiple-choice": "ForMultipleChoice",
}
PREFIX = {"bert": "Bert", "roberta": "Roberta", "albert": "Albert", "electra": "Electra",
          "distilbert": "DistilBert"}


def hf_config(family: str, num_labels: int = 3):
    common = dict(vocab_size=99, num_labels=num_labels, max_position_embeddings=64)
    if family == "distilbert":
        return transformers.DistilBertConfig(dim=32, hidden_dim=64, n_layers=2, n_heads=4,
                                             **common)
    sizes = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                 intermediate_size=64, **common)
    if family == "albert":
        return transformers.AlbertConfig(embedding_size=16, **sizes)
    if family == "electra":
        return transformers.ElectraConfig(embedding_size=16, **sizes)
    if family == "roberta":
        return transformers.RobertaConfig(pad_token_id=1, type_vocab_size=1, **sizes)
    return transformers.BertConfig(**sizes)


def inputs(family: str, mc: bool):
    torch.manual_seed(0)
    shape = (2, 3, 9) if mc else (2, 9)
    ids = torch.randint(5, 99, shape)
    mask = torch.ones(shape, dtype=torch.long)
    mask[..., 0, 6:] = 0 if not mc else 1
    if mc:
        mask[:, :, 7:] = 0
        mask[1] = 1
    ids = ids.masked_fill(mask == 0, 1 if family == "roberta" else 0)
    batch = {"input_ids": ids, "attention_mask": mask}
    if family in ("bert", "albert", "electra"):
        batch["token_type_ids"] = torch.zeros_like(ids)
    return batch


def their_logits(model, head, batch):
    out = model(**batch)
    if head == "question-answering":
        return torch.stack([out.start_logits, out.end_logits], dim=-1)
    return out.logits


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("head", list(HEADS))
def test_head_parity_both_ways(tmp_path, family, head):
    torch.manual_seed(1)
    cls = getattr(transformers, PREFIX[family] + HEADS[head])
    theirs = cls(hf_config(family, 2 if head == "question-answering" else 3)).eval()
    theirs.save_pretrained(tmp_path / "theirs")
    ours = load_pretrained(tmp_path / "theirs")  # head from config.json's architectures
    assert list(ours.heads) == [head]
    batch = inputs(family, head == "multiple-choice")
    with torch.no_grad():
        expected = their_logits(theirs, head, batch)
        got = task_logits(ours, head, batch)
    assert got.shape == expected.shape
    if head in ("token-classification", "question-answering"):
        # Per-token logits: padding positions are no predictions, and lmlab skips the padding
        # by default (models.md), so the real tokens are compared.
        real = batch["attention_mask"].bool()  # (B, T)
        got, expected = got[real], expected[real]
    # Other kernels on each side: 2 layers and a head of sums of up to 64 terms.
    assert_close_rounding(got, expected, terms=64, depth=3)
    # and back: our save -> their AutoModelFor... load
    lmlab.save_pretrained(ours, tmp_path / "ours")
    auto = {"sequence-classification": transformers.AutoModelForSequenceClassification,
            "token-classification": transformers.AutoModelForTokenClassification,
            "question-answering": transformers.AutoModelForQuestionAnswering,
            "multiple-choice": transformers.AutoModelForMultipleChoice}[head]
    reloaded = auto.from_pretrained(tmp_path / "ours").eval()
    assert type(reloaded) is cls
    with torch.no_grad():
        assert_close_rounding(their_logits(reloaded, head, batch), their_logits(theirs, head, batch),
                              terms=64, depth=3)


@pytest.mark.numerics
def test_regression_head_and_labels_roundtrip(tmp_path):
    """num_labels=1 is regression (MSE); label names survive save/load."""
    theirs = transformers.BertForSequenceClassification(hf_config("bert", num_labels=1)).eval()
    theirs.save_pretrained(tmp_path / "reg")
    ours = lmlab.from_pretrained(tmp_path / "reg", head="sequence-classification")
    batch = inputs("bert", False)
    labels = torch.tensor([0.5, 2.0])
    with torch.no_grad():
        out = ours(**batch, labels=labels, heads=["sequence-classification"])
        ref = theirs(**batch, labels=labels)
    assert out.logits.shape == (2, 1)
    assert_close_rounding(out.loss, ref.loss, terms=64, depth=3)

    model = ours
    add_task_head(model, "sequence-classification", 3, {0: "a", 1: "b", 2: "c"})
    assert model.heads["sequence-classification"].classifier.out_features == 3
    lmlab.save_pretrained(model, tmp_path / "named")
    back = transformers.AutoModelForSequenceClassification.from_pretrained(tmp_path / "named")
    assert back.config.id2label == {0: "a", 1: "b", 2: "c"}
    again = load_pretrained(tmp_path / "named")
    assert again.config.extra["id2label"] == {0: "a", 1: "b", 2: "c"}


@pytest.mark.numerics
@pytest.mark.parametrize("pooling", ["mean", "concat"])
def test_lmlab_poolings(pooling):
    """Mean and ULMFiT concat pooling ignore padding: a padded copy gives the same logits."""
    from lmlab.models.config import TransformerConfig
    from lmlab.models.model import LanguageModel

    config = TransformerConfig(vocab_size=50, hidden_size=16, num_hidden_layers=1,
                               num_attention_heads=2, intermediate_size=32)
    model = LanguageModel(config)
    add_task_head(model, "sequence-classification", 4, pooling=pooling)
    model.eval()
    ids = torch.tensor([[2, 7, 9, 3]])
    padded = torch.tensor([[2, 7, 9, 3, 0, 0]])
    mask = torch.tensor([[1, 1, 1, 1, 0, 0]])
    with torch.no_grad():
        a = task_logits(model, "sequence-classification", {"input_ids": ids})
        b = task_logits(model, "sequence-classification",
                        {"input_ids": padded, "attention_mask": mask})
    # Padded rows change the matrix shapes, not the sums: rounding of 1 layer + head, 32 terms.
    assert_close_rounding(a, b, terms=32, depth=2)
    width = 48 if pooling == "concat" else 16
    assert model.heads["sequence-classification"].classifier.in_features == width


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("pooling", ["family", "mean"])
def test_task_heads_are_the_declared_layout(family, pooling):
    """One declaration (FamilySpec.task_heads) gives both the modules lmlab builds for each task
    head and the checkpoint names they are saved under: the two cover the same parameters."""
    from lmlab.models.families import get_family
    from lmlab.models.model import LanguageModel
    from lmlab.models.task_heads import TASK_HEADS

    spec = get_family(family)
    config = spec.config(vocab_size=99, hidden_size=32, num_hidden_layers=1,
                         num_attention_heads=4, intermediate_size=64, extra={"pooling": pooling})
    model = LanguageModel(config, heads=[])
    for head in TASK_HEADS:
        add_task_head(model, head)
    built = {name for name, _ in model.named_parameters() if name.startswith("heads.")}
    declared = {rule.ours for head in TASK_HEADS for rule in spec.head_rules[head](config)}
    assert built == declared
    assert set(spec.task_heads) == set(TASK_HEADS)
