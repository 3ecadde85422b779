"""PEFT parity: the same base model and the same adapter weights give the same outputs in
lmlab and in peft (the test reference), in both directions (lmlab reads peft's folder, peft
reads lmlab's). Families: BERT (encoder, with and without a sequence-classification head),
Llama (grouped key/value heads) and GPT-2 (fused Conv1D ``c_attn``); methods: LoRA, prompt
tuning and prefix tuning.

Tolerance: fp32 rounding of the outputs' size over a few chained sums (conftest's
``assert_close_rounding``); a wrong rank scaling, a transposed or mis-split B, or a virtual
token in the wrong place moves outputs by about their own size.
"""

from __future__ import annotations

import json

import pytest
import torch
from conftest import assert_close_rounding

import lmlab
from lmlab.adapt import apply_method
from lmlab.adapt.peft_format import load_peft, save_peft
from lmlab.utils.errors import LmlabError

transformers = pytest.importorskip("transformers")
peft = pytest.importorskip("peft")

TINY_BERT = dict(vocab_size=64, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                 intermediate_size=64, max_position_embeddings=40, hidden_dropout_prob=0.0,
                 attention_probs_dropout_prob=0.0)
TINY_LLAMA = dict(vocab_size=64, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                  num_key_value_heads=2, intermediate_size=64, max_position_embeddings=64)
TINY_GPT2 = dict(vocab_size=64, n_embd=32, n_layer=2, n_head=4, n_positions=64,
                 resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, bos_token_id=0,
                 eos_token_id=0)
# family -> (HF class, its config, LoRA target modules (transformers names))
CASES = {
    "bert": ("BertModel", lambda: transformers.BertConfig(**TINY_BERT),
             ["query", "value", "attention.output.dense"]),
    "bert-cls": ("BertForSequenceClassification",
                 lambda: transformers.BertConfig(**TINY_BERT, num_labels=3), ["query", "key"]),
    "llama": ("LlamaForCausalLM", lambda: transformers.LlamaConfig(**TINY_LLAMA),
              ["q_proj", "v_proj", "down_proj"]),
    "gpt2": ("GPT2LMHeadModel", lambda: transformers.GPT2Config(**TINY_GPT2),
             ["c_attn", "mlp.c_proj"]),
}


def _hf_base(case: str, folder):
    class_name, make_config, _ = CASES[case]
    torch.manual_seed(0)
    model = getattr(transformers, class_name)(make_config()).eval()
    model.save_pretrained(folder)
    return model


def _inputs(padded: bool = True) -> dict[str, torch.Tensor]:
    ids = torch.tensor([[5, 9, 13, 2, 7, 11], [4, 8, 15, 16, 23, 42]])
    mask = torch.ones_like(ids)
    if padded:
        mask[0, 4:] = 0
    return {"input_ids": ids, "attention_mask": mask}


def _compare(case: str, ours_model, theirs_model, n_virtual: int = 0, padded: bool = True):
    batch = _inputs(padded)
    with torch.no_grad():
        theirs = theirs_model(**batch)
        ours = ours_model(**batch)
    real = batch["attention_mask"].bool()
    if case == "bert":
        expected, actual = theirs.last_hidden_state[:, n_virtual:], ours.last_hidden_state
    else:  # logits of the head
        expected, actual = theirs.logits, ours.logits
        if expected.dim() == 3:
            expected = expected[:, -actual.shape[1]:]
    if actual.dim() == 3:  # padding positions hold nothing anyone reads
        expected, actual = expected[real], actual[real]
    assert_close_rounding(actual, expected, terms=64, depth=6)
    assert expected.abs().max() > 0.1  # a real signal, not zeros compared with zeros


def _random_lora_b(model) -> None:
    """B is zero at initialisation (the adapter is then a no-op): give it values."""
    generator = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "lora_B" in name:
                param.copy_(torch.randn(param.shape, generator=generator) * 0.2)


