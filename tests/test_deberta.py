"""DeBERTa-v2/v3 and v1 (issue 31): disentangled attention on the one core against transformers
(test reference) both ways, on perturbed random weights and padded batches, for every head the family
maps and the attention's options (log buckets or clamped distances, shared or own position maps,
c2p/p2c, the normalised table, absolute positions at the input, token types, both MLM heads);
the refusals; the v3 presets' parameter counts; a fresh-process reload; MLM pretraining.

Tolerance: float32 rounding of the compared values' size (tests/conftest.py,
``rounding_tolerance``) and at most 1e-4 absolute, as the issue asks.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest
import torch
from conftest import assert_parity, finetune_kinds, perturb, run_lmlab, write_kjv_corpus

import lmlab
from lmlab.models.task_heads import task_logits
from lmlab.utils.errors import LmlabError

transformers = pytest.importorskip("transformers")

#: deberta-v3's attention at a small size; 20 tokens reach past the 8 buckets' exact half
V3 = dict(vocab_size=99, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
          intermediate_size=64, max_position_embeddings=64, relative_attention=True,
          pos_att_type="p2c|c2p", position_buckets=8, max_relative_positions=64,
          share_att_key=True, norm_rel_ebd="layer_norm", position_biased_input=False)
VARIANTS = {
    "v3": {},
    "own-position-maps": dict(share_att_key=False),
    "clamped-distances": dict(position_buckets=-1, max_relative_positions=6, norm_rel_ebd="none",
                              position_biased_input=True, type_vocab_size=2),
    "c2p-only": dict(pos_att_type=["c2p"], share_att_key=False),
    "p2c-only": dict(pos_att_type=["p2c"]),
    "no-relative": dict(relative_attention=False),
    "non-legacy-mlm": dict(legacy=False),
}
CLASSES = {"mlm": "ForMaskedLM", "sequence-classification": "ForSequenceClassification",
           "token-classification": "ForTokenClassification",
           "question-answering": "ForQuestionAnswering", "multiple-choice": "ForMultipleChoice"}






def _padded(shape, seed: int = 0) -> dict[str, torch.Tensor]:
    """Random ids 5..98 of ``shape`` (pad 0), rows right-padded to different lengths."""
    ids = torch.randint(5, 99, shape, generator=torch.Generator().manual_seed(seed))
    mask = torch.ones(shape, dtype=torch.long)
    lengths = torch.randint(3, shape[-1] + 1, shape[:-1],
                            generator=torch.Generator().manual_seed(seed + 1))
    mask[torch.arange(shape[-1]) >= lengths.unsqueeze(-1)] = 0
    mask[(0,) * (len(shape) - 1)][12:] = 0  # at least one row padded
    types = torch.randint(0, 2, shape, generator=torch.Generator().manual_seed(seed + 2))
    return {"input_ids": ids.masked_fill(mask == 0, 0), "attention_mask": mask,
            "token_type_ids": types * mask}


def _logits(model, head: str, batch, ours: bool) -> torch.Tensor:
    with torch.no_grad():
        if ours:
            return model(**batch).head_logits["mlm"] if head == "mlm" else \
                task_logits(model, head, batch)
        out = model(**batch)
    if head == "question-answering":
        return torch.stack([out.start_logits, out.end_logits], dim=-1)
    return out.logits


def _check_both_ways(theirs, head: str, class_name: str, tmp_path, batch) -> None:
    family = theirs.config.model_type
    theirs.save_pretrained(tmp_path / "theirs")
    ours = lmlab.from_pretrained(tmp_path / "theirs")
    assert ours.config.family == family and list(ours.heads) == [head]
    expected = _logits(theirs, head, batch, ours=False)
    got = _logits(ours, head, batch, ours=True)
    # per-token logits at the real tokens (transformers attends from padding too, lmlab skips it)
    where = None if head in ("sequence-classification", "multiple-choice") else \
        batch["attention_mask"].bool()
    assert_parity(got, expected, f"{head} logits (transformers -> lmlab)", where)

    saved = lmlab.save_pretrained(ours, tmp_path / "ours")
    written = json.loads((saved / "config.json").read_text())
    assert written["model_type"] == family and written["architectures"] == [class_name]
    back = getattr(transformers, class_name).from_pretrained(saved).eval()
    assert_parity(got, _logits(back, head, batch, ours=False), f"{head} logits (lmlab -> hf)", where)
    if head != "multiple-choice":
        bare = transformers.AutoModel.from_pretrained(saved).eval()
        assert type(bare).__name__ == class_name.split("For")[0] + "Model"
        with torch.no_grad():
            assert_parity(ours(**batch).last_hidden_state, bare(**batch).last_hidden_state,
                   "AutoModel states", batch["attention_mask"].bool())


@pytest.mark.numerics
@pytest.mark.parametrize("variant,head", [
    (variant, head) for variant in VARIANTS for head in ("mlm", "sequence-classification")
    if head == "mlm" or variant != "non-legacy-mlm"])
def test_attention_options_parity_both_ways(variant, head, tmp_path):
    """DebertaV2ForMaskedLM / ForSequenceClassification -> lmlab -> the same class and
    AutoModel: equal logits and states on a padded batch, for each attention option."""
    class_name = "DebertaV2" + CLASSES[head]
    config = transformers.DebertaV2Config(**{**V3, **VARIANTS[variant]}, num_labels=3)
    torch.manual_seed(0)
    theirs = perturb(getattr(transformers, class_name)(config))
    _check_both_ways(theirs, head, class_name, tmp_path, _padded((3, 20)))


@pytest.mark.numerics
@pytest.mark.parametrize("head", ["token-classification", "question-answering",
                                  "multiple-choice"])
def test_task_heads_parity_both_ways(head, tmp_path):
    class_name = "DebertaV2" + CLASSES[head]
    config = transformers.DebertaV2Config(**V3, num_labels=2 if head == "question-answering"
                                          else 3, pooler_hidden_act="tanh", cls_dropout=0.2)
    torch.manual_seed(0)
    theirs = perturb(getattr(transformers, class_name)(config))
    batch = _padded((2, 3, 20) if head == "multiple-choice" else (3, 20))
    _check_both_ways(theirs, head, class_name, tmp_path, batch)


#: microsoft/deberta-base's attention at a small size (no buckets: the whole table)
V1 = dict(vocab_size=99, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
          intermediate_size=64, max_position_embeddings=64, relative_attention=True,
          pos_att_type="c2p|p2c", position_biased_input=False)
V1_VARIANTS = {"base": {}, "p2c-only": dict(pos_att_type=["p2c"]),
               "clamped-distances": dict(max_relative_positions=6, position_biased_input=True,
                                         type_vocab_size=2),
               "non-legacy-mlm": dict(legacy=False)}


@pytest.mark.numerics
@pytest.mark.parametrize("variant,head", [
    (variant, head) for variant in V1_VARIANTS for head in list(CLASSES)[:4]
    if head == "mlm" or variant != "non-legacy-mlm"])
def test_v1_parity_both_ways(variant, head, tmp_path):
    """DeBERTa v1's classes (fused per-head in_proj, q_bias/v_bias, unbiased keys and pos_proj)
    -> lmlab -> the same class and AutoModel."""
    class_name = "Deberta" + CLASSES[head]
    config = transformers.DebertaConfig(**{**V1, **V1_VARIANTS[variant]},
                                        num_labels=2 if head == "question-answering" else 3)
    torch.manual_seed(0)
    theirs = perturb(getattr(transformers, class_name)(config))
    _check_both_ways(theirs, head, class_name, tmp_path, _padded((3, 20)))


def test_microsoft_v3_config_reads_as_the_preset():
    """microsoft/deberta-v3-base's config.json is preset("deberta-v2", "base"), whose parameter
    count equals transformers' DebertaV2Model (184M with the 128,100-token table)."""
    from lmlab.models.families import get_family
    from lmlab.models.model import LanguageModel
    from lmlab.models.presets import preset

    hf = {"model_type": "deberta-v2", "attention_probs_dropout_prob": 0.1, "hidden_act": "gelu",
          "hidden_dropout_prob": 0.1, "hidden_size": 768, "initializer_range": 0.02,
          "intermediate_size": 3072, "max_position_embeddings": 512, "relative_attention": True,
          "position_buckets": 256, "norm_rel_ebd": "layer_norm", "share_att_key": True,
          "pos_att_type": "p2c|c2p", "layer_norm_eps": 1e-7, "max_relative_positions": -1,
          "position_biased_input": False, "num_attention_heads": 12, "num_hidden_layers": 12,
          "type_vocab_size": 0, "vocab_size": 128100}
    config = get_family("deberta-v2").config_from_hf(hf)
    assert config == preset("deberta-v2", "base")
    for size in ("xsmall", "small", "base", "large"):
        config = preset("deberta-v2", size)
        with torch.device("meta"):
            theirs = transformers.DebertaV2Model(transformers.DebertaV2Config(
                **get_family("deberta-v2").config_to_hf(config)))
            ours = LanguageModel(config, heads=[])
        assert ours.num_parameters() == config.num_parameters() == theirs.num_parameters(), size
    assert preset("deberta-v2", "base").num_parameters() == 183_831_552
    for size in ("base", "large"):  # v1: microsoft/deberta-base and -large
        config = preset("deberta", size)
        with torch.device("meta"):
            theirs = transformers.DebertaModel(transformers.DebertaConfig(
                **get_family("deberta").config_to_hf(config)))
            ours = LanguageModel(config, heads=[])
        assert ours.num_parameters() == config.num_parameters() == theirs.num_parameters(), size


