"""Head pruning (Michel et al. 2019), magnitude pruning and the lottery ticket (lmlab.compress).

References: a pruned model equals the unpruned one with those heads' gates at 0, and equals
transformers' BERT on the same weights with the removed heads' value rows zeroed (its own
attention code; transformers 5 has no prune_heads); importance scores equal finite differences
of the loss; a pruned model saved here loads in a fresh process in lmlab and, for a Llama with
the same head count in every layer, in transformers.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import torch
from conftest import assert_close_rounding

import lmlab
from lmlab.compress.heads import (
    head_gates,
    head_importance,
    heads_per_layer,
    heads_to_prune,
    iterative_head_pruning,
    original_heads,
    prune_heads,
)
from lmlab.compress.magnitude import (
    MagnitudePruningHook,
    MaskHook,
    apply_masks,
    lottery_ticket,
    magnitude_masks,
    prunable_linears,
    sparsity_at,
    sparsity_of,
)
from lmlab.models.config import TransformerConfig
from lmlab.models.model import LanguageModel
from lmlab.utils.errors import LmlabError

LAYERS, HEADS, HIDDEN = 3, 4, 32


def _bert(heads=("sequence-classification",), dtype=torch.float32) -> LanguageModel:
    torch.manual_seed(0)
    config = TransformerConfig(vocab_size=101, hidden_size=HIDDEN, num_hidden_layers=LAYERS,
                               num_attention_heads=HEADS, intermediate_size=64,
                               max_position_embeddings=64, hidden_dropout_prob=0.0,
                               attention_probs_dropout_prob=0.0, extra={"num_labels": 3})
    model = LanguageModel(config, heads=list(heads)).to(dtype)
    with torch.no_grad():  # non-zero biases: a bias sliced wrongly must show
        for name, parameter in model.named_parameters():
            if name.endswith("bias"):
                parameter.normal_(0, 0.05)
    return model.eval()


def _batch(seed: int = 1) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(5, 101, (3, 9), generator=g)
    mask = torch.ones_like(ids)
    mask[1, 6:] = 0  # padding: the pruned path also runs on unpadded tokens
    return {"input_ids": ids, "attention_mask": mask}


PLAN = {0: [1, 3], 2: [0]}  # layer 1 keeps all four heads: per-layer counts differ


@pytest.mark.numerics
def test_pruned_model_equals_gated_model():
    model = _bert()
    batch = _batch()
    gates = [torch.ones(HEADS) for _ in range(LAYERS)]
    for layer, heads in PLAN.items():
        gates[layer][heads] = 0.0
    with torch.no_grad(), head_gates(model, gates):
        expected = model(**batch).last_hidden_state
    before, counted = model.num_parameters(), model.config.num_parameters()
    prune_heads(model, PLAN)
    with torch.no_grad():
        actual = model(**batch).last_hidden_state
    real = batch["attention_mask"].bool()
    assert_close_rounding(actual[real], expected[real], terms=HIDDEN, depth=2 * LAYERS)
    assert heads_per_layer(model) == [2, 4, 3]
    assert model.transformer.layers[0].attention.q_proj.weight.shape == (2 * 8, HIDDEN)
    assert model.transformer.layers[0].attention.o_proj.weight.shape == (HIDDEN, 2 * 8)
    removed = 3 * (4 * HIDDEN * 8 + 3 * 8)  # per head: q, k, v rows with biases, o columns
    assert model.num_parameters() == before - removed
    assert model.config.num_parameters() == counted - removed  # counted from the shapes
    assert model.config.extra["attention_heads_per_layer"] == [2, 4, 3]
    assert model.config.extra["pruned_heads"] == {"0": [1, 3], "2": [0]}


@pytest.mark.numerics
def test_pruned_model_equals_transformers_bert_with_those_heads_zeroed(tmp_path):
    """Reference: transformers' own BERT attention on the same weights, each removed head's
    value projection (rows and bias) set to 0, so its context is 0."""
    from transformers import BertModel

    model = _bert(heads=())
    lmlab.save_pretrained(model, tmp_path / "full")
    reference = BertModel.from_pretrained(tmp_path / "full", attn_implementation="eager").eval()
    with torch.no_grad():
        for layer, heads in PLAN.items():
            value = reference.encoder.layer[layer].attention.self.value
            for head in heads:
                value.weight[head * 8:(head + 1) * 8] = 0
                value.bias[head * 8:(head + 1) * 8] = 0
    batch = _batch()
    with torch.no_grad():
        expected = reference(**batch).last_hidden_state
        prune_heads(model, PLAN)
        actual = model(**batch).last_hidden_state
    real = batch["attention_mask"].bool()
    assert_close_rounding(actual[real], expected[real], terms=HIDDEN, depth=2 * LAYERS)


def test_pruning_keeps_frozen_weights_and_biases_frozen():
    model = _bert()
    for parameter in model.parameters():
        parameter.requires_grad_(False)
    prune_heads(model, PLAN)
    assert not any(p.requires_grad for p in model.parameters())


def test_iterative_pruning_numbers_heads_by_their_original_index():
    model = _bert()
    prune_heads(model, {0: [0]})  # layer 0 now holds original heads 1, 2, 3
    prune_heads(model, {0: [1]})  # current index 1 = original head 2
    assert original_heads(model)[0] == [1, 3]
    assert model.config.extra["pruned_heads"]["0"] == [0, 2]


def test_same_count_everywhere_is_written_as_num_attention_heads():
    model = _bert()
    counted = model.config.num_parameters()
    prune_heads(model, {0: [0], 1: [3], 2: [2]})
    assert model.config.num_attention_heads == 3
    assert model.config.head_dim == 8
    assert "attention_heads_per_layer" not in model.config.extra
    assert model.config.num_parameters() == counted - 3 * (4 * HIDDEN * 8 + 3 * 8)


def test_pruning_every_head_of_a_layer_is_refused_before_any_change():
    model = _bert()
    shapes = [p.shape for p in model.parameters()]
    with pytest.raises(LmlabError, match="every head of layer 1") as error:
        prune_heads(model, {0: [0], 1: [0, 1, 2, 3]})
    assert "keep at least one head" in error.value.fix
    assert [p.shape for p in model.parameters()] == shapes  # layer 0 untouched too
    with pytest.raises(LmlabError, match="no head 4"):
        prune_heads(model, {0: [4]})
    with pytest.raises(LmlabError, match="layer 5 does not exist"):
        prune_heads(model, {5: [0]})


def test_grouped_query_attention_and_shared_layers_are_refused():
    config = TransformerConfig(family="llama", vocab_size=50, hidden_size=32,
                               num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                               intermediate_size=64)
    with pytest.raises(LmlabError, match="grouped-query"):
        prune_heads(LanguageModel(config), {0: [0]})
    shared = TransformerConfig(vocab_size=50, hidden_size=32, num_hidden_layers=2,
                               num_attention_heads=4, intermediate_size=64, share_layers=True)
    with pytest.raises(LmlabError, match="shares one layer"):
        prune_heads(LanguageModel(shared), {0: [0]})


def test_importance_equals_finite_differences():
    """|dL/d gate| from the hooks against central differences of the loss in float64."""
    model = _bert(dtype=torch.float64)
    batch = {**_batch(), "labels": torch.tensor([0, 2, 1])}

    def loss_fn(m, b):
        logits = m(input_ids=b["input_ids"], attention_mask=b["attention_mask"]).logits
        return torch.nn.functional.cross_entropy(logits, b["labels"])

    scores = head_importance(model, [batch], loss_fn, normalize=False)
    eps = 1e-5
    for layer in range(LAYERS):
        for head in range(HEADS):
            values = []
            for sign in (1, -1):
                gates = [torch.ones(HEADS, dtype=torch.float64) for _ in range(LAYERS)]
                gates[layer][head] += sign * eps
                with torch.no_grad(), head_gates(model, gates):
                    values.append(float(loss_fn(model, batch)))
            numeric = abs(values[0] - values[1]) / (2 * eps)
            # tol: central differences in float64: step^2 error, 1e-10 of the rounding
            assert scores[layer][head] == pytest.approx(numeric, rel=1e-5, abs=1e-9)
    assert all(p.grad is None for p in model.parameters())  # weights untouched
    normalised = head_importance(model, [batch, batch], loss_fn)
    for layer in range(LAYERS):  # Michel et al.: unit L2 norm per layer
        precision = normalised[layer].dtype  # the model's, float64
        assert_close_rounding(normalised[layer].norm(), 1.0, terms=HEADS, dtype=precision)
        # two batches summed, then normalised, against one: the same direction
        assert_close_rounding(normalised[layer], scores[layer] / scores[layer].norm(),
                              terms=HEADS, depth=2, dtype=precision)


def test_heads_to_prune_takes_the_least_important_and_keeps_one_per_layer():
    importance = [torch.tensor([0.1, 0.2]), torch.tensor([0.9, 0.05, 0.3])]
    assert heads_to_prune(importance, 2) == {1: [1], 0: [0]}
    assert heads_to_prune(importance, 10) == {1: [1, 2], 0: [0]}  # one head stays per layer


def test_iterative_pruning_curve():
    model = _bert()
    batch = {**_batch(), "labels": torch.tensor([0, 2, 1])}

    def loss_fn(m, b):
        logits = m(input_ids=b["input_ids"], attention_mask=b["attention_mask"]).logits
        return torch.nn.functional.cross_entropy(logits, b["labels"])

    rows = iterative_head_pruning(model, lambda m: head_importance(m, [batch], loss_fn),
                                  lambda m: float(loss_fn(m, batch).detach()), step_fraction=0.25,
                                  max_fraction=0.75)
    assert [r["heads_removed"] for r in rows] == [0, 3, 6, 9]
    assert all(min(r["heads_per_layer"]) >= 1 for r in rows)
    assert sum(heads_per_layer(model)) == 3
    assert rows[-1]["parameters"] < rows[0]["parameters"]


_RELOAD = """
import json, sys, torch
import lmlab
model = lmlab.from_pretrained(sys.argv[1]).eval()
batch = {k: torch.tensor(v) for k, v in json.loads(sys.argv[2]).items()}
with torch.no_grad():
    out = model(**batch)
