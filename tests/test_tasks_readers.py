"""Task readers on small files written in the real formats (GLUE TSV, CoNLL, SQuAD, tables)."""

from __future__ import annotations

import json

import pytest

from lmlab.metrics.glue import GLUE_TASKS
from lmlab.tasks.conll import iob1_to_iob2, load_conll_task, read_conll
from lmlab.tasks.glue import GLUE_FORMATS, load_glue_task
from lmlab.tasks.readers import load_table_task, read_table
from lmlab.tasks.squad import load_squad_task, read_squad
from lmlab.tasks.types import Example, Task
from lmlab.utils.errors import LmlabError

# ----------------------------------------------------------------------------- tables


def test_csv_tsv_jsonl_with_column_mapping(tmp_path):
    (tmp_path / "a.csv").write_text('review,stars\n"good, really",pos\nbad,neg\n')
    (tmp_path / "a.tsv").write_text('review\tstars\n"quoted" text\tpos\n')
    (tmp_path / "a.jsonl").write_text(
        json.dumps({"review": "fine", "other": "x", "stars": "pos"}) + "\n\n")
    csv_rows = read_table(tmp_path / "a.csv", "review", "stars")
    assert [(e.text, e.label) for e in csv_rows] == [("good, really", "pos"), ("bad", "neg")]
    assert read_table(tmp_path / "a.tsv", "review", "stars")[0].text == '"quoted" text'
    assert read_table(tmp_path / "a.jsonl", "review", "stars")[0].text == "fine"


def test_table_task_infers_labels_and_pair_type(tmp_path):
    (tmp_path / "train.jsonl").write_text("".join(
        json.dumps({"a": f"s{i}", "b": f"t{i}", "y": str(i % 2)}) + "\n" for i in range(6)))
    (tmp_path / "dev.jsonl").write_text(json.dumps({"a": "x", "b": "y", "y": "1"}) + "\n")
    task = load_table_task("toy", {"train": tmp_path / "train.jsonl", "dev": tmp_path / "dev.jsonl"},
                           text_column="a", label_column="y", text_pair_column="b")
    assert task.type == "pair-classification" and task.labels == ["0", "1"]
    assert task.positive_label == "1" and task.split("dev")[0].text_pair == "y"
    assert task.evaluate("dev", ["1"]) == {"accuracy": 1.0, "f1": 1.0, "macro_f1": 1.0}


def test_label_outside_label_set_names_label_line_and_set(tmp_path):
    (tmp_path / "train.csv").write_text("text,label\na,pos\nb,neg\n")
    (tmp_path / "dev.csv").write_text("text,label\nc,pos\nd,neutral\n")
    with pytest.raises(LmlabError) as info:
        load_table_task("t", {"train": tmp_path / "train.csv", "dev": tmp_path / "dev.csv"},
                        "text", "label")
    message = str(info.value)
    assert "'neutral'" in message and "line 3" in message and "['neg', 'pos']" in message


def test_missing_column_names_it_and_the_present_ones(tmp_path):
    (tmp_path / "train.csv").write_text("sentence,label\na,pos\n")
    with pytest.raises(LmlabError) as info:
        read_table(tmp_path / "train.csv", "text", "label")
    assert "'text'" in str(info.value) and "sentence, label" in str(info.value)


def test_pair_task_given_single_texts(tmp_path):
    (tmp_path / "train.csv").write_text("s1,s2,label\na,,1\nb,c,0\n")
    with pytest.raises(LmlabError, match="line 2: a pair task got a single text"):
        load_table_task("t", {"train": tmp_path / "train.csv", "dev": tmp_path / "train.csv"},
                        "s1", "label", text_pair_column="s2")


def test_empty_dev_set(tmp_path):
    (tmp_path / "train.csv").write_text("text,label\na,x\nb,y\n")
    (tmp_path / "dev.csv").write_text("text,label\n")
    with pytest.raises(LmlabError, match="dev file .* has no examples"):
        load_table_task("t", {"train": tmp_path / "train.csv", "dev": tmp_path / "dev.csv"},
                        "text", "label")
    task = Task("t", "classification", ["x"], ["accuracy"], {"dev": []})
    with pytest.raises(LmlabError, match="the dev split of task 't' is empty"):
        task.split("dev")


