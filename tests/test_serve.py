"""``lmlab serve`` driven by the real ``openai`` client over 127.0.0.1: completions equal
``lmlab generate``'s greedy output, alone and under concurrency (continuous batching), streams
equal whole answers, chat uses the template transformers applies, embeddings equal
``lmlab embed``'s; the key, the limits, bad input, abandoned streams and a full queue."""

from __future__ import annotations

import concurrent.futures
import copy
import json
import socket
import threading
import time

import httpx
import numpy as np
import pytest
import torch
from conftest import assert_close_rounding, perturb, run_lmlab

openai = pytest.importorskip("openai")
uvicorn = pytest.importorskip("uvicorn")

PROMPTS = ["Once upon a time", "The capital of France is", "def add(a, b):",
           "A list of fruits: apples, pears,"]


def _start(app) -> tuple[str, object, threading.Thread]:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="error"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.time() + 30
    while not server.started and time.time() < deadline:
        time.sleep(0.02)
    assert server.started, "uvicorn did not start"
    return f"http://127.0.0.1:{port}", server, thread


@pytest.fixture(scope="module")
def served(smollm2_gguf, minilm_dir):
    """smollm2 (decoder), minilm (encoder), 'tiny': a random 2-layer Llama on smollm2's
    tokenizer (the load tests), and 'narrow': the tiny one with one row and one waiting place
    (the full-queue test)."""
    from lmlab.models.model import LanguageModel
    from lmlab.models.presets import family_config
    from lmlab.serve.api import Served
    from lmlab.serve.engine import Engine
    from lmlab.serve.server import load_served

    decoder, encoder = load_served("smollm2"), load_served("minilm")
    tokenizer = decoder.tokenizer
    torch.manual_seed(0)
    model = LanguageModel(family_config(
        "llama", vocab_size=len(tokenizer), hidden_size=32, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, intermediate_size=64,
        max_position_embeddings=256, eos_token_id=tokenizer.eos_token_id), heads=("clm",))
    model = perturb(model, scale=0.2)  # off its initialisation: varied, not repeated, tokens
    tiny = Served("tiny", model, tokenizer, engine=Engine(model, tokenizer))
    narrow = Served("narrow", model, tokenizer,
                    engine=Engine(model, tokenizer, max_batch=1, max_waiting=1))
    yield [decoder, encoder, tiny, narrow]
    for one in (decoder, tiny, narrow):
        one.engine.close()


@pytest.fixture(scope="module")
def server(served):
    from lmlab.serve.api import Limits, create_app

    url, server, thread = _start(create_app(served, Limits(max_tokens=256, max_body_bytes=200_000)))
    yield url
    server.should_exit = True
    thread.join(timeout=10)


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server + "/v1", api_key="unused", max_retries=0, timeout=60)


@pytest.fixture(scope="module")
def reference(served):
    """The tiny decoder's greedy continuations (12 new tokens) of PROMPTS, each alone, by
    ``generate_text`` (what ``lmlab generate`` runs)."""
    from lmlab.generation.generate import generate_text

    tiny = served[2]
    return [generate_text(tiny.model, tiny.tokenizer, p, max_new_tokens=12)[0] for p in PROMPTS]


def test_models_are_listed(client):
    assert [m.id for m in client.models.list().data] == ["smollm2", "minilm", "tiny", "narrow"]


def test_completion_equals_generate_greedy(client, served):
    from lmlab.generation.generate import generate_text

    decoder = served[0]
    answer = client.completions.create(model="smollm2", prompt=PROMPTS[1], max_tokens=8,
                                       temperature=0)
    expected = generate_text(decoder.model, decoder.tokenizer, PROMPTS[1], max_new_tokens=8)[0]
    assert answer.choices[0].text == expected and expected.strip()
    assert answer.choices[0].finish_reason == "length"
    assert (answer.usage.completion_tokens, answer.usage.total_tokens) == (8, 8 + 5)


