"""What lmlab saves loads again in a fresh Python process, whatever was imported before.

Every task head (sequence classification, regression, pair classification, token
classification, extractive QA, multiple choice) is saved the way ``lmlab finetune`` saves it
(``lmlab.save_pretrained``) and loaded in a subprocess with ``lmlab.from_pretrained`` and with
transformers' ``AutoModelFor...``: both give the pre-save logits. Fine-tuning runs (full and
feature-based, one seed and several) load, evaluate and serve from a fresh process too.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from conftest import assert_close_rounding, save_tiny_bert_folder

from lmlab.models.task_heads import add_task_head, task_logits

transformers = pytest.importorskip("transformers")

HIDDEN, LAYERS, FFN, VOCAB = 32, 2, 64, 99

# case -> (head, num_labels, problem_type, pair input, transformers Auto class)
CASES = {
    "classification": ("sequence-classification", 3, None, False,
                       "AutoModelForSequenceClassification"),
    "regression": ("sequence-classification", 1, "regression", False,
                   "AutoModelForSequenceClassification"),
    "pair-classification": ("sequence-classification", 2, None, True,
                            "AutoModelForSequenceClassification"),
    "token-classification": ("token-classification", 5, None, False,
                             "AutoModelForTokenClassification"),
    "question-answering": ("question-answering", 2, None, False,
                           "AutoModelForQuestionAnswering"),
    "multiple-choice": ("multiple-choice", None, None, False, "AutoModelForMultipleChoice"),
}


def _run(code: str, *args: str) -> subprocess.CompletedProcess:
    """``python -c code args...`` in a fresh interpreter; fails the test with its stderr."""
    result = subprocess.run([sys.executable, "-c", code, *args], capture_output=True,
                            text=True, timeout=300)
    assert result.returncode == 0, result.stdout + result.stderr
    return result


def _base_checkpoint(family: str, path: Path) -> Path:
    """A random bare encoder of ``family`` saved by transformers (the base a run starts from)."""
    torch.manual_seed(0)
    if family == "distilbert":
        config = transformers.DistilBertConfig(vocab_size=VOCAB, dim=HIDDEN, hidden_dim=FFN,
                                               n_layers=LAYERS, n_heads=4,
                                               max_position_embeddings=64)
    else:
        sizes = dict(vocab_size=VOCAB, hidden_size=HIDDEN, num_hidden_layers=LAYERS,
                     num_attention_heads=4, intermediate_size=FFN, max_position_embeddings=64)
        config = {"roberta": lambda: transformers.RobertaConfig(pad_token_id=1,
                                                                type_vocab_size=1, **sizes),
                  "roformer": lambda: transformers.RoFormerConfig(**sizes),
                  "bert": lambda: transformers.BertConfig(**sizes)}[family]()
    transformers.AutoModel.from_config(config).save_pretrained(path)
    return path


def _batch(family: str, multiple_choice: bool, pair: bool) -> dict[str, torch.Tensor]:
    """Padded inputs, (B, T) or (B, C, T) for multiple choice; a second segment for pairs."""
    generator = torch.Generator().manual_seed(1)
    shape = (2, 3, 9) if multiple_choice else (2, 9)
    ids = torch.randint(5, VOCAB, shape, generator=generator)
    mask = torch.ones(shape, dtype=torch.long)
    mask[..., 0, 6:] = 0  # the first sequence (of every example, for choices) is padded
    ids = ids.masked_fill(mask == 0, 1 if family == "roberta" else 0)
    batch = {"input_ids": ids, "attention_mask": mask}
    if family == "bert":
        segments = torch.zeros_like(ids)
        if pair:
            segments[..., 4:] = 1  # "[CLS] a a a [SEP] | b b b [SEP]"
        batch["token_type_ids"] = segments * mask
    return batch


LOAD_IN_FRESH_PROCESS = """
import json, sys
from pathlib import Path
import torch
from safetensors.torch import load_file, save_file
import lmlab

root = Path(sys.argv[1])
cases = json.loads((root / "cases.json").read_text())
out = {}
# lmlab first, before anything else is imported: the heads must resolve on their own
for name, (head, auto) in cases.items():
    batch = load_file(str(root / f"{name}.inputs.safetensors"))
    model = lmlab.from_pretrained(root / name)
    assert list(model.heads) == [head], (name, list(model.heads))
    assert model.fresh_heads == [], (name, model.fresh_heads)
    from lmlab.models.task_heads import task_logits
    with torch.no_grad():
        out[f"{name}.lmlab"] = task_logits(model, head, batch)
import transformers
for name, (head, auto) in cases.items():
    batch = load_file(str(root / f"{name}.inputs.safetensors"))
    theirs = getattr(transformers, auto).from_pretrained(root / name).eval()
    with torch.no_grad():
        result = theirs(**batch)
    out[f"{name}.transformers"] = (torch.stack([result.start_logits, result.end_logits], -1)
                                   if head == "question-answering" else result.logits)
