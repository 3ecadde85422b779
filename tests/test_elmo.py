"""ELMo (lmlab.models.rnn): characters of word pieces, the biLSTM against torch's bidirectional
nn.LSTM (packed sequences) on the same weights, the residual connection, the bilm loss with its
shared softmax, the scalar mix, ELMo features in feature extraction, probing and the feature
recipe, `lmlab pretrain --family elmo --objective bilm`, and save -> reload in a fresh process."""

from __future__ import annotations

import json
import math
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
from torch.nn.utils.rnn import pack_padded_sequence, pad_packed_sequence

from lmlab.interop.recurrent import build_model
from lmlab.models.pooling import scalar_mix
from lmlab.models.rnn.char_cnn import BOC, BOW, EOW, PAD, SPECIAL, char_table, token_chars
from lmlab.models.rnn.config import check_family_objective, recurrent_preset
from lmlab.utils.errors import LmlabError

VOCAB = 40
TOKENS = ["[PAD]", "[CLS]", "[SEP]", "ing", "##ing", "run", "##s", "the"] + [
    f"w{i}" for i in range(VOCAB - 8)]


def tiny_elmo(heads=("bilm",), **overrides):
    torch.manual_seed(0)
    config = recurrent_preset("elmo", "tiny", vocab_size=VOCAB, **overrides)
    table = char_table(TOKENS, {"[PAD]", "[CLS]", "[SEP]"}, config.max_chars)
    table[0] = PAD  # the padding token: no characters at all
    return build_model(config, list(heads), char_table=table)


@pytest.fixture(scope="module")
def shards(tmp_path_factory):
    return kjv_shards(tmp_path_factory, 12, 2)


def test_characters_of_word_pieces():
    assert token_chars("ing", False, 8) == [BOW, 106, 111, 104, EOW, PAD, PAD, PAD]
    assert token_chars("##ing", False, 8)[:5] == [BOC, 106, 111, 104, EOW]  # a continuation
    assert token_chars("[SEP]", True, 8)[0] == SPECIAL
    assert token_chars("abcdefghij", False, 6) == [BOW, 98, 99, 100, 101, EOW]  # truncated
    assert token_chars("é", False, 5)[1:3] == [0xC3 + 1, 0xA9 + 1]  # UTF-8 bytes
    # vocabularies that mark word starts (byte-level BPE, SentencePiece): an unmarked piece is a
    # continuation, so "\u0120the" and "the" (two tokens) keep two character rows
    for marker in ("\u0120", "\u2581"):
        table = char_table(["<s>", marker + "the", "the", marker, "ing"], {"<s>"}, 8)
        assert len({tuple(row) for row in table.tolist()}) == 5
        assert table[1, 0] == BOW and table[2, 0] == BOC and table[4, 0] == BOC
        assert table[1, 1:4].tolist() == table[2, 1:4].tolist()  # the same characters


@pytest.mark.numerics
def test_token_vectors_are_functions_of_the_token_and_pieces_differ_from_words():
    model = tiny_elmo().eval()
    ids = torch.tensor([[5, 3, 4, 5, 3]])  # run ing ##ing run ing
    with torch.no_grad():
        tokens = model.token_encoder(ids)[0]
    # another position of the batch is another row of each product: the same value up to the
    # rounding of the sums (char convolution 8 x 3, highway and projection over 32 filters)
    bound = {"terms": 32, "depth": 4, "scale": float(tokens.abs().max())}
    assert_close_rounding(tokens[3], tokens[0], **bound)
    assert_close_rounding(tokens[4], tokens[1], **bound)
    with pytest.raises(AssertionError):  # "ing" is not "##ing"
        assert_close_rounding(tokens[2], tokens[1], **bound)


def _bidirectional_reference(model, layer: int) -> nn.LSTM:
    """torch's bidirectional projected LSTM holding the two directions' weights of ``layer``."""
    fwd, bwd = model.forward_layers[layer].lstm, model.backward_layers[layer].lstm
    ref = nn.LSTM(fwd.input_size, fwd.hidden_size, batch_first=True, bidirectional=True,
                  proj_size=fwd.proj_size)
    state = {f"{name}_reverse" if name.endswith("_l0") else name: value
             for name, value in bwd.state_dict().items()}
    ref.load_state_dict({**fwd.state_dict(), **state})
    return ref