@pytest.mark.parametrize("change,problem", [
    ({"conv_kernel_size": 3}, "convolution after its first layer"),
    ({"embedding_size": 16}, "embedding_size 16 != hidden_size 32"),
    ({"pos_att_type": "c2p|p2p"}, "pos_att_type"),
    ({"talking_head": True}, "talking_head"),
])
def test_what_lmlab_does_not_build_is_refused(change, problem):
    from lmlab.models.families import get_family

    v1 = "talking_head" in change
    config = (transformers.DebertaConfig(**{**V1, **change}) if v1 else
              transformers.DebertaV2Config(**{**V3, **change})).to_dict()
    with pytest.raises(LmlabError, match=problem):
        get_family("deberta" if v1 else "deberta-v2").config_from_hf(config)


def test_v1_and_v2_configs_are_not_saved_as_each_other():
    """v1's keys have no bias, v2's do: a config of one family is refused under the other."""
    from dataclasses import replace

    from lmlab.models.families import get_family
    from lmlab.models.presets import preset

    with pytest.raises(LmlabError, match="key_bias"):
        get_family("deberta-v2").config_to_hf(replace(preset("deberta", "base"),
                                                      family="deberta-v2"))
    with pytest.raises(LmlabError, match="not deberta shaped"):
        get_family("deberta").config_to_hf(replace(preset("deberta-v2", "base"),
                                                   family="deberta"))


