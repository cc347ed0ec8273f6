/* RLCR episode viewer (written into the viewer folder by rlcr/viewer.py; see its docstring).
 *
 * Data arrive as `RLCR.put(key, data)` calls: data/<key>.js files loaded on demand by a script tag
 * (index.html, works from file://), or JSON blocks `<script type="application/json"
 * id="rlcr-data-<key>">` parsed on demand (standalone.html).
 *
 * Escaping: agent text is hostile. This file never parses data as HTML: every element is made with
 * createElement/createElementNS by `h`/`svg` below, every text goes in as a text node, and `h` only
 * sets attributes from an allow-list (no href, src, style or on* handlers).
 */
(function () {
  "use strict";

  // ------------------------------------------------------------------------------ data loading
  const store = {};
  const waiting = {};
  window.RLCR = {
    put(key, data) {
      store[key] = data;
      (waiting[key] || []).forEach((done) => done(data));
      delete waiting[key];
    },
  };

  function load(key) {
    if (!/^[a-z0-9]+$/.test(key)) return Promise.reject(new Error("bad data key"));
    if (key in store) return Promise.resolve(store[key]);
    const block = document.getElementById("rlcr-data-" + key);
    if (block) {
      store[key] = JSON.parse(block.textContent);
      return Promise.resolve(store[key]);
    }
    return new Promise((resolve, reject) => {
      if (waiting[key]) {
        waiting[key].push(resolve);
        return;
      }
      waiting[key] = [resolve];
      const tag = document.createElement("script");
      tag.src = "data/" + key + ".js";
      tag.onerror = () => reject(new Error("cannot load data/" + key + ".js"));
      document.head.appendChild(tag);
    });
  }

  // ------------------------------------------------------------------------------------ DOM
  // bidi overrides, zero-width and other format characters: shown as marks, never applied
  const FORMAT = /[\u061c\u200b-\u200f\u202a-\u202e\u2060-\u2069\ufeff]/g;
  function visible(value) {
    return String(value === null || value === undefined ? "" : value).replace(
      FORMAT, (c) => "<U+" + c.codePointAt(0).toString(16).toUpperCase().padStart(4, "0") + ">");
  }

  const ATTRS = new Set(["id", "title", "type", "value", "min", "max", "step", "placeholder", "for", "colspan",
    "aria-label", "aria-live", "role"]);

  function h(tag, props, ...kids) {
    const el = document.createElement(tag);
    for (const [k, v] of Object.entries(props || {})) {
      if (v === undefined || v === null || v === false) continue;
      if (k === "class") el.className = v;
      else if (k === "text") el.textContent = visible(v);
      else if (k === "on") for (const [ev, fn] of Object.entries(v)) el.addEventListener(ev, fn);
      else if (k === "checked" || k === "disabled" || k === "hidden" || k === "open") el[k] = Boolean(v);
      else if (k.startsWith("data-") || ATTRS.has(k)) el.setAttribute(k, String(v));
      else throw new Error("attribute not allowed: " + k);
    }
    add(el, kids);
    return el;
  }

  function add(el, kids) {
    for (const kid of kids.flat(Infinity)) {
      if (kid === null || kid === undefined || kid === false) continue;
      el.appendChild(kid instanceof Node ? kid : document.createTextNode(visible(kid)));
    }
    return el;
  }

  const SVG = "http://www.w3.org/2000/svg";
  function svg(tag, attrs, ...kids) {
    const el = document.createElementNS(SVG, tag);
    for (const [k, v] of Object.entries(attrs || {})) {
      if (v === undefined || v === null) continue;
      if (/^on/i.test(k) || /href/i.test(k) || k === "style") throw new Error("attribute not allowed: " + k);
      el.setAttribute(k, String(v));
    }
    for (const kid of kids.flat(Infinity)) {
      if (kid === null || kid === undefined) continue;
      el.appendChild(kid instanceof Node ? kid : document.createTextNode(visible(kid)));
    }
    return el;
  }

  function clear(el) {
    while (el.firstChild) el.removeChild(el.firstChild);
    return el;
  }

  const $ = (id) => document.getElementById(id);
  const fmt = (x, d = 2) => (x === null || x === undefined ? "n/a" : Number(x).toFixed(d));
  const badge = (cls, text, title) => h("span", { class: "badge " + cls, text, title });

  // ---------------------------------------------------------------------------------- state
  const PAGE = 50;
  const state = { manifest: null, run: null, rows: [], shown: [], page: 0, episode: null };

  function setStatus(text) {
    $("status").textContent = visible(text);
  }

  function setHash() {
    const parts = [];
    if (state.tab === "curves") parts.push("tab=curves");
    if (state.run) parts.push("run=" + state.run.key);
    if (state.episode !== null) parts.push("ep=" + state.episode);
    try {
      history.replaceState(null, "", "#" + parts.join("&"));
    } catch (e) {
      /* a sandboxed frame may refuse: the page works without deep links */
    }
  }

  function readHash() {
    const out = {};
    for (const part of location.hash.replace(/^#/, "").split("&")) {
      const [k, v] = part.split("=");
      if (k) out[k] = v;
    }
    return out;
  }

  // ----------------------------------------------------------------------------------- page
  function skeleton() {
    const app = $("app") || document.body.appendChild(h("div", { id: "app" }));
    add(clear(app), [
      h("header", {},
        h("h1", { id: "title", text: state.manifest.title }),
        h("nav", { class: "tabs", role: "tablist" },
          h("button", { id: "tab-episodes", class: "tab active", text: "Episodes", on: { click: () => showTab("episodes") } }),
          h("button", { id: "tab-curves", class: "tab", text: "Training curves", on: { click: () => showTab("curves") } })),
        h("span", { id: "status", "aria-live": "polite" })),
      h("main", {},
        h("section", { id: "episodes-page", class: "page" },
          h("aside", { id: "sidebar" },
            h("div", { id: "runs" }),
            h("div", { id: "filters", hidden: true }),
            h("div", { id: "list" })),
          h("article", { id: "episode" }, h("p", { class: "hint", text: "Pick a run, then an episode." }))),
        h("section", { id: "curves-page", class: "page", hidden: true })),
    ]);
  }

  function showTab(tab) {
    state.tab = tab;
    $("episodes-page").hidden = tab !== "episodes";
    $("curves-page").hidden = tab !== "curves";
    $("tab-episodes").classList.toggle("active", tab === "episodes");
    $("tab-curves").classList.toggle("active", tab === "curves");
    if (tab === "curves" && !$("curves-page").firstChild) renderCurves();
    setHash();
  }

  // ----------------------------------------------------------------------------------- runs
  // box `id` cleared, with its heading; null (and a hint in the box) when there is nothing to show
  function titled(id, title, count, empty) {
    const box = add(clear($(id)), [h("h2", { text: title })]);
    if (!count) box.appendChild(h("p", { class: "hint", text: empty }));
    return count ? box : null;
  }

  function renderRuns() {
    const runs = state.manifest.runs;
    const box = titled("runs", "Runs", runs.length, "No rollout or ablation parquet files were given.");
    if (!box) return;
    const groups = [["rollout", "Rollouts (policy x org)"], ["ablation", "Ablations (variant, seed)"]];
    for (const [kind, title] of groups) {
      const mine = runs.filter((r) => r.kind === kind);
      if (!mine.length) continue;
      box.appendChild(h("h3", { text: title }));
      box.appendChild(h("ul", { class: "run-list" }, mine.map((r) =>
        h("li", {}, h("button", {
          class: "run", "data-run": r.key, title: r.source,
          on: { click: () => openRun(r.key) },
        }, h("span", { class: "run-label", text: r.label }),
        h("span", { class: "run-meta", text: r.org + " | " + r.episodes + " episodes | success " + fmt(r.success) }))))));
    }
  }

  async function openRun(key, episode) {
    const run = state.manifest.runs.find((r) => r.key === key);
    if (!run) return;
    setStatus("loading " + run.label + " ...");
    let data;
    try {
      data = await load(key);
    } catch (e) {
      setStatus(e.message);
      return;
    }
    state.run = run;
    state.rows = data.episodes.map((row, i) => Object.assign({ index: i }, row));
    state.page = 0;
    state.episode = null;
    for (const b of document.querySelectorAll("button.run")) b.classList.toggle("active", b.dataset.run === key);
    renderFilters();
    applyFilters();
    clear($("episode")).appendChild(h("p", { class: "hint", text: "Pick an episode of " + run.label + "." }));
    setStatus(run.label + ": " + state.rows.length + " episodes");
    setHash();
    if (episode !== undefined && state.rows[episode]) openEpisode(episode);
  }

  // -------------------------------------------------------------------------------- filters
  const FLAGS = [
    ["f-fail", "failures (score < 1)", (r) => (r.outcome || 0) < 1],
    ["f-false", "verifier false approvals", (r) => r.false_approvals > 0],
    ["f-idle", "idle hires", (r) => r.idle_hires > 0],
    ["f-malformed", "malformed turns", (r) => r.malformed > 0],
  ];
  const SORTS = {
    file: ["file order", null],
    rounds: ["longest first", (a, b) => b.rounds - a.rounds || a.index - b.index],
    agents: ["largest org first", (a, b) => b.agents - a.agents || a.index - b.index],
    reward: ["lowest reward first", (a, b) => (a.reward || 0) - (b.reward || 0) || a.index - b.index],
  };

  function options(values, all) {
    return [h("option", { value: "", text: all })].concat(values.map((v) => h("option", { value: String(v), text: v })));
  }

  function renderFilters() {
    const rows = state.rows;
    const families = [...new Set(rows.map((r) => r.family))].sort();
    const diffs = [...new Set(rows.map((r) => r.difficulty))].sort((a, b) => a - b);
    // `input` only: a `change` on blur would redraw the list under the click that caused the blur
    const onChange = { input: () => { state.page = 0; applyFilters(); } };
    const box = clear($("filters"));
    box.hidden = false;
    add(box, [
      h("h2", { text: "Filters" }),
      FLAGS.map(([id, label]) => h("label", { class: "check" }, h("input", { id, type: "checkbox", on: onChange }), " " + label)),
      h("label", {}, "family ", h("select", { id: "f-family", on: onChange }, options(families, "all"))),
      h("label", {}, "difficulty ", h("select", { id: "f-difficulty", on: onChange }, options(diffs, "all"))),
      h("label", {}, "rounds ",
        h("input", { id: "f-min-rounds", type: "number", min: 0, placeholder: "min", on: onChange }), " to ",
        h("input", { id: "f-max-rounds", type: "number", min: 0, placeholder: "max", on: onChange })),
      h("label", {}, "id contains ", h("input", { id: "f-search", type: "text", on: onChange })),
      h("label", {}, "sort ", h("select", { id: "f-sort", on: onChange },
        Object.entries(SORTS).map(([k, [label]]) => h("option", { value: k, text: label })))),
    ]);
  }

  function applyFilters() {
    const on = FLAGS.filter(([id]) => $(id).checked).map(([, , test]) => test);
    const family = $("f-family").value;
    const diff = $("f-difficulty").value;
    const lo = $("f-min-rounds").value === "" ? -Infinity : Number($("f-min-rounds").value);
    const hi = $("f-max-rounds").value === "" ? Infinity : Number($("f-max-rounds").value);
    const needle = $("f-search").value.toLowerCase();
    let shown = state.rows.filter((r) => on.every((test) => test(r)) && (!family || r.family === family)
      && (!diff || String(r.difficulty) === diff) && r.rounds >= lo && r.rounds <= hi
      && (!needle || r.id.toLowerCase().includes(needle)));
    const order = SORTS[$("f-sort").value][1];
    if (order) shown = shown.slice().sort(order);
    state.shown = shown;
    renderList();
  }

  function flags(r) {
    return [
      (r.outcome || 0) >= 1 ? badge("ok", "success") : badge("bad", "fail"),
      r.false_approvals ? badge("warn", "false approval x" + r.false_approvals) : null,
      r.idle_hires ? badge("warn", "idle x" + r.idle_hires) : null,
      r.malformed ? badge("warn", "malformed x" + r.malformed) : null,
    ];
  }

  function renderList() {
    const rows = state.shown;
    const pages = Math.max(1, Math.ceil(rows.length / PAGE));
    state.page = Math.min(state.page, pages - 1);
    const part = rows.slice(state.page * PAGE, (state.page + 1) * PAGE);
    const go = (p) => () => { state.page = p; renderList(); };
    add(clear($("list")), [
      h("p", { id: "count", text: rows.length + " of " + state.rows.length + " episodes" }),
      h("table", { id: "episode-list" },
        h("thead", {}, h("tr", {}, ["episode", "family", "d", "score", "reward", "rounds", "agents", ""].map(
          (c) => h("th", { text: c })))),
        h("tbody", {}, part.map((r) => h("tr", {
          class: "ep" + (r.index === state.episode ? " active" : ""), "data-index": r.index, title: r.id,
          on: { click: () => openEpisode(r.index) },
        }, h("td", { class: "id", text: r.id }), h("td", { text: r.family }), h("td", { text: r.difficulty }),
        h("td", { text: fmt(r.outcome) }), h("td", { text: fmt(r.reward) }), h("td", { text: r.rounds }),
        h("td", { text: r.agents }), h("td", {}, flags(r)))))),
      h("div", { class: "pager" },
        h("button", { id: "prev", text: "previous", disabled: state.page === 0, on: { click: go(state.page - 1) } }),
        h("span", { id: "page", text: " page " + (state.page + 1) + " of " + pages + " " }),
        h("button", { id: "next", text: "next", disabled: state.page >= pages - 1, on: { click: go(state.page + 1) } })),
    ]);
  }

  // -------------------------------------------------------------------------------- episode
  async function openEpisode(index) {
    const run = state.run;
    const row = state.rows[index];
    setStatus("loading episode " + row.id + " ...");
    let chunk;
    try {
      chunk = await load(run.key + "c" + row.chunk);
    } catch (e) {
      setStatus(e.message);
      return;
    }
    if (state.run !== run) return;
    const ep = chunk.episodes[index - row.chunk * state.manifest.chunk_size];
    state.episode = index;
    for (const tr of document.querySelectorAll("tr.ep")) tr.classList.toggle("active", Number(tr.dataset.index) === index);
    renderEpisode(ep);
    setStatus(run.label + ": episode " + row.id);
    setHash();
  }

  function section(id, title, ...kids) {
    return h("section", { id, class: "part" }, h("h3", { text: title }), kids);
  }

  function renderEpisode(ep) {
    const box = clear($("episode"));
    box.dataset.episode = ep.id;
    add(box, [
      h("h2", { id: "episode-title", text: ep.id }),
      h("p", { class: "facts", text: [ep.family, "difficulty " + ep.difficulty, ep.mode, ep.rounds + " rounds",
        ep.agents + " agents", "depth " + ep.depth, ep.n_turns + " turns", ep.tokens + " tokens",
        "critical path " + ep.critical_path + " tokens", ep.seconds === null ? null : fmt(ep.seconds) + " s"]
        .filter((x) => x !== null).join(" | ") }, flags(ep)),
      verdict(ep),
      section("org", "Org chart (hiring tree)", orgChart(ep)),
      section("timeline", "Timeline (one lane per agent, one column per round)", timeline(ep)),
      section("board", "Board posts", board(ep)),
      section("files", "Workspace files", files(ep)),
    ]);
  }

  function verdict(ep) {
    const ok = (ep.outcome || 0) >= 1;
    const who = ep.submitter >= 0 ? "agent" + ep.submitter : "";
    const rewards = Object.entries(ep.agent_rewards).map(([a, v]) => "agent" + a + " " + fmt(v)).join(", ");
    return h("section", { id: "verdict", class: "part " + (ok ? "success" : "failure"), "data-outcome": ep.outcome },
      h("h3", { text: "Task, answer, verdict" }),
      h("dl", {},
        h("dt", { text: "task" }), h("dd", {}, h("pre", { id: "task-prompt", text: ep.task.prompt })),
        h("dt", { text: "expected answer" }), h("dd", { id: "expected", text: ep.task.answer }),
        h("dt", { text: "submitted answer" }),
        h("dd", { id: "answer", class: ep.submitted ? "" : "none", text: ep.submitted ? ep.answer : "nothing submitted" }),
        h("dt", { text: "submitted by" }), h("dd", { id: "submitter", text: who || "nobody" }),
        h("dt", { text: "verifier score" }), h("dd", { id: "outcome", text: fmt(ep.outcome) + (ok ? " (success)" : " (failure)") }),
        h("dt", { text: "reward" }), h("dd", { id: "reward", text: fmt(ep.reward, 3) }),
        h("dt", { text: "agent rewards" }), h("dd", { id: "agent-rewards", text: rewards || "none" }),
        h("dt", { text: "ended" }), h("dd", { id: "end-reason", text: ep.end_reason + (ep.truncated ? " (truncated)" : "") })));
  }

  function orgChart(ep) {
    const kids = {};
    for (const m of ep.org) (kids[m.parent] = kids[m.parent] || []).push(m);
    const idle = new Set(ep.idle);
    const node = (m) => h("li", { class: "member", "data-agent": m.agent, "data-role": m.role },
      h("div", { class: "who" },
        h("span", { class: "agent", text: "agent" + m.agent }), " ",
        h("span", { class: "role", text: m.role }),
        h("span", { class: "joined", text: m.parent >= 0 ? " joined round " + m.round : " CEO" }),
        idle.has(m.agent) ? badge("warn", "idle", "never posted, wrote, hired, ran or submitted") : null),
      m.brief ? h("div", { class: "brief", text: m.brief }) : null,
      kids[m.agent] ? h("ul", {}, kids[m.agent].map(node)) : null);
    return h("ul", { class: "tree" }, (kids[-1] || []).map(node));
  }

  function timeline(ep) {
    const byCell = {};
    for (const t of ep.turns) byCell[t.agent + ":" + t.round] = t;
    const rounds = Array.from({ length: ep.rounds }, (_, i) => i + 1);
    return h("div", { class: "scroll" }, h("table", { class: "lanes" },
      h("thead", {}, h("tr", {}, h("th", { text: "agent" }),
        rounds.map((r) => h("th", { class: "round-head", "data-round": r, text: "round " + r })))),
      h("tbody", {}, ep.org.map((m) => h("tr", { class: "lane", "data-agent": m.agent },
        h("th", { class: "lane-head" }, h("span", { class: "agent", text: "agent" + m.agent }), h("br"),
          h("span", { class: "role", text: m.role })),
        rounds.map((r) => {
          const t = byCell[m.agent + ":" + r];
          return t ? h("td", { class: "cell turn" + (t.malformed ? " malformed" : ""), "data-round": r }, turn(t))
            : h("td", { class: "cell empty", "data-round": r });
        }))))));
  }

  function turn(t) {
    const prompt = h("details", { class: "prompt" }, h("summary", { text: "what it saw" }));
    prompt.addEventListener("toggle", () => {
      if (prompt.open && prompt.children.length === 1) prompt.appendChild(h("pre", { text: t.prompt }));
    }, { once: false });
    return [
      h("pre", { class: "completion", text: t.completion }),
      t.actions.length ? h("ul", { class: "actions" }, t.actions.map((a) => h("li", { class: "action", "data-kind": a.kind },
        h("span", { class: "kind", text: a.kind }), a.arg ? " " + a.arg : "",
        a.body ? h("pre", { class: "body", text: a.body }) : null))) : null,
      t.errors.length ? h("ul", { class: "errors" }, t.errors.map((e) => h("li", { class: "error", text: e }))) : null,
      h("div", { class: "meta", text: t.tokens + "/" + t.max_tokens + " tokens" + (t.finish ? ", " + t.finish : "") }),
      prompt,
    ];
  }

  function board(ep) {
    if (!ep.posts.length) return h("p", { class: "hint", text: "No posts." });
    return h("ol", { class: "posts" }, ep.posts.map((p) => h("li", {
      class: "post" + (p.false_approval ? " false-approval" : ""), "data-post": p.id,
    }, h("span", { class: "post-head", text: "#" + p.id + " round " + p.round + " agent" + p.agent + " " + p.role }),
    p.verdict ? badge(p.verdict === "approve" ? "ok" : "bad", p.verdict) : null,
    p.false_approval ? badge("warn", "false approval", "approves a claim that is wrong") : null,
    h("div", { class: "post-text", text: p.text }))));
  }

  function files(ep) {
    if (!ep.files.length) return h("p", { class: "hint", text: "No files written." });
    const rounds = [...new Set(ep.files.map((f) => f.round))];
    return rounds.map((r) => h("div", { class: "file-round", "data-round": r },
      h("h4", { text: "round " + r }),
      ep.files.filter((f) => f.round === r).map((f) => h("div", { class: "write" + (f.won ? "" : " lost"), "data-path": f.path },
        h("div", { class: "write-head", text: f.path + " by agent" + f.agent + (f.won ? ", version " + f.version
          : " (overwritten in the same round by a higher agent)") + ", " + f.chars + " chars" }),
        f.won ? h("pre", { class: "diff" }, f.diff.map((line) => h("span", {
          class: line.startsWith("+") ? "add" : line.startsWith("-") ? "del" : line.startsWith("@@") ? "hunk" : "same",
          text: line + "\n",
        }))) : null,
        f.won ? h("details", {}, h("summary", { text: "whole file" }), h("pre", { class: "content", text: f.content })) : null))));
  }

  // --------------------------------------------------------------------------------- curves
  const COLOURS = ["#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#17becf", "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22"];

  function metricOrder(cols) {
    const rank = (c) => c === "org_size" ? 0 : c === "org_depth" ? 1 : c === "org_hires" ? 2 : c.startsWith("org_hires_") ? 3
      : c.startsWith("org_") ? 4 : c === "behaviour_collective_thinking" ? 5 : 6;
    return cols.sort((a, b) => rank(a) - rank(b) || (a < b ? -1 : a > b ? 1 : 0));
  }

  function renderCurves() {
    const series = state.manifest.curves;
    const page = titled("curves-page", "The organisation's shape over training, per variant", series.length,
      "No training curves (plots/train.csv, plots/ablations/*.csv) were given.");
    if (!page) return;
    const variants = [...new Set(series.map((s) => s.variant))];
    const colour = (v) => COLOURS[variants.indexOf(v) % COLOURS.length];
    page.appendChild(h("div", { id: "legend" }, variants.map((v) => h("label", { class: "legend-item", "data-variant": v },
      h("input", { type: "checkbox", checked: true, on: { change: (e) => toggleVariant(v, e.target.checked) } }),
      svg("svg", { width: 18, height: 10 }, svg("line", { x1: 0, y1: 5, x2: 18, y2: 5, stroke: colour(v), "stroke-width": 3 })),
      " " + v))));
    const cols = metricOrder([...new Set(series.flatMap((s) => Object.keys(s.columns)))]);
    page.appendChild(h("div", { class: "charts" }, cols.map((c) => chart(c, series, colour))));
  }

  function toggleVariant(variant, on) {
    for (const el of document.querySelectorAll("#curves-page .series")) {
      if (el.dataset.variant === variant) el.classList.toggle("hidden", !on);
    }
  }

  function ticks(lo, hi, n) {
    if (hi === lo) return [lo];
    const step0 = (hi - lo) / n;
    const mag = Math.pow(10, Math.floor(Math.log10(step0)));
    const step = [1, 2, 5, 10].map((m) => m * mag).find((s) => s >= step0);
    const out = [];
    for (let v = Math.ceil(lo / step) * step; v <= hi + step * 1e-9; v += step) out.push(Number(v.toPrecision(12)));
    return out;
  }

  function chart(column, series, colour) {
    const W = 380, H = 220, L = 44, R = 10, T = 10, B = 30;
    const pts = series.map((s) => (s.columns[column] || []).map((y, i) => [s.iteration[i], y]).filter(([x, y]) => x !== null && y !== null));
    const xs = pts.flat().map((p) => p[0]);
    const ys = pts.flat().map((p) => p[1]);
    const x0 = Math.min(...xs), x1 = Math.max(...xs);
    const y0 = Math.min(0, ...ys), y1 = Math.max(...ys) > y0 ? Math.max(...ys) : y0 + 1;
    const X = (x) => L + (x1 === x0 ? 0.5 : (x - x0) / (x1 - x0)) * (W - L - R);
    const Y = (y) => T + (1 - (y - y0) / (y1 - y0)) * (H - T - B);
    const axis = [
      svg("line", { x1: L, y1: H - B, x2: W - R, y2: H - B, class: "axis" }),
      svg("line", { x1: L, y1: T, x2: L, y2: H - B, class: "axis" }),
      ticks(y0, y1, 4).map((v) => [svg("line", { x1: L, y1: Y(v), x2: W - R, y2: Y(v), class: "grid" }),
        svg("text", { x: L - 4, y: Y(v) + 4, "text-anchor": "end", class: "tick" }, String(v))]),
      ticks(x0, x1, 5).filter((v) => Number.isInteger(v)).map((v) =>
        svg("text", { x: X(v), y: H - B + 14, "text-anchor": "middle", class: "tick" }, String(v))),
      svg("text", { x: (L + W - R) / 2, y: H - 2, "text-anchor": "middle", class: "label" }, "iteration"),
    ];
    const lines = series.map((s, i) => pts[i].length ? svg("g", { class: "series", "data-variant": s.variant, "data-seed": s.seed === null ? "" : s.seed },
      svg("title", {}, s.variant + (s.seed === null ? "" : " seed " + s.seed) + " (" + s.source + ")"),
      svg("polyline", { points: pts[i].map(([x, y]) => X(x).toFixed(1) + "," + Y(y).toFixed(1)).join(" "),
        fill: "none", stroke: colour(s.variant), "stroke-width": 1.8, "stroke-dasharray": i % 2 && s.seed ? "4 2" : null }),
      pts[i].map(([x, y]) => svg("circle", { cx: X(x).toFixed(1), cy: Y(y).toFixed(1), r: 2.5, fill: colour(s.variant) },
        svg("title", {}, s.variant + " iteration " + x + ": " + fmt(y, 3))))) : null);
    return h("figure", { class: "chart", "data-metric": column },
      h("figcaption", { text: column.replace(/^(org|behaviour)_/, "$1/") }),
      svg("svg", { viewBox: "0 0 " + W + " " + H, width: W, height: H, role: "img" }, axis, lines));
  }

  // ---------------------------------------------------------------------------------- start
  async function start() {
    try {
      state.manifest = await load("manifest");
    } catch (e) {
      document.body.appendChild(h("p", { class: "hint", text: "The viewer's data/manifest.js is missing: " + e.message }));
      return;
    }
    document.title = visible(state.manifest.title) + " - episode viewer";
    skeleton();
    renderRuns();
    setStatus(state.manifest.runs.length + " runs");
    const want = readHash();
    if (want.tab === "curves") showTab("curves");
    if (want.run) openRun(want.run, want.ep === undefined ? undefined : Number(want.ep));
    document.body.dataset.ready = "1";
  }

  if (document.readyState === "loading") document.addEventListener("DOMContentLoaded", start);
  else start();
})();
