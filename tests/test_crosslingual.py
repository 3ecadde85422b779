"""Two languages offline: the SWORD Bible reader, FreeDict's word pairs, the alignment maps
(least squares, Procrustes, self-learning) with precision@k, and the experiment script at toy
size (scripts/crosslingual_alignment.py, docs/crosslingual.md)."""

from __future__ import annotations

import collections
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from lmlab.text.sources import get_source
from lmlab.text.sources.dictd import freedict_pairs
from lmlab.text.sources.sword import SwordSource, bible_verses, sword_modules
from lmlab.utils.errors import LmlabError
from lmlab.vectors.align import (
    centred_unit_rows,
    compare_alignments,
    least_squares,
    retrieve,
    reweighted_maps,
    robust_self_learning,
    self_learning,
)
from lmlab.vectors.keyed import WordVectors

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "crosslingual_alignment.py"


def test_bibles_line_up_verse_by_verse():
    english, spanish = bible_verses("engKJV2006eb", ["John"]), bible_verses("spaRV1909eb", ["John"])
    assert english.keys() == spanish.keys() and len(english) == 879
    assert english["John.3.16"].startswith("For God so loved the world")
    assert spanish["John.3.16"].startswith("Porque de tal manera amó Dios al mundo")
    assert not any("¶" in text or text != text.strip() for text in english.values())
    assert {"engKJV2006eb", "spaRV1909eb"} <= set(sword_modules())


def test_sword_refusals_and_source():
    with pytest.raises(LmlabError, match="no SWORD module 'klingon'"):
        bible_verses("klingon")
    with pytest.raises(LmlabError, match="no verses in the books Narnia"):
        bible_verses("spaRV1909eb", ["Narnia"])
    source = get_source("sword:spaRV1909eb")
    assert isinstance(source, SwordSource) and source.name == "sword:spaRV1909eb"
    assert source.is_available() and not SwordSource("klingon").is_available()


def test_freedict_pairs_both_directions():
    pairs = freedict_pairs("eng", "spa")
    assert ("water", "agua") in pairs and ("god", "dios") in pairs and ("two", "dos") in pairs
    # eng-spa cuts "one hundred" to a headword "one": only one direction gives that pair
    assert ("one", "ciento") not in pairs
    assert ("one", "ciento") in freedict_pairs("eng", "spa", both_directions=False)
    assert all(" " not in a and " " not in b for a, b in pairs)
    assert {(b, a) for a, b in freedict_pairs("spa", "eng")} == set(pairs)
    with pytest.raises(LmlabError, match="freedict-eng-xyz"):
        freedict_pairs("eng", "xyz")


def test_least_squares_recovers_a_linear_map():
    rng = np.random.default_rng(0)
    x, a = rng.normal(size=(200, 8)), rng.normal(size=(8, 8))
    # tol: a float64 least-squares solve of an exactly linear, well-conditioned system, cast to float32
    np.testing.assert_allclose(least_squares(x, x @ a), a, atol=1e-4)


def test_retrieve_best_k_in_score_order():
    rng = np.random.default_rng(1)
    queries, keys = rng.normal(size=(5, 6)), rng.normal(size=(40, 6))
    top = retrieve(queries, keys, "nn", best=4)
    scores = (queries / np.linalg.norm(queries, axis=1, keepdims=True)) @ (
        keys / np.linalg.norm(keys, axis=1, keepdims=True)).T
    np.testing.assert_array_equal(top, np.argsort(-scores, axis=1)[:, :4])
    np.testing.assert_array_equal(top[:, 0], retrieve(queries, keys, "nn"))


def _rotated_spaces(size=1500, dim=24, noise=0.05):
    rng = np.random.default_rng(2)
    a = rng.normal(size=(size, dim)).astype(np.float32)
    rotation, _ = np.linalg.qr(rng.normal(size=(dim, dim)))
    b = (a @ rotation + rng.normal(scale=noise, size=a.shape)).astype(np.float32)
    return (WordVectors([f"s{i}" for i in range(size)], a),
            WordVectors([f"t{i}" for i in range(size)], b))


def test_self_learning_from_a_small_seed_finds_the_rotation():
    source, target = _rotated_spaces()
    x, z = centred_unit_rows(source.matrix), centred_unit_rows(target.matrix)
    mapping, history = self_learning(x, z, [(i, i) for i in range(10)])  # 6 in 24-D: stuck
    assert (retrieve(x @ mapping, z, "nn") == np.arange(len(x))).mean() > 0.99
    assert history[-1] > history[0] and len(history) >= 2


def test_reweighted_maps_meet_in_one_space():
    rng = np.random.default_rng(3)
    x = rng.normal(size=(300, 12))
    rotation, _ = np.linalg.qr(rng.normal(size=(12, 12)))
    z = x @ rotation  # an exact rotation: the two mapped spaces coincide
    map_x, map_z = reweighted_maps(x, z, np.arange(300), np.arange(300))
    # tol: float32 maps built from float64 SVDs, whitening and an inverse of 12-D Gaussian data
    np.testing.assert_allclose(x @ map_x, z @ map_z, atol=1e-4)
    assert not np.allclose(map_z, np.eye(12), atol=0.1)  # both sides move


