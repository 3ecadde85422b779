"""Encoder-decoder checkpoints (BART, Marian = the original Transformer's layout, T5 v1.0 and
v1.1) against transformers (test reference): forward parity both ways on padded batches,
generation parity (greedy and beam search, with and without the cache) on models trained for a
few seconds to copy their input, a fresh process loading what lmlab saved, and the refusals.

Tolerance: float32 rounding of the compared values' size through the stacks
(``rounding_tolerance``, tests/conftest.py) and, as the issue asks, at most 1e-4 absolute.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest
import torch
from conftest import assert_close_rounding, rounding_tolerance

import lmlab
from lmlab.generation.generate import generate
from lmlab.models.families import get_family
from lmlab.models.seq2seq import EncoderDecoderModel
from lmlab.utils.errors import LmlabError

transformers = pytest.importorskip("transformers")

SHARED = dict(d_model=32, encoder_layers=2, decoder_layers=3, encoder_attention_heads=4,
              decoder_attention_heads=4, encoder_ffn_dim=64, decoder_ffn_dim=64, vocab_size=64,
              max_position_embeddings=40)
T5_SHARED = dict(d_model=32, d_kv=8, d_ff=64, num_layers=2, num_decoder_layers=3, num_heads=4,
                 vocab_size=64, relative_attention_num_buckets=8,
                 relative_attention_max_distance=20, decoder_start_token_id=0)


def _bart(**more):
    return transformers.BartConfig(**{**SHARED, **more}, scale_embedding=True)


def _marian(**more):
    # bad_words_ids: OPUS-MT checkpoints never generate the pad token
    return transformers.MarianConfig(**{**SHARED, **more}, pad_token_id=63,
                                     decoder_start_token_id=63, eos_token_id=0,
                                     activation_function="swish", scale_embedding=True,
                                     bad_words_ids=[[63]])


def _t5(**more):
    return transformers.T5Config(**{**T5_SHARED, **more})


def _t5_v11(**more):
    return transformers.T5Config(**{**T5_SHARED, **more}, feed_forward_proj="gated-gelu",
                                 tie_word_embeddings=False)


# case -> (HF class, config factory, pad id, eos id)
CASES = {
    "bart": ("BartForConditionalGeneration", _bart, 1, 2),
    "marian": ("MarianMTModel", _marian, 63, 0),
    "marian-unshared": ("MarianMTModel",
                        lambda **more: _marian(share_encoder_decoder_embeddings=False, **more),
                        63, 0),
    "t5": ("T5ForConditionalGeneration", _t5, 0, 1),
    "t5-v1.1": ("T5ForConditionalGeneration", _t5_v11, 0, 1),
}


def _padded(rows: list[int], width: int, pad: int, generator: torch.Generator
            ) -> tuple[torch.Tensor, torch.Tensor]:
    """Random ids 3..59 in rows of the given lengths, right-padded with ``pad``."""
    ids = torch.randint(3, 60, (len(rows), width), generator=generator)
    mask = torch.zeros(len(rows), width, dtype=torch.long)
    for row, length in enumerate(rows):
        mask[row, :length] = 1
    return ids.masked_fill(mask == 0, pad), mask


def _batch(pad: int) -> dict[str, torch.Tensor]:
    generator = torch.Generator().manual_seed(1)
    src, src_mask = _padded([9, 6, 3], 9, pad, generator)
    tgt, tgt_mask = _padded([7, 4, 2], 7, pad, generator)
    return {"input_ids": src, "attention_mask": src_mask, "decoder_input_ids": tgt,
            "decoder_attention_mask": tgt_mask}


def _check_close(got: torch.Tensor, ref: torch.Tensor, where: torch.Tensor, what: str) -> float:
    """Max |got - ref| at the real positions ``where`` (B, T), within rounding and 1e-4."""
    diff = (got[where].float() - ref[where].float()).abs().max().item()
    scale = float(ref[where].abs().max())
    tolerance = min(rounding_tolerance(terms=64, depth=6, scale=scale), 1e-4)
    assert diff <= tolerance, f"{what}: max |diff| {diff:.3g} > {tolerance:.3g}"
    return diff


@pytest.fixture(scope="module")
def hf_folders(tmp_path_factory):
    """One randomly initialised, perturbed transformers checkpoint per case."""
    folders = {}
    generator = torch.Generator().manual_seed(2)
    for case, (class_name, make_config, _, _) in CASES.items():
        torch.manual_seed(0)
        model = getattr(transformers, class_name)(make_config()).eval()
        with torch.no_grad():  # unit norms and zero biases would hide a swapped tensor
            for param in model.parameters():
                param.add_(torch.randn(param.shape, generator=generator) * 0.05)
        folder = tmp_path_factory.mktemp(case)
        model.save_pretrained(folder)
        folders[case] = folder
    return folders


def _compare(ours, theirs, batch) -> None:
    with torch.no_grad():
        ref, got = theirs(**batch), ours(**batch)
    _check_close(got.logits, ref.logits, batch["decoder_attention_mask"].bool(), "logits")
    _check_close(got.encoder_last_hidden_state, ref.encoder_last_hidden_state,
                 batch["attention_mask"].bool(), "encoder states")


@pytest.mark.numerics
@pytest.mark.parametrize("case", list(CASES))
def test_parity_hf_to_lmlab(case, hf_folders):
    class_name, _, pad, _ = CASES[case]
    ours = lmlab.from_pretrained(hf_folders[case])
    assert isinstance(ours, EncoderDecoderModel) and tuple(ours.heads) == ("seq2seq-lm",)
    assert ours.config.num_decoder_layers == 3 and ours.config.num_hidden_layers == 2
    shared = ours.get_input_embeddings().weight is ours.get_target_embeddings().weight
    assert shared == (case != "marian-unshared")
    theirs = getattr(transformers, class_name).from_pretrained(
        hf_folders[case], attn_implementation="eager").eval()
    _compare(ours, theirs, _batch(pad))


@pytest.mark.parametrize("case", list(CASES))
def test_parity_lmlab_to_hf(case, hf_folders, tmp_path):
    """What lmlab saves loads in transformers (the task class and AutoModel) with the same
    outputs, and the same tensors come back."""
    class_name, _, pad, _ = CASES[case]
    ours = lmlab.from_pretrained(hf_folders[case])
    saved = lmlab.save_pretrained(ours, tmp_path / "saved")
    assert json.loads((saved / "config.json").read_text())["architectures"] == [class_name]
    theirs = getattr(transformers, class_name).from_pretrained(saved).eval()
    batch = _batch(pad)
    _compare(ours, theirs, batch)
    bare = transformers.AutoModel.from_pretrained(saved).eval()
    with torch.no_grad():
        hidden = bare(**batch).last_hidden_state
        got = ours(**batch).last_hidden_state
    _check_close(got, hidden, batch["decoder_attention_mask"].bool(), "AutoModel decoder states")


def _copy_batch(generator: torch.Generator, pad: int, eos: int, size: int = 32):
    """Sources of 3..7 random ids, each target the source followed by eos (right-padded)."""
    lengths = torch.randint(3, 8, (size,), generator=generator).tolist()
    src, mask = _padded(lengths, 8, pad, generator)
    labels = torch.full((size, 9), -100, dtype=torch.long)
    for row, length in enumerate(lengths):
        labels[row, :length] = src[row, :length]
        labels[row, length] = eos
    return src, mask, labels


@pytest.fixture(scope="module")
def copy_models(tmp_path_factory):
    """Per family, lmlab's model trained for 300 steps towards copying its input, saved:
    generation then depends on the source (a random model repeats one token whatever it
    reads)."""
    folders = {}
    for case in ("bart", "marian", "t5"):
        class_name, make_config, pad, eos = CASES[case]
        torch.manual_seed(0)
        folder = tmp_path_factory.mktemp(f"{case}-random")
        # equal stacks: transformers' T5 cache assumes them when generating
        stacks = ({"num_decoder_layers": 2, "dropout_rate": 0.0} if case == "t5"
                  else {"decoder_layers": 2, "dropout": 0.0})
        getattr(transformers, class_name)(make_config(**stacks)).save_pretrained(folder)
        model = lmlab.from_pretrained(folder).train()
        optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
        generator = torch.Generator().manual_seed(3)
        for _ in range(300):
            src, mask, labels = _copy_batch(generator, pad, eos)
            loss = model(input_ids=src, attention_mask=mask, labels=labels).loss
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
        folders[case] = lmlab.save_pretrained(model.eval(), tmp_path_factory.mktemp(f"{case}-copy"))
    return folders


def _up_to_eos(sequences: torch.Tensor, eos: int) -> list[list[int]]:
    """Each row up to its first end-of-sequence token after the start token: what follows is
    filler, and transformers' beam search fills with eos where the pad id is 0 (it tests
    ``pad_token_id or eos_token_id``), lmlab with the pad id."""
    rows = []
    for row in sequences.tolist():
        end = row.index(eos, 1) + 1 if eos in row[1:] else len(row)
        rows.append(row[:end])
    return rows


GENERATION_SETTINGS = [dict(num_beams=1), dict(num_beams=4),
                       dict(num_beams=5, length_penalty=0.6, early_stopping=True),
                       dict(num_beams=1, no_repeat_ngram_size=1),
                       dict(num_beams=4, no_repeat_ngram_size=2)]


@pytest.mark.parametrize("case", ["bart", "marian", "t5"])
def test_generation_matches_transformers(case, copy_models):
    class_name, _, pad, eos = CASES[case]
    ours = lmlab.from_pretrained(copy_models[case])
    theirs = getattr(transformers, class_name).from_pretrained(copy_models[case]).eval()
    src, mask, labels = _copy_batch(torch.Generator().manual_seed(9), pad, eos, size=6)
    for settings in GENERATION_SETTINGS:
        for use_cache in (True, False):
            # each side with its checkpoint's own settings (BART and Marian force </s> at
            # the last step)
            ref = theirs.generate(input_ids=src, attention_mask=mask, max_new_tokens=10,
                                  do_sample=False, use_cache=use_cache, **settings)
            got = generate(ours, src, mask, max_new_tokens=10, use_cache=use_cache, **settings)
            assert _up_to_eos(got, eos) == _up_to_eos(ref, eos), (settings, use_cache)
    # several hypotheses per input, best first, as transformers returns them
    ref = theirs.generate(input_ids=src, attention_mask=mask, max_new_tokens=10, num_beams=4,
                          num_return_sequences=3, do_sample=False)
    got = generate(ours, src, mask, max_new_tokens=10, num_beams=4, num_return_sequences=3)
    assert got.shape[0] == 3 * len(src)
    assert _up_to_eos(got, eos) == _up_to_eos(ref, eos)
    # what was generated depends on the source (a random model repeats one token)
    got = generate(ours, src, mask, max_new_tokens=10)
    assert len({tuple(row) for row in got.tolist()}) >= 4, got


def test_saved_model_loads_in_a_fresh_process(hf_folders, tmp_path):
    ours = lmlab.from_pretrained(hf_folders["bart"])
    folder = lmlab.save_pretrained(ours, tmp_path / "bart")
    batch = _batch(1)
    with torch.no_grad():
        expected = ours(**batch).logits[0, :3].tolist()
    code = textwrap.dedent("""
        import json, sys, torch, lmlab
        model = lmlab.from_pretrained(sys.argv[1])
        batch = {k: torch.tensor(v) for k, v in json.loads(sys.argv[2]).items()}
        with torch.no_grad():
            print(json.dumps(model(**batch).logits[0, :3].tolist()))
    """)
    result = subprocess.run([sys.executable, "-c", code, str(folder),
                             json.dumps({k: v.tolist() for k, v in batch.items()})],
                            capture_output=True, text=True, check=True)
    got = torch.tensor(json.loads(result.stdout))
    assert torch.equal(got, torch.tensor(expected))  # exact: the same weights and batch


def test_mismatched_vocabularies_are_refused(tmp_path):
    config = _marian(decoder_vocab_size=80, share_encoder_decoder_embeddings=False)
    transformers.MarianMTModel(config).save_pretrained(tmp_path)
    with pytest.raises(LmlabError, match="separate source and target vocabularies"):
        lmlab.from_pretrained(tmp_path)


def test_asymmetric_stacks_are_refused(tmp_path):
    transformers.BartForConditionalGeneration(_bart(decoder_ffn_dim=128)).save_pretrained(tmp_path)
    with pytest.raises(LmlabError, match="encoder_ffn_dim=64 but decoder_ffn_dim=128"):
        lmlab.from_pretrained(tmp_path)


@pytest.mark.parametrize("family", ["bart", "marian", "t5"])
def test_config_parameter_count_matches_the_model(family):
    spec = get_family(family)
    size = {"bart": "base", "marian": "base", "t5": "small"}[family]
    config = spec.config(**spec.sizes[size])
    config.vocab_size = 1000  # keeps the model small; every other size is the preset's
    config.pad_token_id = min(config.pad_token_id, 999)
    assert config.num_parameters() == EncoderDecoderModel(config).num_parameters()
    if family == "marian":  # a table per side
        config.share_embeddings = False
        assert config.num_parameters() == EncoderDecoderModel(config).num_parameters()


def test_t5_feed_forward_names_read_as_transformers_reads_them():
    from lmlab.models.families.t5 import feed_forward, projection_name

    assert feed_forward("relu") == ("mlp", "relu")
    assert feed_forward("gelu") == ("mlp", "gelu")  # exact GELU: only gated-gelu is tanh
    assert feed_forward("gated-gelu") == ("glu", "gelu_new")
    assert feed_forward("gated-silu") == ("glu", "silu")
    for name in ("relu", "gelu", "gated-gelu", "gated-silu"):
        assert projection_name(*feed_forward(name)) == name
    for bad in ("wide-relu", "gated-gelu-x", "gated-nope"):
        with pytest.raises(LmlabError, match="not supported"):
            feed_forward(bad)
    assert projection_name("mlp", "gelu_new") == "gelu_new"
    with pytest.raises(LmlabError, match="cannot express"):
        projection_name("glu", "gelu")  # "gated-gelu" means the tanh GELU


def test_t5_pad_row_trains_and_scaling_follows_tying(tmp_path):
    from lmlab.interop import hf

    spec = get_family("t5")
    t5 = EncoderDecoderModel(spec.config(**spec.sizes["tiny"], vocab_size=50))
    assert t5.get_input_embeddings().padding_idx is None  # decoding starts from <pad>
    bart = EncoderDecoderModel(get_family("bart").config(**TINY_BART))
    assert bart.get_input_embeddings().padding_idx == 1
    untied = spec.config(**spec.sizes["tiny"], vocab_size=50, tie_word_embeddings=False)
    with pytest.raises(LmlabError, match="only when the head is tied"):
        hf.save_pretrained(EncoderDecoderModel(untied), tmp_path / "t5")
    assert not (tmp_path / "t5").exists()


TINY_BART = dict(hidden_size=32, num_hidden_layers=1, num_decoder_layers=1,
                 num_attention_heads=2, intermediate_size=64, vocab_size=50,
                 max_position_embeddings=22)


def test_bart_keeps_its_position_offset_whatever_the_pad_id():
    from lmlab.models.presets import preset

    assert preset("bart", "base", pad_token_id=0).position_offset == 2
    assert preset("roberta", "base", pad_token_id=0).position_offset == 1  # tied to the pad


@pytest.mark.numerics
def test_evaluation_loss_has_no_label_smoothing():
    import torch.nn.functional as F

    config = get_family("bart").config(**TINY_BART)
    config.extra["label_smoothing"] = 0.1
    model = EncoderDecoderModel(config)
    src = torch.tensor([[5, 6, 7, 2]])
    labels = torch.tensor([[8, 9, 2]])
    model.eval()
    with torch.no_grad():
        out = model(input_ids=src, labels=labels)
        plain = F.cross_entropy(out.logits[0], labels[0])
        assert_close_rounding(out.loss, plain, terms=50)  # a log-softmax over 50, mean of 3
        model.train()
        model.apply(lambda m: setattr(m, "p", 0.0) if isinstance(m, torch.nn.Dropout) else None)
        assert model(input_ids=src, labels=labels).loss.item() != pytest.approx(plain.item())


def test_generate_text_refuses_several_hypotheses_per_prompt():
    from lmlab.generation.generate import generate_text
    from lmlab.tokenization.symbols import symbol_tokenizer

    tok = symbol_tokenizer("a b c".split())
    config = get_family("t5").config(**get_family("t5").sizes["tiny"], vocab_size=len(tok))
    with pytest.raises(LmlabError, match="one text per prompt"):
        generate_text(EncoderDecoderModel(config), tok, ["a b"], num_beams=3,
                      num_return_sequences=2)


def test_forced_and_suppressed_tokens_follow_transformers_processors():
    """Forced tokens score 0 and everything else -inf (transformers' ForcedBOS/ForcedEOS
    processors), at the first and at the last allowed step; suppressed tokens never score."""
    from lmlab.generation.generate import GenerationConfig, process_logits

    config = GenerationConfig(max_new_tokens=3, forced_bos_token_id=5, forced_eos_token_id=7,
                              suppress_token_ids=[2])
    scores = torch.randn(2, 10)
    sequences, mask = torch.zeros(2, 1, dtype=torch.long), torch.ones(2, 1, dtype=torch.long)
    first = process_logits(scores.clone(), sequences, mask, config, step=0)
    assert (first[:, 5] == 0).all() and torch.isinf(first[:, [0, 1, 2, 3, 4, 6, 7, 8, 9]]).all()
    middle = process_logits(scores.clone(), sequences, mask, config, step=1)
    assert torch.isinf(middle[:, 2]).all() and torch.equal(middle[:, 3:], scores[:, 3:])  # exact: untouched scores
    last = process_logits(scores.clone(), sequences, mask, config, step=2)
    assert (last.argmax(-1) == 7).all() and (last[:, 7] == 0).all()