def test_regression_labels_must_be_numbers(tmp_path):
    (tmp_path / "train.tsv").write_text("a\tb\tscore\nx\ty\t3.5\nx\ty\thigh\n")
    with pytest.raises(LmlabError, match="line 3: label 'high' is not a number"):
        load_table_task("t", {"train": tmp_path / "train.tsv"}, "a", "score",
                        text_pair_column="b", task_type="regression")


def test_example_roundtrip():
    example = Example(id="1", text="a", label="x", extra={"span": [0, 1]})
    assert Example.from_dict(example.to_dict()) == example


# ----------------------------------------------------------------------------- GLUE

MNLI_HEADER = ("index\tpromptID\tpairID\tgenre\tsentence1_binary_parse\tsentence2_binary_parse\t"
               "sentence1_parse\tsentence2_parse\tsentence1\tsentence2\tlabel1\tgold_label")
MNLI_DEV_HEADER = ("index\tpromptID\tpairID\tgenre\tsentence1_binary_parse\t"
                   "sentence2_binary_parse\tsentence1_parse\tsentence2_parse\tsentence1\t"
                   "sentence2\tlabel1\tlabel2\tlabel3\tlabel4\tlabel5\tgold_label")


def _mnli_row(i, s1, s2, label, dev=False):
    labels = [label] * (5 if dev else 1)
    return "\t".join([str(i), "31193", f"{i}n", "government", "( x )", "( y )", "(ROOT x)",
                      "(ROOT y)", s1, s2, *labels, label])


def write_glue(root):
    """Two rows of every GLUE task in the exact layout of the benchmark's files."""
    def put(folder, name, lines):
        path = root / folder / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("\n".join(lines) + "\n", encoding="utf-8")

    cola = ["gj04\t1\t\tOur friends won't buy this analysis, let alone the next one we propose.",
            "gj04\t0\t*\tThe more we study verbs, the crazier they get get."]
    put("CoLA", "train.tsv", cola)
    put("CoLA", "dev.tsv", cola)
    put("CoLA", "test.tsv", ["index\tsentence", "0\tBill whistled past the house."])
    sst = ["sentence\tlabel", "hide new secretions from the parental units \t0",
           "contains no wit , only labored gags \t1"]
    put("SST-2", "train.tsv", sst)
    put("SST-2", "dev.tsv", sst)
    mrpc = ["\ufeffQuality\t#1 ID\t#2 ID\t#1 String\t#2 String",
            '1\t702876\t702977\tAmrozi accused his brother , whom he called " the witness " .\t'
            'Referring to him as only " the witness " , Amrozi accused his brother .',
            "0\t2108705\t2108831\tYucaipa owned Dominick 's .\tYucaipa bought Dominick 's ."]
    put("MRPC", "train.tsv", mrpc)
    put("MRPC", "dev.tsv", mrpc)
    qqp = ["id\tqid1\tqid2\tquestion1\tquestion2\tis_duplicate",
           "133273\t213221\t213222\tHow is the life of a math student?\tWhich level of "
           "prepration is enough?\t0",
           "402555\t536040\t536041\tHow do I control my horny emotions?\tHow do you control "
           "your horniness?\t1",
           "12345\t1\t2\tbroken row without a second question"]
    put("QQP", "train.tsv", qqp)
    put("QQP", "dev.tsv", qqp)
    sts = ["index\tgenre\tfilename\tyear\told_index\tsource1\tsource2\tsentence1\tsentence2"
           "\tscore",
           "0\tmain-captions\tMSRvid\t2012test\t0001\tnone\tnone\tA plane is taking off.\t"
           "An air plane is taking off.\t5.000",
           "1\tmain-captions\tMSRvid\t2012test\t0004\tnone\tnone\tA man is playing a flute.\t"
           "A man is playing a bamboo flute.\t3.800"]
    put("STS-B", "train.tsv", sts)
    put("STS-B", "dev.tsv", sts)
    put("MNLI", "train.tsv", [MNLI_HEADER, _mnli_row(0, "Conceptually cream skimming has two "
                                                        "basic dimensions.", "Product and "
                                                        "geography are what make cream "
                                                        "skimming work.", "neutral")])
    put("MNLI", "dev_matched.tsv", [MNLI_DEV_HEADER, _mnli_row(1, "The new rights are nice.",
                                                               "Everyone loves them.",
                                                               "neutral", dev=True)])
    put("MNLI", "dev_mismatched.tsv", [MNLI_DEV_HEADER, _mnli_row(2, "Your gift is "
                                                                  "appreciated.", "Hundreds "
                                                                  "contributed.",
                                                                  "contradiction", dev=True)])
    qnli = ["index\tquestion\tsentence\tlabel",
            "0\tWhen did the third Digimon series begin?\tUnlike the two seasons before it, "
            "Digimon Tamers takes a darker approach.\tnot_entailment",
            "1\tWhat is the capital of France?\tParis is the capital of France.\tentailment"]
    put("QNLI", "train.tsv", qnli)
    put("QNLI", "dev.tsv", qnli)
    rte = ["index\tsentence1\tsentence2\tlabel",
           "0\tNo Weapons of Mass Destruction Found in Iraq Yet.\tWeapons of Mass Destruction "
           "Found in Iraq.\tnot_entailment",
           "1\tA place of sorrow, after Pope John Paul II died.\tPope John Paul II died.\t"
           "entailment"]
    put("RTE", "train.tsv", rte)
    put("RTE", "dev.tsv", rte)
    put("RTE", "test.tsv", ["index\tsentence1\tsentence2", "0\tMaude died.\tMaude is dead."])
    wnli = ["index\tsentence1\tsentence2\tlabel",
            "0\tI stuck a pin through a carrot. When I pulled the pin out, it had a hole.\t"
            "The carrot had a hole.\t1",
            "1\tJohn couldn't see the stage with Billy in front of him because he is so short."
            "\tBilly is so short.\t0"]
    put("WNLI", "train.tsv", wnli)
    put("WNLI", "dev.tsv", wnli)