from lmlab.compress.heads import original_heads
print(json.dumps({"hidden": out.last_hidden_state.tolist(),
                  "heads": [layer.attention.num_heads for layer in model.transformer.layers],
                  "original": original_heads(model)}))
"""


def _run(script: str, *args: str) -> dict:
    done = subprocess.run([sys.executable, "-c", script, *args], capture_output=True, text=True,
                          check=False)
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_pruned_bert_saves_and_reloads_in_a_new_process(tmp_path):
    from lmlab.interop.hf import save_pretrained
    from lmlab.interop.native import save_model

    model = _bert()
    prune_heads(model, PLAN)
    with pytest.raises(LmlabError, match="different numbers of attention heads"):
        save_pretrained(model, tmp_path / "refused")  # transformers cannot build it
    assert not (tmp_path / "refused").exists()
    folder, kind = save_model(model, tmp_path / "pruned")
    assert kind == "lmlab"
    batch = _batch()
    with torch.no_grad():
        expected = model(**batch).last_hidden_state
    got = _run(_RELOAD, str(folder), json.dumps({k: v.tolist() for k, v in batch.items()}))
    assert got["heads"] == [2, 4, 3]
    assert torch.equal(torch.tensor(got["hidden"]), expected)  # exact: same weights, same kernels


def test_bert_with_the_same_count_per_layer_is_refused_by_the_hf_format(tmp_path):
    """BERT's config.json has no head width: 3 heads of 8 in a hidden size of 32 would be read
    as 3 heads of 10; the model goes to lmlab's format and reloads there."""
    from lmlab.interop.native import save_model

    model = _bert()
    prune_heads(model, {0: [0], 1: [1], 2: [2]})
    folder, kind = save_model(model, tmp_path / "uniform")
    assert kind == "lmlab"
    batch = _batch()
    with torch.no_grad():
        expected = model(**batch).last_hidden_state
    got = _run(_RELOAD, str(folder), json.dumps({k: v.tolist() for k, v in batch.items()}))
    assert got["heads"] == [3, 3, 3]
    assert torch.equal(torch.tensor(got["hidden"]), expected)  # exact: the same weights and batch


