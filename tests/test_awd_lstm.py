"""AWD-LSTM (lmlab.models.rnn): the stack against torch.nn.LSTM and a hand-written LSTM cell on
the same weights, each dropout acting only in training and as the paper defines it, tied
weights, save -> reload in a fresh process, and `lmlab pretrain --family awd-lstm` with its
perplexity and exact resume."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import torch
from conftest import (
    assert_clean_refusal,
    assert_close_rounding,
    kjv_shards,
    run_lmlab_here,
)
from torch import nn

import lmlab
from lmlab.interop.recurrent import build_model, load_recurrent
from lmlab.models.rnn.config import RecurrentConfig, check_family_objective, recurrent_preset
from lmlab.models.rnn.layers import LockedDropout, WeightDropLSTM, embedding_dropout
from lmlab.utils.errors import LmlabError

VOCAB = 50


def tiny(**overrides) -> RecurrentConfig:
    return recurrent_preset("awd-lstm", "tiny", vocab_size=VOCAB, **overrides)


@pytest.fixture(scope="module")
def shards(tmp_path_factory):
    return kjv_shards(tmp_path_factory, 12, 2)


def reference_stack(model) -> tuple[nn.Embedding, list[nn.LSTM]]:
    """torch's own modules holding copies of the model's weights."""
    embedding = nn.Embedding.from_pretrained(model.embeddings.weight.detach().clone())
    layers = []
    for layer in model.layers:
        ref = nn.LSTM(layer.lstm.input_size, layer.lstm.hidden_size, batch_first=True)
        ref.load_state_dict(layer.lstm.state_dict())
        layers.append(ref)
    return embedding, layers


def hand_lstm(x: torch.Tensor, lstm: nn.LSTM) -> torch.Tensor:
    """The LSTM equations step by step (Hochreiter & Schmidhuber 1997; torch's gate order
    i, f, g, o): the readable reference."""
    w_ih, w_hh = lstm.weight_ih_l0, lstm.weight_hh_l0
    b = lstm.bias_ih_l0 + lstm.bias_hh_l0
    h = x.new_zeros(x.shape[0], lstm.hidden_size)
    c = torch.zeros_like(h)
    outputs = []
    for t in range(x.shape[1]):
        i, f, g, o = (x[:, t] @ w_ih.T + h @ w_hh.T + b).chunk(4, dim=-1)
        c = torch.sigmoid(f) * c + torch.sigmoid(i) * torch.tanh(g)
        h = torch.sigmoid(o) * torch.tanh(c)
        outputs.append(h)
    return torch.stack(outputs, dim=1)  # (B, T, H)


@pytest.mark.numerics
def test_eval_mode_is_torch_lstm_stack_on_the_same_weights():
    """Dropout off (eval mode, every dropout of the config non-zero): each layer's output is
    torch.nn.LSTM's on the same weights, and the first layer's is the LSTM equations'."""
    torch.manual_seed(0)
    model = build_model(tiny(), ["clm"]).eval()
    ids = torch.randint(1, VOCAB, (3, 9))
    with torch.no_grad():
        out = model(ids, output_hidden_states=True)
        embedding, layers = reference_stack(model)
        x = embedding(ids)
        assert torch.equal(out.hidden_states[0], x)  # exact: a lookup of the same table
        for index, ref in enumerate(layers):
            expected = ref(x)[0]
            assert_close_rounding(out.hidden_states[index + 1], expected, terms=x.shape[-1],
                                  depth=ids.shape[1], scale=1.0)
            if index == 0:
                assert_close_rounding(expected, hand_lstm(x, ref), terms=x.shape[-1],
                                      depth=ids.shape[1], scale=1.0)
            x = expected
        logits = x @ model.embeddings.weight.T  # the tied decoder
    assert_close_rounding(out.logits, logits, terms=32, scale=float(logits.abs().max()))


def test_weight_drop_masks_w_hh_in_training_only():
    torch.manual_seed(0)
    layer = WeightDropLSTM(6, 8, weight_p=0.5)
    x = torch.randn(2, 5, 6)
    raw = layer.lstm.weight_hh_l0.detach().clone()
    layer.train()
    first, second = layer(x)[0], layer(x)[0]
    assert not torch.allclose(first, second)  # a fresh mask each forward pass
    assert torch.equal(layer.lstm.weight_hh_l0, raw)  # exact: the raw matrix is never overwritten
    first.sum().backward()
    grad = layer.lstm.weight_hh_l0.grad
    dropped = (grad == 0).float().mean().item()
    assert 0.3 < dropped < 0.7, dropped  # DropConnect: about half of W_hh's entries masked
    assert (layer.lstm.weight_ih_l0.grad != 0).float().mean() > 0.9  # W_ih is not dropped
    layer.eval()
    with torch.no_grad():
        assert torch.equal(layer(x)[0], layer.lstm(x)[0])  # exact: eval: the layer calls its nn.LSTM


