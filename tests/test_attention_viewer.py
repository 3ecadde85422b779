"""The attention viewer in a real browser: the system's headless Chromium driven by playwright.

The page must work offline (every request to http/https is aborted and counted), log no
console or page errors, offer the model's layers and heads, and draw, for the head picked in
the model view, exactly the lines of that head's weights as computed in Python. One browser
serves the whole module. Skipped, with the reason, where playwright or a Chromium is missing.
"""

from __future__ import annotations

import os
import re
import shutil

import pytest
import torch

from lmlab.analysis import attention as A
from lmlab.analysis.attention_view import MIN_DRAWN, SCALE, write_html
from lmlab.load import load_model_and_tokenizer

BROWSER_PATHS = ("/usr/bin/chromium-headless-shell", "/usr/bin/chromium")
LAUNCH_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking",
               "--disable-component-update", "--no-first-run", "--disable-sync"]


def find_browser(which=shutil.which, exists=os.path.exists) -> tuple[str | None, str]:
    """(path of a Chromium, "") or (None, why not): on PATH first, then the usual paths."""
    for name in ("chromium-headless-shell", "chromium"):
        found = which(name)
        if found:
            return found, ""
    for path in BROWSER_PATHS:
        if exists(path):
            return path, ""
    return None, ("no Chromium for the viewer test: neither chromium-headless-shell nor "
                  f"chromium is on PATH or at {', '.join(BROWSER_PATHS)} (scripts/setup.sh "
                  "installs the system's chromium-headless-shell)")


def test_skip_reason_names_what_was_looked_for():
    path, reason = find_browser(which=lambda name: None, exists=lambda path: False)
    assert path is None and "chromium-headless-shell" in reason and BROWSER_PATHS[1] in reason
    path, reason = find_browser(which=lambda name: None, exists=lambda p: p == BROWSER_PATHS[1])
    assert (path, reason) == (BROWSER_PATHS[1], "")


@pytest.fixture(scope="module")
def browser():
    sync_api = pytest.importorskip("playwright.sync_api",
                                   reason="playwright is not installed (pip install playwright)")
    path, reason = find_browser()
    if path is None:
        pytest.skip(reason)
    with sync_api.sync_playwright() as playwright:
        launched = playwright.chromium.launch(executable_path=path, args=LAUNCH_ARGS)
        yield launched
        launched.close()


class Page:
    """A page opened offline, recording console errors, page errors and blocked requests."""

    def __init__(self, browser, path):
        self.errors: list[str] = []
        self.blocked: list[str] = []
        self.page = browser.new_page()
        self.page.on("console", lambda message: message.type == "error"
                     and self.errors.append(message.text))
        self.page.on("pageerror", lambda error: self.errors.append(str(error)))
        self.page.route(re.compile(r"^https?://"), self._block)
        self.page.goto(path.as_uri())
        self.page.wait_for_selector("body[data-ready='1']")

    def _block(self, route) -> None:
        self.blocked.append(route.request.url)
        route.abort()

    def lines(self) -> list[tuple[int, int, str, str]]:
        """(from, to, data-weight, stroke-opacity) of every drawn line."""
        return self.page.eval_on_selector_all("#lines line.edge", """edges => edges.map(e => [
            Number(e.dataset.from), Number(e.dataset.to), e.getAttribute('data-weight'),
            e.getAttribute('stroke-opacity')])""")


@pytest.fixture(scope="module")
def minilm_page(minilm_dir, tmp_path_factory):
    model, tokenizer = load_model_and_tokenizer(minilm_dir)
    maps = A.attention_maps(model, tokenizer, "The vase broke, and nobody knew why.",
                            pair="Dawn broke.")
    stats = A.head_statistics(model, tokenizer, ["The vase broke.", "Dawn broke over hills."])
    path = write_html(tmp_path_factory.mktemp("view") / "view.html", maps, stats,
                      title="MiniLM </script> test")  # a title that would end a script early
    return maps, stats, path


def _expected_lines(weights: torch.Tensor) -> dict[tuple[int, int], int]:
    """(query, key) -> weight x SCALE of the lines the head view should draw."""
    ints = (weights.float() * SCALE).round().int()
    return {(q, k): int(ints[q, k]) for q in range(ints.shape[0]) for k in range(ints.shape[1])
            if int(ints[q, k]) >= round(MIN_DRAWN * SCALE)}