save_file({k: v.contiguous() for k, v in out.items()}, str(root / "reloaded.safetensors"))
"""


# one family in the default suite: test_saved_task_models.py reloads every family x head in a
# fresh process there
@pytest.mark.parametrize("family", ["bert", *(pytest.param(f, marks=pytest.mark.slow)
                                             for f in ("roberta", "distilbert", "roformer"))])
def test_every_head_loads_in_a_fresh_process(tmp_path, family):
    """Regression test: a saved sequence-classification model failed to load in a new process
    ('unknown head sequence-classification') because the head registered itself only when
    lmlab.models.task_heads had been imported."""
    from safetensors.torch import load_file, save_file

    import lmlab

    base = _base_checkpoint(family, tmp_path / "base")
    expected, cases = {}, {}
    for name, (head, num_labels, problem_type, pair, auto) in CASES.items():
        model = lmlab.from_pretrained(base)  # as lmlab finetune starts: the base encoder
        add_task_head(model, head, num_labels,
                      {i: f"tag{i}" for i in range(num_labels)} if num_labels else None,
                      problem_type=problem_type)
        with torch.no_grad():  # trained-looking head weights: logits of size 1, not 0.01
            for parameter in model.heads[head].parameters():
                parameter.normal_(0.0, 0.3)
        model.eval()
        batch = _batch(family, head == "multiple-choice", pair)
        with torch.no_grad():
            expected[name] = task_logits(model, head, batch)
        lmlab.save_pretrained(model, tmp_path / name)  # what the runner's saver does
        save_file(batch, str(tmp_path / f"{name}.inputs.safetensors"))
        cases[name] = (head, auto)
    (tmp_path / "cases.json").write_text(json.dumps(cases))

    _run(LOAD_IN_FRESH_PROCESS, str(tmp_path))

    reloaded = load_file(str(tmp_path / "reloaded.safetensors"))
    for name, logits in expected.items():
        mask = _batch(family, name == "multiple-choice", False)["attention_mask"].bool()
        for source in ("lmlab", "transformers"):
            got = reloaded[f"{name}.{source}"]
            assert got.shape == logits.shape, (name, source)
            if CASES[name][0] in ("token-classification", "question-answering"):
                got, want = got[mask], logits[mask]  # padding positions are not predictions
            else:
                got, want = got, logits
            # fp32 sums of FFN-wide dot products through the layers and the head; the scale
            # is that of the hidden states (layer-normed, about 1) or of the logits
            assert_close_rounding(got, want, terms=FFN, depth=LAYERS + 1,
                                  scale=max(1.0, float(want.abs().max())),
                                  msg=f"{family} {name} via {source}")


def test_registries_resolve_without_prior_imports():
    """In a fresh process, every head name builds, every encoder family knows its task heads
    and every family's presets are listed, with nothing imported beforehand but the registry
    being asked: the registries are "module:attribute" tables, filled by no import."""
    code = """
import sys
from lmlab.models.families import KNOWN_FAMILIES
from lmlab.models.config import TransformerConfig
from lmlab.models.heads import HEADS, available_heads, build_head, needs_pooler
assert "lmlab.models.task_heads" not in sys.modules
assert all(isinstance(entry, str) for entry in (*HEADS.values(), *KNOWN_FAMILIES.values()))
from lmlab.models.presets import list_presets
assert {"bert", "gpt2", "llama"} <= {family for family, _ in list_presets()}
config = TransformerConfig(vocab_size=50, hidden_size=16, num_hidden_layers=1,
                           num_attention_heads=2, intermediate_size=32)
from lmlab.models.families import get_family
deberta = get_family("deberta-v2").config(vocab_size=50, hidden_size=16, num_hidden_layers=1,
                                          num_attention_heads=2, intermediate_size=32)
for name in available_heads():
    build_head(name, deberta if name == "emd" else config)  # the EMD is DeBERTa's own
assert needs_pooler("sequence-classification")
assert not needs_pooler("token-classification")
for family, prefix in (("bert", "Bert"), ("roberta", "Roberta"), ("albert", "Albert"),
                       ("electra", "Electra"), ("distilbert", "DistilBert")):
    spec = get_family(family)
    for suffix in ("SequenceClassification", "TokenClassification", "QuestionAnswering",
                   "MultipleChoice"):
        assert f"{prefix}For{suffix}" in spec.architectures, (family, suffix)
    assert "question-answering" in spec.head_rules