@pytest.mark.numerics
def test_bilstm_is_torch_bidirectional_lstm_with_residual_on_padded_rows():
    """Layer 1 is nn.LSTM(bidirectional=True) over packed sequences (torch handles the padding
    and the reversal); in layer 2 each direction reads its own half of layer 1 and adds it to
    its output (the residual connection)."""
    model = tiny_elmo().eval()
    mask = torch.tensor([[1] * 7, [1] * 4 + [0] * 3, [1] * 2 + [0] * 5])
    ids = torch.randint(3, VOCAB, (3, 7)).masked_fill(mask == 0, 0)
    lengths, real, half = mask.sum(1), mask.bool(), 16

    def run(reference: nn.LSTM, inputs: torch.Tensor) -> torch.Tensor:
        packed = pack_padded_sequence(inputs, lengths, batch_first=True, enforce_sorted=False)
        return pad_packed_sequence(reference(packed)[0], batch_first=True, total_length=7)[0]

    with torch.no_grad():
        states = model(ids, attention_mask=mask, output_hidden_states=True).hidden_states
        tokens = model.token_encoder(ids)
        assert torch.equal(states[0], torch.cat([tokens, tokens], -1))  # exact: the same tensor twice
        first = run(_bidirectional_reference(model, 0), tokens)  # (B, T, 2P)
        second = _bidirectional_reference(model, 1)
        forward_in, backward_in = first[..., :half], first[..., half:]
        top = torch.cat([run(second, forward_in)[..., :half] + forward_in,
                         run(second, backward_in)[..., half:] + backward_in], -1)
    for ours, theirs in ((states[1], first), (states[2], top)):
        assert_close_rounding(ours[real], theirs[real], terms=64, depth=14,
                              scale=float(theirs.abs().max()))


def test_directions_read_only_their_side():
    """The forward half at t is unchanged by tokens after t, the backward half by tokens
    before t."""
    model = tiny_elmo().eval()
    ids = torch.randint(3, VOCAB, (1, 8))
    changed = ids.clone()
    changed[0, 5] = 3 if ids[0, 5] != 3 else 4
    with torch.no_grad():
        a, b = model(ids).last_hidden_state[0], model(changed).last_hidden_state[0]
    half = a.shape[-1] // 2
    assert torch.equal(a[:5, :half], b[:5, :half]) and not torch.equal(a[5:, :half], b[5:, :half])  # exact: same rows, same inputs
    assert torch.equal(a[6:, half:], b[6:, half:]) and not torch.equal(a[:6, half:], b[:6, half:])  # exact: same rows, same inputs


@pytest.mark.numerics
def test_bilm_loss_shares_the_softmax_and_averages_the_directions():
    from lmlab.objectives.bilm import BidirectionalLM
    from lmlab.objectives.special_tokens import SpecialTokens

    model = tiny_elmo().eval()
    with torch.no_grad():  # a non-zero softmax bias, so the fused loss must add it
        model.heads["bilm"].decoder.bias.normal_()
    objective = BidirectionalLM(SpecialTokens(vocab_size=VOCAB, cls_id=1, sep_id=2, pad_id=0))
    ids = torch.randint(3, VOCAB, (2, 6))
    mask = torch.tensor([[1] * 6, [1] * 4 + [0] * 2])
    batch = objective.corrupt({"input_ids": ids, "attention_mask": mask}, torch.Generator())
    assert (batch["labels"][1, 4:] == -100).all()
    result = objective.compute_loss(model, batch)
    logits = model(batch["input_ids"], attention_mask=batch["attention_mask"]).logits
    assert logits.shape == (2, 6, 2, VOCAB)  # one softmax, both directions
    assert sorted(n for n, _ in model.named_parameters() if n.startswith("heads.")) == [
        "heads.bilm.decoder.bias", "heads.bilm.decoder.weight"]  # one softmax, with its bias
    # only real positions predict: the forward LM at t scores t+1, the backward LM t-1
    forward = nn.functional.cross_entropy(
        logits[:, :-1, 0].reshape(-1, VOCAB),
        ids[:, 1:].masked_fill(mask[:, 1:] == 0, -100).reshape(-1))
    backward = nn.functional.cross_entropy(
        logits[:, 1:, 1].reshape(-1, VOCAB),
        ids[:, :-1].masked_fill(mask[:, 1:] == 0, -100).reshape(-1))
    assert_close_rounding(result.loss, (forward + backward) / 2, terms=VOCAB, scale=5.0)
    assert_close_rounding(torch.tensor(result.metrics["bilm_forward_loss"]), forward,
                          terms=VOCAB, scale=5.0)
    assert_close_rounding(torch.tensor(result.metrics["bilm_backward_loss"]), backward,
                          terms=VOCAB, scale=5.0)
    head_loss = model(ids, attention_mask=mask, labels=batch["labels"]).loss
    assert_close_rounding(head_loss, (forward + backward) / 2, terms=VOCAB, scale=5.0)
    # the padded row's backward loss is its own, computed without the padding
    short = objective.corrupt({"input_ids": ids[1:, :4], "attention_mask": mask[1:, :4]},
                              torch.Generator())
    alone = objective.compute_loss(model, short).metrics["bilm_backward_loss"]
    row = nn.functional.cross_entropy(logits[1, 1:4, 1], ids[1, :3])
    assert_close_rounding(torch.tensor(alone), row, terms=VOCAB, scale=5.0)