def _check_head(page: Page, weights: torch.Tensor) -> None:
    drawn = page.lines()
    expected = _expected_lines(weights)
    assert {(q, k) for q, k, _, _ in drawn} == set(expected)
    for q, k, weight, opacity in drawn:
        assert weight == opacity == f"{expected[(q, k)] / SCALE:.4f}", (q, k, weight)
        assert abs(float(weight) - float(weights[q, k])) <= 0.5 / SCALE + 1e-6


def test_page_is_self_contained_and_error_free(browser, minilm_page):
    maps, _, path = minilm_page
    html = path.read_text()
    assert not re.search(r"<(script|link|img|iframe)[^>]*(src|href)=", html)  # all inline
    page = Page(browser, path)
    assert page.errors == [] and page.blocked == []
    assert page.page.locator("#layer option").count() == maps.num_layers == 6
    assert page.page.locator("#head option").count() == maps.num_heads == 12
    assert page.page.locator("canvas.thumb").count() == 6 * 12
    assert page.page.title() == "MiniLM </script> test"
    labels = page.page.eval_on_selector_all("#lines text.from", "ts => ts.map(t => t.textContent)")
    assert labels == maps.tokens
    _check_head(page, maps.attentions[0, 0])
    page.page.close()


def test_clicking_a_head_in_the_model_view_draws_its_weights(browser, minilm_page):
    maps, _, path = minilm_page
    page = Page(browser, path)
    page.page.click("#thumb-3-7")
    assert page.page.input_value("#layer") == "3" and page.page.input_value("#head") == "7"
    assert page.page.get_attribute("#thumb-3-7", "class") == "thumb selected"
    _check_head(page, maps.attentions[3, 7])
    page.page.select_option("#layer", "5")  # the selects drive the same view
    _check_head(page, maps.attentions[5, 7])
    page.page.hover("#from-2")  # hovering a token keeps its lines and fades the others
    classes = page.page.eval_on_selector_all(
        "#lines line.edge", "es => es.map(e => [Number(e.dataset.from), e.getAttribute('class')])")
    assert classes and all(c == ("edge active" if q == 2 else "edge faded") for q, c in classes)
    page.page.click("#stat-sep-1-4")  # a head-statistics cell selects its head too
    assert page.page.input_value("#layer") == "1" and page.page.input_value("#head") == "4"
    assert page.errors == [] and page.blocked == []
    page.page.close()


def test_statistics_cells_hold_the_computed_values(browser, minilm_page):
    _, stats, path = minilm_page
    page = Page(browser, path)
    for name in A.STATISTICS:
        value = float(page.page.get_attribute(f"#stat-{name}-2-3", "data-value"))
        assert abs(value - float(stats.values[name][2, 3])) <= 5e-5  # tol: the page keeps 4 decimals (error <= 5e-5)
    page.page.close()


def test_word_view_and_encoder_decoder_views(browser, minilm_dir, tmp_path):
    model, tokenizer = load_model_and_tokenizer(minilm_dir)
    words = A.attention_maps(model, tokenizer, "Tokenizers split embeddings.").words()
    path = write_html(tmp_path / "words.html", words, layer=4, head=2)
    page = Page(browser, path)
    assert page.page.input_value("#layer") == "4" and page.page.input_value("#head") == "2"
    assert page.page.eval_on_selector_all("#lines text.to", "ts => ts.map(t => t.textContent)") \
        == ["[CLS]", "Tokenizers", "split", "embeddings", ".", "[SEP]"]
    _check_head(page, words.attentions[4, 2])
    assert page.page.is_hidden("#stats") and page.errors == []
    page.page.close()

    pytest.importorskip("transformers")
    from test_attention import save_tiny_bart

    bart = save_tiny_bart(tmp_path / "bart", minilm_dir)
    seq2seq, seq2seq_tokenizer = load_model_and_tokenizer(bart)
    maps = A.attention_maps(seq2seq, seq2seq_tokenizer, "The vase broke.", target="It broke.")
    page = Page(browser, write_html(tmp_path / "bart.html", maps))
    assert page.page.locator("#view option").count() == 3
    assert page.page.locator("#layer option").count() == 2
    page.page.select_option("#view", "2")  # cross-attention: 3 decoder layers
    assert page.page.locator("#layer option").count() == 3
    assert page.page.eval_on_selector_all("#lines text.to", "ts => ts.map(t => t.textContent)") \
        == maps.tokens
    page.page.click("#thumb-2-1")
    _check_head(page, maps.cross_attentions[2, 1])
    assert page.errors == [] and page.blocked == []
    page.page.close()
