"""One self-contained HTML page for looking at attention: no network when it is opened.

The page has three parts, drawn by ``attention_view.js`` (inlined, as are the styles and the
data):

- a head view: pick a layer and head; a line joins each token on the left (the query) to each
  token on the right (the key) it attends to, its opacity and width the weight (lines under
  :data:`MIN_DRAWN` are left out); hovering a token shows only its lines;
- a model view: every layer x head as a small heat map; clicking one selects it above;
- the head statistics of :mod:`lmlab.analysis.attention`, one shaded layers x heads table per
  statistic (clicking a cell selects that head too).

Weights are stored rounded to 4 decimals (as integers, weight x 10,000) to keep the file small.
"""

from __future__ import annotations

import html
import json
from importlib import resources
from pathlib import Path

from lmlab.analysis.attention import STATISTICS, AttentionMaps, HeadStatistics
from lmlab.utils.errors import LmlabError

MIN_DRAWN = 0.01  # the head view draws lines of at least this weight
SCALE = 10_000  # weights stored as round(weight * SCALE)

_TITLES = {"encoder": "encoder self-attention", "decoder": "decoder self-attention",
           "cross": "cross-attention (decoder to source)"}
_SIDES = {"encoder": ("query", "key"), "decoder": ("query", "key"),
          "cross": ("target (query)", "source (key)")}

_STYLE = """
body { font-family: system-ui, sans-serif; margin: 1.5em; color: #222; }
h1 { font-size: 1.3em; } h2 { font-size: 1.1em; margin-top: 1.5em; }
.note { color: #8a4b00; } .controls label { margin-right: 1em; }
#lines text.token { font-size: 13px; cursor: pointer; }
#lines text.side { font-size: 11px; fill: #777; }
#lines line.edge { stroke: #1f5fbf; }
#lines line.edge.faded { stroke-opacity: 0.03; }
#lines line.edge.active { stroke: #c0392b; }
canvas.thumb { border: 1px solid #ddd; cursor: pointer; image-rendering: pixelated; }
canvas.thumb.selected { border: 2px solid #c0392b; }
#grid td, .panel td { padding: 1px; font-size: 11px; }
.panel { display: inline-block; margin: 0 1.5em 1em 0; vertical-align: top; }
.panel-title { font-size: 12px; margin-bottom: 0.3em; max-width: 30em; }
td.stat { width: 14px; height: 14px; cursor: pointer; border: 1px solid #eee; }
"""


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
    if not 0 <= layer < maps.num_layers:
        raise LmlabError(f"layer {layer} does not exist: the model has {maps.num_layers} layers",
                         f"give a layer from 0 to {maps.num_layers - 1}")
    if not 0 <= head < maps.num_heads:
        raise LmlabError(f"head {head} does not exist: each layer has {maps.num_heads} heads",
                         f"give a head from 0 to {maps.num_heads - 1}")
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
    heading = html.escape(title or "Attention")
    level = "words (pieces merged: attention to a word summed, from a word averaged)" \
        if maps.level == "word" else "tokens"
    return f"""<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<title>{heading}</title>
<style>{_STYLE}</style>
</head>
<body>
<h1>{heading}</h1>
<p>Attention between {level}. Rows sum to 1; lines lighter than {MIN_DRAWN} are not drawn.</p>
{notes}
<div class="controls">
<label id="view-box">Attention <select id="view"></select></label>
<label>Layer <select id="layer"></select></label>
<label>Head <select id="head"></select></label>
</div>
<section id="head-view">
<h2>Head view</h2>
<p id="caption"></p>
<svg id="lines" xmlns="http://www.w3.org/2000/svg"></svg>
</section>
<section id="model-view">
<h2>Model view: every layer and head (click one to see it above)</h2>
<div id="grid"></div>
</section>
<section id="stats">
<h2>Head statistics (Clark et al. 2019)</h2>
<p id="stats-caption"></p>
<div id="stats-grid"></div>
</section>
<script id="data" type="application/json">{payload}</script>
<script>{script}</script>
</body>
</html>
"""


def write_html(path: str | Path, maps: AttentionMaps, stats: HeadStatistics | None = None,
               title: str = "", layer: int = 0, head: int = 0) -> Path:
    """Write :func:`build_html`'s page to ``path`` atomically."""
    from lmlab.utils.io import atomic_write_text

    atomic_write_text(path, build_html(maps, stats, title=title, layer=layer, head=head))
    return Path(path)
