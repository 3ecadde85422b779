"""Task pipelines against transformers' pipelines on the same random-weight models."""

from __future__ import annotations

import shutil

import pytest
import torch
from conftest import assert_close_rounding

transformers = pytest.importorskip("transformers")

import lmlab  # noqa: E402
from lmlab.utils.catalog import minilm_dir  # noqa: E402

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "vocab.txt",
                   "special_tokens_map.json")


def _folder(tmp_path, cls, **config):
    source = minilm_dir()
    if source is None:
        pytest.skip("MiniLM tokenizer not available")
    torch.manual_seed(3)
    hf = transformers.BertConfig(vocab_size=30522, hidden_size=32, num_hidden_layers=2,
                                 num_attention_heads=4, intermediate_size=64,
                                 max_position_embeddings=128, **config)
    model = cls(hf).eval()
    with torch.no_grad():  # make the head decisive so ties cannot flip the comparison
        for p in model.parameters():
            p.mul_(8.0) if p.dim() == 2 and p.shape[0] <= 9 else None
    folder = tmp_path / cls.__name__
    model.save_pretrained(folder)
    for name in TOKENIZER_FILES:
        if (source / name).exists():
            shutil.copy(source / name, folder / name)
    return folder


CONTEXT = ("The Jargon File is a glossary of hacker slang. It was maintained by Eric Raymond "
           "and first appeared in 1975 at Stanford. Fortune cookies hold short sayings.")


def _reference_span(folder, question, context, max_answer_len):
    """transformers 5 dropped its QA pipeline: the reference is their model's logits and their
    tokenizer's offsets, with an exhaustive search over valid spans (no n-best shortcut)."""
    tok = transformers.AutoTokenizer.from_pretrained(folder)
    model = transformers.AutoModelForQuestionAnswering.from_pretrained(folder).eval()
    enc = tok(question, context, return_offsets_mapping=True, return_tensors="pt")
    offsets = enc.pop("offset_mapping")[0].tolist()
    with torch.no_grad():
        out = model(**enc)
    seq = enc.sequence_ids(0)
    ctx = [i for i, s in enumerate(seq) if s == 1]
    best = max(((out.start_logits[0, s] + out.end_logits[0, e]).item(), s, e)
               for s in ctx for e in ctx if s <= e < s + max_answer_len)
    _, s, e = best
    return offsets[s][0], offsets[e][1]


def test_question_answering_matches_transformers(tmp_path):
    folder = _folder(tmp_path, transformers.BertForQuestionAnswering)
    ours = lmlab.pipeline("question-answering", model=str(folder))
    for question in ("Who maintained the Jargon File?", "When did it first appear?"):
        a = ours(question=question, context=CONTEXT, max_answer_len=10)
        assert (a["start"], a["end"]) == _reference_span(folder, question, CONTEXT, 10)
        assert a["answer"] == CONTEXT[a["start"]:a["end"]]
        assert 0 < a["score"] <= 1
    # a short max_seq_len forces several overlapping windows; the answer is still a real span
    long = CONTEXT * 3
    a = ours(question="Who?", context=long, max_seq_len=32, doc_stride=8, top_k=3)
    assert len(a) == 3 and all(x["answer"] == long[x["start"]:x["end"]] for x in a)
    assert a[0]["score"] >= a[1]["score"] >= a[2]["score"]


def test_qa_decoding_null_answer_and_max_length():
    from lmlab.finetune.qa import decode_answers

    offsets = [None, (0, 3), (4, 8), (9, 12), None]
    window = {"example_index": 0, "offsets": offsets,
              "start_logits": [5.0, 1.0, 3.0, 0.0, 9.0], "end_logits": [5.0, 0.0, 0.0, 4.0, 9.0]}
    context = "abc defg hij"
    got = decode_answers([window], [context], max_answer_length=2)[0]
    assert (got["answer"], got["start"], got["end"]) == ("defg hij", 4, 12)
    short = decode_answers([window], [context], max_answer_length=1)[0]
    assert short["answer"] == "hij"  # best one-token span: 0 + 4 beats 3 + 0
    null = decode_answers([window], [context], max_answer_length=2, allow_null=True)[0]
    assert null["answer"] == ""  # null score 10 > 7
    kept = decode_answers([window], [context], max_answer_length=2, allow_null=True,
                          null_threshold=5.0)[0]
    assert kept["answer"] == "defg hij"


