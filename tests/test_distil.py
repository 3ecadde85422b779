"""Distillation (lmlab/compress/distil.py, lmlab/objectives/distillation.py): the student made
of the teacher's layers, DistilBERT's loss terms against hand computations and torch's own
losses, a short run on the Trainer that lowers the loss and resumes exactly, the student
loading in a fresh process with lmlab and transformers, task-specific distillation through
``lmlab.finetune``, and the refusals."""

from __future__ import annotations

import dataclasses
import json
import math
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from conftest import (
    TOKENIZER_FILES,
    assert_clean_refusal,
    assert_close_rounding,
    disk_snapshot,
    kjv_shards,
    run_lmlab_here,
)

import lmlab
from lmlab.compress.distil import (
    DistilSettings,
    TaskDistillation,
    TaskDistillationObjective,
    choose_layers,
    distil,
    make_student,
    spread_layers,
)
from lmlab.models.config import TransformerConfig
from lmlab.models.model import LanguageModel
from lmlab.objectives.distillation import Distillation, hidden_cosine_loss, soft_target_loss
from lmlab.objectives.special_tokens import SpecialTokens
from lmlab.training.config import TrainingConfig
from lmlab.training.metrics_log import read_metrics
from lmlab.training.pretrain import DataSettings, PretrainConfig
from lmlab.utils.errors import LmlabError


def tiny_teacher(layers: int = 4, heads: tuple[str, ...] = ("mlm",), seed: int = 0,
                 init: float = 0.02):
    """A random BERT on MiniLM's vocabulary (hidden 32, ``layers`` layers) with a pooler;
    ``init`` is the weights' standard deviation (0.2: layers that change the hidden states
    enough that a student without some of them starts far from the teacher)."""
    torch.manual_seed(seed)
    config = TransformerConfig(vocab_size=30522, hidden_size=32, num_hidden_layers=layers,
                               num_attention_heads=4, intermediate_size=64,
                               max_position_embeddings=128, initializer_range=init)
    return LanguageModel(config, heads=heads, with_pooler=True)


def save_with_tokenizer(model, folder: Path) -> Path:
    import shutil

    from lmlab.utils.catalog import minilm_dir

    lmlab.save_pretrained(model, folder)
    for name in TOKENIZER_FILES:
        if (minilm_dir() / name).exists():
            shutil.copy(minilm_dir() / name, folder / name)
    return folder


@pytest.fixture(scope="module")
def shards(tmp_path_factory) -> Path:
    return kjv_shards(tmp_path_factory, train=24, validation=6)


@pytest.fixture(scope="module")
def teacher_folder(tmp_path_factory) -> Path:
    return save_with_tokenizer(tiny_teacher(init=0.2), tmp_path_factory.mktemp("teacher") / "bert")


def special() -> SpecialTokens:
    from lmlab.tokenization.tokenizer import Tokenizer
    from lmlab.utils.catalog import minilm_dir

    return SpecialTokens.from_tokenizer(Tokenizer.from_pretrained(minilm_dir()))


# -- the student ----------------------------------------------------------------------------------
def test_spread_layers_are_distilberts():
    assert spread_layers(12, 6) == (0, 2, 4, 7, 9, 11)  # extract_distilbert.py's choice
    assert spread_layers(6, 3) == (0, 3, 5)
    assert spread_layers(6, 6) == tuple(range(6))
    assert choose_layers(6) == (0, 3, 5)  # default: half the teacher's depth
    assert choose_layers(6, layers=[1, 4]) == (1, 4)


def test_student_copies_exactly_the_chosen_teacher_layers():
    teacher = tiny_teacher(layers=4)
    layers = (0, 2, 3)
    student = make_student(teacher, layers)
    assert student.config.num_hidden_layers == 3
    t_state, s_state = teacher.state_dict(), student.state_dict()
    for j, i in enumerate(layers):
        mine = {k.split(".", 3)[3]: v for k, v in s_state.items()
                if k.startswith(f"transformer.layers.{j}.")}
        theirs = {k.split(".", 3)[3]: v for k, v in t_state.items()
                  if k.startswith(f"transformer.layers.{i}.")}
        assert mine.keys() == theirs.keys() and mine
        for name in mine:
            assert torch.equal(mine[name], theirs[name]), (j, i, name)  # exact: copies
        for other in set(range(4)) - {i}:  # a copy of layer i, not of another layer
            assert not torch.equal(mine["attention.q_proj.weight"],
                                   t_state[f"transformer.layers.{other}.attention.q_proj.weight"])
    rest = [k for k in s_state if not k.startswith("transformer.layers.")]
    assert any(k.startswith("heads.mlm.") for k in rest) and any("pooler" in k for k in rest)
    for key in rest:
        assert torch.equal(s_state[key], t_state[key]), key  # exact: copies
    # the student owns its tensors: training it leaves the teacher as it was
    with torch.no_grad():
        student.transformer.embeddings.word_embeddings.weight.add_(1.0)
        student.transformer.layers[0].attention.q_proj.weight.add_(1.0)
    assert torch.equal(teacher.state_dict()["transformer.layers.0.attention.q_proj.weight"],
                       t_state["transformer.layers.0.attention.q_proj.weight"])  # exact: untouched
    # the MLM decoder stays tied to the student's own embeddings
    assert (student.heads["mlm"].decoder.weight.data_ptr()
            == student.transformer.embeddings.word_embeddings.weight.data_ptr())


