"""The real all-MiniLM-L6-v2 checkpoint: lmlab's hidden states and sentence embeddings equal
transformers' and sentence-transformers' on real text (WordNet noun glosses), batched with
padding. Tolerances: hidden states max abs <= 1e-4 at every real (non-padding) token of every
layer, pooled output <= 1e-4, normalised embeddings max abs <= 1e-5.

States at padding positions are compared too, loosely (1e-3): nothing reads them (attention
masks them as keys, pooling skips them), and float noise grows there (measured up to 3.7e-4,
identical with transformers' eager and SDPA attention, while real tokens agree to 1e-5)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

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
    worst_real = worst_padding = 0.0
    with torch.no_grad():
        for batch in batches:
            got = ours(**batch, output_hidden_states=True)
            ref = theirs(**batch, output_hidden_states=True)
            real = batch["attention_mask"].bool()  # (B, T)
            for a, b in zip(got.hidden_states, ref.hidden_states, strict=True):
                diff = (a - b).abs()  # (B, T, H)
                worst_real = max(worst_real, diff[real].max().item())
                if (~real).any():
                    worst_padding = max(worst_padding, diff[~real].max().item())
            worst_real = max(worst_real, (got.pooler_output - ref.pooler_output).abs().max().item())
    assert worst_real <= 1e-4, worst_real
    assert worst_padding <= 1e-3, worst_padding


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
    assert (ours_embeddings - reference).abs().max().item() <= 1e-5
    cosine = torch.nn.functional.cosine_similarity(ours_embeddings, reference, dim=-1)
    assert (1 - cosine).abs().max().item() <= 1e-5