def test_token_classification_matches_transformers(tmp_path):
    labels = ["O", "B-PER", "I-PER", "B-LOC", "I-LOC"]
    folder = _folder(tmp_path, transformers.BertForTokenClassification,
                     id2label=dict(enumerate(labels)), label2id={v: i for i, v in
                                                                 enumerate(labels)})
    ours = lmlab.pipeline("token-classification", model=str(folder))
    theirs = transformers.pipeline("token-classification", model=str(folder),
                                   aggregation_strategy="simple")
    text = "Eric Raymond maintained the Jargon File in Pennsylvania near Philadelphia."
    got = [(g["entity_group"], g["start"], g["end"], g["word"]) for g in ours(text)]
    want = [(g["entity_group"], g["start"], g["end"], text[g["start"]:g["end"]])
            for g in theirs(text)]
    assert got == want
    assert all(0 < g["score"] <= 1 for g in ours(text))
    raw = lmlab.pipeline("token-classification", model=str(folder), aggregation_strategy="none")
    their_raw = transformers.pipeline("token-classification", model=str(folder))
    assert [(t["entity"], t["index"]) for t in raw(text)] == \
        [(t["entity"], t["index"]) for t in their_raw(text)]


@pytest.mark.numerics
def test_text_classification_matches_transformers(tmp_path):
    folder = _folder(tmp_path, transformers.BertForSequenceClassification,
                     id2label={0: "neg", 1: "pos", 2: "mixed"},
                     label2id={"neg": 0, "pos": 1, "mixed": 2})
    ours = lmlab.pipeline("text-classification", model=str(folder))
    theirs = transformers.pipeline("text-classification", model=str(folder))
    for text in ("a fine day", "nothing works"):
        a, b = ours(text), theirs(text)[0]
        assert a["label"] == b["label"]
        with torch.no_grad():
            logits = theirs.model(**theirs.tokenizer(text, return_tensors="pt")).logits
        # a probability moves no more than the logits: two layers (32, 64), the pooler, the head
        assert_close_rounding(a["score"], b["score"], terms=64, depth=4,
                              scale=float(logits.abs().max()))
    ranked = ours("a fine day", top_k=None)
    assert [r["label"] for r in ranked] == [r["label"] for r in theirs("a fine day", top_k=None)]
    assert_close_rounding(sum(r["score"] for r in ranked), 1.0, terms=3)  # 3 probabilities
    pair = ours({"text": "a fine day", "text_pair": "it rains"})
    assert pair["label"] in ("neg", "pos", "mixed")


def test_pipeline_without_head_is_an_error(tmp_path):
    folder = _folder(tmp_path, transformers.BertModel)
    with pytest.raises(lmlab.LmlabError, match="question-answering"):
        lmlab.pipeline("question-answering", model=str(folder))


def test_a_misspelled_option_is_refused_before_the_model_loads(monkeypatch):
    """The pipeline's options are checked against its class before any loading."""
    import lmlab.load as base

    def no_loading(*args, **kwargs):
        raise AssertionError("the model was loaded before the options were checked")

    monkeypatch.setattr(base, "load_model_and_tokenizer", no_loading)
    with pytest.raises(lmlab.LmlabError, match="(?s)no option batchsize.*layer, batch_size"):
        lmlab.pipeline("feature-extraction", model="minilm", batchsize=8)
    with pytest.raises(lmlab.LmlabError, match="options: none"):
        lmlab.pipeline("fill-mask", model="minilm", top_k=3)