@pytest.mark.slow
def test_completion_and_embeddings_equal_the_cli_in_a_fresh_process(client, tmp_path):
    result = run_lmlab("generate", "smollm2", PROMPTS[1], "--max-new-tokens", "8", "--json")
    assert result.returncode == 0, result.stderr
    answer = client.completions.create(model="smollm2", prompt=PROMPTS[1], max_tokens=8,
                                       temperature=0)
    assert answer.choices[0].text == json.loads(result.stdout)["generated"]
    texts = ["The vase broke.", "Dawn broke over the hills."]
    result = run_lmlab("embed", "minilm", *texts, "--pooling", "mean", "--normalize",
                       "--out", tmp_path / "v.npy")
    assert result.returncode == 0, result.stderr
    got = torch.tensor([d.embedding for d in client.embeddings.create(model="minilm",
                                                                      input=texts).data])
    assert_close_rounding(got, torch.from_numpy(np.load(tmp_path / "v.npy")), terms=384,
                          depth=6)


def test_concurrent_requests_share_steps_and_equal_each_alone(client, served, reference):
    engine = served[2].engine
    steps, shared = engine.steps, engine.shared_steps

    def ask(prompt: str) -> str:
        return client.completions.create(model="tiny", prompt=prompt, max_tokens=12,
                                         temperature=0).choices[0].text

    with concurrent.futures.ThreadPoolExecutor(len(PROMPTS) * 2) as pool:
        answers = list(pool.map(ask, PROMPTS * 2))
    assert answers == reference * 2  # token for token what each gives alone
    assert engine.shared_steps > shared, "no decoding step ran more than one request"
    assert engine.steps - steps < 8 * 11, "the requests ran one after another"


def test_a_batch_of_prompts_in_one_request(client, reference):
    answer = client.completions.create(model="tiny", prompt=PROMPTS, max_tokens=12,
                                       temperature=0)
    assert [c.text for c in sorted(answer.choices, key=lambda c: c.index)] == reference


def test_streamed_text_equals_the_whole_answer_with_a_stop_string(client):
    options = dict(model="smollm2", prompt=PROMPTS[3], max_tokens=24, temperature=0, stop=[","])
    whole = client.completions.create(**options).choices[0]
    pieces = list(client.completions.create(stream=True, **options))
    assert "".join(p.choices[0].text for p in pieces) == whole.text
    assert "," not in whole.text and whole.finish_reason == "stop"
    assert pieces[-1].choices[0].finish_reason == "stop"


def test_chat_uses_the_template_transformers_applies(client, served):
    from transformers.utils.chat_template_utils import render_jinja_template

    tokenizer = served[0].tokenizer  # its template is the GGUF file's (test_gguf: = transformers')
    messages = [{"role": "system", "content": "Answer briefly."},
                {"role": "user", "content": "What is the capital of France?"}]
    prompt = render_jinja_template([messages], chat_template=tokenizer.chat_template,
                                   add_generation_prompt=True, bos_token=tokenizer.bos_token,
                                   eos_token=tokenizer.eos_token)
    prompt = prompt[0][0] if isinstance(prompt, tuple) else prompt
    chat = client.chat.completions.create(model="smollm2", messages=messages, max_tokens=4,
                                          temperature=0)
    plain = client.completions.create(model="smollm2", prompt=prompt, max_tokens=4,
                                      temperature=0)
    assert chat.choices[0].message.content == plain.choices[0].text
    assert chat.usage.prompt_tokens == plain.usage.prompt_tokens
    stream = client.chat.completions.create(model="smollm2", messages=messages, max_tokens=4,
                                            temperature=0, stream=True,
                                            stream_options={"include_usage": True})
    chunks = list(stream)
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == \
        chat.choices[0].message.content
    assert chunks[-1].usage.completion_tokens == chat.usage.completion_tokens


