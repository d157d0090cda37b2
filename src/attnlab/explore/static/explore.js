// attnlab explore: the page's script (hand-written, no build step, no other file fetched).
// Two modes: "server" (the JSON API of attnlab.explore.server) and "static" (the data embedded
// by attnlab.explore.explore_html in <script type="application/json" id="explore-data">).
// Everything drawn is also kept in window.__explore, so tests can read the numbers back.
"use strict";
(function () {
  const $ = (id) => document.getElementById(id);
  const SVG = "http://www.w3.org/2000/svg";
  const embedded = $("explore-data");
  const S = (window.__explore = {
    mode: embedded ? "static" : "server",
    busy: 0, version: 0, error: null,
    info: null, ids: [], tokens: [], attention: null, rollout: null, qk: null,
    layer: 0, head: 0, query: 0, key: 0, stack: null, stacks: [], seqs: {}, target_ids: null, translation: null, rolloutLayer: 0, lensPosition: -1,
    focus: null, focused: false, fmt: null, equation: null,
    head_weights: null, neuron: null, positional: null, masks: null, next: null, lens: null, cost: null, fill_mask: null,
    input: null, image: null, vit: null, prediction: null,
  });

  // -- helpers -------------------------------------------------------------------------------
  function unpack(p) {
    const bin = atob(p.data);
    const bytes = new Uint8Array(bin.length);
    for (let i = 0; i < bin.length; i++) bytes[i] = bin.charCodeAt(i);
    return { shape: p.shape, data: new Float32Array(bytes.buffer) };
  }
  function el(tag, attrs, text) {
    const e = document.createElement(tag);
    for (const [k, v] of Object.entries(attrs || {})) e.setAttribute(k, v);
    if (text !== undefined) e.textContent = text;
    return e;
  }
  function shown(text) {
    return text.replace(/ /g, "␣").replace(/\n/g, "⏎").replace(/\t/g, "⇥").replace(/^Ġ/, "␣");
  }
  // A number for display, d decimals (3 by default); "—" for none. A value that rounds to zero is
  // written without a sign: never "-0.0000" (attnlab.explore.focus.display_number in Python).
  function fmt(x, d) {
    if (x === null || x === undefined) return "—";
    const s = Number(x).toFixed(d === undefined ? 3 : d);
    return /^-[0.]+$/.test(s) ? s.slice(1) : s;
  }
  // Eq. (1) for one query and key, left to right: each step's result after its "=".
  function equation(N) {
    let s = `Σ q·k = ${fmt(N.dot, 4)}; × 1/√${N.d_head} = ${fmt(N.scaled, 4)}`;
    if (N.masked) s += "; masked: score −∞";
    else if (fmt(N.bias, 4) !== "0.0000") s += `; + bias/mask ${fmt(N.bias, 4)} = ${fmt(N.score, 4)}`;
    return s + `; softmax over the row → ${fmt(N.weight, 4)}`;
  }
  function big(n) {
    const a = Math.abs(n);
    if (a >= 1e12) return (n / 1e12).toFixed(2) + " T";
    if (a >= 1e9) return (n / 1e9).toFixed(2) + " G";
    if (a >= 1e6) return (n / 1e6).toFixed(2) + " M";
    if (a >= 1e3) return (n / 1e3).toFixed(1) + " k";
    return String(n);
  }
  function showError(message) {
    S.error = message;
    const box = $("error");
    box.textContent = message;
    box.hidden = !message;
  }
  function fillSelect(sel, n, label, value) {
    sel.replaceChildren();
    for (let i = 0; i < n; i++) sel.appendChild(el("option", { value: String(i) }, label(i)));
    sel.value = String(Math.min(value, n - 1));
  }
  function heat(w) {  // 0 -> white, 1 -> the accent blue
    const t = Math.max(0, Math.min(1, w));
    return [Math.round(255 - 219 * t), Math.round(255 - 169 * t), Math.round(255 - 54 * t)];
  }
  function drawMatrix(canvas, get, T) {
    const ctx = canvas.getContext("2d");
    const img = ctx.createImageData(T, T);
    for (let i = 0; i < T; i++) for (let j = 0; j < T; j++) {
      const [r, g, b] = heat(get(i, j));
      const o = 4 * (i * T + j);
      img.data[o] = r; img.data[o + 1] = g; img.data[o + 2] = b; img.data[o + 3] = 255;
    }
    const off = document.createElement("canvas");
    off.width = T; off.height = T;
    off.getContext("2d").putImageData(img, 0, 0);
    ctx.imageSmoothingEnabled = false;
    ctx.clearRect(0, 0, canvas.width, canvas.height);
    ctx.drawImage(off, 0, 0, canvas.width, canvas.height);
  }

  async function api(path, body) {
    S.busy++;
    try {
      const resp = await fetch(path, body === undefined ? {} : {
        method: "POST", headers: { "Content-Type": "application/json" }, body: JSON.stringify(body),
      });
      let data;
      try { data = await resp.json(); } catch (e) { data = { error: `HTTP ${resp.status}` }; }
      if (!resp.ok) throw new Error(data.error || `HTTP ${resp.status}`);
      showError(null);
      return data;
    } finally { S.busy--; }
  }
  // Answers can come back out of order: only the newest request of each kind is drawn.
  const latest = {};
  function ticket(kind) { latest[kind] = (latest[kind] || 0) + 1; return latest[kind]; }
  function stale(kind, t) { return latest[kind] !== t; }
  async function guard(fn) {
    try { await fn(); } catch (e) { showError(String(e.message || e)); }
    S.version++;
  }

  // -- weights --------------------------------------------------------------------------------
  function T() { return S.tokens.length; }
  function cur() { return S.stacks.find((x) => x.name === S.stack) || S.stacks[0]; }
  function qTok() { return S.seqs[cur().queries]; }
  function kTok() { return S.seqs[cur().keys]; }
  function att(l, h, i, j) {
    const A = cur().attention, [, H, n, m] = A.shape;
    return A.data[((l * H + h) * n + i) * m + j];
  }
  function headMatrix(l, h) {
    const n = qTok().length, m = kTok().length, out = [];
    for (let i = 0; i < n; i++) { const row = []; for (let j = 0; j < m; j++) row.push(att(l, h, i, j)); out.push(row); }
    return out;
  }
  function targetBody() { return S.info.seq2seq ? { target_ids: S.target_ids } : {}; }
  function inputBody() { return S.info.vision ? S.input : { ids: S.ids, ...targetBody() }; }

  // -- head view ------------------------------------------------------------------------------
  function drawHead() {
    const svg = $("head-view"), n = qTok().length, m = kTok().length, rowH = 18, width = 420;
    const W = headMatrix(S.layer, S.head);
    S.head_weights = W;
    svg.replaceChildren();
    svg.setAttribute("width", String(width));
    svg.setAttribute("height", String(rowH * Math.max(n, m) + 10));
    svg.dataset.stack = cur().name;
    svg.dataset.layer = String(S.layer);
    svg.dataset.head = String(S.head);
    const xl = 130, xr = width - 130;
    const g = document.createElementNS(SVG, "g");
    for (let i = 0; i < n; i++) for (let j = 0; j < m; j++) {
      const w = W[i][j];
      if (!(w >= 0.005)) continue;
      const ln = document.createElementNS(SVG, "line");
      ln.setAttribute("x1", xl + 4); ln.setAttribute("y1", rowH * i + 14);
      ln.setAttribute("x2", xr - 4); ln.setAttribute("y2", rowH * j + 14);
      ln.setAttribute("stroke-opacity", w.toFixed(4));
      ln.setAttribute("stroke-width", (1 + 3 * w).toFixed(2));
      ln.dataset.q = String(i); ln.dataset.k = String(j); ln.dataset.w = String(w);
      g.appendChild(ln);
    }
    svg.appendChild(g);
    const label = (i, side) => {
      const t = document.createElementNS(SVG, "text");
      t.setAttribute("x", side === "q" ? xl : xr);
      t.setAttribute("y", rowH * i + 18);
      t.setAttribute("text-anchor", side === "q" ? "end" : "start");
      t.textContent = shown((side === "q" ? qTok() : kTok())[i].text);
      t.dataset.side = side; t.dataset.index = String(i);
      if ((side === "q" && i === S.query) || (side === "k" && i === S.key)) t.setAttribute("class", "sel");
      t.addEventListener("mouseenter", () => focusLines(side, i));
      t.addEventListener("mouseleave", () => focusLines(null, -1));
      t.addEventListener("click", () => {
        if (side === "q") S.query = i; else S.key = i;
        $("query").value = String(S.query); $("key").value = String(S.key);
        guard(async () => { drawHead(); await drawNeuron(); });
      });
      svg.appendChild(t);
    };
    for (let i = 0; i < n; i++) label(i, "q");
    for (let j = 0; j < m; j++) label(j, "k");
    if (S.image) drawOverlay();
  }
  function focusLines(side, index) {
    for (const ln of $("head-view").querySelectorAll("line")) {
      const on = side === null || (side === "q" ? ln.dataset.q : ln.dataset.k) === String(index);
      ln.style.display = on ? "" : "none";
    }
  }

  // -- model view -----------------------------------------------------------------------------
  function drawModel() {
    const box = $("model-view"), L = cur().attention.shape[0], H = S.info.n_heads;
    const n = qTok().length, m = kTok().length, side = Math.max(n, m);
    box.replaceChildren();
    box.style.gridTemplateColumns = `auto repeat(${H}, 58px)`;
    box.appendChild(el("span", { class: "label" }, ""));
    for (let h = 0; h < H; h++) box.appendChild(el("span", { class: "label" }, `h${h}`));
    for (let l = 0; l < L; l++) {
      box.appendChild(el("span", { class: "label" }, `L${l}`));
      for (let h = 0; h < H; h++) {
        const c = el("canvas", { width: "56", height: "56", "data-layer": String(l), "data-head": String(h), title: `layer ${l} head ${h}` });
        if (l === S.layer && h === S.head) c.classList.add("sel");
        drawMatrix(c, (i, j) => (i < n && j < m ? att(l, h, i, j) : 0), side);
        c.addEventListener("click", () => selectHead(l, h));
        box.appendChild(c);
      }
    }
  }
  function selectHead(l, h) {
    S.layer = l; S.head = h;
    $("layer").value = String(l); $("head").value = String(h);
    for (const c of $("model-view").querySelectorAll("canvas")) {
      c.classList.toggle("sel", c.dataset.layer === String(l) && c.dataset.head === String(h));
    }
    return guard(async () => { drawHead(); await drawNeuron(); });
  }

  // -- neuron view ----------------------------------------------------------------------------
  function neuronFromEmbedded(l, h, i, j) {  // static mode: the same arithmetic as Explorer.neuron
    const E = S.qk[cur().name], q = E.q, k = E.k, sc = E.scores;
    const [, H, n, D] = q.shape, Hkv = k.shape[1], rep = H / Hkv, nk = k.shape[2];
    const qv = [], kv = [], products = [];
    for (let d = 0; d < D; d++) {
      const a = q.data[((l * H + h) * n + i) * D + d], b = k.data[((l * Hkv + Math.floor(h / rep)) * nk + j) * D + d];
      qv.push(a); kv.push(b); products.push(Math.fround(a * b));
    }
    const dot = products.reduce((s, x) => s + x, 0), scale = 1 / Math.sqrt(D);
    const minF = -3.4028234663852886e38;
    const srow = []; for (let m = 0; m < nk; m++) { const s = sc.data[((l * H + h) * n + i) * nk + m]; srow.push(s > minF / 2 ? s : null); }
    const score = srow[j];
    const wrow = []; for (let m = 0; m < nk; m++) wrow.push(att(l, h, i, m));
    return { stack: cur().name, layer: l, head: h, query: i, key: j, d_head: D, q: qv, k: kv, products, dot, scale,
      scaled: dot * scale, score, bias: score === null ? null : score - dot * scale, masked: score === null,
      scores_row: srow, weights_row: wrow, weight: att(l, h, i, j) };
  }
  async function drawNeuron() {
    const l = S.layer, h = S.head, i = S.query, j = S.key, tk = ticket("neuron");
    const N = S.mode === "static" ? neuronFromEmbedded(l, h, i, j)
      : await api("/api/neuron", { ...inputBody(), stack: cur().name, layer: l, head: h, query: i, key: j });
    if (stale("neuron", tk)) return;
    S.neuron = N;
    const box = $("neuron");
    box.replaceChildren();
    for (const [k, v] of Object.entries({ layer: l, head: h, query: i, key: j, dot: N.dot, scale: N.scale, score: N.score, weight: N.weight })) {
      box.dataset[k] = String(v);
    }
    const q = shown(qTok()[i].text), k = shown(kTok()[j].text);
    box.appendChild(el("div", { class: "eq" }, `query “${q}” (${i}) · key “${k}” (${j}), layer ${l} head ${h}, d_k = ${N.d_head}`));
    box.appendChild(el("div", { class: "eq", id: "neuron-eq" }, equation(N)));
    const dims = el("div", { class: "dims" }), t = el("table", { id: "neuron-dims" });
    const maxAbs = Math.max(1e-12, ...N.products.map(Math.abs)), WRAP = 12;
    for (let start = 0; start < N.d_head; start += WRAP) {  // 12 dimensions per block of rows
      const idx = el("tr", { class: "dim-index" }); idx.appendChild(el("th", {}, "dim"));
      for (let d = start; d < Math.min(start + WRAP, N.d_head); d++) idx.appendChild(el("td", { class: "num hint" }, String(d)));
      t.appendChild(idx);
      for (const [name, values] of [["q", N.q], ["k", N.k], ["q·k", N.products]]) {
        const tr = el("tr", {}); tr.appendChild(el("th", {}, name));
        for (let d = start; d < Math.min(start + WRAP, N.d_head); d++) {
          const v = values[d];
          const td = el("td", { class: "num", title: `dimension ${d}` }, fmt(v, 2));
          if (name === "q·k") {
            const a = Math.abs(v) / maxAbs;
            td.style.background = v >= 0 ? `rgba(36,86,201,${a.toFixed(3)})` : `rgba(180,35,24,${a.toFixed(3)})`;
            td.dataset.product = String(v);
          }
          tr.appendChild(td);
        }
        t.appendChild(tr);
      }
    }
    dims.appendChild(t); box.appendChild(dims);
    const sm = el("table", { id: "neuron-softmax" });
    N.weights_row.forEach((w, m) => {
      const tr = el("tr", { "data-key": String(m), "data-weight": String(w) });
      tr.appendChild(el("td", {}, shown(kTok()[m].text)));
      tr.appendChild(el("td", { class: "num" }, N.scores_row[m] === null ? "masked" : fmt(N.scores_row[m], 3)));
      const bar = el("td", {}); const b = el("span", { class: "bar" }); b.style.width = `${(200 * w).toFixed(1)}px`;
      bar.appendChild(b); tr.appendChild(bar);
      tr.appendChild(el("td", { class: "num" }, fmt(w, 4)));
      if (m === j) tr.style.fontWeight = "bold";
      sm.appendChild(tr);
    });
    const head = el("tr", {}); for (const c of ["key", "score", "softmax", "weight"]) head.appendChild(el("th", {}, c));
    sm.prepend(head);
    box.appendChild(sm);
  }

  // -- rollout --------------------------------------------------------------------------------
  function drawRollout() {
    const n = T(), l = S.rolloutLayer, R = S.rollout.data, c = $("rollout");
    const get = (i, j) => R[(l * n + i) * n + j];
    S.rollout_matrix = []; for (let i = 0; i < n; i++) { const r = []; for (let j = 0; j < n; j++) r.push(get(i, j)); S.rollout_matrix.push(r); }
    c.dataset.layer = String(l);
    let max = 0; for (let i = 0; i < n; i++) for (let j = 0; j < n; j++) max = Math.max(max, get(i, j));
    drawMatrix(c, (i, j) => get(i, j) / (max || 1), n);
    if (S.image) drawOverlay();
  }

  // -- ViT: the image, the overlays, the prediction --------------------------------------------
  function drawPixels(canvas, fade) {  // the image, nearest-neighbour scaled; fade: toward white
    const I = S.image, [h, w, c] = I.shape, ctx = canvas.getContext("2d"), img = ctx.createImageData(w, h);
    for (let y = 0; y < h; y++) for (let x = 0; x < w; x++) {
      const o = 4 * (y * w + x), at = (y * w + x) * c;
      for (let k = 0; k < 3; k++) {
        const v = I.data[at + (c === 1 ? 0 : k)];
        img.data[o + k] = Math.round(v + (255 - v) * fade);
      }
      img.data[o + 3] = 255;
    }
    const off = document.createElement("canvas"); off.width = w; off.height = h;
    off.getContext("2d").putImageData(img, 0, 0);
    ctx.imageSmoothingEnabled = false;
    ctx.clearRect(0, 0, canvas.width, canvas.height);
    ctx.drawImage(off, 0, 0, canvas.width, canvas.height);
  }
  function drawHeat(canvas, values, g) {  // the image faded, g x g cells heated from min (clear) to max
    drawPixels(canvas, 0.6);
    const ctx = canvas.getContext("2d"), cw = canvas.width / g, ch = canvas.height / g;
    const lo = Math.min(...values), span = Math.max(...values) - lo || 1;
    for (let p = 0; p < g * g; p++) {
      const t = (values[p] - lo) / span;
      ctx.fillStyle = `rgba(214,40,40,${(0.85 * t).toFixed(3)})`;
      ctx.fillRect((p % g) * cw, Math.floor(p / g) * ch, cw, ch);
    }
  }
  function patchRow(get) {  // the overlay's query: [CLS], the mean over patch queries, or S.query
    const g = S.info.vision.grid, P = g * g, mode = $("overlay-query").value, out = [];
    for (let p = 0; p < P; p++) {
      if (mode === "mean") { let s = 0; for (let q = 1; q <= P; q++) s += get(q, 1 + p); out.push(s / P); }
      else out.push(get(mode === "cls" ? 0 : S.query, 1 + p));
    }
    return out;
  }
  function drawOverlay() {
    const g = S.info.vision.grid, n = T(), R = S.rollout.data, l = S.rolloutLayer;
    const mode = $("overlay-query").value;
    const attention = patchRow((q, k) => att(S.layer, S.head, q, k));
    const rollout = patchRow((q, k) => R[(l * n + q) * n + k]);
    const who = mode === "cls" ? "[CLS]" : mode === "mean" ? "the mean patch query" : `query ${shown(S.tokens[S.query].text)}`;
    S.vit = { mode, query: mode === "query" ? S.query : mode, layer: S.layer, head: S.head, rollout_layer: l, grid: g, attention, rollout };
    const a = $("vit-attention"), r = $("vit-rollout");
    drawHeat(a, attention, g); drawHeat(r, rollout, g);
    a.dataset.layer = String(S.layer); a.dataset.head = String(S.head); a.dataset.query = String(S.vit.query);
    const range = (v) => `${fmt(Math.min(...v), 4)} (clear) to ${fmt(Math.max(...v), 4)} (red)`;
    $("vit-attention-caption").textContent = `${who}'s attention over the patches, layer ${S.layer} head ${S.head}: ${range(attention)}`;
    $("vit-rollout-caption").textContent = `rollout through layer ${l}, ${who}'s row: ${range(rollout)}`;
  }
  function drawVision(a) {
    const u = unpack(a.image);
    S.image = { shape: u.shape, data: u.data };
    S.prediction = a.prediction;
    drawPixels($("vit-image"), 0);
    const top = a.prediction[0];
    $("vit-image-caption").textContent = (a.sample !== null ? `test image ${a.sample}` : "uploaded image") +
      (a.label !== null ? `, label ${S.info.vision.classes ? S.info.vision.classes[a.label] : a.label}` : "") + `; predicted ${top.name} (${fmt(top.prob, 3)})`;
    const t = $("vit-prediction"); t.replaceChildren();
    const head = el("tr", {}); for (const c of ["class", "logit", "probability", ""]) head.appendChild(el("th", {}, c));
    t.appendChild(head);
    for (const r of a.prediction.slice(0, 10)) {
      const tr = el("tr", { "data-class": String(r.class), "data-prob": String(r.prob), "data-logit": String(r.logit) });
      tr.appendChild(el("td", {}, r.name + (r.class === a.label ? " (label)" : "")));
      tr.appendChild(el("td", { class: "num" }, fmt(r.logit, 3)));
      tr.appendChild(el("td", { class: "num" }, fmt(r.prob, 4)));
      const bar = el("td", {}); const b = el("span", { class: "bar" }); b.style.width = `${(240 * r.prob).toFixed(1)}px`;
      bar.appendChild(b); tr.appendChild(bar);
      t.appendChild(tr);
    }
  }
  function base64(bytes) { let bin = ""; for (let i = 0; i < bytes.length; i++) bin += String.fromCharCode(bytes[i]); return btoa(bin); }
  async function uploaded(file) {  // centre-crop to a square, scale to the model's size, send the pixels
    const v = S.info.vision, bitmap = await createImageBitmap(file);
    const side = Math.min(bitmap.width, bitmap.height), c = document.createElement("canvas");
    c.width = v.size; c.height = v.size;
    const ctx = c.getContext("2d");
    ctx.drawImage(bitmap, (bitmap.width - side) / 2, (bitmap.height - side) / 2, side, side, 0, 0, v.size, v.size);
    const rgba = ctx.getImageData(0, 0, v.size, v.size).data, bytes = new Uint8Array(v.size * v.size * v.channels);
    for (let p = 0; p < v.size * v.size; p++) {
      if (v.channels === 1) bytes[p] = Math.round(0.299 * rgba[4 * p] + 0.587 * rgba[4 * p + 1] + 0.114 * rgba[4 * p + 2]);
      else for (let k = 0; k < 3; k++) bytes[3 * p + k] = rgba[4 * p + k];
    }
    await analyze({ image: { shape: [v.size, v.size, v.channels], data: base64(bytes) } });
  }

  // -- next token, lens, mask -----------------------------------------------------------------
  function sampling() {
    const num = (id, int) => { const v = $(id).value.trim(); if (v === "") return null; return int ? parseInt(v, 10) : parseFloat(v); };
    return { temperature: parseFloat($("temperature").value), top_k: num("top-k", true), top_p: num("top-p"), min_p: num("min-p") };
  }
  function drawNext(view) {
    S.next = view;
    const t = $("next-table");
    t.replaceChildren();
    t.dataset.temperature = String(view.temperature);
    $("next-summary").textContent = `${view.kept} token(s) kept; temperature ${fmt(view.temperature, 2)}` +
      (view.top_k ? `, top-k ${view.top_k}` : "") + (view.top_p ? `, top-p ${view.top_p}` : "") + (view.min_p ? `, min-p ${view.min_p}` : "");
    const head = el("tr", {}); for (const c of ["token", "id", "logit", "probability", ""]) head.appendChild(el("th", {}, c));
    t.appendChild(head);
    for (const r of view.top) {
      const tr = el("tr", { "data-id": String(r.id), "data-logit": String(r.logit), "data-prob": String(r.prob) });
      tr.appendChild(el("td", {}, shown(r.text)));
      tr.appendChild(el("td", { class: "num" }, String(r.id)));
      tr.appendChild(el("td", { class: "num" }, fmt(r.logit, 3)));
      tr.appendChild(el("td", { class: "num" }, fmt(r.prob, 4)));
      const bar = el("td", {}); const b = el("span", { class: "bar" }); b.style.width = `${(240 * r.prob).toFixed(1)}px`;
      bar.appendChild(b); tr.appendChild(bar);
      t.appendChild(tr);
    }
  }
  function drawLens(lens) {
    S.lens = lens;
    const t = $("lens-table");
    t.replaceChildren();
    t.dataset.position = String(lens.position);
    const head = el("tr", {}); for (const c of ["read after", "top tokens", `p(final “${shown(lensFinalText(lens))}”)`]) head.appendChild(el("th", {}, c));
    t.appendChild(head);
    for (const r of lens.rows) {
      const tr = el("tr", { "data-label": r.label, "data-p-final": String(r.p_final) });
      tr.appendChild(el("td", {}, r.label));
      const cell = el("td", {});
      for (const x of r.top.slice(0, 5)) { cell.appendChild(el("span", { class: "tok" }, shown(x.text))); cell.appendChild(document.createTextNode(` ${fmt(x.prob, 3)}  `)); }
      tr.appendChild(cell);
      tr.appendChild(el("td", { class: "num" }, fmt(r.p_final, 3)));
      t.appendChild(tr);
    }
  }
  function lensFinalText(lens) { const last = lens.rows[lens.rows.length - 1]; return last.top[0].text; }
  function drawMask(list) {
    S.fill_mask = list;
    const box = $("mask-view");
    box.replaceChildren();
    if (!list.length) { box.appendChild(el("p", { class: "hint" }, `put ${S.info.mask_token} in the text to see the model fill it`)); return; }
    for (const m of list) {
      const p = el("p", { "data-position": String(m.position) }, `position ${m.position}: `);
      for (const x of m.top) { p.appendChild(el("span", { class: "tok", "data-prob": String(x.prob) }, shown(x.text))); p.appendChild(document.createTextNode(` ${fmt(x.prob, 3)}  `)); }
      box.appendChild(p);
    }
  }
  function drawCost(cost) {
    S.cost = cost;
    const box = $("cost");
    box.replaceChildren();
    const n = cost.flops.seq_len, c = cost.crossover;
    box.appendChild(el("p", {}, `${big(cost.params.total)} parameters; one forward pass over ${n} tokens: ${big(cost.flops.forward)} FLOPs (matmuls), attention products ${fmt(100 * cost.attention_share, 1)}% of them.`));
    box.appendChild(el("p", {}, `Attention (n²·d) overtakes the projections (n·d²) at n = ${c.block.toFixed(0)} in one block, ${c.layer.toFixed(0)} in one layer (with the FFN), ${c.model.toFixed(0)} for the whole model; this input (n = ${n}) is ${cost.past.layer ? "past" : "below"} the layer crossover.`));
    const table = (id, title, rows) => {
      const t = el("table", { id });
      const head = el("tr", {}); for (const h of title) head.appendChild(el("th", {}, h));
      t.appendChild(head);
      for (const r of rows) {
        const tr = el("tr", { "data-group": r[0] });
        r.forEach((c, i) => tr.appendChild(el("td", i ? { class: "num" } : {}, c)));
        t.appendChild(tr);
      }
      box.appendChild(t);
    };
    table("cost-params", ["component", "parameters"], Object.entries(cost.params.grouped).map(([g, v]) => [g, big(v)]));
    table("cost-flops", ["matmuls", `FLOPs at n = ${n}`, "share"], Object.entries(cost.flops.grouped).map(
      ([g, v]) => [g, big(v), `${fmt(100 * cost.flops.shares[g], 1)}%`]));
  }

  // -- positional encodings and masks ----------------------------------------------------------
  function nested(p, offset) {  // the (rows, cols) matrix at a flat offset of a packed array
    const [r, c] = p.shape.slice(-2), out = [];
    for (let i = 0; i < r; i++) out.push(Array.from(p.data.subarray(offset + i * c, offset + (i + 1) * c)));
    return out;
  }
  function drawScaled(canvas, M) {
    let lo = Infinity, hi = -Infinity;
    for (const row of M) for (const v of row) { lo = Math.min(lo, v); hi = Math.max(hi, v); }
    const span = hi - lo || 1, R = M.length, C = M[0].length;
    canvas.width = Math.max(64, Math.min(256, 4 * C)); canvas.height = Math.max(64, Math.min(256, 4 * R));
    const ctx = canvas.getContext("2d"), img = ctx.createImageData(C, R);
    for (let i = 0; i < R; i++) for (let j = 0; j < C; j++) {
      const [r, g, b] = heat((M[i][j] - lo) / span), o = 4 * (i * C + j);
      img.data[o] = r; img.data[o + 1] = g; img.data[o + 2] = b; img.data[o + 3] = 255;
    }
    const off = document.createElement("canvas"); off.width = C; off.height = R;
    off.getContext("2d").putImageData(img, 0, 0);
    ctx.imageSmoothingEnabled = false; ctx.drawImage(off, 0, 0, canvas.width, canvas.height);
  }
  async function drawPositional() {
    const body = { kind: $("pos-kind").value, d_model: parseInt($("pos-d").value, 10), length: parseInt($("pos-len").value, 10), n_heads: S.info.n_heads };
    const tk = ticket("positional");
    const v = await api("/api/positional", body);
    if (stale("positional", tk)) return;
    const m = unpack(v.matrix), alibi = m.shape.length === 3;
    $("pos-head").disabled = !alibi;
    const h = alibi ? Math.min(parseInt($("pos-head").value || "0", 10), m.shape[0] - 1) : 0;
    const L = m.shape[m.shape.length - 1];
    S.positional = { kind: v.kind, names: v.names, head: h, matrix: nested(m, h * L * L), table: v.table ? nested(unpack(v.table), 0) : null };
    $("pos-matrix").dataset.kind = v.kind;
    drawScaled($("pos-matrix"), S.positional.matrix);
    $("pos-table").hidden = !S.positional.table;
    if (S.positional.table) drawScaled($("pos-table"), S.positional.table);
  }
  async function drawMasks() {
    const kind = $("mask-kind").value;
    const tk = ticket("masks");
    const r = await api("/api/masks", { kinds: [kind], seq_len: parseInt($("mask-len").value, 10), window: parseInt($("mask-window").value, 10) });
    if (stale("masks", tk)) return;
    S.masks = { kind, matrix: r[kind] };
    $("mask-canvas").dataset.kind = kind;
    drawScaled($("mask-canvas"), r[kind]);
  }
  function setupPanels(info) {
    fillSelect($("pos-head"), info.n_heads, (i) => String(i), 0);
    $("pos-d").value = String(info.d_model);
    if (["sinusoidal", "learned", "rope", "alibi"].includes(info.pos_encoding)) $("pos-kind").value = info.pos_encoding;
    for (const id of ["pos-kind", "pos-d", "pos-len", "pos-head"]) $(id).addEventListener("change", () => guard(drawPositional));
    for (const id of ["mask-kind", "mask-len", "mask-window"]) $(id).addEventListener("change", () => guard(drawMasks));
  }

  // -- whole analysis ---------------------------------------------------------------------------
  function setStack(name) {  // the stack's layers, queries and keys in the selectors
    S.stack = name;
    const L = cur().attention.shape[0];
    S.layer = Math.min(S.layer, L - 1);
    fillSelect($("layer"), L, (i) => String(i), S.layer);
    const q = qTok(), k = kTok();
    S.query = Math.min(S.query, q.length - 1); S.key = Math.min(S.key, k.length - 1);
    fillSelect($("query"), q.length, (i) => `${i}: ${shown(q[i].text)}`, S.query);
    fillSelect($("key"), k.length, (i) => `${i}: ${shown(k[i].text)}`, S.key);
  }
  // The view the page opens on (attnlab.explore.focus.first_view): applied to the first analysis
  // only, so a new input or a generation step keeps the head the reader chose; the "most telling
  // head" button applies the current input's.
  function takeFocus(f) {
    S.stack = f.stack; S.layer = f.layer; S.head = f.head; S.query = f.query; S.key = f.key;
    $("stack").value = f.stack;
  }
  function showFocus() {
    const f = S.focus;
    $("focus").disabled = !f;
    $("focus-note").textContent = f ? f.reason : "";
  }
  function render(a) {
    S.focus = a.focus || null;
    if (S.focus && !S.focused) { takeFocus(S.focus); S.focused = true; }
    showFocus();
    S.ids = a.ids; S.tokens = a.tokens;
    S.target_ids = a.target_ids || null;
    S.seqs = { source: a.tokens, target: a.target_tokens || a.tokens };
    S.stacks = (a.stacks || [{ name: "self", queries: "source", keys: "source", attention: a.attention }])
      .map((x) => ({ ...x, attention: unpack(x.attention) }));
    S.rollout = unpack(a.rollout);
    const n = T(), info = S.info;
    setStack(S.stack || S.stacks[0].name);
    $("head").value = String(S.head);
    const lensTokens = S.seqs.target;
    S.rolloutLayer = info.n_layers - 1;
    fillSelect($("rollout-layer"), info.n_layers, (i) => String(i), S.rolloutLayer);
    fillSelect($("lens-position"), lensTokens.length, (i) => `${i}: ${shown(lensTokens[i].text)}`, lensTokens.length - 1);
    $("token-count").textContent = `${n} tokens (at most ${info.max_tokens})`;
    drawHead(); drawModel(); drawRollout(); drawCost(a.cost);
    if (a.next) drawNext(a.next);
    if (a.lens) drawLens(a.lens);
    if (a.fill_mask) drawMask(a.fill_mask);
    if (a.image) { drawVision(a); drawOverlay(); }
  }
  async function analyze(body) {
    const tk = ticket("analyze");
    const a = await api("/api/analyze", body);
    if (stale("analyze", tk)) return;
    if (S.info.vision) S.input = body;
    render(a);
    await drawNeuron();
  }
  async function refreshNext() {
    const tk = ticket("next");
    const view = await api("/api/next", { ids: S.ids, ...targetBody(), ...sampling(), n: 20 });
    if (!stale("next", tk)) drawNext(view);
  }
  let stepSeed = 0;
  async function stepOnce(sample) {
    const r = await api("/api/step", { ids: S.ids, ...targetBody(), ...sampling(), sample, seed: stepSeed++, n: 20 });
    if (S.info.seq2seq) {
      if (r.text !== null) $("target").value = r.text;
      await analyze({ ids: S.ids, target_ids: r.target_ids });
    } else {
      $("text").value = r.text === null ? $("text").value : r.text;
      await analyze({ ids: r.ids });
    }
    await refreshNext();
  }

  function setup(info) {
    S.info = info;
    const layers = info.seq2seq ? `${info.n_layers} encoder + ${info.n_decoder_layers} decoder layers` : `${info.n_layers} layers`;
    $("model-info").textContent = `${info.name}: ${info.model_type}, ${layers} × ${info.n_heads} heads, d_model ${info.d_model}`;
    fillSelect($("layer"), info.n_layers, (i) => String(i), 0);
    $("stack-label").hidden = !info.seq2seq; $("target-row").hidden = !info.seq2seq;
    $("translate-panel").hidden = !info.seq2seq || S.mode === "static";
    const stacks = $("stack"); stacks.replaceChildren();
    for (const name of info.stacks) stacks.appendChild(el("option", { value: name }, name));
    stacks.addEventListener("change", () => { setStack(stacks.value); guard(async () => { drawHead(); drawModel(); await drawNeuron(); }); });
    fillSelect($("head"), info.n_heads, (i) => String(i), 0);
    $("focus").addEventListener("click", () => {
      if (!S.focus) return;
      takeFocus(S.focus); setStack(S.stack); $("head").value = String(S.head);
      guard(async () => { drawHead(); drawModel(); await drawNeuron(); });
    });
    $("layer").addEventListener("change", () => selectHead(parseInt($("layer").value, 10), S.head));
    $("head").addEventListener("change", () => selectHead(S.layer, parseInt($("head").value, 10)));
    $("query").addEventListener("change", () => { S.query = parseInt($("query").value, 10); guard(async () => { drawHead(); await drawNeuron(); }); });
    $("key").addEventListener("change", () => { S.key = parseInt($("key").value, 10); guard(async () => { drawHead(); await drawNeuron(); }); });
    $("rollout-layer").addEventListener("change", () => { S.rolloutLayer = parseInt($("rollout-layer").value, 10); guard(async () => drawRollout()); });
    $("next-panel").hidden = !info.language_model || S.mode === "static";
    $("lens-panel").hidden = !info.language_model;
    $("mask-panel").hidden = !info.masked_lm;
    $("text").readOnly = S.mode === "static" || !info.text_input;
    $("position-panel").hidden = S.mode === "static";
    const vision = info.vision;
    $("image-panel").hidden = !vision;
    $("input-panel").hidden = !!vision;
    if (vision) {
      $("model-info").textContent += `; ${vision.size}x${vision.size}x${vision.channels} images, ${vision.patch}x${vision.patch} patches (${vision.grid}x${vision.grid}), ${vision.pool} pooling`;
      $("overlay-query").value = vision.pool === "mean" ? "mean" : "cls";
      $("overlay-query").addEventListener("change", () => guard(async () => drawOverlay()));
      $("vit-image").addEventListener("click", (ev) => {
        const c = $("vit-image"), box = c.getBoundingClientRect(), g = vision.grid;
        const col = Math.min(g - 1, Math.floor((ev.clientX - box.left) / box.width * g));
        const row = Math.min(g - 1, Math.floor((ev.clientY - box.top) / box.height * g));
        S.query = 1 + row * g + col; $("query").value = String(S.query); $("overlay-query").value = "query";
        guard(async () => { drawHead(); await drawNeuron(); });
      });
      $("image-controls").hidden = S.mode === "static";
      $("sample-label").hidden = !vision.n_samples; $("sample-run").hidden = !vision.n_samples;
      $("sample").max = String(Math.max(0, vision.n_samples - 1));
      $("sample-count").textContent = vision.n_samples ? `of ${vision.n_samples} (${vision.dataset} test split)` : "";
    }
    if (S.mode === "static") {
      $("run").hidden = true; $("static-note").hidden = false;
      $("lens-position").disabled = true;
      return;
    }
    setupPanels(info);
    if (vision) {
      $("sample-run").addEventListener("click", () => guard(() => analyze({ sample: parseInt($("sample").value, 10) })));
      $("upload").addEventListener("change", () => guard(async () => { const f = $("upload").files[0]; if (f) await uploaded(f); }));
    }
    $("run").addEventListener("click", () => guard(() => analyze(info.seq2seq ? { text: $("text").value, target: $("target").value } : { text: $("text").value })));
    $("translate-run").addEventListener("click", () => guard(async () => {
      const r = await api("/api/translate", { ids: S.ids, num_beams: parseInt($("beams").value, 10) });
      S.translation = r;
      const box = $("translate-view"); box.replaceChildren();
      for (const name of ["greedy", "beam"]) {
        const x = r[name], p = el("p", { "data-kind": name }, `${name === "beam" ? `beam (${r.num_beams})` : "greedy"}: `);
        p.appendChild(el("span", { class: "tok" }, x.text !== null ? x.text : x.ids.join(" ")));
        box.appendChild(p);
      }
    }));
    let timer = null;
    const later = () => { clearTimeout(timer); S.busy++; timer = setTimeout(() => { S.busy--; guard(refreshNext); }, 60); };
    $("temperature").addEventListener("input", () => { $("temperature-value").textContent = fmt($("temperature").value, 2); later(); });
    for (const id of ["top-k", "top-p", "min-p"]) $(id).addEventListener("input", later);
    $("step-greedy").addEventListener("click", () => guard(() => stepOnce(false)));
    $("step-sample").addEventListener("click", () => guard(() => stepOnce(true)));
    $("lens-position").addEventListener("change", () => guard(async () => {
      const tk = ticket("lens");
      const lens = await api("/api/lens", { ids: S.ids, ...targetBody(), position: parseInt($("lens-position").value, 10) });
      if (!stale("lens", tk)) drawLens(lens);
    }));
  }

  S.fmt = fmt; S.equation = equation;  // for the tests
  window.addEventListener("error", (e) => showError(`page error: ${e.message}`));
  guard(async () => {
    if (S.mode === "static") {
      const d = JSON.parse(embedded.textContent);
      setup(d.info);
      S.qk = {};
      for (const [name, x] of Object.entries(d.qk)) S.qk[name] = { q: unpack(x.q), k: unpack(x.k), scores: unpack(x.scores) };
      $("target").value = d.target || "";
      $("text").value = d.text || "";
      render(d.analysis);
      await drawNeuron();
      return;
    }
    const info = await api("/api/info");
    setup(info);
    $("text").value = info.default_text || "";
    if (info.vision) {
      const v = info.vision, grey = () => base64(new Uint8Array(v.size * v.size * v.channels).fill(128));
      const first = info.default_input || (v.n_samples ? { sample: 0 } : { image: { shape: [v.size, v.size, v.channels], data: grey() } });
      if (first.sample !== undefined) $("sample").value = String(first.sample);
      await analyze(first);
    } else if (info.text_input && $("text").value) await analyze(info.seq2seq ? { text: $("text").value, target: "" } : { text: $("text").value });
    else if (!info.text_input) await analyze({ ids: [0, 1, 2, 3] });
    await drawPositional();
    await drawMasks();
  });
})();