def test_a_student_of_every_layer_computes_what_the_teacher_does():
    teacher = tiny_teacher(layers=3).eval()
    student = make_student(teacher, (0, 1, 2)).eval()
    ids = torch.tensor([[101, 7592, 2088, 2003, 102, 0]])
    mask = torch.tensor([[1, 1, 1, 1, 1, 0]])
    with torch.no_grad():
        a, b = teacher(input_ids=ids, attention_mask=mask), student(input_ids=ids,
                                                                    attention_mask=mask)
    assert torch.equal(a.last_hidden_state, b.last_hidden_state)  # exact: the same weights and ops
    assert torch.equal(a.logits, b.logits)  # exact: the same weights and ops


def test_a_student_of_a_pruned_and_factorised_teacher_keeps_its_layers_shapes():
    """The per-layer records of config.extra (head counts, pruned heads, low-rank modules)
    follow the copied layers: student layer j has teacher layer layers[j]'s shapes."""
    from lmlab.compress.heads import prune_heads
    from lmlab.compress.lowrank import low_rank

    teacher = tiny_teacher(layers=4).eval()
    prune_heads(teacher, {0: [1], 3: [0, 2]})
    low_rank(teacher, rank=4, modules=["transformer.layers.3.feed_forward.up_proj",
                                       "transformer.layers.1.feed_forward.up_proj"])
    student = make_student(teacher, (0, 3)).eval()
    assert student.config.extra["attention_heads_per_layer"] == [3, 2]
    assert student.config.extra["pruned_heads"] == {"0": [1], "1": [0, 2]}
    assert student.config.extra["low_rank"] == {"transformer.layers.1.feed_forward.up_proj": 4}
    full = make_student(teacher, (0, 1, 2, 3)).eval()  # every layer: the teacher's outputs
    ids = torch.tensor([[101, 7592, 2088, 2003, 102]])
    with torch.no_grad():
        assert torch.equal(full(input_ids=ids).last_hidden_state,
                           teacher(input_ids=ids).last_hidden_state)  # exact: the same weights and ops


def test_a_student_deeper_than_its_teacher_is_refused():
    with pytest.raises(LmlabError, match=r"student \(7 layers\) is deeper than its teacher "
                                         r"\(6 layers\)") as error:
        choose_layers(6, 7)
    assert "between 1 and 6" in error.value.fix
    with pytest.raises(LmlabError, match="lacks"):
        choose_layers(6, layers=[0, 6])
    with pytest.raises(LmlabError, match="increasing"):
        choose_layers(6, layers=[3, 1])
    with pytest.raises(LmlabError, match="at least 1"):
        choose_layers(6, 0)


# -- the loss terms -----------------------------------------------------------------------------------
@pytest.mark.numerics
def test_soft_target_loss_against_a_hand_computation_and_kldivloss():
    student = torch.tensor([[1.0, 2.0, 0.5], [0.0, -1.0, 3.0]])
    teacher = torch.tensor([[2.0, 0.0, 1.0], [1.0, 1.0, 1.0]])
    temperature = 2.0

    def softmax(row):
        exps = [math.exp(v / temperature) for v in row]
        return [e / sum(exps) for e in exps]

    by_hand = 0.0
    for s_row, t_row in zip(student.tolist(), teacher.tolist()):
        p, q = softmax(t_row), softmax(s_row)
        cross_entropy = -sum(pi * math.log(qi) for pi, qi in zip(p, q))  # soft-target CE
        entropy = -sum(pi * math.log(pi) for pi in p)
        by_hand += cross_entropy - entropy  # KL = CE - teacher's entropy
    by_hand = by_hand / 2 * temperature ** 2
    ours = soft_target_loss(student, teacher, temperature)
    # float32 against float64: a softmax of 3, a sum over 3 classes, the mean of 2 rows;
    # T^2 * logits / T of size 6
    bound = {"terms": 3, "depth": 3, "scale": temperature * float(student.abs().max())}
    assert_close_rounding(ours, by_hand, **bound)
    reference = torch.nn.KLDivLoss(reduction="batchmean")(
        torch.log_softmax(student / temperature, -1),
        torch.softmax(teacher / temperature, -1)) * temperature ** 2  # distiller.py's loss_ce
    assert_close_rounding(ours, reference, **bound)
    assert_close_rounding(soft_target_loss(teacher, teacher, temperature), 0.0, **bound)
    # its gradient is the soft cross-entropy's: T^2 * (q - p) / T per row, averaged
    student.requires_grad_(True)
    soft_target_loss(student, teacher, temperature).backward()
    expected = (torch.softmax(student / temperature, -1) - torch.softmax(teacher / temperature,
                                                                         -1)) * temperature / 2
    assert_close_rounding(student.grad, expected.detach(), terms=3, depth=2,
                          scale=temperature / 2)  # (q - p) * T / 2, |q - p| <= 1