@pytest.mark.parametrize("case", list(CASES))
def test_lmlab_reads_peft_lora(tmp_path, case):
    base = _hf_base(case, tmp_path / "base")
    config = peft.LoraConfig(r=4, lora_alpha=12, target_modules=CASES[case][2],
                             task_type="SEQ_CLS" if case == "bert-cls" else None,
                             fan_in_fan_out=case == "gpt2")
    peft_model = peft.get_peft_model(base, config).eval()
    _random_lora_b(peft_model)
    if case == "bert-cls":
        with torch.no_grad():  # the trained head travels in modules_to_save
            peft_model.base_model.model.classifier.modules_to_save["default"].weight.normal_()
    peft_model.save_pretrained(tmp_path / "adapter")

    ours = load_peft(tmp_path / "adapter", lmlab.from_pretrained(tmp_path / "base"))
    assert ours.adaptation.method == "lora"
    _compare(case, ours, peft_model)


@pytest.mark.parametrize("case", list(CASES))
def test_peft_reads_lmlab_lora(tmp_path, case):
    base = _hf_base(case, tmp_path / "base")
    ours = lmlab.from_pretrained(tmp_path / "base")
    if case == "bert-cls":
        ours.heads["sequence-classification"].classifier.weight.data.normal_()
    targets = ("q_proj", "k_proj", "o_proj") if case != "llama" else ("q_proj", "up_proj")
    apply_method(ours, "lora", r=4, alpha=6, targets=targets)
    _random_lora_b(ours)
    if case == "gpt2":  # q, k, v with their own A: written as one block-diagonal c_attn update
        ours.transformer.layers[0].attention.k_proj.lora_A.weight.data.normal_()
    save_peft(ours, tmp_path / "adapter", base_model=tmp_path / "base")
    config = json.loads((tmp_path / "adapter" / "adapter_config.json").read_text())
    assert config["peft_type"] == "LORA" and config["base_model_name_or_path"]
    theirs = peft.PeftModel.from_pretrained(base, tmp_path / "adapter").eval()
    _compare(case, ours.eval(), theirs)
    again = load_peft(tmp_path / "adapter", lmlab.from_pretrained(tmp_path / "base"))
    _compare(case, again, theirs)  # and back: lmlab reads what it wrote


@pytest.mark.parametrize("method", ["prompt", "prefix"])
@pytest.mark.parametrize("case", ["bert", "llama"])
def test_virtual_tokens_parity_both_ways(tmp_path, method, case):
    base = _hf_base(case, tmp_path / "base")
    kind = peft.PromptTuningConfig if method == "prompt" else peft.PrefixTuningConfig
    task = "FEATURE_EXTRACTION" if case == "bert" else "CAUSAL_LM"
    peft_model = peft.get_peft_model(base, kind(task_type=task, num_virtual_tokens=3)).eval()
    with torch.no_grad():
        peft_model.prompt_encoder["default"].embedding.weight.normal_()
    peft_model.save_pretrained(tmp_path / "adapter")
    ours = load_peft(tmp_path / "adapter", lmlab.from_pretrained(tmp_path / "base"))
    n = 3 if method == "prompt" else 0  # prompt tuning's output holds the virtual positions
    _compare(case, ours, peft_model, n_virtual=n, padded=case == "bert")

    save_peft(ours, tmp_path / "written")
    theirs = peft.PeftModel.from_pretrained(_hf_base(case, tmp_path / "base2"),
                                            tmp_path / "written").eval()
    _compare(case, ours, theirs, n_virtual=n, padded=case == "bert")


def test_unsupported_peft_method_is_refused(tmp_path):
    base = _hf_base("bert", tmp_path / "base")
    peft.get_peft_model(base, peft.IA3Config(target_modules=["key", "value"],
                                             feedforward_modules=[])).save_pretrained(
        tmp_path / "ia3")
    with pytest.raises(LmlabError, match="PEFT IA3 adapter, which lmlab does not read"):
        load_peft(tmp_path / "ia3", lmlab.from_pretrained(tmp_path / "base"))
    dora = peft.get_peft_model(_hf_base("bert", tmp_path / "b2"),
                               peft.LoraConfig(r=2, target_modules=["query"], use_dora=True))
    dora.save_pretrained(tmp_path / "dora")
    with pytest.raises(LmlabError, match="use_dora=True"):
        load_peft(tmp_path / "dora", lmlab.from_pretrained(tmp_path / "base"))


