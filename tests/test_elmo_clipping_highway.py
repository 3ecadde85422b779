"""ELMo's cell and projection clipping against a direct transcription of AllenNLP's
``LstmCellWithProjection`` (weights large enough that the clips bite), its highway layers
against transcriptions of AllenNLP's ``Highway`` and bilm-tf's ``high``, their initialisations,
and ELMo folders saved before the clipping fields (they load unclipped, as they were trained)."""

from __future__ import annotations

import json

import pytest
import torch
from conftest import assert_close_rounding
from torch.nn import functional as F

from lmlab.interop.recurrent import build_model, load_recurrent, save_recurrent
from lmlab.models.rnn.char_cnn import Highway
from lmlab.models.rnn.config import RecurrentConfig, recurrent_preset
from lmlab.models.rnn.layers import WeightDropLSTM
from lmlab.utils.errors import LmlabError


def allennlp_lstm_cell_with_projection(inputs, input_weight, state_weight, state_bias,
                                       projection_weight, cell_clip, proj_clip):
    """AllenNLP's LstmCellWithProjection.forward (allennlp/modules/lstm_cell_with_projection.py),
    transcribed for a full-length batch in eval mode (no dropout): gates i, f, memory, o."""
    batch, steps, _ = inputs.shape
    cell_size = state_weight.shape[0] // 4
    memory = inputs.new_zeros(batch, cell_size)
    state = inputs.new_zeros(batch, projection_weight.shape[0])
    outputs, memories = [], []
    for index in range(steps):
        projected_input = inputs[:, index] @ input_weight.T
        projected_state = state @ state_weight.T + state_bias
        gates = [projected_input[:, k * cell_size:(k + 1) * cell_size]
                 + projected_state[:, k * cell_size:(k + 1) * cell_size] for k in range(4)]
        input_gate, forget_gate = torch.sigmoid(gates[0]), torch.sigmoid(gates[1])
        memory_init, output_gate = torch.tanh(gates[2]), torch.sigmoid(gates[3])
        memory = input_gate * memory_init + forget_gate * memory
        if cell_clip:
            memory = torch.clamp(memory, -cell_clip, cell_clip)
        pre_projection_timestep_output = output_gate * torch.tanh(memory)
        state = pre_projection_timestep_output @ projection_weight.T
        if proj_clip:
            state = torch.clamp(state, -proj_clip, proj_clip)
        outputs.append(state)
        memories.append(memory)
    return torch.stack(outputs, 1), torch.stack(memories, 1)


@pytest.mark.numerics
@pytest.mark.parametrize("cell_clip,proj_clip", [(3.0, 3.0), (3.0, None), (None, 0.5)])
def test_clipped_lstm_is_allennlps_lstm_cell_with_projection(cell_clip, proj_clip):
    torch.manual_seed(0)
    # float64: 12 steps of saturated gates amplify float32 rounding in the gradients
    layer = WeightDropLSTM(6, 10, proj_size=4, cell_clip=cell_clip,
                           proj_clip=proj_clip).double().eval()
    with torch.no_grad():  # big weights and a forget gate near 1: the cell grows past 3
        for param in layer.lstm.parameters():
            param.mul_(8.0)
        layer.lstm.bias_ih_l0[10:20] += 20.0
    lstm = layer.lstm
    x = torch.randn(3, 12, 6, dtype=torch.float64, requires_grad=True)
    ours, (h, c) = layer(x)
    theirs, memories = allennlp_lstm_cell_with_projection(
        x, lstm.weight_ih_l0, lstm.weight_hh_l0, lstm.bias_ih_l0 + lstm.bias_hh_l0,
        lstm.weight_hr_l0, cell_clip, proj_clip)
    # the clips bite: without them the cell passes 3 and the outputs 0.5
    unclipped, raw = allennlp_lstm_cell_with_projection(
        x, lstm.weight_ih_l0, lstm.weight_hh_l0, lstm.bias_ih_l0 + lstm.bias_hh_l0,
        lstm.weight_hr_l0, None, None)
    assert float(raw.detach().abs().max()) > 3.5 and float(unclipped.detach().abs().max()) > 0.6
    assert not torch.allclose(theirs, unclipped)
    bound = {"terms": 16, "depth": 12, "scale": float(theirs.detach().abs().max())}
    assert_close_rounding(ours, theirs, **bound)
    assert_close_rounding(h[0], theirs[:, -1], **bound)
    assert_close_rounding(c[0], memories[:, -1], terms=16, depth=12,
                          scale=float(memories.detach().abs().max()))
    # the same gradients (the clamps pass none where they clip)
    ours_grad = torch.autograd.grad(ours.square().sum(), [x, lstm.weight_hh_l0])
    theirs_grad = torch.autograd.grad(theirs.square().sum(), [x, lstm.weight_hh_l0])
    for g, e in zip(ours_grad, theirs_grad):
        assert_close_rounding(g, e, terms=16, depth=24, scale=float(e.abs().max()))
    # unclipped, the layer is torch's fused LSTM
    plain = WeightDropLSTM(6, 10, proj_size=4).double().eval()
    plain.load_state_dict(layer.state_dict())
    with torch.no_grad():
        assert_close_rounding(plain(x)[0], unclipped, terms=16, depth=12,
                              scale=float(unclipped.detach().abs().max()))