@pytest.mark.numerics
def test_cosine_loss_equals_torchs_cosine_embedding_loss_on_real_tokens():
    torch.manual_seed(1)
    student, teacher = torch.randn(2, 5, 8), torch.randn(2, 5, 8)
    mask = torch.tensor([[1, 1, 1, 0, 0], [1, 1, 1, 1, 1]])
    keep = mask.bool()
    reference = torch.nn.CosineEmbeddingLoss()(student[keep], teacher[keep],
                                               torch.ones(int(keep.sum())))
    # cosines of 8 numbers (size <= 1), the mean over 8 real tokens
    assert_close_rounding(hidden_cosine_loss(student, teacher, mask), reference, terms=8,
                          depth=2, scale=1.0)
    assert_close_rounding(hidden_cosine_loss(teacher, 3 * teacher, mask), 0.0, terms=8, depth=2,
                          scale=1.0)


def test_the_objective_weighs_the_three_terms_as_distilbert():
    teacher = tiny_teacher(layers=4).eval()
    student = make_student(teacher, (0, 3))
    with torch.no_grad():  # soft targets far from the student's (random-init logits are ~0)
        student.heads["mlm"].decoder.bias.normal_(0.0, 2.0)
    objective = Distillation(special(), teacher=teacher, temperature=2.0)
    objective.prepare(student)
    assert not list(objective.parameters()) and not objective.state_dict()  # teacher kept out
    ids = torch.tensor([[101, 7592, 2088, 2003, 1037, 3231, 102, 0],
                        [101, 2054, 2003, 2023, 102, 0, 0, 0]])
    batch = objective.corrupt({"input_ids": ids, "attention_mask": (ids != 0).long()},
                              torch.Generator().manual_seed(3))
    masked = batch["labels"] != -100
    assert masked.any()
    student.eval()  # no dropout: the pieces below see the same numbers
    result = objective.compute_loss(student, batch)
    with torch.no_grad():
        real = batch["attention_mask"].bool()
        s = student(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"],
                    token_type_ids=None)
        t = teacher(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"])
        s_logits, t_logits = s.head_logits["mlm"], t.head_logits["mlm"]  # (B, T, V)
        ce = torch.nn.KLDivLoss(reduction="batchmean")(
            torch.log_softmax(s_logits[real] / 2, -1), torch.softmax(t_logits[real] / 2, -1)) * 4
        mlm = torch.nn.functional.cross_entropy(s_logits[masked], batch["labels"][masked])
        cos = torch.nn.CosineEmbeddingLoss()(s.last_hidden_state[real],
                                             t.last_hidden_state[real],
                                             torch.ones(int(real.sum())))
    # each term up to the rounding of its reductions: log-softmax over the 30,522 pieces (terms
    # <= 1 after the max; T^2 = 4 scales the soft one), the mean over positions; cosines of 32
    # numbers <= 1; the total weighs them 5, 2 and 1
    terms = {"terms": 30522, "depth": 2}
    assert_close_rounding(result.metrics["ce_loss"], float(ce), **terms, scale=4.0)
    assert_close_rounding(result.metrics["mlm_loss"], float(mlm), **terms, scale=1.0)
    assert_close_rounding(result.metrics["cos_loss"], float(cos), terms=32, depth=2, scale=1.0)
    assert_close_rounding(result.loss.detach(), float(5 * ce + 2 * mlm + cos), **terms,
                          scale=5 * 4.0 + 2 + 1)
    assert result.num_predictions == int(real.sum())
    # restrict_ce_to_mask: the soft targets at the masked positions only, the rest unchanged
    restricted = Distillation(special(), teacher=teacher, temperature=2.0,
                              restrict_ce_to_mask=True)
    restricted.prepare(student)
    result = restricted.compute_loss(student, batch)
    with torch.no_grad():
        ce_masked = torch.nn.KLDivLoss(reduction="batchmean")(
            torch.log_softmax(s_logits[masked] / 2, -1),
            torch.softmax(t_logits[masked] / 2, -1)) * 4
    assert abs(float(ce_masked) - float(ce)) > 1e-3  # the two position sets differ here
    assert_close_rounding(result.metrics["ce_loss"], float(ce_masked), **terms, scale=4.0)
    # ... by more than the bound: the nearer of the two is the masked positions' one
    assert abs(result.metrics["ce_loss"] - float(ce_masked)) < \
        abs(result.metrics["ce_loss"] - float(ce)) / 10
    assert_close_rounding(result.metrics["mlm_loss"], float(mlm), **terms, scale=1.0)
    assert_close_rounding(result.loss.detach(), float(5 * ce_masked + 2 * mlm + cos), **terms,
                          scale=5 * 4.0 + 2 + 1)


def test_a_teacher_without_an_mlm_head_is_refused_while_soft_targets_are_on():
    teacher = tiny_teacher(layers=2, heads=())
    with pytest.raises(LmlabError, match="no masked-LM head") as error:
        Distillation(special(), teacher=teacher).prepare(make_student(teacher, (1,)))
    assert "--alpha-ce 0" in error.value.fix
    Distillation(special(), teacher=teacher, alpha_ce=0).prepare(make_student(teacher, (1,)))
    with pytest.raises(LmlabError, match="all 0"):
        Distillation(special(), teacher=teacher, alpha_ce=0, alpha_mlm=0, alpha_cos=0)


# -- runs on the Trainer ----------------------------------------------------------------------------
def run_config(out: Path, shards: Path, steps: int, **training) -> PretrainConfig:
    values = {"seq_len": 32, "batch_size": 4, "lr": 2e-3, "max_steps": steps, "log_every": 1,
              "eval_every": 1000, "save_every": 1000, "seed": 0, "precision": "fp32",
              "warmup_steps": 0, **training}
    return PretrainConfig(out=out, training=TrainingConfig(**values),
                          data=DataSettings(shards, None, 2), track_cost=False)


def train_losses(run: Path) -> list[float]:
    return [r["loss"] for r in read_metrics(run / "metrics.jsonl") if r["kind"] == "train"]


def test_a_short_run_lowers_the_distillation_loss_and_saves_a_bert(shards, teacher_folder,
                                                                   tmp_path):
    settings = DistilSettings(str(teacher_folder), student_layers=2)
    result = distil(settings, run_config(tmp_path / "run", shards, 8))
    assert result.step == 8
    records = [r for r in read_metrics(tmp_path / "run" / "metrics.jsonl") if r["kind"] == "train"]
    assert {"ce_loss", "mlm_loss", "cos_loss"} <= set(records[-1])
    # the student (teacher layers 0 and 3) starts away from the teacher and moves towards it
    first, last = records[0], records[-3:]
    assert max(r["ce_loss"] for r in last) < 0.5 * first["ce_loss"], records
    assert max(r["cos_loss"] for r in last) < 0.7 * first["cos_loss"], records
    assert max(r["loss"] for r in last) < first["loss"], records
    config = json.loads((tmp_path / "run" / "config.json").read_text())
    assert config["hparams"]["student_layers"] == [0, 3]
    assert config["hparams"]["objective"] == "distil"
    assert config["hparams"]["objective_args"]["teacher"] == str(teacher_folder)
    assert config["model"]["num_hidden_layers"] == 2
    assert (tmp_path / "run" / "model" / "tokenizer.json").is_file()


def test_an_interrupted_run_resumes_exactly(shards, teacher_folder, tmp_path):
    settings = DistilSettings(str(teacher_folder), student_layers=2, alpha_ce=1.0)
    # a constant schedule: stopping at step 2 changes no learning rate of the first session
    same = {"save_every": 2, "schedule": "constant"}
    distil(settings, run_config(tmp_path / "whole", shards, 4, **same))
    distil(settings, run_config(tmp_path / "split", shards, 2, **same))
    distil(settings, run_config(tmp_path / "split", shards, 4, **same))  # resumes
    assert train_losses(tmp_path / "split") == train_losses(tmp_path / "whole")
    from safetensors.torch import load_file

    whole = load_file(tmp_path / "whole" / "model" / "model.safetensors")
    split = load_file(tmp_path / "split" / "model" / "model.safetensors")
    assert whole.keys() == split.keys()
    assert all(torch.equal(whole[k], split[k]) for k in whole)  # exact: a resumed run repeats the run's ops
    changed = DistilSettings(str(teacher_folder), student_layers=2, alpha_ce=2.0)
    with pytest.raises(LmlabError, match="alpha_ce"):  # other settings on the same run: refused
        distil(changed, run_config(tmp_path / "split", shards, 6, **same))


def test_the_student_loads_in_a_new_process_with_lmlab_and_transformers(shards, teacher_folder,
                                                                        tmp_path):
    distil(DistilSettings(str(teacher_folder), student_layers=2),
           run_config(tmp_path / "run", shards, 1))
    model = tmp_path / "run" / "model"
    script = f"""
import json, torch, lmlab, transformers
ids = torch.tensor([[101, 7592, 2088, 2003, 1037, 3231, 102]])
ours = lmlab.from_pretrained({str(model)!r}).eval()
theirs = transformers.AutoModelForMaskedLM.from_pretrained({str(model)!r}).eval()
with torch.no_grad():
    a = ours(input_ids=ids)
    b = theirs(input_ids=ids, output_hidden_states=True)
print(json.dumps({{"layers": theirs.config.num_hidden_layers, "arch": type(theirs).__name__,
                  "hidden": (a.last_hidden_state - b.hidden_states[-1]).abs().max().item(),
                  "logits": (a.logits - b.logits).abs().max().item(),
                  "scale": b.logits.abs().max().item()}}))
"""
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          timeout=240, env={**__import__("os").environ, "HF_HUB_OFFLINE": "1"})
    assert done.returncode == 0, done.stderr[-3000:]
    found = json.loads(done.stdout.strip().splitlines()[-1])
    assert found["layers"] == 2 and found["arch"] == "BertForMaskedLM"
    # fp32, 2 layers of width 32 and a 30k vocabulary: a few ulps of the logits' size
    assert found["hidden"] < 1e-4 and found["logits"] < 1e-5 * max(found["scale"], 1.0) * 100


