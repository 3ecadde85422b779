"""Generation on tiny random decoders: greedy, sampling, filters, repetition penalty, beam search
(against transformers), left-padded batches, stop strings, streaming."""

from __future__ import annotations

import pytest
import torch
from conftest import assert_close_rounding

import lmlab
from lmlab.generation.generate import (
    apply_repetition_penalty,
    generate,
    generate_text,
    top_k_filter,
    top_p_filter,
)
from lmlab.models.model import LanguageModel
from lmlab.models.presets import family_config
from lmlab.utils.errors import LmlabError


def tiny(family: str = "gpt2", vocab: int = 61, seed: int = 0) -> LanguageModel:
    torch.manual_seed(seed)
    extra = dict(num_key_value_heads=2, tie_word_embeddings=False) if family == "llama" else {}
    config = family_config(family, vocab_size=vocab, hidden_size=32, num_hidden_layers=2,
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
    lmlab.save_pretrained(model, path)
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


@pytest.mark.parametrize("n", [1, 2, 3])
@pytest.mark.parametrize("num_beams", [1, 3])
def test_no_repeat_ngram_matches_transformers(hf_gpt2, n, num_beams):
    """Blocked n-grams as transformers' NoRepeatNGramLogitsProcessor blocks them (the prompt
    counts), greedy and in beam search; and the block changes what a repetitive model says."""
    ours, theirs = hf_gpt2
    ids = torch.tensor([[3, 14, 15, 9, 26], [7, 7, 1, 2, 40]])
    got = generate(ours, ids, max_new_tokens=20, no_repeat_ngram_size=n, num_beams=num_beams)
    ref = theirs.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=20,
                          do_sample=False, no_repeat_ngram_size=n, num_beams=num_beams,
                          pad_token_id=0, eos_token_id=None)
    assert torch.equal(got, ref)
    for row in got.tolist():  # no generated token completes an n-gram seen before it
        for end in range(ids.shape[1], len(row)):
            gram = row[end - n + 1:end + 1]
            earlier = [row[i:i + n] for i in range(end - n + 1)]
            assert gram not in earlier, (row, end)
    assert not torch.equal(got, generate(ours, ids, max_new_tokens=20, num_beams=num_beams))


def test_no_repeat_ngram_is_validated():
    with pytest.raises(LmlabError, match="no_repeat_ngram_size"):
        generate(tiny(), torch.tensor([[1, 2]]), no_repeat_ngram_size=-1)


@pytest.mark.numerics
def test_repetition_penalty_formula():
    from transformers import RepetitionPenaltyLogitsProcessor

    scores = torch.tensor([[2.0, -1.0, 0.5, -3.0, 1.0]])
    seq = torch.tensor([[0, 1, 1, 3]])
    ours = apply_repetition_penalty(scores, seq, 1.5)
    theirs = RepetitionPenaltyLogitsProcessor(1.5)(seq, scores.clone())
    # one multiplication or division per score (x / 1.5 or x * 1.5): one rounding
    assert_close_rounding(ours, theirs)
    assert_close_rounding(ours, torch.tensor([[2.0 / 1.5, -1.5, 0.5, -4.5, 1.0]]))
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
    lmlab.save_pretrained(model, tmp_path)
    tokenizer.save_pretrained(tmp_path)
    pipe = lmlab.pipeline("text-generation", model=str(tmp_path))
    out = pipe("the cat", max_new_tokens=5)
    assert out[0]["generated_text"].startswith("the cat")
    assert main(["generate", str(tmp_path), "the cat", "--max-new-tokens", "5",
                 "--no-stream"]) == 0
    assert capsys.readouterr().out.startswith("the cat")


@pytest.fixture(scope="module")
def smol_tokenizer(smollm2_gguf):
    from lmlab.tokenization.tokenizer import Tokenizer

    return Tokenizer.from_pretrained(smollm2_gguf)


def _streamed(model, tokenizer, prompt: str, stops: list[str], **options
              ) -> tuple[str, list[str]]:
    """(the streamed text joined, the text emitted so far after each generated token)."""
    from lmlab.generation.generate import TextStreamer

    pieces: list[str] = []
    streamer = TextStreamer(tokenizer, pieces.append, stop_strings=stops)
    after_each: list[str] = []

    def record(tokens: torch.Tensor) -> None:
        streamer(tokens)
        after_each.append("".join(pieces))

    ids = torch.tensor([tokenizer.encode(prompt)])
    generate(model, ids, streamer=record, tokenizer=tokenizer, stop_strings=stops, **options)
    streamer.end()
    return "".join(pieces), after_each


