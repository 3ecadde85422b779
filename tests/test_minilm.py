"""The real all-MiniLM-L6-v2 checkpoint: lmlab's hidden states and sentence embeddings equal
transformers' and sentence-transformers' on real text (WordNet noun glosses), batched with
padding. Tolerances follow from float32 rounding (tests/conftest.py, ``rounding_tolerance``):
layer i's states, the pooled output and the normalised embeddings agree to within the rounding of
i chained sums of up to 1536 terms, at the size of the values compared.

States at padding positions are compared too, loosely (10 times that), from the padded
computation (``skip_padding=False``; the default call skips padding and leaves zeros there, see
models.md): nothing reads them
(attention masks them as keys, pooling skips them), and float noise grows there (measured up to
3.7e-4, identical with transformers' eager and SDPA attention, while real tokens agree to 1e-5)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from conftest import assert_close_rounding

import lmlab

WORDNET_NOUNS = Path("/usr/share/wordnet/data.noun")
NUM_GLOSSES = 300
BATCH = 32
MAX_LENGTH = 256  # sentence_bert_config.json's max_seq_length


def _glosses(count: int) -> list[str]:
    """``count`` glosses spread over the noun file (the text after ``| `` on each synset line)."""
    if not WORDNET_NOUNS.exists():
        pytest.fail(f"{WORDNET_NOUNS} is missing; install the wordnet-base Debian package")
    lines = [line for line in WORDNET_NOUNS.read_text(encoding="utf-8").splitlines()
             if not line.startswith("  ") and " | " in line]
    step = max(1, len(lines) // count)
    return [line.split(" | ", 1)[1].strip() for line in lines[::step][:count]]


@pytest.fixture(scope="module")
def glosses() -> list[str]:
    return _glosses(NUM_GLOSSES)


@pytest.fixture(scope="module")
def ours(minilm_dir):
    return lmlab.from_pretrained(minilm_dir)


@pytest.fixture(scope="module")
def batches(minilm_dir, glosses):
    transformers = pytest.importorskip("transformers")
    tokenizer = transformers.AutoTokenizer.from_pretrained(str(minilm_dir))
    return [tokenizer(glosses[i:i + BATCH], padding=True, truncation=True,
                      max_length=MAX_LENGTH, return_tensors="pt")
            for i in range(0, len(glosses), BATCH)]


def test_glosses_are_real_sentences(glosses, batches):
    assert len(glosses) == NUM_GLOSSES and len(set(glosses)) > NUM_GLOSSES * 0.95
    padded = sum(int((b["attention_mask"] == 0).sum()) for b in batches)
    assert padded > 0, "batches must contain padding"


def test_hidden_states_match_transformers(minilm_dir, ours, batches):
    transformers = pytest.importorskip("transformers")
    theirs = transformers.AutoModel.from_pretrained(str(minilm_dir)).eval()
    with torch.no_grad():
        for batch in batches:
            got = ours(**batch, output_hidden_states=True)  # the default: padding skipped
            ref = theirs(**batch, output_hidden_states=True)
            real = batch["attention_mask"].bool()  # (B, T)
            padded = ours(**batch, output_hidden_states=True, skip_padding=False)
            for depth, (a, p, b) in enumerate(zip(got.hidden_states, padded.hidden_states,
                                                  ref.hidden_states, strict=True)):
                assert_close_rounding(a[real], b[real], terms=1536, depth=max(depth, 1))
                if (~real).any():
                    assert a[~real].abs().max() == 0, "from_pretrained's model skips padding"
                    assert_close_rounding(p[~real], b[~real], terms=1536, depth=max(depth, 1),
                                          scale=10 * float(b[~real].abs().max()))
            assert_close_rounding(got.pooler_output, ref.pooler_output, terms=1536, depth=7)


def test_sentence_embeddings_match_sentence_transformers(minilm_dir, ours, glosses, batches):
    """Mean pooling over real tokens + L2 normalisation, as modules.json prescribes."""
    st = pytest.importorskip("sentence_transformers")
    pooled = []
    with torch.no_grad():
        for batch in batches:
            hidden = ours(**batch).last_hidden_state  # (B, T, H)
            mask = batch["attention_mask"].unsqueeze(-1).float()  # (B, T, 1)
            mean = (hidden * mask).sum(1) / mask.sum(1).clamp(min=1e-9)  # (B, H)
            pooled.append(torch.nn.functional.normalize(mean, dim=-1))
    ours_embeddings = torch.cat(pooled)
    model = st.SentenceTransformer(str(minilm_dir), device="cpu")
    reference = model.encode(glosses, batch_size=BATCH, convert_to_tensor=True)
    assert ours_embeddings.shape == reference.shape == (NUM_GLOSSES, 384)
    # Unit vectors through 6 layers of sums of up to 1536 terms, other kernels on each side.
    assert_close_rounding(ours_embeddings, reference, terms=1536, depth=6, scale=1.0)
    cosine = torch.nn.functional.cosine_similarity(ours_embeddings, reference, dim=-1)
    assert_close_rounding(cosine, torch.ones_like(cosine), terms=1536, depth=6)