def test_a_teacher_without_mlm_head_is_refused_before_overwrite_removes_a_run(shards,
                                                                             tmp_path):
    """--overwrite removes the run in --out; a teacher the loss cannot use (no MLM head while
    alpha_ce > 0) is refused before that, so the run there survives the refusal."""
    import dataclasses

    teacher = save_with_tokenizer(tiny_teacher(heads=()), tmp_path / "teacher")
    run = tmp_path / "run"
    run.mkdir()
    (run / "config.json").write_text("{}")
    (run / "metrics.jsonl").write_text("")
    before = disk_snapshot(tmp_path)
    config = dataclasses.replace(run_config(run, shards, 2), overwrite=True)
    with pytest.raises(LmlabError, match="no masked-LM head"):
        distil(DistilSettings(str(teacher), student_layers=2), config)
    assert disk_snapshot(tmp_path) == before


def test_the_command_refuses_a_student_deeper_than_its_teacher_before_any_work(
        shards, teacher_folder, tmp_path):
    before = disk_snapshot(tmp_path)
    result = run_lmlab_here("distil", "--teacher", teacher_folder, "--student-layers", 9,
                       "--shards", shards, "--steps", 2, "--out", tmp_path / "run")
    assert_clean_refusal(result, "student (9 layers) is deeper than its teacher (4 layers)",
                         fix="--student-layers between 1 and 4")
    assert disk_snapshot(tmp_path) == before