print("ok")
"""
    assert _run(code).stdout.strip() == "ok"


def test_family_lookup_leaves_the_family_module_unchanged():
    """get_family returns the family module's own FAMILY, which declares its task heads itself:
    nothing wraps or edits a family spec after its module is imported."""
    from lmlab.models.families import bert, get_family

    spec = get_family("bert")
    assert spec is bert.FAMILY
    assert "sequence-classification" in spec.head_rules
    assert "BertForTokenClassification" in spec.architectures
    assert not {"config_from_hf", "config_to_hf"} & set(vars(spec))  # not wrapped per spec
    assert not any(name.endswith("ForSequenceClassification")
                   for name in get_family("gpt2").architectures)


def test_unknown_head_names_the_available_ones():
    from lmlab.models.config import TransformerConfig
    from lmlab.models.heads import build_head
    from lmlab.utils.errors import LmlabError

    with pytest.raises(LmlabError, match="unknown head 'sequence-clasification'") as error:
        build_head("sequence-clasification", TransformerConfig(num_hidden_layers=1))
    assert "sequence-classification" in error.value.fix


# -- fine-tuning runs --------------------------------------------------------------------------
WORDS = {"animal": ["dog", "cat", "horse", "bird", "fish", "cow"],
         "tool": ["hammer", "saw", "drill", "wrench", "chisel", "file"]}


@pytest.fixture(scope="module")
def tiny_bert(tmp_path_factory):
    """A random BERT (the shape of this file) with MiniLM's real WordPiece tokenizer."""
    return save_tiny_bert_folder(tmp_path_factory.mktemp("tiny") / "bert", hidden=HIDDEN,
                                 layers=LAYERS, ffn=FFN)


