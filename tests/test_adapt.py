"""Parameter-efficient methods on lmlab's own models: what trains, what starts unchanged,
merging, incremental decoding with virtual tokens, the adapter file in a fresh process,
fine-tuning with --method end to end, and the refusals (wrong base, bad options).
PEFT parity lives in tests/test_adapt_peft.py."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest
import torch
from conftest import assert_close_rounding
from safetensors.torch import load_file, save_file

import lmlab
from lmlab.adapt import (
    METHODS,
    apply_method,
    load_adapter,
    merge,
    save_adapter,
    trainable_parameters,
)
from lmlab.interop.native import save_model
from lmlab.models.families import get_family
from lmlab.models.model import LanguageModel
from lmlab.models.task_heads import add_task_head
from lmlab.utils.errors import LmlabError

SIZES = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64,
             vocab_size=64, max_position_embeddings=64)
OPTIONS = {"lora": {"r": 4, "alpha": 8, "targets": ("q_proj", "v_proj", "down_proj")},
           "adapter": {"bottleneck": 8}, "bitfit": {}, "prompt": {"num_virtual_tokens": 3},
           "prefix": {"num_virtual_tokens": 3}}


def _model(family: str = "bert", head: str | None = "sequence-classification",
           dropout: float = 0.0) -> LanguageModel:
    torch.manual_seed(0)
    extra = dict(num_key_value_heads=2) if family == "llama" else {}
    config = get_family(family).config(**SIZES, **extra, hidden_dropout_prob=dropout,
                                       attention_probs_dropout_prob=dropout)
    model = LanguageModel(config, heads=("clm",) if family != "bert" else ())
    if head is not None:
        add_task_head(model, head, 3, pooling="mean")
    return model.eval()


def _batch() -> dict[str, torch.Tensor]:
    ids = torch.tensor([[5, 9, 13, 2, 7, 11], [4, 8, 15, 16, 23, 42]])
    mask = torch.ones_like(ids)
    mask[0, 4:] = 0
    return {"input_ids": ids, "attention_mask": mask}


def _perturb(model, skip: str = "heads.") -> None:
    """Give every trainable tensor of the method values (zero-initialised ones included)."""
    generator = torch.Generator().manual_seed(3)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.requires_grad and not name.startswith(skip):
                p.add_(torch.randn(p.shape, generator=generator) * 0.1)


@pytest.mark.parametrize("family", ["bert", "gpt2", "llama"])
@pytest.mark.parametrize("method", METHODS)
def test_method_trains_only_its_parameters(family, method):
    model = _model(family)
    before = model(**_batch())
    if method == "bitfit" and family == "llama":
        with pytest.raises(LmlabError, match="no bias terms"):
            apply_method(model, method)
        return
    record = apply_method(model, method, **OPTIONS[method])
    after = model(**_batch())
    real = _batch()["attention_mask"].bool()
    if method in ("lora", "adapter", "bitfit"):  # zero-initialised updates: the base function
        assert_close_rounding(after.last_hidden_state[real], before.last_hidden_state[real],
                              terms=64, depth=6)
    assert after.last_hidden_state.shape == before.last_hidden_state.shape  # real tokens only
    trainable = {n for n, p in model.named_parameters() if p.requires_grad}
    assert trainable == set(record.trainable)
    assert {n for n in trainable if n.startswith("heads.")} == {
        n for n, _ in model.named_parameters() if n.startswith("heads.sequence-classification")}
    assert not any(n.startswith("heads.clm") for n in trainable)  # the LM head stays frozen
    body = [n for n in trainable if not n.startswith("heads.")]
    expected = {"lora": ("lora_A", "lora_B"), "adapter": ("adapter.", "norm"),
                "bitfit": (".bias",), "prompt": ("prompt_embeddings",),
                "prefix": ("prefix_key_values",)}[method]
    assert body and all(any(e in n for e in expected) for n in body), body
    assert trainable_parameters(model) < 0.5 * model.num_parameters()
    _perturb(model)
    model.train()
    out = model(**_batch(), labels=torch.tensor([0, 2]), heads=["sequence-classification"])
    out.loss.backward()
    for name, p in model.named_parameters():
        assert (p.grad is not None) == (name in trainable), name
        if name in trainable and not name.endswith("lora_A.weight"):
            assert p.grad.abs().sum() > 0, name


@pytest.mark.numerics
def test_lora_merges_into_a_plain_model_with_equal_outputs(tmp_path):
    model = _model("bert", head=None)
    apply_method(model, "lora", **OPTIONS["lora"])
    _perturb(model)
    adapted = model(**_batch()).last_hidden_state
    merged = merge(model)
    assert not any("lora" in n for n, _ in merged.named_parameters())
    assert merged.adaptation is None
    real = _batch()["attention_mask"].bool()
    assert_close_rounding(merged(**_batch()).last_hidden_state[real], adapted[real],
                          terms=64, depth=6)
    lmlab.save_pretrained(merged, tmp_path / "merged")  # a plain checkpoint: saved and loaded as any
    again = lmlab.from_pretrained(tmp_path / "merged")
    assert_close_rounding(again(**_batch()).last_hidden_state[real], adapted[real],
                          terms=64, depth=6)
    model = _model("bert", head=None)
    apply_method(model, "adapter", bottleneck=4)
    with pytest.raises(LmlabError, match="cannot be merged"):
        merge(model)
    from lmlab.interop import hf
    from lmlab.interop.native import save_native

    for method in ("lora", "prefix"):  # a plain checkpoint would drop the adaptation
        model = _model("bert", head=None)
        apply_method(model, method, **OPTIONS[method])
        for save in (hf.save_pretrained, save_model, save_native):
            with pytest.raises(LmlabError, match=f"carries a {method} adaptation"):
                save(model, tmp_path / "plain")
        assert not (tmp_path / "plain").exists()


@pytest.mark.parametrize("family", ["gpt2", "llama"])
@pytest.mark.parametrize("method", ["prompt", "prefix", "lora"])
def test_incremental_decoding_equals_the_full_pass(family, method):
    """A decoder with virtual tokens decodes step by step (a key/value cache, the mask given
    for the real tokens only) to the logits of one pass over the whole sequence."""
    model = _model(family, head=None)
    apply_method(model, method, **OPTIONS[method])
    _perturb(model)
    ids = torch.tensor([[5, 9, 13, 2, 7, 11, 3]])
    full = model(input_ids=ids, attention_mask=torch.ones_like(ids)).logits
    out = model(input_ids=ids[:, :4], attention_mask=torch.ones(1, 4, dtype=torch.long),
                use_cache=True)
    steps = [out.logits]
    for t in range(4, ids.shape[1]):
        out = model(input_ids=ids[:, t:t + 1], attention_mask=torch.ones(1, t + 1,
                    dtype=torch.long), past_key_values=out.past_key_values, use_cache=True)
        steps.append(out.logits)
    assert_close_rounding(torch.cat(steps, dim=1), full, terms=64, depth=6)


@pytest.mark.parametrize("family", ["gpt2", "llama"])
@pytest.mark.parametrize("method", ["prompt", "prefix"])
def test_generate_with_virtual_tokens_continues_as_the_training_call(family, method):
    """generate (cache or none: explicit position ids counting real tokens) picks the tokens a
    plain call (the training call, no position ids) ranks first: the virtual tokens' cache
    length is not taken for prompt tokens, and real positions follow the virtual ones."""
    from lmlab.generation.generate import _Decoder, generate

    model = _model(family, head=None)
    apply_method(model, method, **OPTIONS[method])
    _perturb(model)
    model.eval()
    ids = torch.tensor([[5, 9, 13, 2, 7]])
    with torch.no_grad():
        step = _Decoder(model, use_cache=False).logits(ids, torch.ones_like(ids))
        plain = model(input_ids=ids, attention_mask=torch.ones_like(ids)).logits[:, -1]
        assert_close_rounding(step, plain.float(), terms=64, depth=6)
        expected = ids
        for _ in range(5):
            logits = model(input_ids=expected, attention_mask=torch.ones_like(expected)).logits
            expected = torch.cat([expected, logits[:, -1].argmax(-1, keepdim=True)], dim=1)
        for use_cache in (True, False):
            got = generate(model, ids, max_new_tokens=5, use_cache=use_cache)
            assert torch.equal(got, expected), (use_cache, got, expected)


def test_adapters_load_in_a_fresh_process(tmp_path):
    """Each method's file, loaded on its base model by another Python process, gives the
    outputs of the model that saved it."""
    model = _model("bert")
    save_model(model, tmp_path / "base")  # a mean-pooled head: lmlab's own format
    outputs = {}
    for method in METHODS:
        adapted = lmlab.from_pretrained(tmp_path / "base")
        adapted.config.extra.pop("num_labels", None)
        del adapted.heads["sequence-classification"]
        add_task_head(adapted, "sequence-classification", 3, {0: "a", 1: "b", 2: "c"}, "mean")
        apply_method(adapted, method, **OPTIONS[method])
        _perturb(adapted, skip="")
        save_adapter(adapted, tmp_path / method, base_model=tmp_path / "base")
        outputs[method] = adapted.eval()(**_batch()).logits
    save_file({**outputs, **_batch()}, str(tmp_path / "expected.safetensors"))
    size = (tmp_path / "lora" / "adapter.safetensors").stat().st_size
    assert size < 0.2 * (tmp_path / "base" / "model.safetensors").stat().st_size
    script = textwrap.dedent(f"""
        import sys
        from safetensors.torch import load_file, save_file
        from lmlab.adapt import load_adapter
        batch = load_file(sys.argv[1] + "/expected.safetensors")
        got = {{}}
        for method in {list(METHODS)!r}:
            model = load_adapter(sys.argv[1] + "/" + method)
            assert model.config.extra["id2label"][2] == "c"
            got[method] = model(input_ids=batch["input_ids"],
                                attention_mask=batch["attention_mask"]).logits
        save_file(got, sys.argv[1] + "/got.safetensors")
    """)
    subprocess.run([sys.executable, "-c", script, str(tmp_path)], check=True, timeout=120)
    got = load_file(str(tmp_path / "got.safetensors"))
    for method in METHODS:
        assert torch.equal(got[method], outputs[method]), method  # exact: same weights, same ops


def test_a_pooler_the_head_added_travels_with_the_adapter(tmp_path):
    """A head that reads the pooled [CLS] gives a base without a pooler a fresh, frozen one:
    it is saved with the adapter (else the adapter was refused on its own base, or reloaded
    with another random pooler); a base's own pooler is not copied into the file."""
    torch.manual_seed(0)
    base = LanguageModel(get_family("bert").config(**SIZES))
    assert base.pooler is None
    lmlab.save_pretrained(base, tmp_path / "base")
    model = lmlab.from_pretrained(tmp_path / "base")
    add_task_head(model, "sequence-classification", 3)  # the family's pooled [CLS]
    assert model.pooler is not None
    apply_method(model, "lora", r=2)
    assert not any(p.requires_grad for p in model.pooler.parameters())
    _perturb(model, skip="")
    save_adapter(model, tmp_path / "adapter", base_model=tmp_path / "base")
    expected = model.eval()(**_batch()).logits
    torch.manual_seed(1)  # another fresh pooler, were it initialised again
    assert torch.equal(load_adapter(tmp_path / "adapter")(**_batch()).logits, expected)  # exact: the same weights and ops

    with_pooler = LanguageModel(get_family("bert").config(**SIZES), with_pooler=True)
    lmlab.save_pretrained(with_pooler, tmp_path / "pooled")
    model = lmlab.from_pretrained(tmp_path / "pooled")
    add_task_head(model, "sequence-classification", 3)
    apply_method(model, "lora", r=2)
    save_adapter(model, tmp_path / "small", base_model=tmp_path / "pooled")
    assert not any(k.startswith("pooler.") for k in load_file(
        str(tmp_path / "small" / "adapter.safetensors")))
    assert torch.equal(load_adapter(tmp_path / "small")(**_batch()).logits,
                       model.eval()(**_batch()).logits)  # exact: the same weights and ops


