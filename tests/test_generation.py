"""Generation on tiny random decoders: greedy, sampling, filters, repetition penalty, beam search
(against transformers), left-padded batches, stop strings, streaming."""

from __future__ import annotations

import pytest
import torch

from lmlab.generation.generate import (
    apply_repetition_penalty,
    generate,
    generate_text,
    top_k_filter,
    top_p_filter,
)
from lmlab.models.model import LanguageModel
from lmlab.models.presets_decoders import decoder_config


def tiny(family: str = "gpt2", vocab: int = 61, seed: int = 0) -> LanguageModel:
    torch.manual_seed(seed)
    extra = dict(num_key_value_heads=2, tie_word_embeddings=False) if family == "llama" else {}
    config = decoder_config(family, vocab_size=vocab, hidden_size=32, num_hidden_layers=2,
                            num_attention_heads=4, intermediate_size=64,
                            max_position_embeddings=128, eos_token_id=None, bos_token_id=None,
                            initializer_range=0.3, **extra)
    return LanguageModel(config, heads=("clm",)).eval()


@pytest.fixture(scope="module")
def hf_gpt2(tmp_path_factory):
    """A tiny random GPT-2 saved by lmlab and loaded by transformers."""
    import transformers

    model = tiny("gpt2")
    path = tmp_path_factory.mktemp("gpt2")
    model.save_pretrained(path)
    return model, transformers.AutoModelForCausalLM.from_pretrained(path).eval()


@pytest.mark.parametrize("family", ["gpt2", "llama"])
@pytest.mark.parametrize("use_cache", [True, False])
def test_greedy_equals_argmax_loop(family, use_cache):
    model = tiny(family)
    ids = torch.tensor([[3, 14, 15, 9, 26]])
    out = generate(model, ids, max_new_tokens=12, use_cache=use_cache)
    expected = ids
    with torch.no_grad():
        for _ in range(12):
            logits = model(input_ids=expected).logits[:, -1]
            expected = torch.cat([expected, logits.argmax(-1, keepdim=True)], dim=1)
    assert torch.equal(out, expected)


def test_greedy_and_repetition_penalty_match_transformers(hf_gpt2):
    ours, theirs = hf_gpt2
    ids = torch.tensor([[3, 14, 15, 9, 26], [7, 7, 1, 2, 40]])
    for penalty in (1.0, 1.3, 0.8):
        a = generate(ours, ids, max_new_tokens=15, repetition_penalty=penalty)
        b = theirs.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=15,
                            do_sample=False, repetition_penalty=penalty, pad_token_id=0,
                            eos_token_id=None)
        assert torch.equal(a, b), penalty


def test_repetition_penalty_formula():
    from transformers import RepetitionPenaltyLogitsProcessor

    scores = torch.tensor([[2.0, -1.0, 0.5, -3.0, 1.0]])
    seq = torch.tensor([[0, 1, 1, 3]])
    ours = apply_repetition_penalty(scores, seq, 1.5)
    theirs = RepetitionPenaltyLogitsProcessor(1.5)(seq, scores.clone())
    torch.testing.assert_close(ours, theirs)
    torch.testing.assert_close(ours, torch.tensor([[2.0 / 1.5, -1.5, 0.5, -4.5, 1.0]]))
    masked = apply_repetition_penalty(scores, seq, 1.5, mask=torch.tensor([[0, 1, 1, 1]]))
    assert masked[0, 0] == 2.0  # token 0 only occurs in padding


def test_top_k_and_top_p_filters_on_known_logits():
    probs = torch.tensor([[0.5, 0.25, 0.15, 0.1]])
    logits = probs.log()
    kept = torch.isfinite(top_k_filter(logits, 2))
    assert kept.tolist() == [[True, True, False, False]]
    assert torch.isfinite(top_p_filter(logits, 0.7)).tolist() == [[True, True, False, False]]
    assert torch.isfinite(top_p_filter(logits, 0.5)).tolist() == [[True, False, False, False]]
    assert torch.isfinite(top_p_filter(logits, 0.76)).tolist() == [[True, True, True, False]]
    assert torch.isfinite(top_p_filter(logits, 0.01)).sum() == 1  # always keeps one


def test_sampling_is_seeded_and_respects_top_k():
    model = tiny("llama")
    ids = torch.tensor([[3, 14, 15]])
    runs = [generate(model, ids, max_new_tokens=20, do_sample=True, top_k=3,
                     generator=torch.Generator().manual_seed(s)) for s in (7, 7, 8)]
    assert torch.equal(runs[0], runs[1])
    assert not torch.equal(runs[0], runs[2])
    sequence = runs[2]
    with torch.no_grad():
        logits = model(input_ids=sequence).logits[0]
    for t in range(ids.shape[1], sequence.shape[1]):
        top3 = logits[t - 1].topk(3).indices.tolist()
        assert int(sequence[0, t]) in top3
    # top_k=1 sampling is greedy decoding.
    greedy = generate(model, ids, max_new_tokens=10)
    assert torch.equal(generate(model, ids, max_new_tokens=10, do_sample=True, top_k=1,
                                generator=torch.Generator().manual_seed(1)), greedy)