# -- task-specific distillation -------------------------------------------------------------------
@pytest.fixture(scope="module")
def small_task():
    from dataclasses import replace

    from lmlab.tasks import load_builtin_task

    task = load_builtin_task("fortunes-topic")
    return replace(task, splits={"train": task.split("train")[:24],
                                 "dev": task.split("dev")[:12]})


def task_teacher(task, folder: Path) -> Path:
    """A random tiny BERT with the task's classification head and labels (a stand-in for a
    fine-tuned teacher: the mechanics do not need a good one)."""
    from lmlab.models.task_heads import HEAD_FOR_TASK, add_task_head

    model = tiny_teacher(layers=2, heads=(), seed=5)
    add_task_head(model, HEAD_FOR_TASK[task.type], len(task.labels), dict(enumerate(task.labels)))
    return save_with_tokenizer(model, folder)


@pytest.mark.numerics
def test_teacher_logits_travel_in_the_batches_and_the_loss_mixes_them(small_task, tmp_path):
    from lmlab.finetune import data as fdata
    from lmlab.finetune.objective import TaskObjective
    from lmlab.finetune.runner import load_model
    from lmlab.models.task_heads import task_logits

    teacher_dir = task_teacher(small_task, tmp_path / "teacher")
    distillation = TaskDistillation(str(teacher_dir), alpha=0.3, temperature=3.0)
    distillation.check(small_task, teacher_dir)
    teacher, tokenizer, _ = load_model(teacher_dir)
    features = fdata.encode_examples(small_task, small_task.split("train"), tokenizer, 64)
    stream = fdata.TaskStream(features, 8, 0, seed=0)
    base = TaskObjective(small_task.type, len(small_task.labels),
                         dict(enumerate(small_task.labels)))
    wrapped_stream, objective = distillation.attach(small_task, features, stream, base, 0,
                                                    torch.device("cpu"))
    batch = next(iter(wrapped_stream))
    first = wrapped_stream.epoch_batches(0)[0]
    teacher.eval()
    with torch.no_grad():  # each example alone: the teacher's logits do not depend on padding
        alone = torch.cat([task_logits(teacher, "sequence-classification",
                                       fdata.collate([features[i]], 0)) for i in first])
    # another batch, other padding: two layers (widths 32 and 64), the pooler and the head
    assert_close_rounding(batch["teacher_logits"], alone, terms=64, depth=3)
    assert isinstance(objective, TaskDistillationObjective)
    student = make_student(tiny_teacher(layers=2, heads=(), seed=9), (1,))
    objective.prepare(student)
    student.eval()
    result = objective.compute_loss(student, batch)
    with torch.no_grad():
        logits = task_logits(student, "sequence-classification", batch)
        soft = torch.nn.KLDivLoss(reduction="batchmean")(
            torch.log_softmax(logits / 3, -1), torch.softmax(alone / 3, -1)) * 9
        hard = torch.nn.functional.cross_entropy(logits, batch["labels"])
    # and the loss through them: T^2 * (logits / T) of the soft term, T = 3
    assert_close_rounding(result.loss.detach(), float(0.3 * soft + 0.7 * hard), terms=64,
                          depth=4, scale=3 * float(torch.cat([logits, alone]).abs().max()))