def test_seeded_sampling_n_and_logprobs(client, served):
    from lmlab.generation.generate import generate_text

    decoder = served[2]
    options = dict(model="tiny", prompt=PROMPTS[0], max_tokens=6, temperature=0.8,
                   top_p=0.9, seed=7, n=2, logprobs=3)
    first, again = (client.completions.create(**options) for _ in range(2))
    texts = [c.text for c in sorted(first.choices, key=lambda c: c.index)]
    assert texts == [c.text for c in sorted(again.choices, key=lambda c: c.index)]
    alone = generate_text(decoder.model, decoder.tokenizer, PROMPTS[0], max_new_tokens=6,
                          do_sample=True, temperature=0.8, top_p=0.9, seed=7)[0]
    assert texts[0] == alone  # choice i samples with seed + i
    logprobs = first.choices[0].logprobs
    assert len(logprobs.tokens) == len(logprobs.token_logprobs) == 6
    assert all(len(top) <= 3 and max(top.values()) <= 0 for top in logprobs.top_logprobs)
    chat = client.chat.completions.create(model="tiny", max_tokens=3, temperature=0,
                                          logprobs=True, top_logprobs=2,
                                          messages=[{"role": "user", "content": "Hi"}])
    content = chat.choices[0].logprobs.content
    assert len(content) == chat.usage.completion_tokens and len(content[0].top_logprobs) == 2
    assert content[0].logprob == pytest.approx(content[0].top_logprobs[0].logprob)  # greedy


def test_embeddings_equal_lmlab_embed(client, served):
    from lmlab.pipelines import pipeline

    texts = ["The vase broke.", "Dawn broke over the hills."]
    assert (served[1].embed.pooling, served[1].embed.normalize) == ("mean", True)
    embed = pipeline("feature-extraction", model="minilm")  # what `lmlab embed` runs
    expected = embed(texts, pooling="mean", normalize=True)
    for fmt in ("float", "base64"):  # the client asks for base64 unless told
        answer = client.embeddings.create(model="minilm", input=texts, encoding_format=fmt) \
            if fmt == "float" else client.embeddings.create(model="minilm", input=texts)
        got = torch.tensor([d.embedding for d in answer.data])
        assert_close_rounding(got, expected, terms=384, depth=6)
    assert answer.usage.prompt_tokens == sum(len(served[1].tokenizer.encode(t)) for t in texts)


def test_an_api_key_is_required_when_set(served, monkeypatch):
    from lmlab.serve.api import create_app
    from lmlab.serve.server import server_limits

    monkeypatch.setenv("LMLAB_API_KEY", "s3cret")  # as --api-key s3cret
    assert server_limits("other").api_key == "other"
    url, server, thread = _start(create_app(served[:2], server_limits()))
    try:
        for key in ("wrong", None):
            headers = {"Authorization": f"Bearer {key}"} if key else {}
            response = httpx.get(url + "/v1/models", headers=headers)
            assert response.status_code == 401
            assert response.json()["error"]["code"] == "invalid_api_key"
        good = openai.OpenAI(base_url=url + "/v1", api_key="s3cret", max_retries=0)
        assert [m.id for m in good.models.list().data] == ["smollm2", "minilm"]
    finally:
        server.should_exit = True
        thread.join(timeout=10)


