"""XLNet against transformers 5.23 on random weights moved off their initialisation: the LM head
with perm_mask + target_mapping (the query stream), with memory across two segments, the
attention options (uni, same_length, bi_data, clamp_len), the task heads, both ways; a fresh
process reads what was saved; presets count as transformers does; refusals."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import torch
from conftest import assert_parity, perturb

transformers = pytest.importorskip("transformers")

import lmlab  # noqa: E402
from lmlab.models.presets import preset  # noqa: E402
from lmlab.models.xlnet import XLNetModel  # noqa: E402
from lmlab.utils.errors import LmlabError  # noqa: E402

VOCAB, LENGTH = 97, 12
SHAPE = dict(vocab_size=VOCAB, hidden_size=32, num_attention_heads=4, intermediate_size=64)


def tiny(heads=("plm",), **extra):
    torch.manual_seed(0)
    config = preset("xlnet", "tiny", **SHAPE)
    config.extra.update(extra)
    return perturb(XLNetModel(config, heads=list(heads)))


def batch(rows: int = 4, predictions: int = 4, seed: int = 1):
    """Ids, a left- and right-padded attention mask, two segments, a random perm_mask and a
    target_mapping of ``predictions`` real positions per row."""
    generator = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, VOCAB, (rows, LENGTH), generator=generator)
    mask = torch.ones(rows, LENGTH)
    mask[1, :3] = 0
    mask[2, 9:] = 0
    segments = torch.zeros(rows, LENGTH, dtype=torch.long)
    segments[:, 5:] = 1
    perm = (torch.rand(rows, LENGTH, LENGTH, generator=generator) > 0.5).float()
    mapping = torch.zeros(rows, predictions, LENGTH)
    for row, positions in enumerate(([1, 4, 6, 11], [3, 5, 8, 10], [0, 2, 6, 8], [2, 3, 7, 9])[:rows]):
        mapping[row, torch.arange(predictions), torch.tensor(positions[:predictions])] = 1
    return ids, mask, segments, perm, mapping


def both(ours, theirs, rowwise: bool = False, **inputs):
    """(our logits, transformers'); ``rowwise``: transformers run one row at a time (its causal
    mask cannot take a padding or perm mask of several rows: an in-place broadcast fails)."""
    with torch.no_grad():
        got = ours(**inputs, use_mems=False).logits
        if not rowwise:
            return got, theirs(**inputs, use_mems=False).logits
        rows = [theirs(**{k: v[row:row + 1] for k, v in inputs.items()}, use_mems=False).logits
                for row in range(got.shape[0])]
        return got, torch.cat(rows)


OPTIONS = [dict(), dict(attn_type="uni"), dict(attn_type="uni", same_length=True),
           dict(bi_data=True, clamp_len=5)]


@pytest.mark.parametrize("options", OPTIONS, ids=["bi", "uni", "uni-same_length", "bi_data-clamp"])
def test_lm_head_parity_lmlab_to_transformers(tmp_path, options):
    ours = tiny(**options)
    lmlab.save_pretrained(ours, tmp_path)
    theirs = transformers.XLNetLMHeadModel.from_pretrained(tmp_path).eval()
    ids, mask, segments, perm, mapping = batch()
    real = mask.bool()[..., None].expand(-1, -1, VOCAB)
    rowwise = options.get("attn_type") == "uni"
    got, ref = both(ours, theirs, rowwise, input_ids=ids, attention_mask=mask,
                    token_type_ids=segments)
    assert_parity(got, ref, "content stream", real)
    got, ref = both(ours, theirs, rowwise, input_ids=ids, attention_mask=mask,
                    token_type_ids=segments, perm_mask=perm, target_mapping=mapping)
    assert got.shape == (4, 4, VOCAB)
    assert_parity(got, ref, "query stream")


def test_lm_head_parity_transformers_to_lmlab(tmp_path):
    torch.manual_seed(3)
    config = transformers.XLNetConfig(vocab_size=VOCAB, d_model=32, n_layer=2, n_head=4,
                                      d_inner=64, mem_len=6, ff_activation="gelu")
    theirs = perturb(transformers.XLNetLMHeadModel(config))
    theirs.save_pretrained(tmp_path)
    ours = lmlab.from_pretrained(tmp_path)
    assert isinstance(ours, XLNetModel) and list(ours.heads) == ["plm"]
    assert ours.heads["plm"].decoder.weight is ours.transformer.word_embeddings.weight
    ids, mask, segments, perm, mapping = batch()
    got, ref = both(ours, theirs, input_ids=ids, attention_mask=mask, token_type_ids=segments,
                    perm_mask=perm, target_mapping=mapping)
    assert_parity(got, ref, "query stream")


@pytest.mark.parametrize("memory,kept", [(dict(mem_len=4), 4), (dict(mem_len=0, reuse_len=3), 6)])
def test_memory_across_two_segments(tmp_path, memory, kept):
    """Segment 2 reads segment 1's memory: the memories and the query stream's logits equal
    transformers' (mem_len keeps the last states, reuse_len the first of each segment)."""
    ours = tiny(**memory)
    lmlab.save_pretrained(ours, tmp_path)
    theirs = transformers.XLNetLMHeadModel.from_pretrained(tmp_path).eval()
    ids, mask, segments, perm, mapping = batch()
    half = LENGTH // 2
    with torch.no_grad():
        first = ours(ids[:, :half], attention_mask=mask[:, :half],
                     token_type_ids=segments[:, :half], use_mems=True)
        reference = theirs(ids[:, :half], attention_mask=mask[:, :half],
                           token_type_ids=segments[:, :half], use_mems=True)
        for mine, their in zip(first.mems, reference.mems):
            assert_parity(mine, their.transpose(0, 1), "memory")  # theirs is (M, B, H)
        second = dict(input_ids=ids[:, half:], attention_mask=mask[:, half:],
                      token_type_ids=segments[:, half:],
                      perm_mask=perm[:, half:, half:], target_mapping=mapping[:, 2:, half:],
                      use_mems=True)
        got = ours(**second, mems=first.mems)
        ref = theirs(**second, mems=reference.mems)
    assert_parity(got.logits, ref.logits, "second segment")
    assert got.mems[0].shape[1] == kept
    assert not torch.allclose(got.logits, ours(**second).logits)  # tol: the memory changes them