@pytest.mark.numerics
def test_tagging_teacher_logits_follow_their_tokens_and_the_soft_loss_reads_tagged_ones(
        tmp_path):
    """Tagging: each sequence's (T_i, C) teacher logits sit on its own tokens in the padded
    batch (zeros on padding), and the soft term is the KL over the tagged positions only."""
    from lmlab.finetune import data as fdata
    from lmlab.finetune.objective import TaskObjective
    from lmlab.finetune.runner import load_model
    from lmlab.models.task_heads import add_task_head, task_logits
    from lmlab.tasks.types import Example, Task

    labels = ["O", "B-PER", "I-PER"]
    words = [["Moses", "spake", "unto", "the", "children", "of", "Israel"], ["Amen"],
             ["And", "Aaron", "said"], ["In", "the", "beginning", "was", "the", "Word"]]
    task = Task("ner", "tagging", labels, ["entity_f1"], {"train": [
        Example(str(i), tokens=w, tags=["B-PER" if w_[0].isupper() else "O" for w_ in w])
        for i, w in enumerate(words)], "dev": []})
    teacher = tiny_teacher(layers=2, heads=(), seed=5)
    add_task_head(teacher, "token-classification", len(labels), dict(enumerate(labels)))
    teacher_dir = save_with_tokenizer(teacher, tmp_path / "teacher")
    distillation = TaskDistillation(str(teacher_dir), alpha=0.6, temperature=2.0)
    distillation.check(task, teacher_dir)
    teacher, tokenizer, _ = load_model(teacher_dir)
    features = fdata.encode_examples(task, task.split("train"), tokenizer, 64)
    base = TaskObjective(task.type, len(labels), dict(enumerate(labels)))
    stream, objective = distillation.attach(task, features, fdata.TaskStream(features, 4, 0),
                                            base, 0, torch.device("cpu"))
    batch = next(iter(stream))
    order = stream.epoch_batches(0)[0]
    teacher.eval()
    assert batch["teacher_logits"].shape == (4, batch["input_ids"].shape[1], len(labels))
    for row, index in enumerate(order):
        length = len(features[index].input_ids)
        with torch.no_grad():
            alone = task_logits(teacher, "token-classification",
                                fdata.collate([features[index]], 0))[0]  # (T_i, C)
        assert_close_rounding(batch["teacher_logits"][row, :length], alone, terms=64,
                              depth=3)  # another batch: two layers and the head
        assert not batch["teacher_logits"][row, length:].any()
    student = make_student(tiny_teacher(layers=2, heads=(), seed=9), (1,))
    objective.prepare(student)
    student.eval()
    result = objective.compute_loss(student, batch)
    keep = batch["labels"] != -100
    with torch.no_grad():
        logits = task_logits(student, "token-classification", batch)
        soft = torch.nn.KLDivLoss(reduction="batchmean")(
            torch.log_softmax(logits[keep] / 2, -1),
            torch.softmax(batch["teacher_logits"][keep] / 2, -1)) * 4
        hard = torch.nn.functional.cross_entropy(logits[keep], batch["labels"][keep])
    assert result.num_predictions == int(keep.sum()) == sum(len(w) for w in words)
    scale = 2 * float(torch.cat([logits, batch["teacher_logits"]], 1).abs().max())  # T = 2
    assert_close_rounding(result.loss.detach(), float(0.6 * soft + 0.4 * hard), terms=64,
                          depth=4, scale=scale)


@pytest.mark.filterwarnings("ignore:.*collapsed onto one class")
def test_finetune_with_a_teacher_runs_on_the_trainer_and_records_it(small_task, tmp_path):
    from lmlab.finetune.runner import finetune

    teacher_dir = task_teacher(small_task, tmp_path / "teacher")
    student_dir = save_with_tokenizer(make_student(tiny_teacher(layers=2, heads=()), (1,)),
                                      tmp_path / "student")
    common = {"epochs": 1, "batch_size": 8, "max_length": 64, "show_progress": False,
              "precision": "fp32", "device": "cpu", "eval_splits": ("dev",)}
    result = finetune(small_task, student_dir, tmp_path / "run", seed=0,
                      distil=TaskDistillation(str(teacher_dir), alpha=0.5), **common)
    assert result["distil"] == {"teacher": str(teacher_dir), "alpha": 0.5, "temperature": 2.0}
    config = json.loads((tmp_path / "run" / "config.json").read_text())
    assert config["hparams"]["distil"]["teacher"] == str(teacher_dir)
    records = [r for r in read_metrics(tmp_path / "run" / "metrics.jsonl") if r["kind"] == "train"]
    assert records and {"soft_loss", "label_loss"} <= set(records[0])
    assert (tmp_path / "run" / "model" / "config.json").is_file() and "dev" in result


@pytest.mark.filterwarnings("ignore:.*collapsed onto one class")
@pytest.mark.slow
def test_a_teacher_weighted_zero_is_plain_finetuning(small_task, tmp_path):
    from lmlab.finetune.runner import finetune

    teacher_dir = task_teacher(small_task, tmp_path / "teacher")
    student_dir = save_with_tokenizer(make_student(tiny_teacher(layers=2, heads=()), (1,)),
                                      tmp_path / "student")
    common = {"epochs": 2, "batch_size": 8, "max_length": 64, "show_progress": False,
              "precision": "fp32", "device": "cpu", "eval_splits": ("dev",)}
    zero = finetune(small_task, student_dir, tmp_path / "zero", seed=0,
                    distil=TaskDistillation(str(teacher_dir), alpha=0.0), **common)
    plain = finetune(small_task, student_dir, tmp_path / "plain", seed=0, **common)
    # 0 * soft + 1 * hard is hard, and its gradient the same: the same run, step for step
    assert [r["loss"] for r in read_metrics(tmp_path / "zero" / "metrics.jsonl")
            if r["kind"] == "train"] == \
        [r["loss"] for r in read_metrics(tmp_path / "plain" / "metrics.jsonl")
         if r["kind"] == "train"]
    assert zero["dev"] == plain["dev"]