def test_robust_self_learning_finds_the_rotation():
    source, target = _rotated_spaces(size=600)
    x, z = centred_unit_rows(source.matrix), centred_unit_rows(target.matrix)
    map_x, map_z, history = robust_self_learning(x, z, [(i, i) for i in range(10)], patience=2)
    assert (retrieve(x @ map_x, z @ map_z, "nn") == np.arange(len(x))).mean() > 0.99
    assert max(history) > history[0]
    with pytest.raises(LmlabError, match="keep must be in"):
        robust_self_learning(x, z, [(0, 0)], keep=0)


def test_compare_alignments_floor_and_ceiling():
    source, target = _rotated_spaces()
    pairs = [(f"s{i}", f"t{i}") for i in range(1500)]
    table = compare_alignments(source, target, pairs[:600], pairs[1000:1200], pairs[:20],
                               patience=2)
    assert table["identity"]["nn@1"] < 0.05
    for method in ("least-squares", "procrustes", "self-learning", "robust self-learning"):
        assert table[method]["nn@1"] > 0.95 and table[method]["csls@5"] > 0.95
    with pytest.raises(LmlabError, match="none of the 1 seed pairs"):
        compare_alignments(source, target, pairs[:600], pairs[1000:1200], [("x", "y")])


def test_experiment_script_at_toy_size(tmp_path):
    out = tmp_path / "run"
    result = subprocess.run(
        [sys.executable, str(SCRIPT), "--books", "John", "--epochs", "1", "--seeds", "0",
         "--dim", "16", "--min-count", "3", "--threads", "1", "--patience", "2",
         "--out", str(out)],
        capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-2000:]
    report = json.loads((out / "alignment.json").read_text())
    assert report["sizes"]["test_words"] > 10 and report["sizes"]["seed_pairs"] > 3
    assert set(report["per_seed"][0]) == {"identity", "least-squares", "procrustes",
                                          "self-learning", "robust self-learning"}
    assert (out / "alignment.png").stat().st_size > 5000
    assert json.loads((out / "table-seed0.json").read_text())["table"] == report["per_seed"][0]
    assert "| procrustes |" in result.stdout


def test_transfer_script_at_toy_size(tmp_path):
    out = tmp_path / "transfer"
    result = subprocess.run(
        [sys.executable, str(SCRIPT.with_name("crosslingual_transfer.py")),
         "--books", "Ruth,Jonah,Song,Phlm,Jude", "--pretrain-steps", "6", "--vocab-size", "600",
         "--train", "120", "--dev", "40", "--test", "40", "--epochs", "1", "--seeds", "0",
         "--threads", "1", "--out", str(out)], capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-2000:]
    report = json.loads((out / "transfer.json").read_text())
    assert set(report["rows"]) == {"pretrained", "random init", "pretrained, Spanish labels",
                                   "TF-IDF", "TF-IDF, English test"}
    spanish = [json.loads(line) for line in (out / "spa-test.jsonl").read_text().splitlines()]
    english = [json.loads(line) for line in (out / "eng-test.jsonl").read_text().splitlines()]
    assert [r["id"] for r in spanish] == [r["id"] for r in english] and len(spanish) == 40
    assert {r["label"] for r in spanish} <= {"history", "prophets", "wisdom", "letters"}
    assert (out / "transfer.png").stat().st_size > 5000 and "| pretrained |" in result.stdout
    counts = collections.Counter(r["label"] for r in spanish)  # the chance row, saved too
    assert report["most_frequent_part"] == max(counts.values()) / len(spanish)
    assert (out / "transfer.md").read_text().startswith("| row | English dev | Spanish test |")


def test_translation_script_at_toy_size(tmp_path):
    out = tmp_path / "translate"
    result = subprocess.run(
        [sys.executable, str(SCRIPT.with_name("crosslingual_translation.py")),
         "--books", "Ruth,Jonah,Phlm", "--steps", "4", "--seeds", "0", "--test", "20",
         "--dev", "10", "--vocab-size", "600", "--layers", "1", "--hidden", "32",
         "--threads", "1", "--out", str(out)], capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-2000:]
    report = json.loads((out / "translation.json").read_text())
    assert report["sizes"]["test"] == 20 and report["sizes"]["train"] > 50
    assert 0 <= report["per_seed"]["0"]["4"]["chrf"] <= 100
    test = [json.loads(line) for line in (out / "data" / "test.jsonl").read_text().splitlines()]
    train = {json.loads(line)["key"] for line in (out / "data" / "train.jsonl").open()}
    assert not train & {r["key"] for r in test}  # no test verse is trained on
    assert (out / "translation.png").stat().st_size > 5000 and "| beam 4 |" in result.stdout
