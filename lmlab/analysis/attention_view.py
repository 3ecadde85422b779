"""One self-contained HTML page for looking at attention (no network when it is opened): a head
view (lines from each query token to the keys it attends to; lines under :data:`MIN_DRAWN` left
out), a model view (every layer x head as a small heat map) and the head statistics of
:mod:`lmlab.analysis.attention`. The markup and styles are ``attention_view.html`` (a jinja2
template), the drawing ``attention_view.js``, both inlined with the data; weights are stored as
integers (weight x 10,000) to keep the file small.
"""

from __future__ import annotations

import html
import json
from importlib import resources
from pathlib import Path

from lmlab.analysis.attention import STATISTICS, AttentionMaps, HeadStatistics
from lmlab.analysis.report import template
from lmlab.utils.errors import LmlabError

MIN_DRAWN = 0.01  # the head view draws lines of at least this weight
SCALE = 10_000  # weights stored as round(weight * SCALE)

_TITLES = {"encoder": "encoder self-attention", "decoder": "decoder self-attention",
           "cross": "cross-attention (decoder to source)"}
_SIDES = {"encoder": ("query", "key"), "decoder": ("query", "key"),
          "cross": ("target (query)", "source (key)")}

def display_token(token: str) -> str:
    """A token as a reader wants to see it: byte-level and SentencePiece space markers shown
    as a leading space, a newline marker as ``\\n``."""
    shown = token.replace("Ġ", " ").replace("▁", " ").replace("Ċ", "\\n")
    return shown if shown.strip() else token


def view_data(maps: AttentionMaps) -> list[dict]:
    """The page's views: labels, shape and weights as integers (layer, head, query, key)."""
    views = []
    for name, queries, keys, weights in maps.views():
        layers, heads = weights.shape[:2]
        ints = (weights.float() * SCALE).round().int()  # (L, H, Q, K)
        views.append({
            "name": name, "title": _TITLES[name], "query_side": _SIDES[name][0],
            "key_side": _SIDES[name][1], "layers": int(layers), "heads": int(heads),
            "queries": [display_token(t) for t in queries],
            "keys": [display_token(t) for t in keys],
            "weights": ints.flatten().tolist(),
        })
    return views


def build_html(maps: AttentionMaps, stats: HeadStatistics | None = None, title: str = "",
               layer: int = 0, head: int = 0) -> str:
    """The page (a string): ``maps`` drawn, ``stats`` shaded, ``layer``/``head`` selected."""
    _check_index(layer, maps.num_layers, "layer", "layers")
    _check_index(head, maps.num_heads, "head", "heads per layer")
    data = {"views": view_data(maps), "layer": layer, "head": head, "min_drawn": MIN_DRAWN,
            "level": maps.level, "stats": None}
    if stats is not None:
        data["stats"] = {
            "caption": f"Over {stats.texts} text(s), {stats.tokens} query tokens "
                       f"({stats.sample or 'the text above'}), {stats.attention}.",
            "descriptions": STATISTICS,
            "values": {name: [[round(float(v), 4) for v in row] for row in grid]
                       for name, grid in stats.values.items()},
        }
    # "</" inside a <script> would end it: JSON allows "<\/" for the same text
    payload = json.dumps(data, ensure_ascii=False, separators=(",", ":")).replace("</", "<\\/")
    script = resources.files("lmlab.analysis").joinpath("attention_view.js").read_text("utf-8")
    notes = "".join(f'<p class="note">Note: {html.escape(n)}.</p>'
                    for n in maps.truncation_notes())
    level = "words (pieces merged: attention to a word summed, from a word averaged)" \
        if maps.level == "word" else "tokens"
    return template("attention_view.html").render(heading=html.escape(title or "Attention"), level=level,
                                                  min_drawn=MIN_DRAWN, notes=notes,
                                                  payload=payload, script=script)


def write_html(path: str | Path, maps: AttentionMaps, stats: HeadStatistics | None = None,
               title: str = "", layer: int = 0, head: int = 0) -> Path:
    """Write :func:`build_html`'s page to ``path`` atomically."""
    from lmlab.utils.io import atomic_write_text

    atomic_write_text(path, build_html(maps, stats, title=title, layer=layer, head=head))
    return Path(path)


def write_attention_view(model, tokenizer, path: str | Path, text: str, pair: str | None = None,
                         target: str | None = None, words: bool = False, layer: int = 0,
                         head: int = 0, stats_sample: int | None = None,
                         corpus: str | Path | None = None, max_length: int | None = None,
                         title: str = "") -> tuple[Path, AttentionMaps, AttentionMaps]:
    """What ``lmlab attention`` writes: ``text``'s attention maps (with its ``pair`` or the
    decoder's ``target``; pieces merged into ``words``) and the head statistics (over the text,
    or over ``stats_sample`` sentences of ``corpus`` or of WordNet), as one HTML page opened at
    ``layer`` and ``head``. Returns (the page, the maps, the maps shown); the maps'
    ``truncation_notes()`` say what was cut."""
    import warnings

    from lmlab.analysis import attention as A

    A.check_inputs(model, pair, target)
    _check_index(layer, model.config.num_hidden_layers, "--layer", "layers")
    _check_index(head, model.config.num_attention_heads, "--head", "heads per layer")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # said by the caller, from the maps' record
        maps = A.attention_maps(model, tokenizer, text, pair=pair, target=target,
                                max_length=max_length)
    if stats_sample:
        texts, description = A.text_sample(stats_sample, corpus=corpus)
        stats = A.head_statistics(model, tokenizer, texts, max_length=max_length,
                                  sample=description, show_progress=True)
    else:
        stats = A.head_statistics(model, tokenizer, [text],
                                  pairs=[pair] if pair is not None else None,
                                  max_length=max_length, sample="the text above")
    shown = maps.words() if words else maps
    return write_html(path, shown, stats, title=title, layer=layer, head=head), maps, shown


def _check_index(value: int, count: int, option: str, what: str) -> None:
    if not 0 <= value < count:
        raise LmlabError(f"{option} {value} does not exist: the model has {count} {what}",
                         f"give {option} from 0 to {count - 1}")