def _toy_files(tmp_path: Path, n_train: int = 48, n_dev: int = 16) -> list[str]:
    """'the X is here' -> animal or tool, as train/dev JSON lines; the CLI's task arguments."""
    for split, count, offset in (("train", n_train, 0), ("dev", n_dev, 3)):
        rows = []
        for i in range(count):
            label = "animal" if i % 2 else "tool"
            word = WORDS[label][(i // 2 + offset) % len(WORDS[label])]
            rows.append(json.dumps({"text": f"the {word} is here", "label": label,
                                    "id": f"{split}-{i}"}))
        (tmp_path / f"{split}.jsonl").write_text("\n".join(rows) + "\n")
    return ["--task", "toy", "--train", str(tmp_path / "train.jsonl"),
            "--dev", str(tmp_path / "dev.jsonl")]


def _dev_texts(tmp_path: Path) -> list[str]:
    return [json.loads(line)["text"] for line in (tmp_path / "dev.jsonl").read_text().splitlines()]


def _predictions(path: Path) -> list:
    return [json.loads(line)["prediction"] for line in path.read_text().splitlines() if line]


SERVE_IN_FRESH_PROCESS = """
import json, sys
from pathlib import Path
import lmlab

run, texts = Path(sys.argv[1]), json.loads(sys.argv[2])
model = lmlab.from_pretrained(run)
print(json.dumps({"type": type(model).__name__, "heads": list(model.heads)}))
classify = lmlab.pipeline("text-classification", model=run)
print(json.dumps([r["label"] for r in classify(texts)]))
"""


def test_cli_finetune_run_loads_in_a_fresh_process(tiny_bert, tmp_path):
    """End to end: `lmlab finetune` (BERT recipe) writes a run; a new process loads it with
    lmlab.from_pretrained and the text-classification pipeline (same predictions as the run
    wrote before saving) and with transformers' AutoModelForSequenceClassification."""
    from lmlab.cli import main

    task_args = _toy_files(tmp_path)
    run = tmp_path / "run"
    assert main(["finetune", *task_args, "--model", str(tiny_bert), "--out", str(run),
                 "--epochs", "3", "--lr", "1e-3", "--batch-size", "8",
                 "--precision", "fp32"]) == 0  # served in fp32: the same predictions
    # after serving it with lmlab (first, in a fresh process), transformers reads the same run
    with_transformers = SERVE_IN_FRESH_PROCESS + """
import torch, transformers
from lmlab.models.task_heads import task_logits
tokenizer = lmlab.Tokenizer.from_pretrained(run / "model")
batch = tokenizer(texts, padding=True, return_tensors="pt")
batch = {k: batch[k] for k in ("input_ids", "attention_mask", "token_type_ids")}
theirs = transformers.AutoModelForSequenceClassification.from_pretrained(run / "model").eval()
with torch.no_grad():
    a, b = theirs(**batch).logits, task_logits(model, "sequence-classification", batch)
assert theirs.config.id2label == {0: "animal", 1: "tool"}, theirs.config.id2label
print(json.dumps({"transformers": a.tolist(), "lmlab": b.tolist()}))
"""
    texts = _dev_texts(tmp_path)
    lines = _run(with_transformers, str(run), json.dumps(texts)).stdout.splitlines()
    assert json.loads(lines[0]) == {"type": "LanguageModel",
                                    "heads": ["sequence-classification"]}
    assert json.loads(lines[1]) == _predictions(run / "predictions-dev.jsonl")
    logits = json.loads(lines[2])
    assert_close_rounding(torch.tensor(logits["lmlab"]), torch.tensor(logits["transformers"]),
                          terms=FFN, depth=LAYERS + 1, scale=1.0)


def test_feature_run_evaluates_and_serves_in_a_fresh_process(tiny_bert, tmp_path):
    """A feature-based (frozen encoder) run loads with lmlab.from_pretrained, serves through
    the text-classification pipeline and is scored by `lmlab evaluate`, in new processes, with
    the predictions and dev accuracy the run itself wrote."""
    from lmlab.cli import main

    task_args = _toy_files(tmp_path)
    run = tmp_path / "feature"
    assert main(["finetune", *task_args, "--model", str(tiny_bert), "--out", str(run),
                 "--recipe", "feature", "--epochs", "20", "--lr", "5e-2",
                 "--precision", "fp32"]) == 0  # served in fp32: the same predictions
    assert (run / "model" / "config.json").exists()  # the encoder travels with the head
    texts = _dev_texts(tmp_path)
    lines = _run(SERVE_IN_FRESH_PROCESS, str(run), json.dumps(texts)).stdout.splitlines()
    assert json.loads(lines[0]) == {"type": "FeatureClassifier",
                                    "heads": ["sequence-classification"]}
    assert json.loads(lines[1]) == _predictions(run / "predictions-dev.jsonl")

    result = subprocess.run([sys.executable, "-m", "lmlab.cli", "evaluate", *task_args,
                             "--model", str(run)], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    scored = json.loads((run / "eval-metrics.json").read_text())
    trained = json.loads((run / "metrics.json").read_text())
    assert scored["dev"]["accuracy"] == trained["dev"]["accuracy"]
    assert _predictions(run / "eval-predictions-dev.jsonl") == _predictions(
        run / "predictions-dev.jsonl")


def test_feature_run_rejects_other_heads(tiny_bert, tmp_path):
    import lmlab
    from lmlab.finetune.runner import finetune
    from lmlab.tasks import load_table_task
    from lmlab.utils.errors import LmlabError

    _toy_files(tmp_path, 16, 8)
    task = load_table_task("toy", {"train": tmp_path / "train.jsonl",
                                   "dev": tmp_path / "dev.jsonl"}, "text", "label")
    finetune(task, tiny_bert, tmp_path / "f", recipe="feature", epochs=1, show_progress=False)
    with pytest.raises(LmlabError, match="feature-based run: its only head is"):
        lmlab.pipeline("token-classification", model=tmp_path / "f")


def test_evaluate_reports_every_seed(tiny_bert, tmp_path, capsys):
    """`lmlab evaluate` on a several-seed run scores every seed-N/ and reports the median and
    spread (it used to score seed-0 silently)."""
    from lmlab.cli import main
    from lmlab.finetune.results import summarize_seeds

    task_args = _toy_files(tmp_path, 24, 12)
    run = tmp_path / "seeds"
    assert main(["finetune", *task_args, "--model", str(tiny_bert), "--out", str(run),
                 "--seeds", "0,1,2", "--epochs", "1", "--lr", "1e-3", "--batch-size", "8",
                 "--precision", "fp32"]) == 0  # served in fp32: the same predictions
    capsys.readouterr()
    assert main(["evaluate", *task_args, "--model", str(run)]) == 0
    printed = json.loads(capsys.readouterr().out)
    assert printed["seeds"] == [0, 1, 2]
    for seed in (0, 1, 2):
        trained = json.loads((run / f"seed-{seed}" / "metrics.json").read_text())
        assert printed["per_seed"][str(seed)]["dev"] == pytest.approx(trained["dev"])
        assert (run / f"seed-{seed}" / "eval-predictions-dev.jsonl").exists()
    summary = json.loads((run / "summary.json").read_text())
    for metric, stats in printed["dev"].items():
        assert set(stats) >= {"median", "spread", "n"} and stats["n"] == 3
        assert stats["median"] == pytest.approx(summary["dev"][metric]["median"])
        assert stats["spread"] == pytest.approx(summary["dev"][metric]["spread"])
    assert printed["dev"] == summarize_seeds(list(printed["per_seed"].values()), "dev")
    assert json.loads((run / "eval-metrics.json").read_text())["seeds"] == [0, 1, 2]
    # loading "the" model of a several-seed run names the choice instead of taking seed 0
    import lmlab
    from lmlab.utils.errors import LmlabError

    with pytest.raises(LmlabError, match="several seeds") as error:
        lmlab.pipeline("text-classification", model=run)
    assert "seed-0" in error.value.fix