def test_a_teacher_for_another_task_is_refused_before_any_work(small_task, tmp_path):
    from lmlab.finetune.runner import finetune

    wrong = tiny_teacher(layers=2, heads=(), seed=5)
    from lmlab.models.task_heads import add_task_head

    add_task_head(wrong, "sequence-classification", 3, {0: "a", 1: "b", 2: "c"})
    teacher_dir = save_with_tokenizer(wrong, tmp_path / "teacher")
    before = disk_snapshot(tmp_path)
    with pytest.raises(LmlabError, match="predicts 3 labels"):
        finetune(small_task, teacher_dir, tmp_path / "run", epochs=1, show_progress=False,
                 distil=TaskDistillation(str(teacher_dir)))
    with pytest.raises(LmlabError, match="not in \\[0, 1\\]"):
        finetune(small_task, teacher_dir, tmp_path / "run", epochs=1, show_progress=False,
                 distil=TaskDistillation(str(teacher_dir), alpha=1.5))
    assert disk_snapshot(tmp_path) == before


def test_the_objective_is_registered_and_takes_a_loaded_teacher(teacher_folder):
    from lmlab.objectives.registry import build_objective

    teacher = tiny_teacher(init=0.2)
    objective = build_objective("distil", special(), teacher=teacher, alpha_ce=0.0)
    assert isinstance(objective, Distillation) and objective.teacher is teacher
    objective.prepare(make_student(tiny_teacher(init=0.2), (0, 3)))
    assert not objective.teacher.training
    assert not any(p.requires_grad for p in objective.teacher.parameters())  # frozen
    assert not list(objective.parameters())  # outside the objective's parameters and state
    objective.train()
    assert not objective.teacher.training  # no dropout in the teacher, ever
    with pytest.raises(LmlabError, match="needs a teacher"):
        build_objective("distil", special())
    with pytest.raises(LmlabError, match="loaded teacher model") as error:
        build_objective("distil", special(), teacher=str(teacher_folder))
    assert "lmlab.from_pretrained" in error.value.fix  # the objective never loads a path


def test_distil_task_refuses_a_teacher_of_another_task_before_any_work(small_task, tmp_path):
    from lmlab.models.task_heads import add_task_head

    wrong = tiny_teacher(layers=2, heads=(), seed=5)
    add_task_head(wrong, "sequence-classification", 3, {0: "a", 1: "b", 2: "c"})
    teacher_dir = save_with_tokenizer(wrong, tmp_path / "teacher")
    before = disk_snapshot(tmp_path)
    result = run_lmlab_here("distil-task", "--task", "fortunes-topic", "--teacher", teacher_dir,
                       "--student", teacher_dir, "--epochs", 1, "--out", tmp_path / "run")
    assert_clean_refusal(result, "predicts 3 labels")
    assert disk_snapshot(tmp_path) == before


# -- the teacher's FLOPs in the cost report ---------------------------------------------------------
def _forward_flops_by_hand(layers: int, seq_len: int, mlm_fraction: float | None,
                           vocab: int = 30522, hidden: int = 32, ffn: int = 64) -> float:
    """Forward FLOPs per token of tiny_teacher's shape, written out (lmlab.cost.flops'
    conventions): q, k, v, o; the scores QK^T and AV; the two feed-forward maps; the MLM head's
    transform and decoder on ``mlm_fraction`` of the tokens (None: no head)."""
    per_layer = 4 * 2 * hidden * hidden + 2 * 2 * seq_len * hidden + 2 * 2 * hidden * ffn
    head = 0.0 if mlm_fraction is None else mlm_fraction * (2 * hidden * hidden
                                                            + 2 * hidden * vocab)
    return layers * per_layer + head


def _no_peak_measurement(monkeypatch) -> None:
    """The cost tracker's MFU denominator, given (measuring the CPU peak takes seconds)."""
    import lmlab.cost.report as report

    monkeypatch.setattr(report, "device_peak", lambda *args, **kwargs: (1e12, "test"))


def test_the_distil_cost_report_counts_the_teachers_forward_apart(shards, teacher_folder,
                                                                   tmp_path, monkeypatch):
    from dataclasses import replace

    _no_peak_measurement(monkeypatch)
    config = replace(run_config(tmp_path / "run", shards, 3), track_cost=True)
    distil(DistilSettings(str(teacher_folder), student_layers=2), config)
    cost = json.loads((tmp_path / "run" / "cost.json").read_text())
    tokens = cost["tokens"]
    assert tokens > 0
    teacher = tokens * _forward_flops_by_hand(4, 32, mlm_fraction=1.0)  # soft targets: every token
    assert cost["side_flops"] == {"teacher forward": pytest.approx(teacher, rel=1e-12)}
    # the student's training FLOPs stay the student's: 3 x forward, 2 layers, its MLM head on
    # every token (soft targets) and again on the masked 15% (MLM loss)
    assert cost["flops"] == pytest.approx(3 * tokens * _forward_flops_by_hand(2, 32, 1.15),
                                          rel=1e-12)
    assert cost["total_flops"] == pytest.approx(cost["flops"] + teacher, rel=1e-12)
    markdown = (tmp_path / "run" / "cost.md").read_text()
    assert "FLOPs (teacher forward, not trained)" in markdown and "FLOPs (all)" in markdown