_TRANSFORMERS_LLAMA = """
import json, sys, torch
from transformers import LlamaForCausalLM
model = LlamaForCausalLM.from_pretrained(sys.argv[1]).eval()
model.save_pretrained(sys.argv[3])  # transformers' own save keeps lmlab's record
ids = torch.tensor(json.loads(sys.argv[2]))
with torch.no_grad():
    print(json.dumps({"logits": model(input_ids=ids).logits.tolist(),
                      "heads": model.config.num_attention_heads,
                      "q": list(model.model.layers[0].self_attn.q_proj.weight.shape)}))
"""


def test_pruned_llama_loads_in_transformers_in_a_new_process(tmp_path):
    """Where the format allows it (Llama's config.json has head_dim), transformers loads the
    pruned model and computes the same logits; the removed heads' original indices travel in
    config.json (``lmlab_pruned_heads``: transformers 5 keeps no record of its own) and come
    back in lmlab, also after transformers saved the model again."""
    torch.manual_seed(0)
    from lmlab.interop import hf
    from lmlab.models.presets import family_config

    config = family_config("llama", vocab_size=64, hidden_size=32, num_hidden_layers=2,
                           num_attention_heads=4, num_key_value_heads=4, intermediate_size=48,
                           max_position_embeddings=64, hidden_dropout_prob=0.0,
                           attention_probs_dropout_prob=0.0)
    model = LanguageModel(config, heads=["clm"]).eval()
    prune_heads(model, {0: [1], 1: [3]})  # 3 heads: transformers' config refuses 32 % 3
    with pytest.raises(LmlabError, match="does not divide"):
        hf.save_pretrained(model, tmp_path / "three")
    prune_heads(model, {0: [0], 1: [2]})
    lmlab.save_pretrained(model, tmp_path / "llama")
    ids = torch.randint(0, 64, (2, 7))
    with torch.no_grad():
        expected = model(input_ids=ids).logits
    kept = original_heads(model)
    assert kept == [[2, 3], [0, 1]]
    got = _run(_TRANSFORMERS_LLAMA, str(tmp_path / "llama"), json.dumps(ids.tolist()),
               str(tmp_path / "resaved"))
    assert got["heads"] == 2 and got["q"] == [16, 32]
    assert_close_rounding(torch.tensor(got["logits"]), expected, terms=32, depth=2 * 2 + 1)
    for folder in ("llama", "resaved"):
        reloaded = _run(_RELOAD, str(tmp_path / folder), json.dumps({"input_ids": ids.tolist()}))
        assert reloaded["heads"] == [2, 2] and reloaded["original"] == kept, folder
        assert_close_rounding(torch.tensor(reloaded["hidden"]),
                              model.transformer(input_ids=ids).last_hidden_state.detach(),
                              terms=32, depth=5)