@pytest.mark.parametrize("body, status, code", [
    ('{"model": "smollm2", "prompt": "a", ', 400, "invalid_json"),
    ('[1, 2]', 400, "invalid_json"),
    ('{"model": "gpt-4", "prompt": "a"}', 404, "model_not_found"),
    ('{"model": "smollm2", "prompt": "a", "max_tokens": -1}', 400, "invalid_value"),
    ('{"model": "smollm2", "prompt": "a", "max_tokens": 100000}', 400, "invalid_value"),
    ('{"model": "smollm2", "prompt": "a", "max_tokens": "5"}', 400, "invalid_type"),
    ('{"model": "smollm2", "prompt": "a", "temperature": "hot"}', 400, "invalid_type"),
    ('{"model": "smollm2", "prompt": "a", "n": true}', 400, "invalid_type"),
    ('{"model": "smollm2", "prompt": 5}', 400, "invalid_type"),
    ('{"model": "smollm2", "prompt": "a", "seed": 1e3}', 400, "invalid_type"),
    ('{"model": "smollm2", "prompt": "a", "seed": -1}', 400, "invalid_value"),
    ('{"model": "smollm2", "prompt": "a", "stop": ["", "x"]}', 400, "invalid_value"),
    ('{"model": "smollm2", "prompt": [99999999]}', 400, "invalid_value"),
    ('{"model": "smollm2", "prompt": [' + ", ".join(["9"] * 8190) + ']}', 400,
     "context_length_exceeded"),
    ('{"model": "smollm2", "prompt": "a", "frequency_penalty": 1}', 400,
     "unsupported_parameter"),
    ('{"model": "minilm", "prompt": "a"}', 400, "wrong_model_kind"),
    ('{"model": "smollm2", "prompt": "' + "x" * 300_000 + '"}', 413, "request_too_large"),
])
def test_bad_requests_get_openai_errors_and_the_server_goes_on(server, client, body, status,
                                                               code):
    response = httpx.post(server + "/v1/completions", content=body,
                          headers={"Content-Type": "application/json"})
    assert response.status_code == status, response.text
    assert response.json()["error"]["code"] == code
    assert client.completions.create(model="tiny", prompt="a", max_tokens=1).choices


def test_errors_reach_the_openai_client_as_its_exceptions(client):
    with pytest.raises(openai.NotFoundError):
        client.completions.create(model="nope", prompt="a")
    with pytest.raises(openai.BadRequestError, match="messages"):
        client.chat.completions.create(model="smollm2", messages=[{"role": "user"}])
    with pytest.raises(openai.BadRequestError, match="encoder"):
        client.embeddings.create(model="smollm2", input="a")


def test_a_client_that_leaves_mid_stream_frees_its_row(server, served, client):
    engine = served[2].engine
    body = {"model": "tiny", "prompt": "Once", "max_tokens": 250, "temperature": 0,
            "stream": True}
    with httpx.stream("POST", server + "/v1/completions", json=body) as response:
        assert response.status_code == 200
        next(response.iter_lines())
    deadline = time.time() + 20
    while engine.busy and time.time() < deadline:
        time.sleep(0.05)
    assert engine.busy == 0 and engine.cache is None  # the row left; nothing kept
    assert client.completions.create(model="tiny", prompt="a", max_tokens=1).choices


def test_a_full_queue_answers_503(server, served):
    body = {"model": "narrow", "prompt": "Once upon a time", "max_tokens": 200,
            "temperature": 0, "stop": ["never in tiny's output"]}
    with concurrent.futures.ThreadPoolExecutor(6) as pool:
        statuses = list(pool.map(lambda _: httpx.post(server + "/v1/completions", json=body,
                                                      timeout=120), range(6)))
    codes = sorted(r.status_code for r in statuses)
    assert 503 in codes and 200 in codes, codes
    refused = next(r for r in statuses if r.status_code == 503)
    assert refused.json()["error"]["code"] == "server_busy"


def _rss_mib() -> float:
    with open("/proc/self/status") as status:
        return next(int(line.split()[1]) for line in status if line.startswith("VmRSS")) / 1024


def test_a_soak_of_requests_leaves_nothing_behind(server, served):
    """Three hundred short requests from a bounded loop (six at a time): every one answered,
    the engine empty afterwards, the process's memory flat."""
    engine = served[2].engine
    body = {"model": "tiny", "prompt": "Hello", "max_tokens": 2, "temperature": 0}
    with httpx.Client(base_url=server, timeout=60) as http, \
            concurrent.futures.ThreadPoolExecutor(6) as pool:
        def ask(_):
            return http.post("/v1/completions", json=body).status_code

        assert set(pool.map(ask, range(60))) == {200}
        before = _rss_mib()
        assert set(pool.map(ask, range(240))) == {200}
        grown = _rss_mib() - before
    # the last answer goes out before the engine's thread drops its row: let that step end
    deadline = time.monotonic() + 10
    while (engine.busy or engine.cache is not None) and time.monotonic() < deadline:
        time.sleep(0.01)
    assert engine.busy == 0 and engine.cache is None and engine.rows == []
    assert grown < 64, f"memory grew by {grown:.0f} MiB over 240 requests"