@pytest.mark.numerics
def test_embedding_dropout_drops_whole_words_and_locked_dropout_is_shared_over_time():
    torch.manual_seed(0)
    embedding = nn.Embedding(VOCAB, 16)
    ids = torch.randint(0, 5, (4, 30))  # few words, each repeated
    dropped = embedding_dropout(embedding, ids, 0.5, training=True)
    zero = (dropped == 0).all(-1)  # (B, T): a dropped word's whole vector
    for word in ids.unique():
        rows = zero[ids == word]
        assert rows.all() or not rows.any()  # every occurrence of a word dropped, or none
    kept = ~zero
    assert_close_rounding(dropped[kept], 2.0 * embedding(ids)[kept])  # scaled by 1/(1-p)
    assert torch.equal(embedding_dropout(embedding, ids, 0.5, training=False), embedding(ids))  # exact: no dropout, the same lookup
    locked = LockedDropout(0.5).train()
    out = locked(torch.ones(3, 7, 10))
    assert torch.equal(out, out[:, :1].expand_as(out))  # exact: 0 or 2; one mask per sequence, every step
    assert torch.equal(locked.eval()(torch.ones(3, 7, 10)), torch.ones(3, 7, 10))  # exact: identity in eval


def test_training_mode_is_stochastic_and_eval_mode_deterministic():
    model = build_model(tiny(), ["clm"])
    ids = torch.randint(1, VOCAB, (2, 6))
    model.train()
    assert not torch.equal(model(ids).logits, model(ids).logits)
    model.eval()
    with torch.no_grad():
        assert torch.equal(model(ids).logits, model(ids).logits)  # exact: the same call twice


def test_tied_weights_share_one_matrix_and_gradient():
    model = build_model(tiny(), ["clm"])
    assert model.heads["clm"].decoder.weight is model.embeddings.weight
    ids = torch.randint(1, VOCAB, (2, 6))
    model(ids, labels=ids).loss.backward()
    assert model.embeddings.weight.grad is not None
    assert model.num_parameters() == model.config.num_parameters()
    untied = build_model(tiny(tie_word_embeddings=False), ["clm"])
    assert untied.heads["clm"].decoder.weight is not untied.embeddings.weight
    assert untied.num_parameters() == untied.config.num_parameters()


def test_tied_weights_with_mismatched_sizes_are_refused():
    with pytest.raises(LmlabError, match="tied weights need the last LSTM layer as wide"):
        tiny(output_size=48)
    config = tiny(output_size=48, tie_word_embeddings=False)  # untied: any width
    assert build_model(config, ["clm"]).heads["clm"].decoder.weight.shape == (VOCAB, 48)


def test_bad_configs_and_heads_are_refused():
    with pytest.raises(LmlabError, match="not a dropout probability"):
        tiny(weight_p=1.0)
    with pytest.raises(LmlabError, match="no awd-lstm preset named 'huge'"):
        recurrent_preset("awd-lstm", "huge")
    with pytest.raises(LmlabError, match="has no 'mlm' head"):
        build_model(tiny(), ["mlm"])
    with pytest.raises(LmlabError, match="trains with --objective clm, not mlm"):
        check_family_objective("awd-lstm", "mlm")
    with pytest.raises(LmlabError, match="reads token ids"):
        build_model(tiny())(inputs_embeds=torch.zeros(1, 2, 32))


def test_save_and_reload_in_a_fresh_process_gives_the_same_logits(tmp_path):
    torch.manual_seed(0)
    model = build_model(tiny(), ["clm"]).eval()
    folder = lmlab.save_pretrained(model, tmp_path / "awd")
    ids = torch.randint(1, VOCAB, (2, 8))
    with torch.no_grad():
        expected = model(ids).logits
    code = ("import sys, json, torch, lmlab\n"
            "m = lmlab.from_pretrained(sys.argv[1]).eval()\n"
            "assert m.heads['clm'].decoder.weight is m.embeddings.weight\n"
            "ids = torch.tensor(json.loads(sys.argv[2]))\n"
            "with torch.no_grad():\n"
            "    print(json.dumps(m(ids).logits.tolist()))\n")
    result = subprocess.run([sys.executable, "-c", code, str(folder), json.dumps(ids.tolist())],
                            capture_output=True, text=True, check=True)
    reloaded = torch.tensor(json.loads(result.stdout))
    assert_close_rounding(reloaded, expected, terms=32, depth=8)
    again = load_recurrent(folder)
    with torch.no_grad():
        assert torch.equal(again(ids).logits, expected)  # exact: same process: bit for bit


def test_folder_of_the_wrong_family_is_refused(tmp_path):
    model = build_model(tiny(), ["clm"])
    folder = lmlab.save_pretrained(model, tmp_path / "awd")
    config = json.loads((folder / "config.json").read_text())
    config["family"] = "elmo"
    (folder / "config.json").write_text(json.dumps(config))
    with pytest.raises(LmlabError, match="names family 'elmo' but the format key says"):
        load_recurrent(folder)