# -- a fresh process ----------------------------------------------------------------------------
_RELOAD = textwrap.dedent("""
    import json, sys, torch, lmlab
    model = lmlab.from_pretrained(sys.argv[1])
    batch = {k: torch.tensor(v) for k, v in json.loads(sys.argv[2]).items()}
    with torch.no_grad():
        out = model(**batch)
    print(json.dumps([model.config.family, out.head_logits["mlm"][0, :3].tolist()]))
""")


@pytest.mark.parametrize("family,kind", [("deberta-v2", "native"), ("deberta-v2", "hf"),
                                         ("deberta", "hf")])
def test_saved_model_loads_in_a_fresh_process(family, kind, tmp_path):
    from lmlab.interop.native import save_native
    from lmlab.models.model import LanguageModel
    from lmlab.models.presets import preset

    torch.manual_seed(0)
    small = dict(vocab_size=99, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                 intermediate_size=64, max_position_embeddings=64)
    if family == "deberta-v2":
        small["position_buckets"] = 8
    model = perturb(LanguageModel(preset(family, "base", **small), heads=["mlm"]))
    batch = _padded((3, 20))
    folder = (save_native if kind == "native" else lmlab.save_pretrained)(model, tmp_path / kind)
    assert (kind == "native") == ("lmlab_heads" in (folder / "config.json").read_text())
    with torch.no_grad():
        expected = model(**batch).head_logits["mlm"][0, :3]
    result = subprocess.run([sys.executable, "-c", _RELOAD, str(folder),
                             json.dumps({k: v.tolist() for k, v in batch.items()})],
                            capture_output=True, text=True, check=True)
    name, logits = json.loads(result.stdout.strip().splitlines()[-1])
    assert name == family
    assert torch.equal(torch.tensor(logits), expected)  # exact: same weights, same batch


