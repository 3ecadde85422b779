"""scripts/bert_ablations.py at toy size (one shared corpus and vocabulary, each experiment a
few steps, one seed) and the BiLSTM task head its Table 5 row adds (models.task_heads)."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from conftest import tiny_bert

from lmlab.models.task_heads import SEQUENCE_CLASSIFICATION, add_task_head, task_logits
from lmlab.utils.errors import LmlabError

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "bert_ablations.py"


def _script():
    spec = importlib.util.spec_from_file_location("bert_ablations", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


# -- the BiLSTM head ---------------------------------------------------------------------------
def bilstm_model(pooling: str = "mean"):
    model = tiny_bert()
    model.config.extra["classifier_bilstm"] = True
    add_task_head(model, SEQUENCE_CLASSIFICATION, 3, pooling=pooling)
    torch.manual_seed(1)
    for p in model.heads[SEQUENCE_CLASSIFICATION].parameters():  # off PyTorch's init
        p.data.normal_(0, 0.3)
    return model.eval()


def batch():
    ids = torch.randint(1000, 2000, (3, 7))
    mask = torch.tensor([[1] * 7, [1] * 4 + [0] * 3, [1] * 2 + [0] * 5])  # right padding
    return {"input_ids": ids, "attention_mask": mask}


def test_bilstm_head_equals_each_row_run_alone():
    """Packed batch == each row's real tokens through the LSTM alone, mean-pooled, classified."""
    model = bilstm_model()
    head = model.heads[SEQUENCE_CLASSIFICATION]
    assert head.bilstm.hidden_size == 16 and head.bilstm.bidirectional  # H/2 each way
    data = batch()
    with torch.no_grad():
        logits = task_logits(model, SEQUENCE_CLASSIFICATION, data)
        for row, length in enumerate(data["attention_mask"].sum(-1).tolist()):
            ids = data["input_ids"][row:row + 1, :length]
            hidden = model(ids, torch.ones_like(ids), heads=[]).last_hidden_state  # (1, n, H)
            states = head.bilstm(hidden)[0]  # (1, n, H)
            expected = head.classifier(states.mean(1))[0]
            # the stack's rows agree within float rounding (padding changes the matmul shapes)
            # tol: float32 logits of a row alone vs in a padded batch through a 2-layer stack and an LSTM: sums of 64 terms, values O(1)
            torch.testing.assert_close(logits[row], expected, rtol=0, atol=1e-5)


def test_bilstm_head_refuses_left_padding_and_cls_pooling():
    model = bilstm_model()
    data = batch()
    data["attention_mask"] = data["attention_mask"].flip(-1)
    with pytest.raises(LmlabError, match="right-padded"):
        task_logits(model, SEQUENCE_CLASSIFICATION, data)
    with pytest.raises(LmlabError, match="BiLSTM on top reads every token"):
        bilstm_model(pooling="cls")