@pytest.mark.parametrize("method", [None, "prompt", "prefix"])
def test_rows_that_join_mid_decode_equal_each_alone(served, method):
    """Each request joins while the others decode (submitted from the previous one's third
    token), with prompts of other lengths: every row's tokens are the ones it gives alone, also
    with the virtual tokens of prompt and prefix tuning at the cache's front."""
    from lmlab.adapt import apply_method
    from lmlab.generation.generate import generate, make_config
    from lmlab.serve.engine import Engine, Request

    tokenizer = served[2].tokenizer
    model = copy.deepcopy(served[2].model)
    if method:
        apply_method(model, method, num_virtual_tokens=3)
    model.eval()
    config = make_config(None, model, max_new_tokens=10, eos_token_id=tokenizer.eos_token_id)
    prompts = [tokenizer.encode(p) for p in PROMPTS]
    alone = [generate(model, torch.tensor([p]), config=config)[0, len(p):].tolist()
             for p in prompts]
    engine = Engine(model, tokenizer, max_batch=4)
    got: list[list[int]] = [[] for _ in prompts]
    done = threading.Semaphore(0)

    def emit(index: int):
        def on_event(event):
            got[index].append(event.token)
            if len(got[index]) == 3 and index + 1 < len(prompts):
                engine.submit(Request(prompts[index + 1], config, emit(index + 1)))
            if event.finish:
                done.release()
        return on_event

    try:
        engine.submit(Request(prompts[0], config, emit(0)))
        for _ in prompts:
            assert done.acquire(timeout=60)
    finally:
        engine.close()
    assert got == [tokens[:len(g)] for tokens, g in zip(alone, got)] and got == alone
    assert engine.shared_steps > 0  # and fewer steps than one request after another:
    assert engine.steps < sum(len(tokens) - 1 for tokens in alone)


def test_the_server_stack_is_optional_and_exposure_warns(monkeypatch):
    import sys

    from lmlab.serve.server import exposure_warning, require_server_stack
    from lmlab.utils.errors import LmlabError

    monkeypatch.setitem(sys.modules, "fastapi", None)  # as if the extra were not installed
    with pytest.raises(LmlabError, match="FastAPI") as refused:
        require_server_stack()
    assert "pip install 'lmlab[serve]'" in refused.value.fix
    assert "no API key" in exposure_warning("0.0.0.0", None)
    assert "no API key" in exposure_warning("192.168.1.5", None)
    assert [exposure_warning(*args) for args in (("127.0.0.1", None), ("localhost", None),
                                                 ("::1", None), ("0.0.0.0", "key"))] == [None] * 4


def test_the_command_refuses_bad_settings_before_loading(capsys):
    from lmlab.cli import main

    assert main(["serve", "smollm2", "smollm2"]) == 2
    assert "named twice" in capsys.readouterr().err
    assert main(["serve", "smollm2", "--max-batch", "0"]) == 2
    assert "--max-batch" in capsys.readouterr().err
    assert main(["serve", "smollm2", "--max-tokens", "0"]) == 2
    assert "--max-tokens" in capsys.readouterr().err


def test_a_failing_forward_pass_is_a_500_and_the_server_goes_on(client, monkeypatch):
    from lmlab.serve import engine as engine_module

    real_step, calls = engine_module.decoder_step, []

    def failing_once(*args, **kwargs):
        calls.append(1)
        if len(calls) == 1:
            raise RuntimeError("out of memory (simulated)")
        return real_step(*args, **kwargs)

    monkeypatch.setattr(engine_module, "decoder_step", failing_once)
    with pytest.raises(openai.InternalServerError, match="simulated"):
        client.completions.create(model="tiny", prompt="a", max_tokens=3)
    calls.clear()
    stream = client.completions.create(model="tiny", prompt="a", max_tokens=3, stream=True)
    with pytest.raises(openai.APIError, match="simulated"):  # the stream's error chunk
        list(stream)
    assert client.completions.create(model="tiny", prompt="a", max_tokens=3).choices