# -- pretraining --------------------------------------------------------------------------------
def test_mlm_pretraining_through_the_cli(tmp_path):
    """`lmlab pretrain --family deberta-v2 --objective mlm`, 30 steps on KJV chapters: the
    loss falls and the run's model is a folder transformers loads as DebertaV2ForMaskedLM."""

    from lmlab.data.shards import build_shards
    from lmlab.tokenization.tokenizer import Tokenizer

    corpus = write_kjv_corpus(tmp_path / "corpus", 24, 6)
    Tokenizer.train(corpus, kind="unigram", vocab_size=600, template="bert").save_pretrained(
        tmp_path / "tok")
    build_shards(Tokenizer.from_pretrained(tmp_path / "tok"), corpus, tmp_path / "shards",
                 shard_tokens=8192, show_progress=False)
    settings = {"hparams": {"model_args": {"hidden_size": 64, "num_hidden_layers": 2,
                                           "num_attention_heads": 4, "intermediate_size": 128,
                                           "position_buckets": 16}}}
    (tmp_path / "run.json").write_text(json.dumps(settings))
    result = run_lmlab("pretrain", "--config", tmp_path / "run.json", "--family", "deberta-v2",
                       "--size", "xsmall", "--objective", "mlm", "--shards", tmp_path / "shards",
                       "--out", tmp_path / "run", "--seq-len", 64, "--batch-size", 8, "--lr",
                       3e-3, "--steps", 30, "--log-every", 10, "--eval-every", 30, "--seed", 0,
                       "--threads", 1)
    assert result.returncode == 0, result.stderr[-2000:]
    rows = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").open()]
    losses = [r["loss"] for r in rows if r["kind"] == "train"]
    assert losses[-1] < losses[0] - 0.5, losses
    model_dir = tmp_path / "run" / "model"
    config = json.loads((model_dir / "config.json").read_text())
    assert config["model_type"] == "deberta-v2" and config["position_biased_input"] is False
    transformers.DebertaV2ForMaskedLM.from_pretrained(model_dir)


def test_finetune_through_the_cli(tiny_bert_folder, tmp_path):
    """`lmlab finetune` on a DeBERTa-v3-shaped folder (MiniLM's WordPiece tokenizer): the
    ContextPooler head trains (loss falls) and the saved model is DebertaV2ForSequenceClassification."""
    import shutil

    from lmlab.models.model import LanguageModel
    from lmlab.models.presets import preset

    torch.manual_seed(0)
    model = LanguageModel(preset("deberta-v2", "xsmall", vocab_size=30522, hidden_size=32,
                                 num_hidden_layers=2, num_attention_heads=4,
                                 intermediate_size=64, max_position_embeddings=128,
                                 position_buckets=16))
    folder = lmlab.save_pretrained(model, tmp_path / "deberta")
    for name in tiny_bert_folder.iterdir():
        if name.name.startswith(("tokenizer", "vocab", "special_tokens")):
            shutil.copy(name, folder / name.name)
    saved = finetune_kinds(folder, tmp_path / "run")
    assert saved["architectures"] == ["DebertaV2ForSequenceClassification"]