def test_bilstm_head_saves_and_loads_in_a_new_process(tmp_path):
    import lmlab

    model = bilstm_model()
    data = batch()
    with torch.no_grad():
        logits = task_logits(model, SEQUENCE_CLASSIFICATION, data)
    lmlab.save_pretrained(model, tmp_path / "m")
    code = """
import json, sys, torch
import lmlab
from lmlab.models.task_heads import task_logits
model = lmlab.from_pretrained(sys.argv[1]).eval()
data = {k: torch.tensor(v) for k, v in json.loads(sys.argv[2]).items()}
with torch.no_grad():
    print(json.dumps(task_logits(model, "sequence-classification", data).tolist()))
"""
    out = subprocess.run([sys.executable, "-c", code, str(tmp_path / "m"),
                          json.dumps({k: v.tolist() for k, v in data.items()})],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    # tol: the same float32 computation in a fresh process; only the printed JSON's decimal digits differ
    torch.testing.assert_close(torch.tensor(json.loads(out.stdout)), logits, rtol=0, atol=1e-6)


# -- the script ----------------------------------------------------------------------------------
def test_masking_rows_are_the_papers_columns():
    script = _script()
    # the paper's columns are MASK/SAME/RND; the objective takes (mask, random, keep)
    assert script.replacement("80/10/10") == (0.8, 0.1, 0.1)
    assert script.replacement("80/0/20") == (0.8, 0.2, 0.0)
    assert script.replacement("80/20/0") == (0.8, 0.0, 0.2)
    assert script.replacement("0/20/80") == (0.0, 0.8, 0.2)
    for bad in ("80/10", "80/10/20", "a/b/c"):
        with pytest.raises(LmlabError):
            script.replacement(bad)
    assert script.parse_size("4x256") == (4, 256)
    with pytest.raises(LmlabError, match="multiple of 64"):
        script.parse_size("2x100")


TOY = ["--sources", "kjv", "--max-documents", "40", "--validation-fraction", "0.2", "--vocab-size", "300", "--layers", "2",
       "--hidden", "64", "--steps", "2", "--batch-size", "4", "--seq-len", "16",
       "--tasks", "fortunes-topic", "--seeds", "0", "--finetune-epochs", "1",
       "--max-train-examples", "16", "--max-eval-examples", "8", "--eval-batches", "1"]


@pytest.fixture(scope="module")
def work(tmp_path_factory):
    return tmp_path_factory.mktemp("ablations") / "work"


def run(work: Path, out: Path, *args: str) -> dict:
    script = _script()
    assert script.main([*args, "--work", str(work), "--out", str(out), *TOY]) == 0
    name = args[0]
    assert (out / f"{name}.md").read_text().startswith("Host: ")
    assert (out / f"{name}.png").stat().st_size > 0
    return json.loads((out / f"{name}.json").read_text())


@pytest.mark.slow
def test_size_at_toy_scale(work, tmp_path):
    report = run(work, tmp_path, "size", "--sizes", "1x64,2x64")
    assert [r["layers"] for r in report["rows"]] == [1, 2]
    first, second = report["rows"]
    assert first["params"] < second["params"] and first["ppl"] > 1
    assert report["budget"]["pretrain_tokens"] == 2 * 4 * 16
    assert set(first["finetuned"]["fortunes-topic"]) == {"dev", "test"}


def test_objectives_at_toy_scale(work, tmp_path):
    """Table 5's rows: NSP, the causal LM and its BiLSTM folder (the other experiments share
    these stages; they run at toy size under ``-m slow``)."""
    report = run(work, tmp_path, "objectives", "--rows", "mlm+nsp,ltr+bilstm,mlm@40")
    assert [r["name"] for r in report["rows"]] == ["BERT (MLM + NSP)", "left-to-right + BiLSTM",
                                                   "MLM only, 40% masked"]
    # each row's tokens as its run reported them, checked against the budget (KJV chapters
    # fill every pair at this length, so the NSP row keeps the batch)
    assert report["budget"]["pretrain_tokens"] == 2 * 4 * 16
    assert all(r["tokens"] == 128 and r["tokens_ok"] for r in report["rows"])
    bilstm = next((work / "stages").glob("bilstm-*")) / "model" / "config.json"
    config = json.loads(bilstm.read_text())
    assert config["causal"] and config["extra"]["classifier_bilstm"]
    assert set(report["rows"][1]["finetuned"]["fortunes-topic"]) == {"dev", "test"}
    dense = next((work / "stages").glob("pretrain-mlm-*-masked40-*")) / "run" / "config.json"
    assert json.loads(dense.read_text())["hparams"]["objective_args"] == {"mask_prob": 0.4}


@pytest.mark.slow
def test_masking_at_toy_scale(work, tmp_path):
    report = run(work, tmp_path, "masking", "--rows", "0/0/100")
    row = report["rows"][0]
    assert row["replacement"] == [0.0, 1.0, 0.0]  # RND 100: all random
    assert float(row["held-out loss"]) > 0 and 0 <= float(row["held-out accuracy"]) <= 100
    assert {"finetuned", "feature"} <= set(row)
    stages = sorted(p.name.rsplit("-", 1)[0] for p in (work / "stages").iterdir())
    assert "finetune-fortunes-topic-feature-seed0" in stages


@pytest.mark.slow
def test_data_curve_at_toy_scale(work, tmp_path):
    report = run(work, tmp_path, "data-curve", "--train-sizes", "8")
    row = report["rows"][0]
    assert row["examples"] == 8 and {"pretrained", "random"} <= set(row)


def test_rows_read_equal_tokens(tmp_path):
    """Segment pairs end with their document (BERT's create_instances_from_document), so on
    short documents a pair row's batch grows until an update reads the packed rows' tokens;
    a row whose run reported tokens more than 3% off the budget is flagged."""
    import argparse
    import itertools
    from types import SimpleNamespace

    from lmlab.data.pretraining import PretrainingStream
    from lmlab.data.shards import build_shards
    from lmlab.objectives.registry import build_objective
    from lmlab.objectives.special_tokens import SpecialTokens
    from lmlab.text.sources.kjv import KJVSource
    from lmlab.tokenization.tokenizer import Tokenizer

    corpus = tmp_path / "corpus"
    corpus.mkdir()
    chapters = [d.sentences for d in itertools.islice(KJVSource().iter_documents(), 12)]
    verses = [s for chapter in chapters for s in chapter]  # one verse a document: short
    for split, part in (("train", verses[:300]), ("validation", verses[300:340])):
        (corpus / f"{split}.jsonl").write_text("".join(json.dumps(
            {"id": f"v/{split}/{i}", "source": "kjv", "sentences": [v]}) + "\n"
            for i, v in enumerate(part)))
    tokenizer = Tokenizer.train(corpus, kind="wordpiece", vocab_size=1000, show_progress=False)
    tokenizer.save_pretrained(tmp_path / "tokenizer")
    build_shards(tokenizer, corpus, tmp_path / "shards", show_progress=False)
    exp = SimpleNamespace(args=argparse.Namespace(batch_size=4, seq_len=256), tokens=tmp_path)
    script = _script()
    assert script.Experiment.batch_for(exp, "mlm") == 4
    batch = script.Experiment.batch_for(exp, "mlm,nsp")
    assert batch > 4
    pairs = PretrainingStream(tmp_path / "shards", objective=build_objective(
        "mlm,nsp", SpecialTokens.from_tokenizer(tokenizer)), batch_size=batch, seq_len=256,
        seed=5)
    read = [int(b["attention_mask"].sum()) for _, b in zip(range(20), pairs)]
    # tol: 20 random batches of whole segment pairs against 4 packed rows: a sampling spread
    assert abs(sum(read) / len(read) / (4 * 256) - 1) < 0.2  # tokens per update as packed rows

    rows = [{"name": "a", "tokens": 10_000}, {"name": "b", "tokens": 10_290},
            {"name": "c", "tokens": 9_650}]
    assert script.flag_tokens(rows, 10_000) == ["c"]
    assert [r["tokens_ok"] for r in rows] == [True, True, False]


def test_bad_settings_are_refused_before_work(tmp_path, capsys):
    script = _script()
    for args in (["masking", "--rows", "90/20/0"], ["objectives", "--rows", "mlm,bogus"],
                 ["size", "--sizes", "4"], ["data-curve", "--train-sizes", "0"],
                 ["objectives", "--warmup-fraction", "1.5"]):
        assert script.main([*args, "--out", str(tmp_path / "o"), "--work",
                            str(tmp_path / "w")]) == 2
    assert not (tmp_path / "w").exists()
    assert "fix:" in capsys.readouterr().err


def test_held_out_score_uses_the_replacement_it_is_given(tiny_bert_folder, tmp_path_factory):
    """masking's held-out column scores every row with every chosen token masked: the split
    reaches the objective (all kept, the inputs are the text itself and the loss differs)."""
    import torch
    from conftest import kjv_shards

    from lmlab.demo.analysis import masked_lm_score

    shards = kjv_shards(tmp_path_factory, train=8, validation=4)

    def score(split):
        torch.manual_seed(0)  # the folder has no masked-LM head: the same fresh one each time
        return masked_lm_score(tiny_bert_folder, shards, seq_len=32, batches=2, replacement=split)

    masked = score((1.0, 0.0, 0.0))
    assert score((1.0, 0.0, 0.0)) == masked  # the same batches and head: one computation
    assert score((0.0, 0.0, 1.0))["loss"] != masked["loss"]