# -- magnitude pruning and the lottery ticket ---------------------------------------------------
def test_global_and_per_layer_masks_remove_the_smallest_weights():
    model = _bert()
    modules = prunable_linears(model)
    assert len(modules) == LAYERS * 6  # q, k, v, o, up, down
    masks = magnitude_masks(modules, 0.6, "global")
    total = sum(m.numel() for m in masks.values())
    kept = sum(int(m.sum()) for m in masks.values())
    assert kept == total - round(0.6 * total)
    smallest_kept = min(float(modules[n].weight.detach().abs()[m].min()) for n, m in masks.items())
    largest_removed = max(float(modules[n].weight.detach().abs()[~m].max()) for n, m in masks.items())
    assert largest_removed <= smallest_kept
    per_layer = magnitude_masks(modules, 0.5, "layer")
    for name, mask in per_layer.items():
        assert int((~mask).sum()) == round(0.5 * mask.numel()), name
    apply_masks(modules, masks)
    assert sparsity_of(modules) == pytest.approx(0.6, abs=1e-4)  # tol: whole weights, round(s n) / n
    again = magnitude_masks(modules, 0.7, "global", current=masks)
    assert all(bool((again[n] <= masks[n]).all()) for n in masks)  # removed stays removed


def test_sparsity_schedules():
    assert sparsity_at(0, 0.8, start=10, end=110) == 0.0
    assert sparsity_at(110, 0.8, start=10, end=110) == 0.8
    assert sparsity_at(60, 0.8, start=10, end=110) == pytest.approx(0.8 - 0.8 * 0.5 ** 3)
    assert sparsity_at(60, 0.8, start=10, end=110, kind="linear") == pytest.approx(0.4)
    with pytest.raises(LmlabError, match="outside"):
        magnitude_masks({}, 1.0)
    with pytest.raises(LmlabError, match="schedule"):
        sparsity_at(5, 0.5, 0, 10, kind="exp")
    with pytest.raises(LmlabError, match="above the final"):  # a falling target would unmask
        MagnitudePruningHook(_bert(), final=0.3, start=0, end=10, initial=0.5)