def test_pretrain_reports_perplexity_and_resumes_exactly(shards, tmp_path):
    """A run cut after its step-2 checkpoint (the later one removed, as a kill leaves it) and
    resumed logs the losses and evaluation of the uninterrupted run: the weight-drop and
    locked-dropout masks come from the restored RNG."""
    import shutil

    import lmlab
    from lmlab.training.metrics_log import read_metrics

    def run(out):
        return lmlab.pretrain(lmlab.PretrainConfig.from_sections(
            None, family="awd-lstm", size="tiny", objective="clm", shards=str(shards),
            out=str(out), max_steps=4, batch_size=4, seq_len=24, lr=3e-3, save_every=2,
            keep_last=3, eval_every=2, precision="fp32", progress=False, track_cost=False))

    whole = run(tmp_path / "whole")
    assert "eval_perplexity" in whole.last_eval and whole.last_eval["eval_perplexity"] > 1
    shutil.copytree(tmp_path / "whole", tmp_path / "cut")
    shutil.rmtree(tmp_path / "cut" / "checkpoints" / "step-4")
    resumed = run(tmp_path / "cut")

    def losses(out):
        return {r["step"]: r["loss"] for r in read_metrics(out / "metrics.jsonl")
                if r["kind"] == "train"}

    assert losses(tmp_path / "cut") == losses(tmp_path / "whole")
    assert resumed.last_eval == whole.last_eval
    model = lmlab.from_pretrained(tmp_path / "whole")
    assert model.config.family == "awd-lstm" and list(model.heads) == ["clm"]


def test_pretrain_command_refuses_a_wrong_objective_before_any_work(shards, tmp_path):
    result = run_lmlab_here("pretrain", "--family", "awd-lstm", "--size", "tiny", "--objective",
                       "mlm", "--shards", shards, "--out", tmp_path / "run", "--steps", 2)
    assert_clean_refusal(result, "--family awd-lstm trains with --objective clm",
                         fix="--objective clm")
    assert not (tmp_path / "run").exists()


def _permutation_task_loss(config: RecurrentConfig, steps: int = 150) -> float:
    """Train on sequences where each token fixes the next (a random permutation: a bigram
    table) with Adam as lmlab's Trainer does; return the eval-mode loss on fresh sequences."""
    torch.manual_seed(0)
    vocab = config.vocab_size
    successor = torch.randperm(vocab - 1) + 1  # token t -> successor[t - 1]; 0 is padding

    def batch(rows: int = 16, length: int = 40) -> torch.Tensor:
        ids = torch.empty(rows, length, dtype=torch.long)
        ids[:, 0] = torch.randint(1, vocab, (rows,))
        for t in range(1, length):
            ids[:, t] = successor[ids[:, t - 1] - 1]
        return ids  # (B, T)

    model = build_model(config, ["clm"])
    optimizer = torch.optim.Adam(model.parameters(), lr=3e-3)
    for _ in range(steps):
        loss = model(ids := batch(), labels=ids).loss
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    model.eval()
    with torch.no_grad():
        return float(model(ids := batch(), labels=ids).loss)


def test_default_awd_lstm_leaves_the_unigram_plateau():
    """The defaults must learn under Adam: with the paper's uniform(-0.1, 0.1) embeddings (made
    for SGD at lr 30) and no softmax bias the stack sat on the unigram plateau (the mini on the
    default corpus, 1,000 steps; here about 3.3 nats after 150 steps, against log V = 5.3)."""
    loss = _permutation_task_loss(recurrent_preset("awd-lstm", "tiny", vocab_size=200))
    assert loss < 0.5 * torch.log(torch.tensor(200.0)).item()


def test_a_classifier_head_without_a_pooling_choice_pools_as_the_family_does():
    """"family" pooling on a recurrent model: ULMFiT's concat for an AWD-LSTM, the mean for
    ELMo; "cls" has no token to read and is refused with the fix named."""
    from lmlab.models.pooling import concat_pool
    from lmlab.models.task_heads import add_task_head

    model = build_model(tiny(), ["clm"]).eval()
    head = add_task_head(model, "sequence-classification", 3)
    assert head.style == "concat"
    ids = torch.randint(1, VOCAB, (2, 7))
    mask = torch.tensor([[1] * 7, [1] * 4 + [0] * 3])
    with torch.no_grad():
        hidden = model(ids, attention_mask=mask).last_hidden_state
        pooled = concat_pool(hidden, mask)  # (B, 3H)
        assert pooled.shape == (2, 3 * hidden.shape[-1])
        logits = model.run_head("sequence-classification", hidden, None, attention_mask=mask)
    assert logits.shape == (2, 3)
    elmo = build_model(recurrent_preset("elmo", "tiny", vocab_size=VOCAB), ["bilm"])
    assert add_task_head(elmo, "sequence-classification", 3).style == "mean"
    with pytest.raises(LmlabError, match="has no \\[CLS\\] token") as refused:
        add_task_head(build_model(tiny(), ["clm"]), "sequence-classification", 3, pooling="cls")
    assert "concat" in refused.value.fix