def test_every_glue_task_reads_its_real_format(tmp_path):
    write_glue(tmp_path)
    for key in GLUE_FORMATS:
        task = load_glue_task(key, tmp_path)
        assert task.metrics == list(GLUE_TASKS[key].metrics)
        assert task.split("train") and task.split("dev")
    cola = load_glue_task("CoLA", tmp_path)
    assert cola.split("train")[1].text.startswith("The more we study")
    assert cola.split("train")[1].label == "0" and cola.type == "classification"
    assert cola.split("test")[0].label is None and cola.split("test")[0].id == "0"
    mrpc = load_glue_task("mrpc", tmp_path)
    assert mrpc.split("train")[0].label == "1" and mrpc.split("train")[0].text_pair.startswith(
        "Referring")
    assert len(load_glue_task("qqp", tmp_path).split("train")) == 2  # the broken row is skipped
    stsb = load_glue_task("sts-b", tmp_path)
    assert stsb.type == "regression" and stsb.split("dev")[1].label == pytest.approx(3.8)
    assert load_glue_task("mnli-m", tmp_path).split("dev")[0].label == "neutral"
    mm = load_glue_task("mnli-mm", tmp_path)
    assert mm.split("dev")[0].label == "contradiction" and mm.labels == [
        "contradiction", "entailment", "neutral"]
    qnli = load_glue_task("qnli", tmp_path)
    assert qnli.split("train")[0].text.startswith("When did") and qnli.is_pair
    assert load_glue_task("glue-rte", tmp_path).split("test")[0].text_pair == "Maude is dead."