def _tiny_task():
    """Sentence classification whose label is which of two word sets the text draws from."""
    from lmlab.tasks.types import Example, Task

    rng = torch.Generator().manual_seed(0)
    words = [["red", "green", "blue", "yellow"], ["dog", "cat", "horse", "bird"]]
    examples = []
    for i in range(64):
        label = i % 2
        picks = torch.randint(0, 4, (5,), generator=rng).tolist()
        examples.append(Example(id=str(i), text=" ".join(words[label][p] for p in picks),
                                label=str(label)))
    return Task(name="colours-animals", type="classification", labels=["0", "1"],
                splits={"train": examples[:48], "dev": examples[48:]}, metrics=["accuracy"])


def test_gradual_magnitude_pruning_on_the_trainer(tmp_path, minilm_dir):
    """A real Trainer run: the sparsity follows the schedule to its final value, pruned
    weights stay 0 after optimizer steps, and the masks are in the checkpoint."""
    from conftest import tiny_bert

    from lmlab.compress.magnitude import train_on_task
    from lmlab.finetune.runner import load_tokenizer

    model = tiny_bert()
    tokenizer = load_tokenizer(minilm_dir)
    hook = MagnitudePruningHook(model, final=0.5, start=2, end=8, every=2)
    train_on_task(model, tokenizer, _tiny_task(), tmp_path / "run", steps=10, hooks=[hook],
                  lr=1e-3, batch_size=8, max_length=16, device="cpu")
    assert [s for s, _ in hook.history] == [2, 4, 6, 8]
    assert hook.history[-1][1] == 0.5
    assert sparsity_of(prunable_linears(model)) == pytest.approx(0.5, abs=1e-3)  # tol: whole weights, round(s n) / n
    restored = MaskHook(model)
    checkpoint = next((tmp_path / "run" / "checkpoints").iterdir())
    state = json.loads((checkpoint / "state.json").read_text())
    restored.load(checkpoint, state["hooks"][0])
    assert set(restored.masks) == set(hook.masks)
    assert all(torch.equal(restored.masks[k], hook.masks[k]) for k in hook.masks)
    with pytest.raises(LmlabError, match="holds a training checkpoint"):  # it would be resumed
        train_on_task(tiny_bert(), tokenizer, _tiny_task(), tmp_path / "run", steps=10,
                      device="cpu")