def allennlp_highway(x, layers):
    """AllenNLP's Highway.forward (allennlp/modules/highway.py), its activation relu."""
    current_input = x
    for weight, bias in layers:
        projected_input = current_input @ weight.T + bias
        linear_part = current_input
        nonlinear_part, gate = projected_input.chunk(2, dim=-1)
        nonlinear_part = F.relu(nonlinear_part)
        gate = torch.sigmoid(gate)
        current_input = gate * linear_part + (1 - gate) * nonlinear_part
    return current_input


def bilm_tf_highway(x, layers):
    """bilm-tf's ``high`` (bilm/training.py): ``carry_gate * relu(x W_tr + b_tr) +
    (1 - carry_gate) * x``, ``carry_gate = sigmoid(x W_carry + b_carry)``."""
    for w_carry, b_carry, w_transform, b_transform in layers:
        carry_gate = torch.sigmoid(x @ w_carry + b_carry)
        transform_gate = F.relu(x @ w_transform + b_transform)
        x = carry_gate * transform_gate + (1.0 - carry_gate) * x
    return x


@pytest.mark.numerics
def test_highway_is_allennlps_and_bilm_tfs():
    torch.manual_seed(1)
    width = 12
    ours = Highway(width, 2)
    with torch.no_grad():
        for layer in ours.layers:
            layer.bias.normal_()  # moved off its initialisation
    x = torch.randn(5, width)
    with torch.no_grad():
        got = ours(x)
        expected = allennlp_highway(x, [(layer.weight, layer.bias) for layer in ours.layers])
        assert_close_rounding(got, expected, terms=width, depth=4)
        # bilm-tf's parameters in our layout: its gate scales the transform, ours the input, so
        # our gate is minus its carry pre-activation
        tf_layers = [(-layer.weight[width:].T, -layer.bias[width:], layer.weight[:width].T,
                      layer.bias[:width]) for layer in ours.layers]
        assert_close_rounding(got, bilm_tf_highway(x, tf_layers), terms=width, depth=4)


def test_highway_initialisations():
    torch.manual_seed(2)
    width = 256
    allennlp, bilm_tf = Highway(width, 2), Highway(width, 2, init="bilm-tf")
    for layer in allennlp.layers:  # AllenNLP: layer.bias[input_dim:].data.fill_(1), the rest torch's
        assert torch.equal(layer.bias[width:], torch.ones(width))  # exact: filled
        assert float(layer.bias[:width].detach().abs().max()) > 0
    for layer in bilm_tf.layers:  # b_carry -2 (our gate +2), b_transform 0, N(0, 1/width)
        assert torch.equal(layer.bias, torch.cat([torch.zeros(width), torch.full((width,), 2.0)]))  # exact: filled
        assert float(layer.weight.std()) == pytest.approx(width ** -0.5, rel=0.02)  # tol: 131k draws
        assert float(layer.weight.mean()) == pytest.approx(0.0, abs=1e-3)  # tol: 131k draws
    with pytest.raises(LmlabError, match="unknown highway initialisation 'tf'"):
        RecurrentConfig(family="elmo", highway_init="tf")
    with pytest.raises(LmlabError, match="cell_clip 0 is not positive"):
        RecurrentConfig(family="elmo", cell_clip=0)


def test_presets_clip_and_old_folders_load_unclipped(tmp_path):
    """Every ELMo preset clips at 3.0; a folder saved before the fields (no cell_clip,
    proj_clip, highway_init in config.json) loads without clipping, giving the outputs it gave
    (torch's fused LSTM); written into config.json, the fields turn clipping on."""
    for size in ("paper", "small", "mini", "tiny"):
        config = recurrent_preset("elmo", size, vocab_size=40)
        assert (config.cell_clip, config.proj_clip, config.highway_init) == (3.0, 3.0, "allennlp")
    torch.manual_seed(3)
    old_config = recurrent_preset("elmo", "tiny", vocab_size=40, cell_clip=None, proj_clip=None)
    table = torch.randint(1, 200, (40, old_config.max_chars), dtype=torch.int16)
    old = build_model(old_config, ["bilm"], char_table=table).eval()
    with torch.no_grad():  # cells past 3, so clipping would change the outputs
        for layer in [*old.forward_layers, *old.backward_layers]:
            layer.lstm.bias_ih_l0[32:64] += 20.0
            layer.lstm.weight_ih_l0.mul_(6.0)
    save_recurrent(old, tmp_path / "old")
    path = tmp_path / "old" / "config.json"
    values = json.loads(path.read_text())
    for key in ("cell_clip", "proj_clip", "highway_init"):
        del values[key]
    path.write_text(json.dumps(values))
    ids = torch.randint(3, 40, (2, 9))
    loaded = load_recurrent(tmp_path / "old").eval()
    assert (loaded.config.cell_clip, loaded.config.proj_clip) == (None, None)
    with torch.no_grad():
        expected = old(ids).last_hidden_state
        assert torch.equal(loaded(ids).last_hidden_state, expected)  # exact: same weights, kernel
        path.write_text(json.dumps({**values, "cell_clip": 3.0, "proj_clip": 3.0}))
        clipped = load_recurrent(tmp_path / "old").eval()  # clipping asked for in config.json
        assert clipped.forward_layers[0].cell_clip == 3.0
        assert not torch.allclose(clipped(ids).last_hidden_state, expected, atol=1e-3)