def test_an_adapter_on_a_short_named_base_reloads(tmp_path, minilm_dir):
    """base_model="minilm" (a name from_pretrained resolves) is kept as a name, not turned
    into a path under the current directory that does not exist."""
    model = lmlab.from_pretrained("minilm")
    apply_method(model, "lora", r=2)
    save_adapter(model, tmp_path / "adapter", base_model="minilm")
    assert json.loads((tmp_path / "adapter" / "adapter.json").read_text())["base_model"] == \
        "minilm"
    assert load_adapter(tmp_path / "adapter").adaptation.method == "lora"


def test_wrong_base_and_bad_files_are_refused(tmp_path):
    model = _model("bert")
    save_model(model, tmp_path / "base")  # a mean-pooled head: lmlab's own format
    apply_method(model, "lora", r=2)
    save_adapter(model, tmp_path / "adapter", base_model=tmp_path / "base")
    with pytest.raises(LmlabError, match="already holds an adapter"):
        save_adapter(model, tmp_path / "adapter")
    torch.manual_seed(0)
    other = LanguageModel(get_family("bert").config(**{**SIZES, "intermediate_size": 48}))
    with pytest.raises(LmlabError, match="trained on another base model") as error:
        load_adapter(tmp_path / "adapter", other)
    assert str(tmp_path / "base") in error.value.fix
    llama = _model("llama", head=None)
    with pytest.raises(LmlabError, match="trained on another base model"):
        load_adapter(tmp_path / "adapter", llama)
    config = json.loads((tmp_path / "adapter" / "adapter.json").read_text())
    (tmp_path / "adapter" / "adapter.json").write_text(json.dumps({**config, "format": "x"}))
    with pytest.raises(LmlabError, match="not an lmlab adapter config"):
        load_adapter(tmp_path / "adapter")
    with pytest.raises(LmlabError, match="holds no adapter.json"):
        load_adapter(tmp_path / "base")
    for method, options, message in [("lora", {"r": 0}, "positive integer"),
                                     ("lora", {"targets": ("query",)}, "unknown LoRA target"),
                                     ("lora", {"rank": 4}, "unknown lora option"),
                                     ("adapter", {"bottleneck": -1}, "positive integer"),
                                     ("prompt", {"num_virtual_tokens": 0}, "positive integer"),
                                     ("bitfit", {"r": 2}, "takes no options"),
                                     ("ia3", {}, "unknown fine-tuning method")]:
        with pytest.raises(LmlabError, match=message):
            apply_method(_model("bert"), method, **options)
    adapted = _model("bert")
    apply_method(adapted, "prompt", num_virtual_tokens=2)
    with pytest.raises(LmlabError, match="already has a prompt adaptation"):
        apply_method(adapted, "lora")