def test_lottery_ticket_rewinds_survivors_to_step_k():
    """A stand-in training loop calling the hooks as the Trainer does: after each round the
    survivors restart from their step-k values and the pruned weights stay 0."""
    model = _bert()
    modules = prunable_linears(model)
    starts, at_step_2 = [], []

    class Loop:
        step = 0

    def train(m, hooks, round_):
        starts.append({k: v.detach().clone() for k, v in m.state_dict().items()})
        loop = Loop()
        for hook in hooks:
            hook.on_train_start(loop)
        for step in range(1, 5):
            with torch.no_grad():
                for parameter in m.parameters():
                    parameter.add_(0.01 * torch.randn_like(parameter))
            loop.step = step
            for hook in hooks:
                hook.on_step_end(loop)
            if step == 2:
                at_step_2.append({k: v.detach().clone() for k, v in m.state_dict().items()})

    rows = lottery_ticket(model, train, lambda m: 0.5, rounds=2, prune_fraction=0.5,
                          rewind_step=2)
    assert [r["round"] for r in rows] == [0, 1, 2]
    assert [round(r["sparsity"], 3) for r in rows] == [0.0, 0.5, 0.75]
    pruned = {f"{n}.weight" for n in modules}
    for round_ in (1, 2):  # every weight back at round 0's step 2, the pruned ones at 0
        for name, value in starts[round_].items():
            if name in pruned:
                kept = value != 0
                assert torch.equal(value[kept], at_step_2[0][name][kept]), name  # exact: rewound
            else:
                assert torch.equal(value, at_step_2[0][name]), name  # exact: rewound
    zero = [sum(int((starts[r][n] == 0).sum()) for n in pruned) for r in (1, 2)]
    total = sum(starts[1][n].numel() for n in pruned)
    assert zero[0] / total == pytest.approx(0.5, abs=1e-3)  # tol: whole weights, round(s n) / n
    assert zero[1] / total == pytest.approx(0.75, abs=1e-3)  # tol: whole weights, round(s n) / n
    # round 2 removes half of round 1's survivors: the mask only shrinks
    assert all(bool(((starts[2][n] == 0) >= (starts[1][n] == 0)).all()) for n in pruned)
    with pytest.raises(LmlabError, match="rounds"):
        lottery_ticket(model, train, lambda m: 0.0, rounds=0)


# -- the command line ---------------------------------------------------------------------------
def test_cli_refuses_bad_input_before_any_work(tmp_path, capsys):
    from lmlab.cli import main

    out = tmp_path / "never"
    assert main(["compress", "prune-heads", "minilm", "--task", "fortunes-topic", "--step", "0",
                 "--out", str(out)]) == 2
    assert "--step 0.0 is outside (0, 1)" in capsys.readouterr().err
    assert main(["compress", "magnitude", "minilm", "--task", "fortunes-topic", "--sparsity",
                 "0.5,1.2", "--out", str(out)]) == 2
    assert "--sparsity 1.2 is outside [0, 1)" in capsys.readouterr().err
    assert main(["compress", "lottery", "minilm", "--task", "fortunes-topic", "--steps", "10",
                 "--rewind-step", "10", "--out", str(out)]) == 2
    assert "rewind to an early step" in capsys.readouterr().err
    assert main(["compress", "low-rank", "minilm", "--rank", "8", "--energy", "0.9",
                 "--out", str(out)]) == 2
    assert "exactly one of --rank and --energy" in capsys.readouterr().err
    assert not out.exists()