def test_streaming_with_stop_strings_prints_what_no_stream_returns(smol_tokenizer):
    """The issue: streaming printed the stop string, --no-stream did not. For stop strings
    inside one token, across two tokens, in the first token, a prefix that then diverges (held
    back, then released) and one that never occurs, the streamed text equals the returned
    text and never contains the stop string."""
    tokenizer = smol_tokenizer
    model = tiny("llama", vocab=len(tokenizer), seed=3)
    prompt, n = "The cat", 16
    ids = tokenizer.encode(prompt)
    tokens = generate(model, torch.tensor([ids]), max_new_tokens=n)[0, len(ids):].tolist()
    texts = [tokenizer.decode(tokens[:i]) for i in range(n + 1)]  # text after i tokens
    full = texts[-1]
    assert all(len(texts[i]) < len(texts[i + 1]) for i in range(n)), texts
    cases = {
        "across two tokens": texts[5][-2:] + full[len(texts[5]):len(texts[5]) + 2],
        "inside one token": full[len(texts[7]) + 1:len(texts[8])],
        "first token": full[:2],
        "prefix then diverge": full[len(texts[3]) - 2:len(texts[4])] + "\u2603",
        "never": "\u2603",
    }
    for name, stop in cases.items():
        stops = [stop] if name != "inside one token" else [stop, cases["across two tokens"]]
        returned = generate_text(model, tokenizer, prompt, max_new_tokens=n,
                                 stop_strings=stops)[0]
        expected = full[:min(full.find(s) if s in full else len(full) for s in stops)]
        assert returned == expected, name
        pieces: list[str] = []
        streamed = generate_text(model, tokenizer, prompt, max_new_tokens=n,
                                 stop_strings=stops, on_text=pieces.append)[0]
        assert "".join(pieces) == streamed == returned, name
        assert not any(s in "".join(pieces) for s in stops), name
        joined, after_each = _streamed(model, tokenizer, prompt, stops, max_new_tokens=n)
        assert joined == returned, name
        if name == "prefix then diverge":
            start = len(texts[3]) - 2  # the stop string's first 2 + len(token 4) characters
            assert after_each[3] == full[:start], "the possible start of a stop string is held"
            assert after_each[4].startswith(full[:len(texts[4])]), "and released when it diverges"


def test_partial_stop_length():
    from lmlab.generation.generate import partial_stop_length

    assert partial_stop_length("Answer: yes. Q", ["Question:"]) == 1
    assert partial_stop_length("Answer: yes. Quest", ["uest?", "Question:"]) == 5  # longest
    assert partial_stop_length("Answer: yes.", ["Question:"]) == 0
    assert partial_stop_length("ab", ["abc", "b"]) == 2
    assert partial_stop_length("", ["abc"]) == 0


def test_cli_stream_and_no_stream_print_the_same_with_stop(tmp_path, capsys):
    """`lmlab generate --stop` prints the same text streamed (the default) and with --no-stream."""
    from lmlab.cli import main
    from lmlab.tokenization.tokenizer import Tokenizer

    texts = ["the cat sat on the mat", "a dog ran in the park", "the sun is bright"] * 20
    tokenizer = Tokenizer.train(texts, kind="bpe", vocab_size=300, template="gpt2",
                                min_frequency=1)
    model = tiny("gpt2", vocab=len(tokenizer), seed=1)
    lmlab.save_pretrained(model, tmp_path)
    tokenizer.save_pretrained(tmp_path)
    args = ["generate", str(tmp_path), "the cat", "--max-new-tokens", "12"]
    assert main(args + ["--no-stream"]) == 0
    full = capsys.readouterr().out[len("the cat"):-1]
    ids = tokenizer.encode("the cat")
    tokens = generate(model, torch.tensor([ids]), max_new_tokens=12)[0, len(ids):].tolist()
    boundary = len(tokenizer.decode(tokens[:4]))
    stop = full[boundary - 1:boundary + 1]  # spans the 4th and 5th generated tokens
    assert len(stop) == 2 and stop in full
    outputs = []
    for extra in ([], ["--no-stream"]):
        assert main(args + ["--stop", stop] + extra) == 0
        outputs.append(capsys.readouterr().out)
    assert outputs[0] == outputs[1] == "the cat" + full[:full.index(stop)] + "\n"


def _single_character_token(tokenizer, tokens: list[int]) -> tuple[int, str] | None:
    """A generated token whose text is one printable ASCII character that no other token of the
    vocabulary contains: then "the text contains it" means "this token was generated"."""
    vocab = [tokenizer.decode([i]) for i in range(len(tokenizer))]
    for token in tokens:
        text = vocab[token]
        if len(text) == 1 and text.isprintable() and text.isascii() and text != " " \
                and sum(text in piece for piece in vocab) == 1:
            return token, text
    return None