def test_peft_lora_on_the_wrong_base_is_refused(tmp_path):
    base = _hf_base("bert", tmp_path / "base")
    peft.get_peft_model(base, peft.LoraConfig(r=2, target_modules=["query"])).save_pretrained(
        tmp_path / "adapter")
    torch.manual_seed(0)
    wider = transformers.BertModel(transformers.BertConfig(**{**TINY_BERT, "hidden_size": 48,
                                                              "num_attention_heads": 4}))
    wider.save_pretrained(tmp_path / "wider")
    with pytest.raises(LmlabError, match="load it on the base model it was trained on"):
        load_peft(tmp_path / "adapter", lmlab.from_pretrained(tmp_path / "wider"))
    _hf_base("llama", tmp_path / "llama")
    with pytest.raises(LmlabError, match="cannot map onto this llama model"):
        load_peft(tmp_path / "adapter", lmlab.from_pretrained(tmp_path / "llama"))


@pytest.mark.numerics
def test_prefix_tuned_classifier_parity_both_ways(tmp_path):
    """A prompt-learning PeftModel saves its task head (modules_to_save) as
    ``base_model.classifier.*`` (no ``.model``): read into lmlab's head, and written there."""
    base = _hf_base("bert-cls", tmp_path / "base")
    peft_model = peft.get_peft_model(base, peft.PrefixTuningConfig(
        task_type="SEQ_CLS", num_virtual_tokens=3)).eval()
    with torch.no_grad():
        peft_model.prompt_encoder["default"].embedding.weight.normal_()
        peft_model.base_model.classifier.modules_to_save["default"].weight.normal_()
    peft_model.save_pretrained(tmp_path / "adapter")
    ours = load_peft(tmp_path / "adapter", lmlab.from_pretrained(tmp_path / "base"))
    _compare("bert-cls", ours, peft_model)

    save_peft(ours, tmp_path / "written")
    theirs = peft.PeftModel.from_pretrained(_hf_base("bert-cls", tmp_path / "base2"),
                                            tmp_path / "written").eval()
    _compare("bert-cls", ours, theirs)


def test_peft_tensors_lmlab_cannot_place_are_refused(tmp_path):
    """modules_to_save beyond a task head (here the pooler) are refused, not dropped."""
    base = _hf_base("bert-cls", tmp_path / "base")
    peft.get_peft_model(base, peft.LoraConfig(
        r=2, target_modules=["query"], task_type="SEQ_CLS",
        modules_to_save=["pooler"])).save_pretrained(tmp_path / "adapter")
    with pytest.raises(LmlabError, match="no place for.*pooler"):
        load_peft(tmp_path / "adapter", lmlab.from_pretrained(tmp_path / "base"))


def test_classifiers_peft_computes_differently_are_refused(tmp_path):
    """PEFT's prompt-tuned classifier pools a virtual token; lmlab's mean pooling is no
    transformers head: both refused (reading and writing) rather than converted silently."""
    base = _hf_base("bert-cls", tmp_path / "base")
    peft.get_peft_model(base, peft.PromptTuningConfig(
        task_type="SEQ_CLS", num_virtual_tokens=2)).save_pretrained(tmp_path / "prompt")
    with pytest.raises(LmlabError, match="first virtual token"):
        load_peft(tmp_path / "prompt", lmlab.from_pretrained(tmp_path / "base"))
    ours = lmlab.from_pretrained(tmp_path / "base")
    apply_method(ours, "prompt", num_virtual_tokens=2)
    with pytest.raises(LmlabError, match="first virtual token"):
        save_peft(ours, tmp_path / "written")
    ours = lmlab.from_pretrained(tmp_path / "base")
    ours.config.extra["pooling"] = "mean"
    apply_method(ours, "lora", r=2)
    with pytest.raises(LmlabError, match="pools by 'mean'"):
        save_peft(ours, tmp_path / "written")
    assert not (tmp_path / "written").exists()