def test_glue_bad_label_and_missing_folder(tmp_path):
    write_glue(tmp_path)
    (tmp_path / "RTE" / "dev.tsv").write_text("index\tsentence1\tsentence2\tlabel\n"
                                              "0\ta\tb\tcontradiction\n")
    with pytest.raises(LmlabError, match=r"line 2: label 'contradiction' is not in the label "
                                         r"set \['entailment', 'not_entailment'\]"):
        load_glue_task("rte", tmp_path)
    with pytest.raises(LmlabError, match="no CoLA files"):
        load_glue_task("cola", tmp_path / "nowhere")
    with pytest.raises(LmlabError, match="unknown GLUE task 'squad'"):
        load_glue_task("squad", tmp_path)


# ----------------------------------------------------------------------------- CoNLL

CONLL = """-DOCSTART- -X- -X- O

EU NNP B-NP B-ORG
rejects VBZ B-VP O
German JJ B-NP B-MISC
call NN I-NP O
. . O O

Peter NNP B-NP B-PER
Blackburn NNP I-NP I-PER

-DOCSTART- -X- -X- O

BRUSSELS NNP B-NP B-LOC
"""


def test_conll_reader(tmp_path):
    path = tmp_path / "eng.testa"
    path.write_text(CONLL)
    sentences = read_conll(path)
    assert [len(s.tokens) for s in sentences] == [5, 2, 1]
    assert sentences[0].tags == ["B-ORG", "O", "B-MISC", "O", "O"]
    assert sentences[1].tokens == ["Peter", "Blackburn"]
    task = load_conll_task("conll2003", {"train": path, "dev": path})
    assert task.type == "tagging" and task.labels[0] == "O" and "I-PER" in task.labels
    assert task.evaluate("dev", [s.tags for s in sentences])["entity_f1"] == 1.0
    assert iob1_to_iob2(["I-PER", "I-PER", "O", "I-LOC", "I-ORG"]) == [
        "B-PER", "I-PER", "O", "B-LOC", "B-ORG"]
    (tmp_path / "bad").write_text("token_without_tag\n")
    with pytest.raises(LmlabError, match="line 1"):
        read_conll(tmp_path / "bad")


# ----------------------------------------------------------------------------- SQuAD


def _squad(qas, context="Super Bowl 50 was won by the Denver Broncos in Santa Clara."):
    return {"version": "v2.0", "data": [{"title": "Super_Bowl_50",
                                         "paragraphs": [{"context": context, "qas": qas}]}]}


def test_squad_v1_v2_reader(tmp_path):
    qas = [
        {"id": "q1", "question": "Who won Super Bowl 50?",
         "answers": [{"text": "Denver Broncos", "answer_start": 29},
                     {"text": "the Denver Broncos", "answer_start": 25}]},
        {"id": "q2", "question": "Where was it?",  # offset off by two: fixed
         "answers": [{"text": "Santa Clara", "answer_start": 49}]},
        {"id": "q3", "question": "Who lost Super Bowl 51?", "answers": [],
         "plausible_answers": [{"text": "Denver Broncos", "answer_start": 29}],
         "is_impossible": True},
    ]
    path = tmp_path / "dev-v2.0.json"
    path.write_text(json.dumps(_squad(qas)))
    examples = read_squad(path)
    assert [e.id for e in examples] == ["q1", "q2", "q3"]
    assert examples[0].answers[0] == {"text": "Denver Broncos", "answer_start": 29}
    assert examples[1].answers[0]["answer_start"] == 47
    assert examples[2].answers == [] and examples[2].extra["is_impossible"]
    task = load_squad_task("squad2", {"dev": path})
    scores = task.evaluate("dev", ["Broncos", "Santa Clara", ""])
    assert scores["exact_match"] == pytest.approx(2 / 3)


def test_squad_answer_not_in_context_names_question(tmp_path):
    path = tmp_path / "train-v1.1.json"
    path.write_text(json.dumps(_squad([{"id": "5733be284776f41900661182", "question": "Who?",
                                        "answers": [{"text": "Carolina Panthers",
                                                     "answer_start": 0}]}])))
    with pytest.raises(LmlabError, match="5733be284776f41900661182.*does not occur"):
        read_squad(path)