def test_beam_search_stop_string_finishes_a_hypothesis_like_eos():
    """A stop string finishes a beam exactly as an end-of-sequence token does (and eos beam
    search equals transformers', tested above): with a one-character stop string that only one
    token of the vocabulary contains, stop_strings=[c] and eos_token_id=token(c) give the same
    beams. generate_text cuts the text before the stop string, and streams the best
    hypothesis once at the end."""
    from lmlab.tokenization.tokenizer import Tokenizer

    texts = ["the cat sat on the mat", "a dog ran in the park", "the sun is bright"] * 20
    tokenizer = Tokenizer.train(texts, kind="bpe", vocab_size=300, template="gpt2",
                                min_frequency=1)
    model = tiny("gpt2", vocab=len(tokenizer), seed=2)
    prompts = [tokenizer.encode("the cat"), tokenizer.encode("a dog ran")]
    width = max(map(len, prompts))
    ids = torch.tensor([[0] * (width - len(p)) + p for p in prompts])
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts])
    options = dict(max_new_tokens=10, num_beams=3, pad_token_id=0)
    free = generate(model, ids, mask, **options)
    found = _single_character_token(tokenizer, free[0, width + 1:].tolist())
    assert found is not None, tokenizer.decode(free[0, width:].tolist())
    token, stop = found
    by_string = generate(model, ids, mask, stop_strings=[stop], tokenizer=tokenizer, **options)
    by_eos = generate(model, ids, mask, eos_token_id=token, **options)
    assert by_string.tolist() == by_eos.tolist()
    assert not torch.equal(by_string[0], free[0, :by_string.shape[1]]) or \
        by_string.shape[1] < free.shape[1], "the stop string changed the search"

    best = tokenizer.decode(by_string[0, width:].tolist())
    assert stop in best
    pieces: list[str] = []
    text = generate_text(model, tokenizer, "the cat", stop_strings=[stop], on_text=pieces.append,
                         max_new_tokens=10, num_beams=3)[0]
    assert text == best[:best.index(stop)] and pieces == [text]
    with pytest.raises(LmlabError, match="streamer cannot follow beam search"):
        generate(model, ids, mask, streamer=lambda t: None, **options)


def test_bad_stop_strings_raise():
    model = tiny("gpt2")
    ids = torch.tensor([[1, 2]])
    with pytest.raises(LmlabError, match="one string, not a list"):
        generate(model, ids, stop_strings="\n", tokenizer=object())
    with pytest.raises(LmlabError, match="empty"):
        generate(model, ids, stop_strings=["x", ""], tokenizer=object())
    with pytest.raises(LmlabError, match="need a tokenizer"):
        generate(model, ids, stop_strings=["x"])


@pytest.mark.slow
def test_smollm2_streams_what_it_returns_with_stop_strings(smollm2_gguf):
    """The real SmolLM2: "The three primary colors are" continues " the primary colors of the
    RGB color model: red, blue, and green." (greedy, measured); with stop strings after a
    token, across tokens (" red, blue") and one that starts like the text and diverges
    ("colors of light"), streaming prints what --no-stream returns."""
    from lmlab.load import load_model_and_tokenizer

    model, tokenizer = load_model_and_tokenizer(str(smollm2_gguf), head=None)
    prompt = "The three primary colors are"
    full = generate_text(model, tokenizer, prompt, max_new_tokens=16)[0]
    for stops in ([","], [" red, blue"], ["colors of light"], ["\n", "RGB color"]):
        pieces: list[str] = []
        streamed = generate_text(model, tokenizer, prompt, max_new_tokens=16, stop_strings=stops,
                                 on_text=pieces.append)[0]
        returned = generate_text(model, tokenizer, prompt, max_new_tokens=16,
                                 stop_strings=stops)[0]
        assert "".join(pieces) == streamed == returned, stops
        assert full.startswith(returned) and not any(s in returned for s in stops), stops


def test_stop_option_reads_newline_tab_and_backslash_escapes():
    """A shell passes --stop "\\n" as backslash + n; the CLI must stop at the end of a line."""
    from lmlab.cli import _register_all
    from lmlab.cli._common import build_parser
    from lmlab.cli.generate import stop_string

    assert stop_string("\\n") == "\n" and stop_string("a\\tb") == "a\tb"
    assert stop_string("\\\\n") == "\\n"  # an escaped backslash, then a plain n
    assert stop_string("C:\\x") == "C:\\x" and stop_string("end\\") == "end\\"
    parser, registry = build_parser()
    _register_all(registry)
    args = parser.parse_args(["generate", "smollm2", "hi", "--stop", "\\n", "--stop", "###"])
    assert args.stop == ["\n", "###"]


@pytest.mark.parametrize("use_cache", [True, False])
def test_vocabulary_projection_runs_at_the_last_position_only(use_cache):
    """The prompt's positions are never projected to the vocabulary (at prefill that would be
    prompt length x a decoding step's projection), and the tokens equal the full-logits path."""
    model = tiny("llama")
    ids = torch.randint(0, 61, (2, 9), generator=torch.Generator().manual_seed(1))
    mask = torch.ones_like(ids)
    mask[1, :3] = 0  # a left-padded row
    rows: list[int] = []
    hook = model.heads["clm"].register_forward_hook(
        lambda module, args, output: rows.append(args[0].shape[1]))
    try:
        out = generate(model, ids, mask, max_new_tokens=5, eos_token_id=[], use_cache=use_cache)
    finally:
        hook.remove()
    assert rows == [1] * 5
    sequences, m = ids, mask
    for _ in range(5):  # greedy with full logits, no cache
        positions = (m.cumsum(-1) - 1).masked_fill(m == 0, 1)
        logits = model(input_ids=sequences, attention_mask=m, position_ids=positions).logits
        sequences = torch.cat([sequences, logits[:, -1].argmax(-1, keepdim=True)], dim=1)
        m = torch.cat([m, torch.ones_like(m[:, :1])], dim=1)
    assert torch.equal(out, sequences)