HEADS = [("sequence-classification", "XLNetForSequenceClassification"),
         ("multiple-choice", "XLNetForMultipleChoice"),
         ("token-classification", "XLNetForTokenClassification")]


@pytest.mark.parametrize("head,architecture", HEADS)
def test_task_heads_both_ways(tmp_path, head, architecture):
    """Our logits on a batch padded on either side equal transformers' on the same rows padded
    on the left (XLNetTokenizer's side: its summary reads the last position); relative positions
    make the padding side invisible to every real token. Then transformers' model read back."""
    ours = tiny(heads=(head,))
    ours.config.extra.update(num_labels=3)
    del ours.heads[head]
    ours.add_head(head)
    perturb(ours.heads[head], seed=5)
    lmlab.save_pretrained(ours, tmp_path / "ours")
    config = json.loads((tmp_path / "ours" / "config.json").read_text())
    assert config["architectures"] == [architecture]
    theirs = getattr(transformers, architecture).from_pretrained(tmp_path / "ours").eval()
    ids, _, segments, _, _ = batch()
    lengths = [12, 9, 7, 10]
    left = torch.zeros(4, LENGTH)
    right = torch.zeros(4, LENGTH)
    right_ids, right_segments = torch.full_like(ids, 5), torch.zeros_like(segments)
    for row, n in enumerate(lengths):
        left[row, LENGTH - n:] = 1
        right[row, :n] = 1
        right_ids[row, :n], right_segments[row, :n] = ids[row, LENGTH - n:], segments[row, LENGTH - n:]
    shape = (2, 2, LENGTH) if head == "multiple-choice" else (4, LENGTH)
    with torch.no_grad():
        ref = theirs(input_ids=ids.view(shape), attention_mask=left.view(shape),
                     token_type_ids=segments.view(shape), use_mems=False).logits
        from lmlab.models.task_heads import task_logits

        got_left = task_logits(ours, head, dict(input_ids=ids.view(shape), attention_mask=left
                                                .view(shape), token_type_ids=segments.view(shape)))
        got_right = task_logits(ours, head, dict(input_ids=right_ids.view(shape),
                                                 attention_mask=right.view(shape),
                                                 token_type_ids=right_segments.view(shape)))
    if head == "token-classification":  # the real tokens, moved to where right padding puts them
        assert_parity(got_left, ref, head, left.bool())
        for row, n in enumerate(lengths):
            assert_parity(got_right[row, :n], ref[row, LENGTH - n:], f"{head} right-padded")
    else:
        assert_parity(got_left, ref, head)
        assert_parity(got_right, ref, f"{head} right-padded")
    theirs = perturb(theirs, seed=7)
    theirs.save_pretrained(tmp_path / "theirs")
    back = lmlab.from_pretrained(tmp_path / "theirs")
    assert list(back.heads) == [head]
    with torch.no_grad():
        ref = theirs(input_ids=ids.view(shape), attention_mask=left.view(shape),
                     use_mems=False).logits
        got = task_logits(back, head, dict(input_ids=ids.view(shape),
                                           attention_mask=left.view(shape)))
    assert_parity(got, ref, f"{head} read from transformers",
                  left.bool() if head == "token-classification" else None)