def test_top_p_sampling_stays_in_nucleus():
    model = tiny("gpt2")
    ids = torch.tensor([[5, 6, 7]])
    out = generate(model, ids, max_new_tokens=15, do_sample=True, top_p=0.5, temperature=0.7,
                   generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        logits = model(input_ids=out).logits[0] / 0.7
    for t in range(3, out.shape[1]):
        allowed = torch.isfinite(top_p_filter(logits[t - 1:t], 0.5))[0]
        assert bool(allowed[out[0, t]])


@pytest.mark.parametrize("early_stopping,length_penalty", [(False, 1.0), (True, 0.6),
                                                           ("never", 1.5)])
def test_beam_search_matches_transformers(hf_gpt2, early_stopping, length_penalty):
    ours, theirs = hf_gpt2
    ids = torch.tensor([[3, 14, 15, 9, 26]])
    greedy = generate(ours, ids, max_new_tokens=6)
    eos = int(greedy[0, -3])  # a token the model actually likes, so beams finish early
    for prompt in (ids, torch.tensor([[40, 2, 33]])):
        a = generate(ours, prompt, max_new_tokens=12, num_beams=3, eos_token_id=eos,
                     length_penalty=length_penalty, early_stopping=early_stopping)
        b = theirs.generate(prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=12,
                            num_beams=3, do_sample=False, eos_token_id=eos, pad_token_id=0,
                            length_penalty=length_penalty, early_stopping=early_stopping)
        assert a.tolist() == b.tolist()


def test_beam_search_batched_matches_transformers(hf_gpt2):
    ours, theirs = hf_gpt2
    ids = torch.tensor([[3, 14, 15, 9], [8, 1, 2, 50]])
    a = generate(ours, ids, max_new_tokens=8, num_beams=4, eos_token_id=5)
    b = theirs.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=8, num_beams=4,
                        do_sample=False, eos_token_id=5, pad_token_id=0)
    assert a.tolist() == b.tolist()


@pytest.mark.parametrize("family", ["gpt2", "llama"])
def test_left_padded_batch_equals_one_by_one(family):
    model = tiny(family)
    prompts = [[3, 14, 15, 9, 26, 5], [7, 8], [40, 2, 33, 1]]
    width = max(map(len, prompts))
    ids = torch.tensor([[0] * (width - len(p)) + p for p in prompts])
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts])
    batched = generate(model, ids, mask, max_new_tokens=10)
    for row, prompt in enumerate(prompts):
        alone = generate(model, torch.tensor([prompt]), max_new_tokens=10)
        assert batched[row, width:].tolist() == alone[0, len(prompt):].tolist()
    beams = generate(model, ids, mask, max_new_tokens=6, num_beams=2)
    for row, prompt in enumerate(prompts):
        alone = generate(model, torch.tensor([prompt]), max_new_tokens=6, num_beams=2)
        assert beams[row, width:width + alone.shape[1] - len(prompt)].tolist() == \
            alone[0, len(prompt):].tolist()


def test_eos_stops_and_pads():
    model = tiny("gpt2")
    ids = torch.tensor([[3, 14, 15], [9, 26, 5]])
    free = generate(model, ids, max_new_tokens=8)
    eos = int(free[0, 5])  # row 0 emits it at its third step
    out = generate(model, ids, max_new_tokens=8, eos_token_id=eos, pad_token_id=60)
    first = out[0, 3:].tolist()
    stop = first.index(eos)
    assert all(t == 60 for t in first[stop + 1:])


def test_stop_strings_and_streaming(smollm2_gguf):
    from lmlab.tokenization.tokenizer import Tokenizer

    tokenizer = Tokenizer.from_pretrained(smollm2_gguf)
    model = tiny("llama", vocab=len(tokenizer), seed=3)
    full = generate_text(model, tokenizer, "The cat", max_new_tokens=12)[0]
    assert len(full) > 4
    stop = full[len(full) // 2: len(full) // 2 + 2]
    cut = generate_text(model, tokenizer, "The cat", max_new_tokens=12, stop_strings=[stop])[0]
    assert cut == full[:full.index(stop)]
    pieces: list[str] = []
    streamed = generate_text(model, tokenizer, "The cat", max_new_tokens=12,
                             on_text=pieces.append)[0]
    assert "".join(pieces) == streamed == full
    tokens: list[int] = []
    ids = torch.tensor([tokenizer.encode("The cat")])
    out = generate(model, ids, max_new_tokens=7, streamer=lambda t: tokens.append(int(t[0])))
    assert tokens == out[0, ids.shape[1]:].tolist()


def test_bad_options_raise():
    from lmlab.utils.errors import LmlabError

    model = tiny("gpt2")
    ids = torch.tensor([[1, 2]])
    with pytest.raises(LmlabError, match="top_p"):
        generate(model, ids, do_sample=True, top_p=1.5)
    with pytest.raises(LmlabError, match="right-padded"):
        generate(model, ids, torch.tensor([[1, 0]]))
    with pytest.raises(LmlabError, match="unknown generation option"):
        generate(model, ids, beams=3)


def test_pipeline_and_cli_on_saved_gpt2(tmp_path, capsys):
    """A saved GPT-2 folder (tied head, no lm_head.weight) generates through the pipeline and
    `lmlab generate`, with a byte-level BPE tokenizer trained on the spot."""
    import lmlab
    from lmlab.cli import main
    from lmlab.tokenization.tokenizer import Tokenizer

    texts = ["the cat sat on the mat", "a dog ran in the park", "the sun is bright"] * 20
    tokenizer = Tokenizer.train(texts, kind="bpe", vocab_size=300, template="gpt2",
                                min_frequency=1)
    model = tiny("gpt2", vocab=len(tokenizer))
    model.save_pretrained(tmp_path)
    tokenizer.save_pretrained(tmp_path)
    pipe = lmlab.pipeline("text-generation", model=str(tmp_path))
    out = pipe("the cat", max_new_tokens=5)
    assert out[0]["generated_text"].startswith("the cat")
    assert main(["generate", str(tmp_path), "the cat", "--max-new-tokens", "5",
                 "--no-stream"]) == 0
    assert capsys.readouterr().out.startswith("the cat")
