"""Static word vectors: formats (against gensim's reader and writer), similarity and analogy
evaluation (against gensim's evaluate_word_pairs / evaluate_word_analogies on the real GloVe
vectors), Procrustes and CSLS (against scipy and the definition), bad input."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest
import torch
from conftest import assert_close_rounding

from lmlab.utils.errors import LmlabError
from lmlab.vectors import align, evaluate
from lmlab.vectors.keyed import WordVectors, glove_6b_50d, load_vectors, save_vectors

gensim_models = pytest.importorskip("gensim.models")


@pytest.fixture(scope="module")
def glove20k() -> WordVectors:
    return load_vectors("glove-6b-50d", limit=20_000)


def _gensim(vectors: WordVectors):
    kv = gensim_models.KeyedVectors(vectors.dim)
    kv.add_vectors(vectors.words, np.asarray(vectors.matrix))
    return kv


def test_glove_vectors_are_stanfords():
    glove = glove_6b_50d()
    assert len(glove) == 400_000 and glove.dim == 50
    # tol: the file's decimals as float32 (6e-8 of themselves)
    assert glove.vector("the")[:2].tolist() == pytest.approx([0.418, 0.24968])
    assert glove.vector("qqqzzzxq") is None
    assert glove.most_similar("frog", topn=3)[0][0] in {"snake", "toad", "frogs"}


@pytest.mark.parametrize("fmt", ["word2vec", "word2vec-binary", "glove"])
def test_formats_round_trip_and_match_gensim(tmp_path, glove20k, fmt):
    vectors = WordVectors([*glove20k.words[:300], "naïve"], np.asarray(glove20k.matrix[:301]))
    path = tmp_path / ("v.bin" if fmt == "word2vec-binary" else "v.txt")
    save_vectors(vectors, path, fmt)
    back = load_vectors(path)
    assert back.words == vectors.words
    np.testing.assert_array_equal(back.matrix, vectors.matrix)  # float32 round-trips exactly
    # gensim reads what we write, and we read what gensim writes
    binary, header = fmt == "word2vec-binary", fmt != "glove"
    theirs = gensim_models.KeyedVectors.load_word2vec_format(
        str(path), binary=binary, no_header=not header)
    assert theirs.index_to_key == vectors.words
    np.testing.assert_array_equal(theirs.vectors, vectors.matrix)
    if header:
        written = tmp_path / ("g.bin" if binary else "g.txt")
        theirs.save_word2vec_format(str(written), binary=binary)
        again = load_vectors(written)
        assert again.words == vectors.words
        # gensim writes str() of each float32: the shortest digits that read back the same
        np.testing.assert_array_equal(again.matrix, vectors.matrix)


def test_format_follows_the_suffix_and_text_is_not_read_as_binary(tmp_path, glove20k):
    vectors = WordVectors(glove20k.words[:50], np.asarray(glove20k.matrix[:50]))
    save_vectors(vectors, tmp_path / "v.bin")  # no format named: binary, as load_vectors reads
    assert load_vectors(tmp_path / "v.bin").words == vectors.words
    assert not (tmp_path / "v.bin").read_bytes()[20:200].isascii()
    save_vectors(vectors, tmp_path / "text.bin", "word2vec")  # text under a binary name
    with pytest.raises(LmlabError, match="holds word2vec text, not binary"):
        load_vectors(tmp_path / "text.bin")
    np.testing.assert_array_equal(load_vectors(tmp_path / "text.bin", format="word2vec").matrix,
                                  vectors.matrix)


@pytest.mark.numerics
def test_similarity_matches_gensim(glove20k):
    kv = _gensim(glove20k)
    for name in ("wordsim353", "simlex999"):
        ours = evaluate.evaluate_similarity(glove20k, name, restrict_vocab=15_000)
        pearson, spearman, oov_percent = kv.evaluate_word_pairs(
            str(evaluate.evaluation_file(name)), restrict_vocab=15_000)
        # float32 cosines of 50 numbers (ours and gensim's sums), then correlations over the
        # pairs; values <= 1
        bound = {"terms": ours.pairs, "depth": 2, "scale": 1.0, "dtype": torch.float32}
        assert_close_rounding(ours.spearman, spearman.statistic, **bound)
        assert_close_rounding(ours.pearson, pearson.statistic, **bound)
        assert 100 * ours.oov_ratio == pytest.approx(oov_percent)
        assert ours.oov > 0  # the restriction leaves words out: they are counted, not scored


def test_spearman_with_ties_matches_scipy():
    stats = pytest.importorskip("scipy.stats")
    rng = np.random.default_rng(0)
    for high in (5, 40):  # nearly all values tied; a few ties among many distinct values
        x = rng.integers(0, high, 50).astype(float)
        y = np.round(x + rng.normal(0, 1, 50), 1)
        assert evaluate.spearman(x, y) == pytest.approx(stats.spearmanr(x, y).statistic,
                                                        abs=1e-12)


def _analogy_sample(tmp_path, step: int = 40):
    """Every ``step``-th question of every section of the Google set."""
    path = tmp_path / "questions.txt"
    lines = []
    for section, questions in evaluate.read_analogies(evaluate.evaluation_file("google")):
        lines.append(f": {section}")
        lines.extend(" ".join(q) for q in questions[::step])
    path.write_text("\n".join(lines) + "\n")
    return path


def test_3cosadd_matches_gensim_per_section(tmp_path, glove20k):
    path = _analogy_sample(tmp_path)
    ours = evaluate.evaluate_analogies(glove20k, path, "3cosadd", restrict_vocab=10_000,
                                       batch_size=64)
    _, sections = _gensim(glove20k).evaluate_word_analogies(str(path), restrict_vocab=10_000)
    theirs = {s["section"]: (len(s["correct"]), len(s["correct"]) + len(s["incorrect"]))
              for s in sections[:-1]}
    assert {s: n for s, (_, n) in ours.sections.items()} == {s: n for s, (_, n) in theirs.items()}
    # tol: the same answers; a near-tie may fall either way on another CPU's summation order
    assert abs(ours.correct - sum(c for c, _ in theirs.values())) <= 1
    assert ours.accuracy > 0.4 and ours.oov > 0  # GloVe 50-d answers about half


def test_3cosmul_matches_gensims_cosmul(tmp_path, glove20k):
    kv = _gensim(glove20k)
    questions = [q for _, qs in evaluate.read_analogies(_analogy_sample(tmp_path, 200))
                 for q in qs if all(w.lower() in glove20k.index for w in q)][:30]
    path = tmp_path / "few.txt"
    path.write_text(": mixed\n" + "\n".join(" ".join(q) for q in questions) + "\n")
    ours = evaluate.evaluate_analogies(glove20k, path, "3cosmul")
    expected = 0
    for a, b, c, d in (map(str.lower, q) for q in questions):
        best = next(w for w, _ in kv.most_similar_cosmul(positive=[b, c], negative=[a], topn=5)
                    if w not in {a, b, c})
        expected += best == d
    # tol: a near-tie may fall either way on another CPU's summation order
    assert abs(ours.correct - expected) <= 1 and ours.scored == len(questions)


def test_3cosmul_and_3cosadd_differ_as_levy_and_goldberg_describe(tmp_path):
    """A hand-made 2-d space where the methods disagree: 3CosAdd picks y (one large
    similarity, to b, outweighs the rest) and 3CosMul picks x (no factor near zero)."""
    words = ["a", "b", "c", "x", "y"]
    angles = {"a": 2.15, "b": 0.64, "c": 3.01, "x": 1.17, "y": 0.34}
    matrix = np.array([[np.cos(angles[w]), np.sin(angles[w])] for w in words], np.float32)
    vectors = WordVectors(words, matrix)
    path = tmp_path / "q.txt"
    path.write_text(": s\na b c x\n")
    unit = vectors.unit_rows()
    add = (unit[1] - unit[0] + unit[2]) @ unit[3:].T
    shifted = (1 + unit @ unit[3:].T) / 2  # (5, 2)
    mul = shifted[1] * shifted[2] / (shifted[0] + 1e-6)
    assert add.argmax() == 1 and mul.argmax() == 0  # the space is what the docstring says
    assert evaluate.evaluate_analogies(vectors, path, "3cosadd").correct == 0
    assert evaluate.evaluate_analogies(vectors, path, "3cosmul").correct == 1


def test_case_variants_count_as_the_same_word(tmp_path):
    vectors = WordVectors(["Paris", "france", "rome", "italy", "paris"],
                          np.array([[1, 0], [0, 1], [1, 0.1], [0.1, 1], [5, 5]], np.float32))
    path = tmp_path / "q.txt"
    path.write_text(": capitals\nROME ITALY paris FRANCE\n")
    result = evaluate.evaluate_analogies(vectors, path)
    assert result.sections == {"capitals": (1, 1)}  # "Paris" (row 0) answers for "paris"
    with pytest.raises(LmlabError, match=r"no question of q.txt .* \(1 skipped\)"):
        evaluate.evaluate_analogies(vectors, path, case_insensitive=False)  # "ROME" is unknown


@pytest.mark.numerics
def test_procrustes_matches_scipy_and_recovers_a_rotation(glove20k):
    linalg = pytest.importorskip("scipy.linalg")
    rng = np.random.default_rng(0)
    x = rng.normal(size=(200, 50))
    y = rng.normal(size=(200, 50))
    expected, _ = linalg.orthogonal_procrustes(x, y)
    # float64 SVDs (scipy's and ours), then ours rounded to float32: entries of size <= 1
    assert_close_rounding(align.procrustes(x, y), expected, scale=1.0, dtype=torch.float32)

    rotation, _ = np.linalg.qr(rng.normal(size=(50, 50)))
    source = glove20k.subset(glove20k.words[:5000])
    noise = rng.normal(scale=0.05, size=source.matrix.shape)
    rotated = WordVectors(source.words, source.matrix @ rotation.astype(np.float32) + noise)
    pairs = align.identical_word_pairs(source, rotated, top=3000)
    report = align.align_spaces(source, rotated, pairs, test_fraction=0.2, seed=0)
    assert report.train_pairs == 2400 and report.test_words == 600
    assert report.precision["csls"] > 0.9 and report.precision["nn"] > 0.9
    assert report.precision["unaligned"] < 0.05


def test_csls_follows_its_definition():
    rng = np.random.default_rng(1)
    mapped, target = rng.normal(size=(7, 4)), rng.normal(size=(9, 4))
    unit = lambda m: m / np.linalg.norm(m, axis=1, keepdims=True)  # noqa: E731
    cos = unit(mapped) @ unit(target).T
    k = 3
    r_t = np.sort(cos, axis=1)[:, -k:].mean(axis=1)
    r_s = np.sort(cos, axis=0)[-k:, :].mean(axis=0)
    expected = (2 * cos - r_t[:, None] - r_s[None, :]).argmax(axis=1)
    np.testing.assert_array_equal(align.retrieve(mapped, target, "csls", k=k), expected)
    np.testing.assert_array_equal(align.retrieve(mapped, target, "nn"), cos.argmax(axis=1))


def test_bad_input_is_refused(tmp_path, glove20k):
    with pytest.raises(LmlabError, match="3 words but a vector table"):
        WordVectors(["a", "b", "c"], np.zeros((2, 4)))
    with pytest.raises(LmlabError, match="no word-vector file"):
        load_vectors(tmp_path / "missing.txt")
    ragged = tmp_path / "ragged.txt"
    ragged.write_text("a 1 2 3\nb 1 2\n")
    with pytest.raises(LmlabError, match="ragged.txt:2 has 2 numbers, not 3"):
        load_vectors(ragged)
    empty = tmp_path / "empty.txt"
    empty.write_text("")
    with pytest.raises(LmlabError, match="holds no word vectors"):
        load_vectors(empty)
    truncated = tmp_path / "cut.bin"
    save_vectors(glove20k.subset(glove20k.words[:3]), truncated, "word2vec-binary")
    truncated.write_bytes(truncated.read_bytes()[:-30])
    with pytest.raises(LmlabError, match="truncated"):
        load_vectors(truncated)
    out = tmp_path / "out.txt"
    save_vectors(glove20k.subset(["the"]), out)
    with pytest.raises(LmlabError, match="already exists"):
        save_vectors(glove20k.subset(["the"]), out)
    with pytest.raises(LmlabError, match="cannot be written"):
        save_vectors(WordVectors(["new york"], np.zeros((1, 2))), tmp_path / "s.txt")
    with pytest.raises(LmlabError, match="unknown analogy method"):
        evaluate.evaluate_analogies(glove20k, "google", method="3cosdiv")
    with pytest.raises(LmlabError, match="no evaluation set"):
        evaluate.evaluate_similarity(glove20k, "wordsim999")
    french = WordVectors(["qqxxchat", "qqxxchien"], np.eye(2, dtype=np.float32))
    with pytest.raises(LmlabError, match="0 pairs of wordsim353.tsv have vectors"):
        evaluate.evaluate_similarity(french, "wordsim353")
    with pytest.raises(LmlabError, match="share no word"):
        align.identical_word_pairs(french, glove20k)
    with pytest.raises(LmlabError, match="50 and 2 dimensions"):
        align.align_spaces(glove20k, french, [("the", "qqxxchat")])
    with pytest.raises(LmlabError, match="none of the 1 dictionary pairs"):
        align.align_spaces(glove20k, glove20k, [("qqqzzzxq", "the")])


def test_cli_evaluates_converts_and_aligns_in_a_new_process(tmp_path):
    def lmlab(*args: str) -> str:
        done = subprocess.run([sys.executable, "-m", "lmlab", "vectors", *args],
                              capture_output=True, text=True, cwd=tmp_path)
        assert done.returncode == 0, done.stderr
        return done.stdout

    lmlab("convert", "glove-6b-50d", "small.bin", "--to", "word2vec-binary", "--limit", "5000")
    out = lmlab("evaluate", "small.bin", "--similarity", "wordsim353", "--analogies", "",
                "--json", "scores.json")
    scores = json.loads((tmp_path / "scores.json").read_text())
    expected = evaluate.evaluate_similarity(load_vectors("glove-6b-50d", limit=5000),
                                            "wordsim353")
    assert scores["similarity"]["wordsim353"]["spearman"] == pytest.approx(expected.spearman)
    assert "Spearman" in out
    out = lmlab("align", "small.bin", "glove-6b-50d", "--limit", "5000", "--top", "1000",
                "--save-mapping", "w.npy")
    assert "Procrustes + CSLS" in out
    # the same vectors both sides (the float32 file): the identity up to a float64 SVD of
    # 1,000 pairs rounded to float32
    assert_close_rounding(np.load(tmp_path / "w.npy"), np.eye(50), terms=1000, depth=2,
                          scale=1.0, dtype=torch.float32)
    refused = subprocess.run([sys.executable, "-m", "lmlab", "vectors", "convert",
                              "glove-6b-50d", "small.bin"], capture_output=True, text=True,
                             cwd=tmp_path)
    assert refused.returncode == 2 and "already exists" in refused.stderr