def test_an_adapter_folder_is_served_as_generate_gives_it(served, tmp_path):
    """A prompt-tuned adapter folder on a saved base, loaded by name as every model is: its
    completion is the adapted model's own greedy output."""
    import lmlab
    from lmlab.adapt import apply_method, save_adapter
    from lmlab.generation.generate import generate_text
    from lmlab.serve.api import Limits, create_app
    from lmlab.serve.server import load_served

    tokenizer = served[2].tokenizer
    base, adapter = tmp_path / "base", tmp_path / "adapter"
    lmlab.save_pretrained(served[2].model, base)
    tokenizer.save_pretrained(base)
    adapted = copy.deepcopy(served[2].model)
    apply_method(adapted, "prompt", num_virtual_tokens=3)
    perturb(adapted.transformer.prompt_embeddings, scale=1.0)
    save_adapter(adapted.eval(), adapter, base_model=base)
    tokenizer.save_pretrained(adapter)
    one = load_served(str(adapter))
    url, server, thread = _start(create_app([one], Limits()))
    try:
        answer = openai.OpenAI(base_url=url + "/v1", api_key="-", max_retries=0).completions \
            .create(model=str(adapter), prompt=PROMPTS[2], max_tokens=8, temperature=0)
    finally:
        server.should_exit = True
        thread.join(timeout=10)
        one.engine.close()
    expected = generate_text(adapted, tokenizer, PROMPTS[2], max_new_tokens=8)[0]
    assert answer.choices[0].text == expected
    assert expected != generate_text(served[2].model, tokenizer, PROMPTS[2], max_new_tokens=8)[0]


@pytest.mark.parametrize("route, body, code", [
    ("embeddings", {"model": "minilm", "input": []}, "invalid_type"),
    ("embeddings", {"model": "minilm", "input": ["a", 3]}, "invalid_type"),
    ("embeddings", {"model": "minilm", "input": "a", "encoding_format": "int8"}, "invalid_value"),
    ("embeddings", {"model": "minilm", "input": "a", "dimensions": 16}, "invalid_value"),
    ("chat/completions", {"model": "tiny", "messages": "hi"}, "invalid_type"),
    ("chat/completions", {"model": "tiny", "messages": [{"role": "user", "content": 5}]},
     "invalid_type"),
    ("chat/completions", {"model": "tiny", "messages": [{"role": "user", "content": "a"}],
                          "top_logprobs": 2}, None),
    ("chat/completions", {"model": "tiny", "messages": [{"role": "user", "content": "a"}],
                          "tools": [{"type": "function"}]}, "unsupported_parameter"),
])
def test_bad_embedding_and_chat_requests(server, route, body, code):
    response = httpx.post(f"{server}/v1/{route}", json=body)
    assert response.status_code == 400, response.text
    assert response.json()["error"]["code"] == code


def test_echo_and_streamed_choices_by_index(client):
    whole = client.completions.create(model="tiny", prompt=PROMPTS[1], max_tokens=5,
                                      temperature=0.7, seed=3, n=2, echo=True)
    texts = {c.index: c.text for c in whole.choices}
    assert all(t.startswith(PROMPTS[1]) for t in texts.values())
    pieces = {0: "", 1: ""}
    for chunk in client.completions.create(model="tiny", prompt=PROMPTS[1], max_tokens=5,
                                           temperature=0.7, seed=3, n=2, stream=True):
        pieces[chunk.choices[0].index] += chunk.choices[0].text
    assert {i: PROMPTS[1] + p for i, p in pieces.items()} == texts