def test_cli_prune_heads_without_a_task_head_is_refused(tiny_bert_folder, tmp_path, capsys):
    from lmlab.cli import main

    assert main(["compress", "prune-heads", str(tiny_bert_folder), "--task", "fortunes-topic",
                 "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert "no head for the task fortunes-topic" in err and "--finetune-steps" in err


@pytest.mark.slow  # about 40 s on the shared 2-core host: a fine-tune and three dev evaluations
def test_cli_prune_heads_writes_the_curve_and_a_loadable_model(tiny_bert_folder, tmp_path):
    import lmlab
    from lmlab.cli import main

    out = tmp_path / "heads"
    args = ["compress", "prune-heads", str(tiny_bert_folder), "--task", "fortunes-topic",
            "--finetune-steps", "2", "--importance-examples", "32", "--step", "0.25",
            "--max", "0.5", "--max-length", "24", "--out", str(out)]
    assert main(args) == 0
    results = json.loads((out / "results.json").read_text())
    assert [r["heads_removed"] for r in results["steps"]] == [0, 2, 4]
    assert (out / "curve.png").stat().st_size > 1000
    model = lmlab.from_pretrained(out / "model")
    assert sum(heads_per_layer(model)) == 4
    assert heads_per_layer(model) == results["steps"][-1]["heads_per_layer"]
    assert main(args) == 2  # the folder holds a run: refused without --overwrite


@pytest.mark.slow  # about a minute on the shared 2-core host: three short fine-tunings
def test_cli_magnitude_and_lottery_write_their_curves(tiny_bert_folder, tmp_path):
    import lmlab
    from lmlab.cli import main

    common = ["--task", "fortunes-topic", "--max-train-examples", "64", "--batch-size", "16",
              "--max-length", "24", "--lr", "1e-3"]
    out = tmp_path / "magnitude"
    assert main(["compress", "magnitude", str(tiny_bert_folder), *common, "--sparsity",
                 "0.5", "--steps", "4", "--every", "1", "--out", str(out)]) == 0
    rows = json.loads((out / "results.json").read_text())["rows"]
    assert rows[0]["sparsity"] == pytest.approx(0.5, abs=1e-3)  # tol: whole weights, round(s n) / n
    model = lmlab.from_pretrained(out / "model")
    assert sparsity_of(prunable_linears(model)) == pytest.approx(0.5, abs=1e-3)  # tol: whole weights, round(s n) / n

    out = tmp_path / "lottery"
    assert main(["compress", "lottery", str(tiny_bert_folder), *common, "--rounds", "2",
                 "--prune-fraction", "0.5", "--steps", "3", "--rewind-step", "1",
                 "--out", str(out)]) == 0
    rounds = json.loads((out / "results.json").read_text())["rounds"]
    assert [round(r["sparsity"], 2) for r in rounds] == [0.0, 0.5, 0.75]
    assert (out / "curve.png").is_file()
    model = lmlab.from_pretrained(out / "model")
    assert sparsity_of(prunable_linears(model)) == pytest.approx(0.75, abs=1e-3)  # tol: whole weights, round(s n) / n


def test_cli_magnitude_overwrite_trains_afresh(tiny_bert_folder, tmp_path):
    """With --overwrite, a rerun into the same --out trains the model it was given: an earlier
    run's checkpoint in out/train-0 was resumed (its weights and masks reported as this run's)."""
    from lmlab.cli import main

    out = tmp_path / "magnitude"
    common = [str(tiny_bert_folder), "--task", "fortunes-topic", "--max-train-examples", "16",
              "--batch-size", "8", "--max-length", "16", "--eval-examples", "8", "--steps", "2",
              "--every", "1", "--out", str(out)]
    assert main(["compress", "magnitude", *common, "--sparsity", "0.3"]) == 0
    assert main(["compress", "magnitude", *common, "--sparsity", "0.6", "--overwrite"]) == 0
    rows = json.loads((out / "results.json").read_text())["rows"]
    assert rows[0]["sparsity"] == pytest.approx(0.6, abs=1e-3)  # tol: whole weights, round(s n) / n


def test_cli_refuses_an_unknown_split_before_training(tiny_bert_folder, tmp_path, capsys):
    from lmlab.cli import main

    out = tmp_path / "heads"
    for split in ("--eval-split", "--importance-split"):
        assert main(["compress", "prune-heads", str(tiny_bert_folder), "--task", "fortunes-topic",
                     "--finetune-steps", "1", split, "nope", "--out", str(out)]) == 2
        assert "has no split 'nope'" in capsys.readouterr().err
    assert main(["compress", "magnitude", str(tiny_bert_folder), "--task", "fortunes-topic",
                 "--steps", "1", "--eval-split", "nope", "--out", str(out)]) == 2
    assert "has no split 'nope'" in capsys.readouterr().err
    assert not out.exists()  # nothing fine-tuned or written
