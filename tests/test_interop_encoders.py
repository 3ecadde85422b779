"""Checkpoint interop for the encoder families, checked against transformers (test reference).

Parity tolerance: every compared tensor (last hidden state, all hidden states, attention
probabilities, pooled output, head logits) must agree, in fp32 and eval mode on a padded batch,
within float32 rounding of its size (tests/conftest.py, ``rounding_tolerance``: 3 chained sums
of up to 64 terms), whatever kernels either side uses. Observed differences are ~1e-6 or below
(see docs/models.md).
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest
import torch
from conftest import rounding_tolerance

import lmlab
from lmlab.utils.errors import LmlabError

transformers = pytest.importorskip("transformers")

TOL = 1.0  # in units of the rounding tolerance (see _max_diff)
TINY = dict(vocab_size=64, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
            intermediate_size=64, max_position_embeddings=40)


def _roberta():
    return transformers.RobertaConfig(**{**TINY, "max_position_embeddings": 42},
                                      type_vocab_size=1, layer_norm_eps=1e-5)


def _distilbert():
    return transformers.DistilBertConfig(vocab_size=64, dim=32, n_layers=2, n_heads=4,
                                         hidden_dim=64, max_position_embeddings=40,
                                         sinusoidal_pos_embds=True)


# family case -> (HF config factory, HF head class, {lmlab head: HF output field}, pad id)
CASES = {
    "bert": (lambda: transformers.BertConfig(**TINY), "BertForPreTraining",
             {"mlm": "prediction_logits", "nsp": "seq_relationship_logits"}, 0),
    "roberta": (_roberta, "RobertaForMaskedLM", {"mlm": "logits"}, 1),
    "albert": (lambda: transformers.AlbertConfig(**TINY, embedding_size=16),
               "AlbertForPreTraining", {"mlm": "prediction_logits", "sop": "sop_logits"}, 0),
    "electra-discriminator": (lambda: transformers.ElectraConfig(**TINY, embedding_size=16),
                              "ElectraForPreTraining", {"rtd": "logits"}, 0),
    "electra-generator": (lambda: transformers.ElectraConfig(**TINY, embedding_size=16),
                          "ElectraForMaskedLM", {"mlm": "logits"}, 0),
    "distilbert": (_distilbert, "DistilBertForMaskedLM", {"mlm": "logits"}, 0),
    "roformer": (lambda: transformers.RoFormerConfig(**TINY), "RoFormerForMaskedLM",
                 {"mlm": "logits"}, 0),
}
NO_TOKEN_TYPES = {"distilbert", "roberta"}  # no second segment


def _batch(pad_id: int, with_types: bool) -> dict[str, torch.Tensor]:
    """Three rows of different lengths, right-padded with ``pad_id``."""
    generator = torch.Generator().manual_seed(1)
    lengths = [9, 6, 3]
    ids = torch.randint(3, 64, (3, 9), generator=generator)
    mask = torch.zeros(3, 9, dtype=torch.long)
    for row, length in enumerate(lengths):
        mask[row, :length] = 1
    ids = ids.masked_fill(mask == 0, pad_id)
    batch = {"input_ids": ids, "attention_mask": mask}
    if with_types:
        types = torch.zeros_like(ids)
        types[0, 5:] = 1
        batch["token_type_ids"] = types
    return batch


def _perturbed(model):
    """Give every weight random values (unit norms and zero biases would hide a swapped name)."""
    generator = torch.Generator().manual_seed(2)
    with torch.no_grad():
        for param in model.parameters():
            if param.requires_grad:
                param.add_(torch.randn(param.shape, generator=generator) * 0.05)
    return model


def _max_diff(a: torch.Tensor, b: torch.Tensor) -> float:
    """Largest |a - b| in units of the float32 rounding tolerance for values of b's size
    through 2 layers and a head (sums of up to 64 terms): above 1 is more than rounding."""
    assert a.shape == b.shape, (a.shape, b.shape)
    tolerance = rounding_tolerance(terms=64, depth=3, scale=float(b.abs().max()))
    return (a.float() - b.float()).abs().max().item() / tolerance


def _compare_stack(ours, theirs, record: dict[str, float]) -> None:
    """Hidden states (all of them) and attention probabilities agree."""
    record["last_hidden_state"] = _max_diff(ours.last_hidden_state,
                                            theirs.hidden_states[-1])
    assert len(ours.hidden_states) == len(theirs.hidden_states)
    record["hidden_states"] = max(_max_diff(a, b)
                                  for a, b in zip(ours.hidden_states, theirs.hidden_states))
    assert len(ours.attentions) == len(theirs.attentions)
    record["attentions"] = max(_max_diff(a, b) for a, b in zip(ours.attentions, theirs.attentions))


def _hf_run(model, batch):
    with torch.no_grad():
        return model(**batch, output_hidden_states=True, output_attentions=True)


def _ours_run(model, batch):
    with torch.no_grad():
        return model(**batch, output_hidden_states=True, output_attentions=True)


@pytest.fixture(scope="module")
def hf_checkpoints(tmp_path_factory):
    """One randomly initialised, perturbed transformers checkpoint per family case."""
    folders = {}
    for case, (make_config, class_name, _, _) in CASES.items():
        torch.manual_seed(0)
        model = _perturbed(getattr(transformers, class_name)(make_config())).eval()
        folder = tmp_path_factory.mktemp(case)
        model.save_pretrained(folder)
        folders[case] = folder
    return folders


@pytest.mark.numerics
@pytest.mark.parametrize("case", list(CASES))
def test_parity_hf_to_lmlab(case, hf_checkpoints):
    """transformers checkpoint -> lmlab: same hidden states, attentions and head logits."""
    _, class_name, outputs, pad_id = CASES[case]
    folder = hf_checkpoints[case]
    ours = lmlab.from_pretrained(folder)
    assert tuple(ours.heads) == tuple(outputs), "heads chosen from config.json architectures"
    theirs = getattr(transformers, class_name).from_pretrained(
        folder, attn_implementation="eager").eval()
    batch = _batch(pad_id, case not in NO_TOKEN_TYPES)
    ref, got = _hf_run(theirs, batch), _ours_run(ours, batch)
    diffs: dict[str, float] = {}
    _compare_stack(got, ref, diffs)
    for head, field in outputs.items():
        diffs[f"{head} logits"] = _max_diff(got.head_logits[head], ref[field])
    assert max(diffs.values()) <= TOL, diffs


@pytest.mark.numerics
@pytest.mark.parametrize("case", list(CASES))
def test_parity_lmlab_to_hf(case, hf_checkpoints, tmp_path):
    """lmlab save -> transformers AutoModel and the AutoModelFor... class: same outputs."""
    _, class_name, outputs, pad_id = CASES[case]
    ours = lmlab.from_pretrained(hf_checkpoints[case])
    saved = lmlab.save_pretrained(ours, tmp_path / "saved")
    config = json.loads((saved / "config.json").read_text())
    assert config["architectures"] == [class_name]
    batch = _batch(pad_id, case not in NO_TOKEN_TYPES)
    got = _ours_run(ours, batch)

    head_model = getattr(transformers, class_name).from_pretrained(
        saved, attn_implementation="eager").eval()
    ref = _hf_run(head_model, batch)
    diffs: dict[str, float] = {}
    _compare_stack(got, ref, diffs)
    for head, field in outputs.items():
        diffs[f"{head} logits"] = _max_diff(got.head_logits[head], ref[field])

    bare = transformers.AutoModel.from_pretrained(saved, attn_implementation="eager").eval()
    bare_out = _hf_run(bare, batch)
    diffs["AutoModel last_hidden_state"] = _max_diff(got.last_hidden_state,
                                                     bare_out.last_hidden_state)
    if got.pooler_output is not None and getattr(bare_out, "pooler_output", None) is not None:
        diffs["pooler_output"] = _max_diff(got.pooler_output, bare_out.pooler_output)
    assert max(diffs.values()) <= TOL, diffs


@pytest.mark.numerics
def test_bare_model_round_trip_with_pooler(tmp_path):
    """A bare checkpoint (RobertaModel, with pooler) loads bare and writes back bare."""
    torch.manual_seed(0)
    hf = _perturbed(transformers.RobertaModel(_roberta())).eval()
    hf.save_pretrained(tmp_path / "hf")
    ours = lmlab.from_pretrained(tmp_path / "hf")
    assert len(ours.heads) == 0 and ours.pooler is not None
    batch = _batch(1, with_types=False)
    got = _ours_run(ours, batch)
    ref = _hf_run(hf, batch)
    assert _max_diff(got.pooler_output, ref.pooler_output) <= TOL
    saved = lmlab.save_pretrained(ours, tmp_path / "ours")
    assert json.loads((saved / "config.json").read_text())["architectures"] == ["RobertaModel"]
    again = transformers.AutoModel.from_pretrained(saved).eval()
    assert _max_diff(_hf_run(again, batch).pooler_output, ref.pooler_output) <= TOL


def test_head_argument_overrides_architectures(hf_checkpoints):
    """``head=`` picks the heads: kept ones load, absent ones start fresh and are reported."""
    albert = lmlab.from_pretrained(hf_checkpoints["albert"], head="sop")
    assert list(albert.heads) == ["sop"] and albert.fresh_heads == []
    electra = lmlab.from_pretrained(hf_checkpoints["electra-generator"], head=["rtd"])
    assert list(electra.heads) == ["rtd"] and electra.fresh_heads == ["rtd"]
    bare = lmlab.from_pretrained(hf_checkpoints["bert"], head=[])
    assert len(bare.heads) == 0


def test_albert_layer_groups_rejected(tmp_path):
    config = transformers.AlbertConfig(**TINY, embedding_size=16, num_hidden_groups=2)
    transformers.AlbertModel(config).save_pretrained(tmp_path)
    with pytest.raises(LmlabError, match="num_hidden_groups=2"):
        lmlab.from_pretrained(tmp_path)


# -- sharded checkpoints ------------------------------------------------------------------------
def test_sharded_save_loads_in_transformers(hf_checkpoints, tmp_path):
    ours = lmlab.from_pretrained(hf_checkpoints["bert"])
    saved = lmlab.save_pretrained(ours, tmp_path / "sharded", max_shard_bytes=40_000)
    shards = sorted(saved.glob("model-*-of-*.safetensors"))
    assert len(shards) > 2 and (saved / "model.safetensors.index.json").exists()
    assert not (saved / "model.safetensors").exists()
    theirs = transformers.BertForPreTraining.from_pretrained(
        saved, attn_implementation="eager").eval()
    batch = _batch(0, True)
    got, ref = _ours_run(ours, batch), _hf_run(theirs, batch)
    assert _max_diff(got.head_logits["mlm"], ref.prediction_logits) <= TOL
    reloaded = lmlab.from_pretrained(saved)
    assert _max_diff(_ours_run(reloaded, batch).last_hidden_state, got.last_hidden_state) == 0


def test_transformers_sharded_save_loads(tmp_path):
    torch.manual_seed(0)
    theirs = _perturbed(transformers.AlbertForPreTraining(
        transformers.AlbertConfig(**TINY, embedding_size=16))).eval()
    theirs.save_pretrained(tmp_path, max_shard_size="20KB")
    assert len(list(tmp_path.glob("model-*.safetensors"))) > 1
    ours = lmlab.from_pretrained(tmp_path)
    batch = _batch(0, True)
    got, ref = _ours_run(ours, batch), _hf_run(theirs, batch)
    assert _max_diff(got.head_logits["sop"], ref.sop_logits) <= TOL
    assert _max_diff(got.head_logits["mlm"], ref.prediction_logits) <= TOL


# -- bad checkpoints: one error listing every problem ------------------------------------------
def _rewrite_weights(folder, edit) -> None:
    from safetensors.torch import load_file, save_file

    tensors = load_file(str(folder / "model.safetensors"))
    edit(tensors)
    save_file(tensors, str(folder / "model.safetensors"), metadata={"format": "pt"})


def _bert_folder(tmp_path):
    config = lmlab.models.config.TransformerConfig(
        vocab_size=64, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
        intermediate_size=64, max_position_embeddings=40)
    from lmlab.models.model import LanguageModel

    return lmlab.save_pretrained(LanguageModel(config, heads=["mlm"]), tmp_path / "bert")


def test_missing_tensor_reported(tmp_path):
    folder = _bert_folder(tmp_path)
    _rewrite_weights(folder, lambda t: t.pop("bert.encoder.layer.1.output.dense.weight"))
    with pytest.raises(LmlabError, match=r"missing tensors: bert\.encoder\.layer\.1\.output\.dense"
                                         r"\.weight") as info:
        lmlab.from_pretrained(folder)
    assert "unexpected" not in str(info.value) and "mis-shaped" not in str(info.value)


def test_unexpected_tensor_reported(tmp_path):
    folder = _bert_folder(tmp_path)
    _rewrite_weights(folder, lambda t: t.update({"bert.encoder.layer.7.extra": torch.zeros(3)}))
    with pytest.raises(LmlabError, match=r"unexpected tensors: bert\.encoder\.layer\.7\.extra"):
        lmlab.from_pretrained(folder)


def test_misshaped_tensor_reported(tmp_path):
    folder = _bert_folder(tmp_path)
    _rewrite_weights(folder, lambda t: t.update(
        {"bert.encoder.layer.0.intermediate.dense.bias": torch.zeros(65)}))
    with pytest.raises(LmlabError, match=r"mis-shaped tensors: bert\.encoder\.layer\.0\.intermediate"
                                         r"\.dense\.bias: checkpoint \(65,\), model \(64,\)"):
        lmlab.from_pretrained(folder)


def test_all_problems_in_one_error(tmp_path):
    folder = _bert_folder(tmp_path)

    def edit(tensors):
        tensors.pop("bert.embeddings.LayerNorm.bias")
        tensors["stray.weight"] = torch.zeros(2)
        tensors["cls.predictions.transform.dense.weight"] = torch.zeros(3, 3)

    _rewrite_weights(folder, edit)
    with pytest.raises(LmlabError) as info:
        lmlab.from_pretrained(folder)
    message = str(info.value)
    for part in ("missing tensors: bert.embeddings.LayerNorm.bias", "unexpected tensors: stray",
                 "mis-shaped tensors: cls.predictions.transform.dense.weight", "fix:"):
        assert part in message, message


def test_pickle_needs_allow_pickle(hf_checkpoints, tmp_path):
    from safetensors.torch import load_file

    source = hf_checkpoints["distilbert"]
    folder = tmp_path / "pickled"
    folder.mkdir()
    (folder / "config.json").write_text((source / "config.json").read_text())
    torch.save(load_file(str(source / "model.safetensors")), folder / "pytorch_model.bin")
    with pytest.raises(LmlabError, match=r"(?s)pickled checkpoint.*allow_pickle=True"):
        lmlab.from_pretrained(folder)
    ours = lmlab.from_pretrained(folder, allow_pickle=True)
    reference = lmlab.from_pretrained(source)
    batch = _batch(0, False)
    assert _max_diff(_ours_run(ours, batch).logits, _ours_run(reference, batch).logits) == 0


# -- memory: the loader streams tensors ---------------------------------------------------------
# Peak resident memory is read from /proc/self/status (VmHWM: the high-water mark of this
# process's own address space). resource.getrusage's ru_maxrss is not used: Linux carries it
# over from the parent across fork/exec, so a child of a large pytest process would report the
# parent's peak. The checkpoint is written by another child for the same reason.
_MAKE_SCRIPT = textwrap.dedent("""
    import sys
    import lmlab
    from lmlab.models.config import TransformerConfig
    from lmlab.models.model import LanguageModel
    lmlab.save_pretrained(LanguageModel(TransformerConfig(), heads=[]), sys.argv[1])  # bert-base
