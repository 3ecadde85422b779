// The attention viewer's behaviour (inlined into the page by lmlab/analysis/attention_view.py).
// Reads the JSON in <script id="data">: views (one per attention: encoder / decoder / cross),
// each with query and key labels and its weights as integers (weight * 10000), row-major
// (layer, head, query, key); the head statistics; the first layer and head to show.
"use strict";

(function () {
  const data = JSON.parse(document.getElementById("data").textContent);
  const SCALE = 10000;
  const MIN_DRAWN = data.min_drawn;   // lines lighter than this are left out of the head view
  const SVG = "http://www.w3.org/2000/svg";
  const viewSelect = document.getElementById("view");
  const layerSelect = document.getElementById("layer");
  const headSelect = document.getElementById("head");
  const lines = document.getElementById("lines");
  const grid = document.getElementById("grid");

  function option(select, value, text) {
    const o = document.createElement("option");
    o.value = String(value);
    o.textContent = text;
    select.appendChild(o);
  }

  function current() {
    return data.views[Number(viewSelect.value)];
  }

  // weight of (layer, head, query, key) in a view, as a number in [0, 1]
  function weight(view, layer, head, q, k) {
    const nq = view.queries.length, nk = view.keys.length;
    return view.weights[((layer * view.heads + head) * nq + q) * nk + k] / SCALE;
  }

  function fillSelects() {
    const view = current();
    const layer = Math.min(Number(layerSelect.value || data.layer), view.layers - 1);
    const head = Math.min(Number(headSelect.value || data.head), view.heads - 1);
    layerSelect.innerHTML = "";
    headSelect.innerHTML = "";
    for (let l = 0; l < view.layers; l++) option(layerSelect, l, "layer " + l);
    for (let h = 0; h < view.heads; h++) option(headSelect, h, "head " + h);
    layerSelect.value = String(layer);
    headSelect.value = String(head);
  }

  function svgElement(name, attributes) {
    const element = document.createElementNS(SVG, name);
    for (const [key, value] of Object.entries(attributes)) element.setAttribute(key, value);
    return element;
  }

  // the head view: queries on the left, keys on the right, a line per weight >= MIN_DRAWN
  function drawHead() {
    const view = current();
    const layer = Number(layerSelect.value), head = Number(headSelect.value);
    const row = 20, top = 24, left = 170, right = 430, width = 600;
    const height = top + row * Math.max(view.queries.length, view.keys.length) + 8;
    lines.innerHTML = "";
    lines.setAttribute("width", width);
    lines.setAttribute("height", height);
    lines.setAttribute("data-layer", layer);
    lines.setAttribute("data-head", head);
    const heading = (text, x, anchor) => {
      const t = svgElement("text", {x: x, y: 12, "text-anchor": anchor, class: "side"});
      t.textContent = text;
      lines.appendChild(t);
    };
    heading(view.query_side, left - 10, "end");
    heading(view.key_side, right + 10, "start");
    const group = svgElement("g", {id: "edges"});
    lines.appendChild(group);
    for (let q = 0; q < view.queries.length; q++) {
      for (let k = 0; k < view.keys.length; k++) {
        const w = weight(view, layer, head, q, k);
        if (w < MIN_DRAWN) continue;
        group.appendChild(svgElement("line", {
          x1: left, y1: top + q * row - 4, x2: right, y2: top + k * row - 4,
          "data-from": q, "data-to": k, "data-weight": w.toFixed(4),
          "stroke-opacity": w.toFixed(4), "stroke-width": (0.5 + 2.5 * w).toFixed(3),
          class: "edge",
        }));
      }
    }
    const label = (text, index, x, anchor, side) => {
      const t = svgElement("text", {x: x, y: top + index * row, "text-anchor": anchor,
                                    class: "token " + side, "data-index": index,
                                    id: side + "-" + index});
      t.textContent = text;
      t.addEventListener("mouseenter", () => highlight(side, index));
      t.addEventListener("mouseleave", () => highlight(null, -1));
      lines.appendChild(t);
    };
    view.queries.forEach((text, q) => label(text, q, left - 10, "end", "from"));
    view.keys.forEach((text, k) => label(text, k, right + 10, "start", "to"));
    document.getElementById("caption").textContent =
      view.title + ", layer " + layer + ", head " + head;
    document.querySelectorAll(".thumb").forEach((thumb) => thumb.classList.toggle(
      "selected", Number(thumb.dataset.layer) === layer && Number(thumb.dataset.head) === head));
  }

  // hovering a token shows its lines only (the others fade)
  function highlight(side, index) {
    for (const edge of lines.querySelectorAll("line.edge")) {
      const mine = side !== null && Number(edge.getAttribute("data-" + side)) === index;
      edge.classList.toggle("active", mine);
      edge.classList.toggle("faded", side !== null && !mine);
    }
  }

  // the model view: every layer x head as a small heat map; a click selects it
  function drawGrid() {
    const view = current();
    grid.innerHTML = "";
    const cell = Math.max(1, Math.floor(56 / Math.max(view.queries.length, view.keys.length)));
    const table = document.createElement("table");
    const header = table.insertRow();
    header.insertCell().textContent = "";
    for (let h = 0; h < view.heads; h++) header.insertCell().textContent = "h" + h;
    for (let l = 0; l < view.layers; l++) {
      const tr = table.insertRow();
      tr.insertCell().textContent = "layer " + l;
      for (let h = 0; h < view.heads; h++) {
        const canvas = document.createElement("canvas");
        canvas.width = cell * view.keys.length;
        canvas.height = cell * view.queries.length;
        canvas.className = "thumb";
        canvas.id = "thumb-" + l + "-" + h;
        canvas.dataset.layer = l;
        canvas.dataset.head = h;
        canvas.title = "layer " + l + ", head " + h;
        const context = canvas.getContext("2d");
        for (let q = 0; q < view.queries.length; q++) {
          for (let k = 0; k < view.keys.length; k++) {
            const w = weight(view, l, h, q, k);
            context.fillStyle = "rgba(31, 95, 191, " + w + ")";
            context.fillRect(k * cell, q * cell, cell, cell);
          }
        }
        canvas.addEventListener("click", () => select(l, h));
        tr.insertCell().appendChild(canvas);
      }
    }
    grid.appendChild(table);
  }

  function select(layer, head) {
    layerSelect.value = String(layer);
    headSelect.value = String(head);
    drawHead();
    document.getElementById("head-view").scrollIntoView({block: "nearest"});
  }

  // the head statistics: one layers x heads table per statistic, shaded by value
  function drawStats() {
    const box = document.getElementById("stats-grid");
    const stats = data.stats;
    if (!stats) {
      document.getElementById("stats").style.display = "none";
      return;
    }
    document.getElementById("stats-caption").textContent = stats.caption;
    for (const name of Object.keys(stats.values)) {
      const values = stats.values[name];
      const top = Math.max(...values.flat(), 1e-9);
      const panel = document.createElement("div");
      panel.className = "panel";
      const title = document.createElement("div");
      title.className = "panel-title";
      title.textContent = name + ": " + stats.descriptions[name];
      panel.appendChild(title);
      const table = document.createElement("table");
      values.forEach((row, l) => {
        const tr = table.insertRow();
        tr.insertCell().textContent = "L" + l;
        row.forEach((value, h) => {
          const td = tr.insertCell();
          td.className = "stat";
          td.id = "stat-" + name + "-" + l + "-" + h;
          td.dataset.value = value;
          td.title = name + " layer " + l + " head " + h + ": " + value.toFixed(3);
          td.style.background = "rgba(31, 95, 191, " + (value / top).toFixed(3) + ")";
          td.addEventListener("click", () => {
            viewSelect.value = "0";
            fillSelects();
            drawGrid();
            select(l, h);
          });
        });
      });
      panel.appendChild(table);
      box.appendChild(panel);
    }
  }

  data.views.forEach((view, index) => option(viewSelect, index, view.title));
  viewSelect.value = "0";
  document.getElementById("view-box").style.display = data.views.length > 1 ? "" : "none";
  fillSelects();
  viewSelect.addEventListener("change", () => { fillSelects(); drawGrid(); drawHead(); });
  layerSelect.addEventListener("change", drawHead);
  headSelect.addEventListener("change", drawHead);
  drawGrid();
  drawHead();
  drawStats();
  document.body.setAttribute("data-ready", "1");
})();