def test_fresh_process_reload(tmp_path):
    """What lmlab saves (its own format and transformers') loads in a new process with the
    same logits."""
    ours = tiny()
    ids, mask, segments, perm, mapping = batch()
    inputs = dict(input_ids=ids, attention_mask=mask, token_type_ids=segments, perm_mask=perm,
                  target_mapping=mapping, use_mems=False)
    torch.save(inputs, tmp_path / "inputs.pt")
    with torch.no_grad():
        expected = ours(**inputs).logits
    from lmlab.interop.native import save_native

    lmlab.save_pretrained(ours, tmp_path / "hf")
    save_native(ours, tmp_path / "native")
    script = ("import sys, torch, lmlab\n"
              "inputs = torch.load(sys.argv[2])\n"
              "model = lmlab.from_pretrained(sys.argv[1])\n"
              "with torch.no_grad():\n"
              "    torch.save(model(**inputs).logits, sys.argv[3])\n")
    for kind in ("hf", "native"):
        subprocess.run([sys.executable, "-c", script, tmp_path / kind, tmp_path / "inputs.pt",
                        tmp_path / f"{kind}.pt"], check=True, timeout=120)
        # exact: the same weights and ops on the same inputs in another process
        assert torch.equal(torch.load(tmp_path / f"{kind}.pt"), expected), kind


@pytest.mark.parametrize("size", ["tiny", "base"])
def test_preset_parameter_counts(size):
    config = preset("xlnet", size)
    hf = transformers.XLNetConfig(vocab_size=config.vocab_size, d_model=config.hidden_size,
                                  n_layer=config.num_hidden_layers,
                                  n_head=config.num_attention_heads,
                                  d_inner=config.intermediate_size)
    with torch.device("meta"):
        count = sum(p.numel() for p in transformers.XLNetModel(hf).parameters())
    assert config.num_parameters() == count
    if size == "tiny":
        assert XLNetModel(config).num_parameters() == count


def test_refusals(tmp_path):
    ours = tiny()
    ids = torch.randint(0, VOCAB, (2, 6))
    with pytest.raises(LmlabError, match="perm_mask has shape"):
        ours(ids, perm_mask=torch.zeros(2, 6, 5))
    with pytest.raises(LmlabError, match="target_mapping has shape"):
        ours(ids, target_mapping=torch.zeros(2, 6))
    with pytest.raises(LmlabError, match="bi_data needs an even batch"):
        tiny(bi_data=True)(torch.randint(0, VOCAB, (3, 6)))
    with pytest.raises(LmlabError, match="attention type"):
        tiny(attn_type="both")
    config = transformers.XLNetConfig(vocab_size=VOCAB, d_model=32, n_layer=1, n_head=4,
                                      d_inner=64, summary_type="first")
    transformers.XLNetModel(config).save_pretrained(tmp_path)
    with pytest.raises(LmlabError, match="summary_type 'last'"):
        lmlab.from_pretrained(tmp_path)


@pytest.mark.parametrize("attn_type", ["bi", "uni"])
def test_flop_count_equals_the_counted_one(attn_type):
    """The cost report's analytic FLOPs (content stream with its position and segment terms,
    the query stream at M of T positions, the plm head on its rows) equal FlopCounterMode's
    count of a forward pass, exactly."""
    from lmlab.cost.flop_counter import measure_flops
    from lmlab.cost.flops import flops_per_token

    model = tiny(attn_type=attn_type).requires_grad_(False)  # the counter's module tracker
    ids, _, segments, perm, mapping = batch()  # trips on parameters under no_grad
    inputs = dict(input_ids=ids, token_type_ids=segments, perm_mask=perm,
                  target_mapping=mapping, use_mems=False)
    measured, _ = measure_flops(model, inputs, training=False)
    tokens = ids.numel()
    config = model.config
    rows = 2 * LENGTH if attn_type == "bi" else LENGTH + 1  # relative distances, once a batch
    table = 2 * rows * config.hidden_size ** 2 * config.num_hidden_layers
    analytic = flops_per_token(config, LENGTH, training=False, head="plm",
                               sparse_prediction_fraction=mapping.shape[1] / LENGTH) * tokens
    assert measured == analytic + table, (measured, analytic)  # tol: integers, exact counts
    content, _ = measure_flops(model, dict(input_ids=ids, token_type_ids=segments,
                                           use_mems=False), training=False)
    assert content == flops_per_token(config, LENGTH, training=False, head="clm") * tokens \
        + table  # tol: integers, both exact counts