@pytest.mark.numerics
def test_scalar_mix_and_its_refusals():
    model = tiny_elmo().eval()
    ids = torch.randint(3, VOCAB, (2, 5))
    with torch.no_grad():
        states = model(ids, output_hidden_states=True).hidden_states
    weights = torch.tensor([0.5, -1.0, 2.0])
    mixed = scalar_mix(states, weights, gamma=0.7)
    w = torch.softmax(weights, 0)
    assert_close_rounding(mixed, 0.7 * (w[0] * states[0] + w[1] * states[1] + w[2] * states[2]),
                          terms=3)
    with pytest.raises(LmlabError, match="scalar mix has 4 weights but the model gives 3"):
        scalar_mix(states, torch.zeros(4))


def test_elmo_features_in_extraction_probing_cache_and_bad_layer(tmp_path):
    from lmlab.analysis.features import FeatureExtractor
    from lmlab.analysis.layer_cache import WordRequest, cached_word_features
    from lmlab.models.pooling import ScalarMix
    from lmlab.tokenization.tokenizer import Tokenizer
    from lmlab.utils.catalog import minilm_dir

    tokenizer = Tokenizer.from_pretrained(minilm_dir())
    config = recurrent_preset("elmo", "tiny", vocab_size=len(tokenizer),
                              pad_token_id=tokenizer.pad_token_id)
    model = build_model(config, [], tokenizer=tokenizer).eval()
    texts = ["The vase broke.", "Dawn broke over the quiet hills."]
    encoded = FeatureExtractor(model, tokenizer, layer="all").encode(texts)
    assert encoded[1].vectors.shape[1:] == (3, 32)  # token layer + 2 biLSTM layers, 2 x 16
    mix = ScalarMix(3)  # the feature recipe's learned mix, as ELMo's task representation
    words, vectors = encoded[0].word_vectors("mean")
    assert words == ["The", "vase", "broke", "."] and mix(vectors).shape == (4, 32)
    alone = FeatureExtractor(model, tokenizer, layer=-1).encode(texts[:1])[0].vectors
    assert_close_rounding(alone, encoded[0].vectors[:, -1], terms=64, depth=10, scale=2.0)
    features = cached_word_features(model, tokenizer, [WordRequest(texts[0], [(4, 8)])],
                                    tmp_path / "cache")
    assert features.array.shape == (1, 3, 32)
    with pytest.raises(LmlabError, match="layer 5 does not exist .the model has 2 layers"):
        FeatureExtractor(model, tokenizer, layer=5).encode(texts)


def test_objective_family_mismatches_are_refused():
    with pytest.raises(LmlabError, match="--family elmo trains with --objective bilm, not clm"):
        check_family_objective("elmo", "clm")
    with pytest.raises(LmlabError, match="bilm objective trains ELMo's two LSTM directions"):
        check_family_objective("bert", "bilm")
    with pytest.raises(LmlabError, match="has no 'clm' head"):
        tiny_elmo(heads=("clm",))
    with pytest.raises(LmlabError, match="character filter of width 3 is wider than max_chars"):
        recurrent_preset("elmo", "tiny", max_chars=2)