@pytest.mark.parametrize("options", [{}, {"restrict_ce_to_mask": True}, {"alpha_ce": 0.0},
                                     {"alpha_mlm": 0.0}, {"alpha_ce": 0.0, "alpha_mlm": 0.0}])
def test_the_students_head_fraction_is_the_rows_its_mlm_head_really_computes(options):
    """The cost report's head fraction for the student against the rows the student's MLM head
    is run on in a real loss computation (a batch whose masked share is exactly mask_prob)."""
    teacher = tiny_teacher(layers=2).eval()
    student = make_student(teacher, (0,))
    objective = Distillation(special(), teacher=teacher, **options)
    objective.prepare(student)
    ids = torch.randint(1000, 2000, (2, 20), generator=torch.Generator().manual_seed(0))
    labels = torch.full_like(ids, -100)
    labels[0, [2, 5, 9]] = ids[0, [2, 5, 9]]
    labels[1, [1, 7, 12]] = ids[1, [1, 7, 12]]  # 6 of 40 tokens: mask_prob exactly
    rows: list[int] = []
    hook = student.heads["mlm"].register_forward_hook(
        lambda module, args, out: rows.append(out.reshape(-1, out.shape[-1]).shape[0]))
    objective.compute_loss(student, {"input_ids": ids, "attention_mask": torch.ones_like(ids),
                                     "labels": labels})
    hook.remove()
    fraction = objective.predicted_fraction
    assert (fraction or 0.0) * 40 == pytest.approx(sum(rows), abs=1e-9)
    assert objective.flops_head == ("mlm" if rows else "none")


def test_the_teachers_forward_follows_which_loss_terms_read_it():
    teacher = tiny_teacher(layers=3)
    flops = {}
    for name, options in {"all": {}, "masked": {"restrict_ce_to_mask": True},
                          "no soft targets": {"alpha_ce": 0.0}}.items():
        objective = Distillation(special(), teacher=teacher, **options)
        flops[name] = objective.side_flops(100, 16)["teacher forward"]
    assert flops["all"] == 100 * _forward_flops_by_hand(3, 16, 1.0)
    assert flops["masked"] == pytest.approx(100 * _forward_flops_by_hand(3, 16, 0.15), rel=1e-12)
    assert flops["no soft targets"] == 100 * _forward_flops_by_hand(3, 16, None)


@pytest.mark.filterwarnings("ignore:.*collapsed onto one class")
def test_the_distil_task_cost_report_counts_the_teachers_logits_once(small_task, tmp_path,
                                                                      monkeypatch):
    """Task-specific: the teacher's logits are computed once per training example, before
    training (length-sorted batches of 64); the report counts that forward pass once."""
    from lmlab.finetune import data as fdata
    from lmlab.finetune.runner import finetune, load_model

    _no_peak_measurement(monkeypatch)
    teacher_dir = task_teacher(small_task, tmp_path / "teacher")
    student_dir = save_with_tokenizer(make_student(tiny_teacher(layers=2, heads=()), (1,)),
                                      tmp_path / "student")
    finetune(small_task, student_dir, tmp_path / "run", seed=0, epochs=2, batch_size=8,
             max_length=64, show_progress=False, precision="fp32", device="cpu",
             eval_splits=("dev",), distil=TaskDistillation(str(teacher_dir), alpha=0.5))
    cost = json.loads((tmp_path / "run" / "cost.json").read_text())
    _, tokenizer, _ = load_model(teacher_dir)
    features = fdata.encode_examples(small_task, small_task.split("train"), tokenizer, 64)
    expected = 0.0
    for _, batch in fdata.eval_batches(features, 64, 0):
        expected += int(batch["attention_mask"].sum()) * _forward_flops_by_hand(
            2, batch["input_ids"].shape[-1], None)  # task_teacher: 2 layers, no MLM head
    assert cost["side_flops"] == {"teacher forward": pytest.approx(expected, rel=1e-12)}
    assert cost["tokens"] > sum(len(f.input_ids) for f in features)  # two epochs of the student


def test_a_pretraining_config_names_the_teacher_by_path(shards, teacher_folder, tmp_path):
    """`lmlab pretrain --config` with ``objective: distil`` and ``objective_args: {teacher:
    PATH}``: pretraining loads the teacher (the objective itself only takes a loaded model)."""
    from lmlab.tokenization.tokenizer import Tokenizer
    from lmlab.training.pretrain import ModelSettings, ObjectiveSettings, _model_and_objective

    config = dataclasses.replace(
        run_config(tmp_path / "run", shards, 1), model=ModelSettings(init=str(teacher_folder)),
        objective=ObjectiveSettings("distil", {"teacher": str(teacher_folder), "alpha_ce": 1.0}))
    model, objective = _model_and_objective(config, Tokenizer.from_pretrained(teacher_folder))
    key = "transformer.layers.3.attention.q_proj.weight"
    assert torch.equal(objective.teacher.state_dict()[key],
                       tiny_teacher(init=0.2).state_dict()[key])  # exact: the saved weights
    assert config.objective.args["teacher"] == str(teacher_folder)  # the record keeps the path