""")
_RSS_SCRIPT = textwrap.dedent("""
    import json, resource, sys
    import torch
    from lmlab.interop.hf import load_pretrained

    def peak():
        try:
            with open("/proc/self/status") as status:
                line = next(l for l in status if l.startswith("VmHWM:"))
            return int(line.split()[1]) * 1024
        except OSError:
            return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024

    torch.ones(1) @ torch.ones(1)  # warm up the allocator and kernels
    before = peak()
    model = load_pretrained(sys.argv[1])
    after = peak()
    weights = sum(p.numel() * p.element_size() for p in model.parameters())
    print(json.dumps({"growth": after - before, "weights": weights}))
""")


@pytest.mark.slow  # ~12 s CPU, 30+ s wall on the shared machine
def test_loading_holds_one_copy_of_the_weights(tmp_path):
    """Peak RSS growth while loading a BERT-base-sized checkpoint (110M parameters, 438 MB) is
    ~1x its weights (model + the largest tensor being copied: 1.2x), not 2x."""
    env = {"OMP_NUM_THREADS": "1", "PATH": "/usr/bin:/bin"}
    folder = tmp_path / "bert-base"
    subprocess.run([sys.executable, "-c", _MAKE_SCRIPT, str(folder)], check=True, env=env)
    result = subprocess.run([sys.executable, "-c", _RSS_SCRIPT, str(folder)],
                            capture_output=True, text=True, check=True, env=env)
    figures = json.loads(result.stdout.strip().splitlines()[-1])
    ratio = figures["growth"] / figures["weights"]
    assert 0.9 < ratio < 1.5, figures


@pytest.mark.numerics
def test_roformer_classification_head_uses_the_models_activation(tmp_path):
    """transformers' RoFormerClassificationHead applies hidden_act (ELECTRA's: always GELU)."""
    from lmlab.models.task_heads import task_logits

    torch.manual_seed(0)
    config = transformers.RoFormerConfig(**TINY, hidden_act="relu", num_labels=3)
    theirs = _perturbed(transformers.RoFormerForSequenceClassification(config)).eval()
    theirs.save_pretrained(tmp_path)
    ours = lmlab.from_pretrained(tmp_path)
    assert ours.config.extra["classifier_act"] == "relu"
    batch = _batch(0, True)
    with torch.no_grad():
        expected = theirs(**batch).logits
        got = task_logits(ours, "sequence-classification", batch)
    assert _max_diff(got, expected) <= TOL