def test_pretrain_elmo_with_bilm_then_reload_in_a_fresh_process(shards, tmp_path):
    import lmlab

    lmlab.pretrain(lmlab.PretrainConfig.from_sections(  # what `lmlab pretrain` runs
        None, family="elmo", size="tiny", objective="bilm", shards=str(shards),
        out=str(tmp_path / "elmo"), max_steps=3, batch_size=4, seq_len=24, eval_every=3,
        precision="fp32", progress=False))
    config = json.loads((tmp_path / "elmo" / "model" / "config.json").read_text())
    assert config["lmlab_recurrent"] == "elmo" and config["heads"] == ["bilm"]
    metrics = [json.loads(line) for line in (tmp_path / "elmo" / "metrics.jsonl").open()]
    evals = [m for m in metrics if m["kind"] == "eval"]
    assert evals and evals[-1]["eval_perplexity"] > 1
    assert "eval_bilm_backward_perplexity" in evals[-1]
    # each perplexity is exp(mean loss) over the validation batches, not the mean of each
    # batch's exp (Jensen: larger whenever the batches' losses differ)
    for name in ("bilm_forward", "bilm_backward", "bilm"):
        assert evals[-1][f"eval_{name}_perplexity"] == pytest.approx(
            math.exp(evals[-1][f"eval_{name}_loss"]), rel=1e-9)
    assert "perplexity" in (tmp_path / "elmo" / "report.md").read_text()
    assert (tmp_path / "elmo" / "cost.md").is_file()  # FLOPs counted by the recurrent config

    model = lmlab.from_pretrained(tmp_path / "elmo").eval()
    ids = torch.randint(1000, 2000, (2, 6))
    with torch.no_grad():
        expected = model(ids).last_hidden_state
    code = ("import sys, json, torch, lmlab\n"
            "m = lmlab.from_pretrained(sys.argv[1]).eval()\n"
            "ids = torch.tensor(json.loads(sys.argv[2]))\n"
            "with torch.no_grad():\n"
            "    print(json.dumps(m(ids).last_hidden_state.tolist()))\n")
    out = subprocess.run([sys.executable, "-c", code, str(tmp_path / "elmo"),
                          json.dumps(ids.tolist())], capture_output=True, text=True, check=True)
    assert_close_rounding(torch.tensor(json.loads(out.stdout)), expected, terms=64, depth=12,
                          scale=float(expected.abs().max()))


def test_pretrain_command_refuses_clm_for_elmo_before_any_work(shards, tmp_path):
    result = run_lmlab_here("pretrain", "--family", "elmo", "--size", "tiny", "--objective", "clm",
                       "--shards", shards, "--out", tmp_path / "run", "--steps", 2)
    assert_clean_refusal(result, "--family elmo trains with --objective bilm",
                         fix="--objective bilm")
    assert not (tmp_path / "run").exists()


def test_elmo_in_contextual_neighbours_and_the_feature_recipe(tmp_path):
    """ELMo's layers where contextual features are used: a neighbours index over every layer,
    and the feature recipe's learned scalar mix, whose run reloads as a FeatureClassifier."""
    import shutil
    from dataclasses import replace

    import lmlab
    from lmlab.analysis.neighbours import ContextualIndex, StaticWordVectors
    from lmlab.finetune.feature_based import FeatureClassifier
    from lmlab.finetune.runner import finetune, predict
    from lmlab.tasks import load_builtin_task
    from lmlab.tokenization.tokenizer import Tokenizer
    from lmlab.utils.catalog import minilm_dir

    tokenizer = Tokenizer.from_pretrained(minilm_dir())
    config = recurrent_preset("elmo", "tiny", vocab_size=len(tokenizer),
                              pad_token_id=tokenizer.pad_token_id)
    model = build_model(config, ["bilm"], tokenizer=tokenizer)
    folder = lmlab.save_pretrained(model, tmp_path / "elmo")
    for name in ("tokenizer.json", "tokenizer_config.json", "vocab.txt",
                 "special_tokens_map.json"):
        if (minilm_dir() / name).exists():
            shutil.copy(minilm_dir() / name, folder / name)
    sentences = ["The vase broke.", "Dawn broke over the hills.", "The glass broke apart.",
                 "He broke the record."]
    index = ContextualIndex.build(model.eval(), tokenizer, sentences, "broke", layer="all")
    by_layer = index.query_by_layer("The cup broke.", k=2)
    assert len(by_layer) == 3 and all(len(found) == 2 for found in by_layer)
    static = StaticWordVectors(model, tokenizer)  # ELMo's context-free layer: its char CNN
    assert static.table.shape == (len(tokenizer), 16)
    assert_close_rounding(static.vector("vase"), model.token_encoder(
        torch.tensor([tokenizer.encode("vase", add_special_tokens=False)]))[0].mean(0), terms=4)
    assert len(static.nearest_words("broke", k=3)) == 3

    task = load_builtin_task("fortunes-topic")
    task = replace(task, splits={"train": task.split("train")[:32],
                                 "dev": task.split("dev")[:16], "test": task.split("test")[:16]})
    result = finetune(task, folder, tmp_path / "run", recipe="feature", epochs=1,
                      show_progress=False, eval_splits=("dev",))
    assert "dev" in result
    loaded = lmlab.from_pretrained(tmp_path / "run")
    assert isinstance(loaded, FeatureClassifier)
    saved = [json.loads(line)["prediction"]
             for line in (tmp_path / "run" / "predictions-dev.jsonl").open()]
    assert predict(loaded, tokenizer, task, "dev") == saved
