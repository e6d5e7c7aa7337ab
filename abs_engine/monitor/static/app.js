/* abs-engine job dashboard.
 *
 * One classic script, no build step. Two modes:
 * - live (default): polls api/pipelines, api/job and api/checkpoints every second (and
 *   api/checkpoints/<id> for the selected checkpoint) and redraws; a job of several
 *   pipelines has a tab per pipeline, and every document is the selected pipeline's
 *   (?pipeline=<name>; the address's #pipeline=<name> keeps the choice);
 * - report: window.ABS_REPORT = {job, checkpoints, details} (or, for a job of several
 *   pipelines, {pipelines: [{name, job, checkpoints, details}, ...]}, a tab each) was set
 *   before this script (abs-engine report); the page is drawn from it, nothing is fetched.
 *
 * Every string from the server reaches the page through textContent or an attribute set
 * with setAttribute, never through innerHTML. Rendering never throws: each section is
 * drawn inside its own guard, and missing or null fields show as "\u2014" (an em dash).
 */
(function () {
  "use strict";

  var POLL_MS = 1000;
  var MAX_RETRY_MS = 5000;
  var HISTORY_ROWS = 50;
  var DASH = "\u2014";
  var SVGNS = "http://www.w3.org/2000/svg";
  var ENDED = { FINISHED: true, FAILED: true, CANCELED: true };
  var VERTEX_HUES = [212, 28, 138, 354, 270, 46, 186, 320, 96, 236, 12, 160];

  var REPORT = (typeof window.ABS_REPORT === "object" && window.ABS_REPORT !== null) ? window.ABS_REPORT : null;

  var model = {
    job: null,            // the last api/job document
    cps: null,            // the last api/checkpoints document
    details: {},          // id -> detail document (ended checkpoints only; they do not change)
    detailErrors: {},     // id -> message of a failed detail request (404)
    liveDetail: null,     // the latest detail of an in-progress checkpoint
    selected: null,       // the selected checkpoint id
    selectedAttempt: null, // and its attempt (ids start again after a restore: the pair names one)
    userSelected: false,  // the user picked it (otherwise it follows the newest completed one)
    connected: null,      // live mode: true/false once known
    lastUpdate: null,
    pipelines: [],        // the last api/pipelines list (one entry: no tabs)
    pipeline: null        // the selected pipeline's name (null: the server's first)
  };

  var charts = { out: null, bp: null, wm: null, cp: null };
  var chartKeys = { out: "", bp: "", wm: "", cp: "" };
  var zoomed = { out: false, bp: false, wm: false, cp: false };  // the user dragged a range: new data keep it
  var graphCache = { key: "", svg: null, boxes: {} };

  // ---------------------------------------------------------------------------------
  // small helpers

  function $(id) { return document.getElementById(id); }

  function isNum(x) { return typeof x === "number" && isFinite(x); }
  function arr(x) { return Array.isArray(x) ? x : []; }
  function obj(x) { return (x !== null && typeof x === "object" && !Array.isArray(x)) ? x : {}; }
  function str(x) { return (x === null || x === undefined) ? DASH : String(x); }

  var intFmt = new Intl.NumberFormat("en-US", { maximumFractionDigits: 0 });
  var oneFmt = new Intl.NumberFormat("en-US", { minimumFractionDigits: 1, maximumFractionDigits: 1 });

  function fmtInt(x) { return isNum(x) ? intFmt.format(x) : DASH; }

  function fmtNum(x) {
    if (!isNum(x)) { return DASH; }
    if (Math.abs(x) >= 100 || Number.isInteger(x)) { return intFmt.format(x); }
    return oneFmt.format(x);
  }

  var compactFmt = new Intl.NumberFormat("en-US", { notation: "compact", maximumSignificantDigits: 3 });
  // 4,921 stays exact; 4,921,300 becomes 4.92M (a narrow cell; the exact count is in the tooltip)
  function fmtCompact(x) { return !isNum(x) ? DASH : (Math.abs(x) < 10000 ? intFmt.format(x) : compactFmt.format(x)); }

  function fmtRate(x) { return isNum(x) ? fmtNum(x) : DASH; }

  function fmtPct(share) {
    if (!isNum(share)) { return DASH; }
    var p = share * 100;
    return (p > 0 && p < 10 ? oneFmt.format(p) : intFmt.format(p)) + " %";
  }

  function fmtBytes(b) {
    if (!isNum(b)) { return DASH; }
    var a = Math.abs(b);
    if (a < 1024) { return intFmt.format(b) + " B"; }
    var units = ["KB", "MB", "GB", "TB"];
    var v = b / 1024, i = 0;
    while (Math.abs(v) >= 1024 && i < units.length - 1) { v /= 1024; i += 1; }
    return (Math.abs(v) < 10 ? v.toFixed(2) : Math.abs(v) < 100 ? v.toFixed(1) : intFmt.format(v)) + " " + units[i];
  }

  function fmtMs(ms) {
    if (!isNum(ms)) { return DASH; }
    if (Math.abs(ms) < 10 && !Number.isInteger(ms)) { return ms.toFixed(2) + " ms"; }
    if (Math.abs(ms) < 100 && !Number.isInteger(ms)) { return oneFmt.format(ms) + " ms"; }
    return intFmt.format(ms) + " ms";
  }

  function fmtDuration(ms) {
    if (!isNum(ms) || ms < 0) { return DASH; }
    var s = ms / 1000;
    if (s < 60) { return oneFmt.format(s) + " s"; }
    var total = Math.floor(s);
    var d = Math.floor(total / 86400), h = Math.floor(total / 3600) % 24;
    var m = Math.floor(total / 60) % 60, sec = total % 60;
    if (d > 0) { return d + " d " + pad(h, 2) + " h " + pad(m, 2) + " min"; }
    if (h > 0) { return h + " h " + pad(m, 2) + " min " + pad(sec, 2) + " s"; }
    return m + " min " + pad(sec, 2) + " s";
  }

  function pad(n, w) { var t = String(n); while (t.length < w) { t = "0" + t; } return t; }

  function fmtClock(ms) {
    if (!isNum(ms) || ms <= 0) { return DASH; }
    var d = new Date(ms);
    return pad(d.getHours(), 2) + ":" + pad(d.getMinutes(), 2) + ":" + pad(d.getSeconds(), 2) + "." +
      pad(d.getMilliseconds(), 3);
  }

  function fmtDateTime(ms) {
    if (!isNum(ms) || ms <= 0) { return DASH; }
    var d = new Date(ms);
    return d.getFullYear() + "-" + pad(d.getMonth() + 1, 2) + "-" + pad(d.getDate(), 2) + " " +
      pad(d.getHours(), 2) + ":" + pad(d.getMinutes(), 2) + ":" + pad(d.getSeconds(), 2);
  }

  /** An HTML element; attrs are set with setAttribute (className via "class"), text is textContent. */
  function h(tag, attrs, text) {
    var e = document.createElement(tag);
    if (attrs) {
      Object.keys(attrs).forEach(function (k) {
        if (attrs[k] !== null && attrs[k] !== undefined && attrs[k] !== false) { e.setAttribute(k, String(attrs[k])); }
      });
    }
    if (text !== undefined && text !== null) { e.textContent = String(text); }
    return e;
  }

  function s(tag, attrs, text) {
    var e = document.createElementNS(SVGNS, tag);
    if (attrs) {
      Object.keys(attrs).forEach(function (k) {
        if (attrs[k] !== null && attrs[k] !== undefined) { e.setAttribute(k, String(attrs[k])); }
      });
    }
    if (text !== undefined && text !== null) { e.textContent = String(text); }
    return e;
  }

  function svgTitle(parent, text) { parent.appendChild(s("title", null, text)); }

  function setText(id, text) { var e = $(id); if (e) { e.textContent = text; } }

  function clear(e) { while (e.firstChild) { e.removeChild(e.firstChild); } }

  /** A tooltip naming the operators of a task's chain behind a count: "check: 1 skipped". */
  function byOperator(counts, what) {
    var c = obj(counts);
    return Object.keys(c).filter(function (k) { return isNum(c[k]) && c[k] > 0; }).sort().map(function (k) {
      return k + ": " + fmtInt(c[k]) + " " + what;
    }).join("\n");
  }

  function td(text, cls, title) {
    return h("td", { "class": cls || null, title: title || null }, text);
  }

  function emptyNote(table, show, text) {
    var wrap = table.parentNode;
    var note = wrap.querySelector(".empty-note");
    if (!note) {
      note = h("p", { "class": "empty-note" });
      wrap.appendChild(note);
    }
    note.textContent = text;
    note.hidden = !show;
  }

  function guard(name, fn) {
    try {
      fn();
    } catch (e) {
      if (window.console && console.info) { console.info("dashboard: could not draw " + name + ": " + e); }
    }
  }

  function bpClass(share) {
    if (!isNum(share)) { return "bp-none"; }
    if (share < 0.10) { return "bp-low"; }
    if (share < 0.50) { return "bp-mid"; }
    return "bp-high";
  }

  function stateClass(state) {
    return "state-" + (typeof state === "string" ? state.toLowerCase().replace(/[^a-z_]/g, "") : "unknown");
  }

  function statusClass(status) {
    return "status-" + (typeof status === "string" ? status.toLowerCase().replace(/[^a-z_]/g, "") : "unknown");
  }

  var TYPE_LABELS = {
    CHECKPOINT: "checkpoint", UNALIGNED_CHECKPOINT: "unaligned checkpoint", SAVEPOINT: "savepoint",
    STOP_THE_WORLD: "stop-the-world"
  };

  function typeLabel(t) { return (typeof t === "string" && TYPE_LABELS[t]) ? TYPE_LABELS[t] : str(t); }

  // ---------------------------------------------------------------------------------
  // derived data

  function vertexOrder(job) {
    var order = {};
    arr(job.vertices).forEach(function (v, i) { if (v && v.id !== undefined) { order[v.id] = i; } });
    return order;
  }

  /** Task ids in vertex order, then subtask; the union of tasks and throughput keys. */
  function taskIds(job) {
    var order = vertexOrder(job);
    var info = {};
    arr(job.tasks).forEach(function (t) { if (t && typeof t.id === "string") { info[t.id] = t; } });
    arr(job.vertices).forEach(function (v) {
      arr(v && v.tasks).forEach(function (id, i) {
        if (typeof id === "string" && !info[id]) { info[id] = { id: id, vertex: v.id, subtask: i }; }
      });
    });
    var tp = obj(job.throughput);
    ["records_out_per_second", "backpressure"].forEach(function (k) {
      Object.keys(obj(tp[k])).forEach(function (id) {
        if (!info[id]) {
          var m = /^(.+)[.#](\d+)$/.exec(id);
          info[id] = { id: id, vertex: m ? m[1] : id, subtask: m ? Number(m[2]) : 0 };
        }
      });
    });
    return Object.keys(info).map(function (id) { return info[id]; }).sort(function (a, b) {
      var va = order[a.vertex], vb = order[b.vertex];
      va = va === undefined ? 1e9 : va;
      vb = vb === undefined ? 1e9 : vb;
      if (va !== vb) { return va - vb; }
      if (a.vertex !== b.vertex) { return String(a.vertex) < String(b.vertex) ? -1 : 1; }
      var sa = isNum(a.subtask) ? a.subtask : 0, sb = isNum(b.subtask) ? b.subtask : 0;
      if (sa !== sb) { return sa - sb; }
      return a.id < b.id ? -1 : a.id > b.id ? 1 : 0;
    });
  }

  /** A colour per task: one hue per vertex, lighter for later subtasks. */
  function taskColours(job, tasks) {
    var order = vertexOrder(job);
    var perVertex = {};
    tasks.forEach(function (t) { perVertex[t.vertex] = (perVertex[t.vertex] || 0) + 1; });
    var seen = {}, nextHue = Object.keys(order).length;
    var colours = {};
    tasks.forEach(function (t) {
      var vi = order[t.vertex];
      if (vi === undefined) { vi = nextHue; nextHue += 1; order[t.vertex] = vi; }
      var hue = VERTEX_HUES[vi % VERTEX_HUES.length];
      var n = perVertex[t.vertex], k = seen[t.vertex] || 0;
      seen[t.vertex] = k + 1;
      var light = n <= 1 ? 42 : 32 + Math.round(30 * k / (n - 1));
      colours[t.id] = "hsl(" + hue + ", 70%, " + light + "%)";
    });
    return colours;
  }

  function vertexStats(job) {
    var stats = {};
    arr(job.tasks).forEach(function (t) {
      if (!t) { return; }
      var v = stats[t.vertex] || (stats[t.vertex] = { inRate: null, outRate: null, bp: null, n: 0 });
      v.n += 1;
      if (isNum(t.records_in_per_second)) { v.inRate = (v.inRate || 0) + t.records_in_per_second; }
      if (isNum(t.records_out_per_second)) { v.outRate = (v.outRate || 0) + t.records_out_per_second; }
      if (isNum(t.backpressure)) { v.bp = v.bp === null ? t.backpressure : Math.max(v.bp, t.backpressure); }
    });
    return stats;
  }

  /** Newest first: by id, and for an id taken again after a restore, the later trigger first. */
  function historyEntries() {
    return arr(obj(model.cps).history).filter(function (e) { return e && isNum(e.id); })
      .slice().sort(function (a, b) {
        return (b.id - a.id) || ((isNum(b.trigger_timestamp) ? b.trigger_timestamp : 0) -
          (isNum(a.trigger_timestamp) ? a.trigger_timestamp : 0));
      });
  }

  /** The newest history entry with this id (and this attempt, unless attempt is null). */
  function findEntry(id, attempt) {
    var hs = historyEntries();
    for (var i = 0; i < hs.length; i += 1) {
      if (hs[i].id === id && (attempt === null || attempt === undefined || hs[i].attempt === attempt)) { return hs[i]; }
    }
    return null;
  }

  function attemptOf(e) { return e && isNum(e.attempt) ? e.attempt : null; }

  function hasDetails(id) {
    var d = model.details[String(id)];
    return !!d && arr(d.subtasks).length > 0;
  }

  /** The newest completed checkpoint with details (report: stored ones), else the newest one at all:
   * an entry ({id, attempt}) or null. */
  function defaultSelection() {
    var hs = historyEntries();
    var i;
    if (REPORT) {
      for (i = 0; i < hs.length; i += 1) { if (hs[i].status === "COMPLETED" && hasDetails(hs[i].id)) { return hs[i]; } }
      for (i = 0; i < hs.length; i += 1) { if (model.details[String(hs[i].id)]) { return hs[i]; } }
    } else {
      for (i = 0; i < hs.length; i += 1) { if (hs[i].status === "COMPLETED") { return hs[i]; } }
    }
    var latest = obj(obj(model.cps).latest).completed;
    if (latest && isNum(latest.id)) { return latest; }
    return hs.length ? hs[0] : null;
  }

  // ---------------------------------------------------------------------------------
  // header

  function renderHeader() {
    var job = obj(model.job);
    setText("job-name", job.name ? String(job.name) : DASH);
    setText("job-id", str(job.jid));
    var st = $("job-state");
    if (model.connected === false && !REPORT && !ENDED[job.state]) {
      // The driver is gone: its last word (RUNNING) is no longer known to be true.
      st.textContent = "UNKNOWN";
      st.className = "badge state-unknown";
      st.title = "last state reported: " + str(job.state) + "; the dashboard lost the driver";
    } else {
      st.textContent = str(job.state);
      st.className = "badge " + stateClass(job.state);
      st.title = "";
    }
    setText("job-mode", str(job.mode));
    setText("job-interval", isNum(job.checkpoint_interval) ? fmtNum(job.checkpoint_interval) + " s" :
      (job.checkpoint_interval === null ? "none" : DASH));
    setText("job-duration", fmtDuration(job.duration));
    setText("job-duration-label", isNum(job["end-time"]) && job["end-time"] > 0 ? "ran for" : "uptime");
    setText("job-start", fmtDateTime(job["start-time"]));
    setText("restart-count", isNum(job.restarts) ? fmtInt(job.restarts) : DASH);
    setText("job-attempt", isNum(job.attempt) ? fmtInt(job.attempt) : DASH);
    setText("source-records", fmtInt(job.source_records));
    // While it runs: the last half minute's markers; once it has ended: the whole run's.
    var lat = obj(job.latency), ended = isNum(job["end-time"]) && job["end-time"] > 0;
    var shown = ended ? lat.run : (lat.recent || null);
    setText("latency", shown && isNum(shown.p50_ms) ? fmtMs(shown.p50_ms) + " / " + fmtMs(shown.p99_ms) : DASH);
    setText("latency-label", ended ? "latency p50 / p99 (run)" : "latency p50 / p99");
    var srcs = obj(job.sources);
    setText("input-read", Object.keys(srcs).map(function (v) {
      var s = obj(srcs[v]);
      if (!s.unit) { return v + " " + DASH; }
      return v + " " + (isNum(s.fraction) ? fmtPct(s.fraction) + " (" + fmtInt(s.done) + " of " + fmtInt(s.total) + " " + s.unit + ")"
        : (isNum(s.left) ? fmtInt(s.left) + " " + s.unit + " left" : "unbounded"));
    }).join(" \u00b7 ") || DASH);
    document.title = (job.name ? String(job.name) + " \u00b7 " : "") + (job.state ? String(job.state) + " \u00b7 " : "") +
      "abs-engine";
    renderConn();
  }

  function renderConn() {
    var c = $("conn-status");
    if (REPORT) {
      c.textContent = "report of a finished job";
      c.className = "conn conn-report";
      var job = obj(model.job);
      c.title = isNum(job["end-time"]) && job["end-time"] > 0 ? "ended " + fmtDateTime(job["end-time"]) : "";
      return;
    }
    if (model.connected === false) {
      c.textContent = "disconnected: the job has ended or the driver stopped";
      c.className = "conn conn-down";
      c.title = model.lastUpdate ? "last update " + fmtClock(model.lastUpdate) + "; retrying" : "retrying";
    } else if (model.connected === true) {
      c.textContent = "live";
      c.className = "conn conn-live";
      c.title = "updated every second; last update " + fmtClock(model.lastUpdate);
    } else {
      c.textContent = "connecting\u2026";
      c.className = "conn conn-connecting";
      c.title = "";
    }
  }

  // ---------------------------------------------------------------------------------
  // job graph

  var G = { boxW: 190, boxH: 70, gapX: 92, gapY: 26, pad: 16, backGap: 30, laneH: 16 };

  function graphKey(job) {
    return JSON.stringify([arr(job.vertices).map(function (v) {
      v = obj(v);
      return [v.id, v.name, v.parallelism, v.is_source, v.loop, v.layer];
    }), arr(job.edges).map(function (e) {
      e = obj(e);
      return [e.source, e.target, e.ship_strategy, e.back_edge];
    })]);
  }

  /**
   * A back-edge runs below the graph in a lane of its own: out of the bottom of its source
   * and into the bottom of its target when they are the lowest boxes of their columns (one
   * curve), else out of the right side / into the left side with rounded corners.
   */
  function backEdgePath(a, b, index, graphBottom) {
    var lane = graphBottom + 18 + index * G.backGap;
    var r = 10, gx = G.gapX * 0.3;
    var sx, sy, tx, ty;
    if (a.bottom && b.bottom) {
      sx = a.x + G.boxW * (a === b ? 0.75 : 0.62);
      sy = a.y + G.boxH;
      tx = b.x + G.boxW * (a === b ? 0.25 : 0.38);
      ty = b.y + G.boxH;
      var depth = lane + (lane - Math.max(sy, ty)) / 3;  // a cubic reaches 3/4 of its control points' depth
      return {
        d: "M " + sx + " " + sy + " C " + sx + " " + depth + ", " + tx + " " + depth + ", " + tx + " " + ty,
        lx: (sx + tx) / 2, ly: lane + 13
      };
    }
    var p = [];
    if (a.bottom) {
      sx = a.x + G.boxW * 0.62;
      p.push("M " + sx + " " + (a.y + G.boxH), "L " + sx + " " + (lane - r), "Q " + sx + " " + lane + " " + (sx - r) + " " + lane);
    } else {
      var x1 = a.x + G.boxW + gx, y1 = a.y + G.boxH * 0.78;
      sx = x1;
      p.push("M " + (a.x + G.boxW) + " " + y1, "L " + (x1 - r) + " " + y1, "Q " + x1 + " " + y1 + " " + x1 + " " + (y1 + r),
        "L " + x1 + " " + (lane - r), "Q " + x1 + " " + lane + " " + (x1 - r) + " " + lane);
    }
    if (b.bottom) {
      tx = b.x + G.boxW * 0.38;
      p.push("L " + (tx + r) + " " + lane, "Q " + tx + " " + lane + " " + tx + " " + (lane - r), "L " + tx + " " + (b.y + G.boxH));
    } else {
      var x2 = b.x - gx, y2 = b.y + G.boxH * 0.78;
      tx = x2;
      p.push("L " + (x2 + r) + " " + lane, "Q " + x2 + " " + lane + " " + x2 + " " + (lane - r), "L " + x2 + " " + (y2 + r),
        "Q " + x2 + " " + y2 + " " + (x2 + r) + " " + y2, "L " + (b.x - 2) + " " + y2);
    }
    return { d: p.join(" "), lx: (sx + tx) / 2, ly: lane + 13 };
  }

  /** Whether the straight edge a -> b passes through a box of a column between them. */
  function crossesBox(L, a, b) {
    var x1 = a.x + G.boxW, y1 = a.y + G.boxH / 2, x2 = b.x, y2 = b.y + G.boxH / 2;
    var hit = false;
    Object.keys(L.byId).forEach(function (id) {
      var n = L.byId[id];
      if (hit || n.layer <= a.layer || n.layer >= b.layer) { return; }
      var ya = y1 + (y2 - y1) * (n.x - x1) / (x2 - x1);
      var yb = y1 + (y2 - y1) * (n.x + G.boxW - x1) / (x2 - x1);
      var lo = Math.min(ya, yb) - 6, hi = Math.max(ya, yb) + 6;
      if (hi > n.y && lo < n.y + G.boxH) { hit = true; }
    });
    return hit;
  }

  /** Shortens an SVG text (in the page) with an ellipsis until it is at most width wide. */
  function fitText(el, text, width) {
    var len = function () { try { return el.getComputedTextLength(); } catch (e) { return 0; } };
    if (!(len() > width)) { return; }
    var lo = 1, hi = text.length - 1, best = 1;
    while (lo <= hi) {
      var mid = (lo + hi) >> 1;
      el.textContent = text.slice(0, mid) + "\u2026";
      if (len() <= width) { best = mid; lo = mid + 1; } else { hi = mid - 1; }
    }
    el.textContent = text.slice(0, best) + "\u2026";
  }

  /** Columns by layer; within a column, ordered by the mean row of their forward predecessors. */
  function layout(vertices, edges) {
    var byId = {}, cols = [];
    vertices.forEach(function (v, i) {
      var layer = isNum(v.layer) && v.layer >= 0 ? Math.floor(v.layer) : 0;
      byId[v.id] = { v: v, layer: layer, order: i, row: 0 };
    });
    Object.keys(byId).forEach(function (id) {
      var n = byId[id];
      (cols[n.layer] || (cols[n.layer] = [])).push(n);
    });
    for (var c = 0; c < cols.length; c += 1) { if (!cols[c]) { cols[c] = []; } }
    var preds = {};
    var backEnd = {};  // ends of back-edges go to the bottom of their column (the back-edges run below)
    edges.forEach(function (e) {
      if (!e.back_edge && byId[e.source] && byId[e.target]) {
        (preds[e.target] || (preds[e.target] = [])).push(e.source);
      }
      if (e.back_edge) { backEnd[e.source] = true; backEnd[e.target] = true; }
    });
    cols.forEach(function (col, ci) {
      col.forEach(function (n) {
        var ps = (preds[n.v.id] || []).map(function (p) { return byId[p].row; });
        n.key = ci > 0 && ps.length ? ps.reduce(function (a, b) { return a + b; }, 0) / ps.length : 1e6 + n.order;
        n.back = backEnd[n.v.id] ? 1 : 0;
      });
      col.sort(function (a, b) { return (a.back - b.back) || (a.key - b.key) || (a.order - b.order); });
      col.forEach(function (n, i) { n.row = i; n.bottom = i === col.length - 1; });
    });
    var maxRows = cols.reduce(function (m, col) { return Math.max(m, col.length); }, 1);
    var fullH = maxRows * G.boxH + (maxRows - 1) * G.gapY;
    cols.forEach(function (col, ci) {
      var colH = col.length * G.boxH + Math.max(0, col.length - 1) * G.gapY;
      var top = G.pad + 18 + (fullH - colH) / 2;
      col.forEach(function (n, i) {
        n.x = G.pad + ci * (G.boxW + G.gapX);
        n.y = top + i * (G.boxH + G.gapY);
      });
    });
    return { byId: byId, cols: Math.max(cols.length, 1), fullH: fullH };
  }

  function buildGraph(job) {
    var vertices = arr(job.vertices).filter(function (v) { return v && v.id !== undefined; });
    var edges = arr(job.edges).filter(function (e) { return e && e.source !== undefined && e.target !== undefined; });
    // Boxes as wide as the longest name needs (a source tag and the parallelism beside it),
    // up to 360 px; a longer name is cut with an ellipsis, whole in the box's tooltip.
    var longest = vertices.reduce(function (m, v) { return Math.max(m, String(v.name || v.id).length); }, 0);
    G.boxW = Math.round(Math.min(360, Math.max(190, 110 + longest * 7.4)));
    var L = layout(vertices, edges);
    var backEdges = edges.filter(function (e) { return e.back_edge; });
    // forward edges that skip a column and would cross a box there go over the top, one lane each
    var laneOf = new Map();
    edges.forEach(function (e) {
      var a = L.byId[e.source], b = L.byId[e.target];
      if (!e.back_edge && a && b && b.layer > a.layer + 1 && crossesBox(L, a, b)) { laneOf.set(e, laneOf.size); }
    });
    var shift = laneOf.size * G.laneH;
    Object.keys(L.byId).forEach(function (id) { L.byId[id].y += shift; });
    var laneY = function (i) { return G.pad + 12 + (laneOf.size - 1 - i) * G.laneH; };
    var width = G.pad * 2 + L.cols * G.boxW + (L.cols - 1) * G.gapX;
    var graphBottom = G.pad + 18 + shift + L.fullH;
    var height = graphBottom + G.pad + (backEdges.length ? 14 + backEdges.length * G.backGap : 0);
    if (!vertices.length) { width = 360; height = 60; }

    var svg = s("svg", {
      id: "job-graph", xmlns: SVGNS, width: width, height: height, viewBox: "0 0 " + width + " " + height,
      role: "img", "aria-label": "job graph", "class": "job-graph"
    });
    var defs = s("defs");
    [["arrow-fwd", "edge-arrow"], ["arrow-back", "back-arrow"]].forEach(function (m) {
      var marker = s("marker", {
        id: m[0], viewBox: "0 0 10 10", refX: 9, refY: 5, markerWidth: 7, markerHeight: 7,
        orient: "auto-start-reverse", markerUnits: "strokeWidth"
      });
      marker.appendChild(s("path", { d: "M 0 0 L 10 5 L 0 10 z", "class": m[1] }));
      defs.appendChild(marker);
    });
    svg.appendChild(defs);

    if (!vertices.length) {
      svg.appendChild(s("text", { x: 12, y: 34, "class": "graph-empty" }, "no job graph reported yet"));
      return { svg: svg, boxes: {}, fits: [] };
    }

    var edgeLayer = s("g", { "class": "edges" });
    var labelLayer = s("g", { "class": "edge-labels" });
    var pairCount = {};

    edges.forEach(function (e) {
      var a = L.byId[e.source], b = L.byId[e.target];
      if (!a || !b) { return; }
      var strategy = e.ship_strategy ? String(e.ship_strategy) : "";
      var g = s("g", { "class": e.back_edge ? "edge back" : "edge" });
      var path, lx, ly;
      if (e.back_edge) {
        var bi = backEdges.indexOf(e);
        var d = backEdgePath(a, b, bi, graphBottom);
        path = s("path", { d: d.d, "class": "back-edge", "marker-end": "url(#arrow-back)" });
        lx = d.lx;
        ly = d.ly;
        var label = "back-edge" + (strategy ? " \u00b7 " + strategy : "");
        svgTitle(g, "back-edge " + str(e.source) + " \u2192 " + str(e.target) + (strategy ? " (" + strategy + ")" : ""));
        g.appendChild(path);
        labelLayer.appendChild(s("text", { x: lx, y: ly, "class": "edge-label back-label", "text-anchor": "middle" }, label));
      } else {
        var key = e.source + "\u0000" + e.target;
        var k = pairCount[key] || 0;
        pairCount[key] = k + 1;
        var x1 = a.x + G.boxW, y1 = a.y + G.boxH / 2 + k * 8;
        var x2 = b.x - 2, y2 = b.y + G.boxH / 2 + k * 8;
        var mid = (x1 + x2) / 2;
        var dd;
        var lane = laneOf.has(e) ? laneY(laneOf.get(e)) : null;
        var q = G.gapX / 2;
        if (lane !== null) {
          dd = "M " + x1 + " " + y1 + " C " + (x1 + q) + " " + y1 + ", " + (x1 + q * 0.4) + " " + lane + ", " + (x1 + q) + " " +
            lane + " L " + (x2 - q) + " " + lane + " C " + (x2 - q * 0.4) + " " + lane + ", " + (x2 - q) + " " + y2 + ", " +
            x2 + " " + y2;
          lx = (x1 + x2) / 2; ly = lane - 4;
        } else if (b.layer > a.layer + 1 || x2 <= x1) {
          dd = "M " + x1 + " " + y1 + " C " + (x1 + 60) + " " + y1 + ", " + (x2 - 60) + " " + y2 + ", " + x2 + " " + y2;
          lx = x1 + 40; ly = y1 + (y2 - y1) * 0.1 - 6;
        } else {
          dd = "M " + x1 + " " + y1 + " C " + mid + " " + y1 + ", " + mid + " " + y2 + ", " + x2 + " " + y2;
          lx = mid; ly = (y1 + y2) / 2 - 6;
        }
        path = s("path", { d: dd, "class": "fwd-edge", "marker-end": "url(#arrow-fwd)" });
        svgTitle(g, str(e.source) + " \u2192 " + str(e.target) + (strategy ? " (" + strategy + ")" : ""));
        g.appendChild(path);
        if (strategy) {
          labelLayer.appendChild(s("text", { x: lx, y: ly, "class": "edge-label", "text-anchor": "middle" }, strategy));
        }
      }
      edgeLayer.appendChild(g);
    });
    svg.appendChild(edgeLayer);

    var boxes = {};
    var fits = [];
    var nodeLayer = s("g", { "class": "vertices" });
    Object.keys(L.byId).forEach(function (id) {
      var n = L.byId[id], v = n.v;
      var g = s("g", { "class": "vertex", transform: "translate(" + n.x + "," + n.y + ")", "data-vertex": String(v.id) });
      var ops = arr(v.operators).map(String).join(" \u2192 ");
      svgTitle(g, str(v.name) + "\nid: " + str(v.id) + (ops ? "\noperators: " + ops : "") +
        "\nparallelism: " + str(v.parallelism) + (v.is_source ? "\nsource" : "") +
        (isNum(v.loop) && v.loop >= 0 ? "\nin loop " + v.loop : ""));
      var rect = s("rect", { width: G.boxW, height: G.boxH, rx: 6, ry: 6, "class": "vbox bp-none" });
      g.appendChild(rect);
      var nameX = 10;
      if (v.is_source) {
        g.appendChild(s("rect", { x: 8, y: 8, width: 44, height: 14, rx: 3, "class": "source-tag" }));
        g.appendChild(s("text", { x: 30, y: 18.5, "class": "source-tag-text", "text-anchor": "middle" }, "source"));
        nameX = 58;
      }
      if (isNum(v.loop) && v.loop >= 0) {
        var lxpos = nameX;
        g.appendChild(s("rect", { x: lxpos, y: 8, width: 34, height: 14, rx: 3, "class": "loop-tag" }));
        g.appendChild(s("text", { x: lxpos + 17, y: 18.5, "class": "loop-tag-text", "text-anchor": "middle" }, "loop"));
        nameX = lxpos + 40;
      }
      var par = "\u00d7" + (isNum(v.parallelism) ? fmtInt(v.parallelism) : "?");
      g.appendChild(s("text", { x: G.boxW - 9, y: 19, "class": "vpar", "text-anchor": "end" }, par));
      var fullName = String(v.name !== undefined && v.name !== null ? v.name : v.id);
      var nameEl = s("text", { x: nameX, y: 19, "class": "vname" }, fullName);
      g.appendChild(nameEl);
      fits.push({ el: nameEl, text: fullName, width: G.boxW - nameX - 14 - par.length * 7.5 });
      var rates = s("text", { x: 10, y: 40, "class": "vstat" }, "");
      var bp = s("text", { x: 10, y: 58, "class": "vstat" }, "");
      g.appendChild(rates);
      g.appendChild(bp);
      nodeLayer.appendChild(g);
      boxes[v.id] = { rect: rect, rates: rates, bp: bp };
    });
    svg.appendChild(nodeLayer);
    svg.appendChild(labelLayer);
    return { svg: svg, boxes: boxes, fits: fits };
  }

  function renderGraph() {
    var job = obj(model.job);
    var key = graphKey(job);
    var wrap = $("graph-wrap");
    if (key !== graphCache.key || !graphCache.svg || !wrap.contains(graphCache.svg)) {
      var built = buildGraph(job);
      clear(wrap);
      wrap.appendChild(built.svg);
      graphCache = { key: key, svg: built.svg, boxes: built.boxes };
      built.fits.forEach(function (f) { fitText(f.el, f.text, f.width); });
      fitGraph();
    }
    var stats = vertexStats(job);
    Object.keys(graphCache.boxes).forEach(function (id) {
      var b = graphCache.boxes[id], st = stats[id];
      if (st) {
        b.rates.textContent = "in " + fmtRate(st.inRate) + "/s \u00b7 out " + fmtRate(st.outRate) + "/s";
        b.bp.textContent = "backpressure " + (st.bp === null ? DASH : fmtPct(st.bp)) + " max";
        b.rect.setAttribute("class", "vbox " + bpClass(st.bp));
      } else {
        b.rates.textContent = "in " + DASH + " \u00b7 out " + DASH;
        b.bp.textContent = "no tasks reported";
        b.rect.setAttribute("class", "vbox bp-none");
      }
    });
  }

  /** Shrinks a graph wider than its section (down to 70 %; past that, it scrolls). */
  function fitGraph() {
    var svg = graphCache.svg, wrap = $("graph-wrap");
    if (!svg) { return; }
    var vb = (svg.getAttribute("viewBox") || "").split(" ").map(Number);
    if (vb.length !== 4 || !(vb[2] > 0)) { return; }
    var avail = wrap.clientWidth;
    var scale = avail > 0 ? Math.min(1, Math.max(0.7, avail / vb[2])) : 1;
    svg.setAttribute("width", String(Math.floor(vb[2] * scale)));
    svg.setAttribute("height", String(Math.floor(vb[3] * scale)));
  }

  function renderGraphLegend() {
    var lg = $("graph-legend");
    if (lg.firstChild) { return; }
    function item(sample, text) {
      var span = h("span", { "class": "legend-item" });
      span.appendChild(sample);
      span.appendChild(document.createTextNode(text));
      lg.appendChild(span);
    }
    function line(cls) {
      var sv = s("svg", { width: 34, height: 12, "class": "legend-svg" });
      sv.appendChild(s("line", { x1: 2, y1: 6, x2: 32, y2: 6, "class": cls }));
      return sv;
    }
    item(line("fwd-edge"), "edge (label: ship strategy)");
    item(line("back-edge-sample"), "back-edge (feedback into a loop)");
    item(h("span", { "class": "swatch box bp-low" }), "backpressure < 10 %");
    item(h("span", { "class": "swatch box bp-mid" }), "< 50 %");
    item(h("span", { "class": "swatch box bp-high" }), "\u2265 50 %");
    item(h("span", { "class": "swatch box bp-none" }), "not reported");
    item(h("span", { "class": "source-sample" }, "source"), "reads external input");
    item(h("span", { "class": "loop-sample" }, "loop"), "inside an iteration (a cycle closed by a back-edge)");
    item(h("span", { "class": "legend-text" }, "\u00d7N"), "parallelism; rates summed over the vertex's tasks");
  }

  // ---------------------------------------------------------------------------------
  // charts (uPlot)

  function uplotReady() { return typeof window.uPlot === "function"; }

  function chartWidth(el) {
    var w = el.clientWidth || (el.parentNode && el.parentNode.clientWidth) || 600;
    return Math.max(280, Math.floor(w));
  }

  function placeholder(el, text) {
    var ph = el.querySelector(".chart-empty");
    if (!ph) { ph = h("div", { "class": "chart-empty" }); el.appendChild(ph); }
    ph.textContent = text;
    ph.hidden = false;
  }

  function hidePlaceholder(el) {
    var ph = el.querySelector(".chart-empty");
    if (ph) { ph.hidden = true; }
  }

  /** A drag zooms (and the zoom survives the next data); a double click returns to all data. */
  function zoomHooks(name) {
    return {
      setSelect: [function (u) { if (u.select && u.select.width > 0) { zoomed[name] = true; } }],
      ready: [function (u) {
        u.over.addEventListener("dblclick", function () { zoomed[name] = false; });
      }]
    };
  }

  function destroyChart(name) {
    zoomed[name] = false;
    if (charts[name]) {
      try { charts[name].destroy(); } catch (e) { /* already gone */ }
      charts[name] = null;
      chartKeys[name] = "";
    }
  }

  function axisStyle() {
    return { stroke: "#555", grid: { stroke: "#eceff3", width: 1 }, ticks: { stroke: "#d8dde3", width: 1 } };
  }

  function withAxis(extra) {
    var a = axisStyle();
    Object.keys(extra).forEach(function (k) { a[k] = extra[k]; });
    return a;
  }

  function renderTaskCharts() {
    var job = obj(model.job);
    var tp = obj(job.throughput);
    var times = arr(tp.time).filter(isNum);
    var tasks = taskIds(job);
    var colours = taskColours(job, tasks);
    var xs = arr(tp.time).map(function (t) { return isNum(t) ? t / 1000 : null; });
    var ok = xs.length > 0 && times.length === xs.length && tasks.length > 0;
    drawTaskChart("out", $("chart-out"), ok, xs, tasks, colours, obj(tp.records_out_per_second), 1,
      "records/s", function (v) { return fmtRate(v); });
    drawTaskChart("bp", $("chart-bp"), ok, xs, tasks, colours, obj(tp.backpressure), 100,
      "%", function (v) { return isNum(v) ? (v < 10 && v > 0 ? oneFmt.format(v) : intFmt.format(v)) + " %" : DASH; });
    var lag = watermarkLag(job, obj(tp.watermark), xs.length);
    if (ok && !lag.any) {
      destroyChart("wm");
      placeholder($("chart-wm"), "no watermarks: the job has no event time, or none has reached a task yet");
    } else {
      drawTaskChart("wm", $("chart-wm"), ok, xs, tasks, colours, lag.series, 1, "",
        function (v) { return isNum(v) ? fmtNum(v) : DASH; });
    }
  }

  // Per sample, how far each operator task's watermark is behind the sources' (the lowest
  // source task's: the event time every source has passed), in the job's own event-time
  // units; null where a task had none. Sources are the reference: no line of their own.
  function watermarkLag(job, wm, n) {
    var sources = {};
    arr(job.vertices).forEach(function (v) { if (v && v.is_source) { sources[v.id] = true; } });
    var vertexOf = {};
    arr(job.tasks).forEach(function (t) { if (t) { vertexOf[t.id] = t.vertex; } });
    var lowest = [];
    for (var i = 0; i < n; i++) {
      var low = null;
      Object.keys(wm).forEach(function (id) {
        var v = arr(wm[id])[i];
        if (sources[vertexOf[id]] && isNum(v) && (low === null || v < low)) { low = v; }
      });
      lowest.push(low);
    }
    var series = {}, any = false;
    Object.keys(wm).forEach(function (id) {
      if (sources[vertexOf[id]]) { return; }
      series[id] = arr(wm[id]).map(function (v, i) {
        if (!isNum(v) || lowest[i] === null) { return null; }
        any = true;
        return Math.max(0, lowest[i] - v);
      });
    });
    return { series: series, any: any };
  }

  function drawTaskChart(name, el, ok, xs, tasks, colours, series, factor, unit, fmt) {
    if (!uplotReady()) { placeholder(el, "charts unavailable (uPlot did not load)"); return; }
    if (!ok) {
      destroyChart(name);
      placeholder(el, xs.length ? "no tasks reported yet" : "no throughput samples yet");
      return;
    }
    hidePlaceholder(el);
    var data = [xs];
    tasks.forEach(function (t) {
      var ys = arr(series[t.id]);
      data.push(xs.map(function (_, i) {
        var v = ys[i];
        return isNum(v) ? v * factor : null;
      }));
    });
    var key = tasks.map(function (t) { return t.id + "=" + colours[t.id]; }).join("|");
    if (charts[name] && chartKeys[name] === key) {
      charts[name].setData(data, !zoomed[name]);
      return;
    }
    destroyChart(name);
    var opts = {
      hooks: zoomHooks(name),
      width: chartWidth(el),
      height: 210,
      cursor: { sync: { key: "abs-tasks" }, drag: { x: true, y: false } },
      legend: { live: true },
      scales: name === "bp" ? { x: { time: true }, y: { auto: false, range: [0, 100] } } : { x: { time: true } },
      axes: [
        withAxis({ space: 70, values: function (u, vals) {
          return vals.map(function (v) { return isNum(v) ? fmtClock(v * 1000).slice(0, 8) : ""; });
        } }),
        withAxis({ size: 64, values: function (u, vals) { return vals.map(function (v) { return fmtAxis(v, unit); }); } })
      ],
      series: [{ value: function (u, v) { return v === null ? DASH : fmtClock(v * 1000); } }].concat(tasks.map(function (t) {
        return {
          label: t.id, stroke: colours[t.id], width: 1.5, spanGaps: false, points: { show: false },
          value: function (u, v) { return fmt(v); }
        };
      }))
    };
    charts[name] = new window.uPlot(opts, data, el);
    chartKeys[name] = key;
  }

  function fmtAxis(v, unit) {
    if (!isNum(v)) { return ""; }
    if (unit === "%") { return intFmt.format(v) + " %"; }
    if (unit === "bytes") { return fmtBytes(v); }
    if (unit === "ms") { return intFmt.format(v) + " ms"; }
    var a = Math.abs(v);
    if (a >= 1e6) { return (v / 1e6).toFixed(a >= 1e7 ? 0 : 1) + " M"; }
    if (a >= 1e4) { return (v / 1e3).toFixed(0) + " k"; }
    return a < 10 && !Number.isInteger(v) ? v.toFixed(1) : intFmt.format(v);
  }

  function renderCheckpointChart() {
    var el = $("chart-cp");
    if (!uplotReady()) { placeholder(el, "charts unavailable (uPlot did not load)"); return; }
    var seen = {};
    var done = historyEntries().filter(function (e) {
      if (e.status !== "COMPLETED" || seen[e.id]) { return false; }
      seen[e.id] = true;
      return true;
    }).reverse();
    if (!done.length) {
      destroyChart("cp");
      placeholder(el, "no completed checkpoints yet");
      return;
    }
    hidePlaceholder(el);
    var data = [
      done.map(function (e) { return e.id; }),
      done.map(function (e) { return isNum(e.end_to_end_duration) ? e.end_to_end_duration : null; }),
      done.map(function (e) { return isNum(e.state_size) ? e.state_size : null; })
    ];
    var few = done.length < 40;
    if (charts.cp) {
      if (chartKeys.cp === String(few)) { charts.cp.setData(data, !zoomed.cp); return; }
      destroyChart("cp");
    }
    var opts = {
      hooks: zoomHooks("cp"),
      width: chartWidth(el),
      height: 210,
      cursor: { drag: { x: true, y: false } },
      scales: { x: { time: false }, ms: { auto: true, range: function (u, lo, hi) { return [0, hi > 0 ? hi * 1.1 : 1]; } },
        bytes: { auto: true, range: function (u, lo, hi) { return [0, hi > 0 ? hi * 1.1 : 1]; } } },
      axes: [
        withAxis({ label: "checkpoint id", labelSize: 18, values: function (u, vals) {
          return vals.map(function (v) { return Number.isInteger(v) ? intFmt.format(v) : ""; });
        } }),
        withAxis({ scale: "ms", size: 70, values: function (u, vals) { return vals.map(function (v) { return fmtAxis(v, "ms"); }); } }),
        withAxis({ scale: "bytes", side: 1, size: 74, grid: { show: false },
          values: function (u, vals) { return vals.map(function (v) { return fmtAxis(v, "bytes"); }); } })
      ],
      series: [
        { label: "checkpoint", value: function (u, v) { return v === null ? DASH : "#" + intFmt.format(v); } },
        { label: "end to end", scale: "ms", stroke: "#2563eb", width: 1.75, points: { show: few, size: 5 },
          value: function (u, v) { return fmtMs(v); } },
        { label: "state size", scale: "bytes", stroke: "#16a34a", width: 1.5, dash: [6, 3], points: { show: few, size: 5 },
          value: function (u, v) { return fmtBytes(v); } }
      ]
    };
    charts.cp = new window.uPlot(opts, data, el);
    chartKeys.cp = String(few);
  }

  function resizeCharts() {
    [["out", "chart-out"], ["bp", "chart-bp"], ["wm", "chart-wm"], ["cp", "chart-cp"]].forEach(function (p) {
      var c = charts[p[0]];
      if (c) {
        var el = $(p[1]);
        var w = chartWidth(el);
        if (Math.abs(w - c.width) > 2) { c.setSize({ width: w, height: c.height }); }
      }
    });
  }

  // ---------------------------------------------------------------------------------
  // tables

  function renderTaskTable() {
    var job = obj(model.job);
    var table = $("task-table");
    var tbody = table.tBodies[0];
    var tasks = arr(job.tasks).filter(function (t) { return t && t.id !== undefined; });
    var order = vertexOrder(job);
    tasks = tasks.slice().sort(function (a, b) {
      var va = order[a.vertex], vb = order[b.vertex];
      va = va === undefined ? 1e9 : va;
      vb = vb === undefined ? 1e9 : vb;
      return (va - vb) || ((isNum(a.subtask) ? a.subtask : 0) - (isNum(b.subtask) ? b.subtask : 0)) ||
        (String(a.id) < String(b.id) ? -1 : 1);
    });
    var frag = document.createDocumentFragment();
    tasks.forEach(function (t) {
      var tr = h("tr");
      tr.appendChild(td(str(t.id), "mono"));
      tr.appendChild(td(str(t.vertex)));  // (the subtask is the id's #N)
      tr.appendChild(td(str(t.status), "task-status " + statusClass(t.status)));
      tr.appendChild(td(t.pid === null || t.pid === undefined ? DASH : String(t.pid), "num"));
      tr.appendChild(td(fmtInt(t.records_in), "num"));
      tr.appendChild(td(fmtInt(t.records_out), "num"));
      tr.appendChild(td(fmtRate(t.records_in_per_second), "num task-in-rate"));
      tr.appendChild(td(fmtRate(t.records_out_per_second), "num"));
      var bp = td(fmtPct(t.backpressure), "num bp-cell " + bpClass(t.backpressure));
      tr.appendChild(bp);
      // Health (runtime/task_health.py): absent (null) while not known, shown as a dash.
      tr.appendChild(td(isNum(t.watermark) ? fmtNum(t.watermark) : DASH, "num task-watermark"));
      tr.appendChild(td(fmtInt(t.late_records), "num task-late", byOperator(t.late_by_operator, "late")));
      tr.appendChild(td(fmtInt(t.skipped_records), "num task-skipped", byOperator(t.skipped_by_operator, "skipped")));
      tr.appendChild(td(fmtInt(t.keys), "num task-keys"));
      tr.appendChild(td(fmtInt(t.timers), "num task-timers"));
      tr.appendChild(td(isNum(t.cpu_seconds) ? oneFmt.format(t.cpu_seconds) + " s" : DASH, "num task-cpu"));
      tr.appendChild(td(isNum(t.rss_bytes) ? fmtBytes(t.rss_bytes) : DASH, "num task-rss"));
      // A source's progress (operators/progress.py): what is left; its offset in the tooltip.
      var p = t.progress && typeof t.progress === "object" ? t.progress : null;
      tr.appendChild(td(p ? (isNum(p.left) ? fmtCompact(p.left) + " " + str(p.unit) : "unbounded") : DASH,
        "num task-left", p ? (isNum(p.left) ? fmtInt(p.left) + " " + str(p.unit) + " left, " : "") + "at " +
          str(p.position) + (isNum(p.total) ? " (the whole input: " + fmtInt(p.total) + " " + str(p.unit) + ")" : "") : ""));
      frag.appendChild(tr);
    });
    clear(tbody);
    tbody.appendChild(frag);
    emptyNote(table, tasks.length === 0, "No tasks have reported yet.");
  }

  function renderCounts() {
    var cps = obj(model.cps);
    var c = obj(cps.counts);
    setText("completed-count", isNum(c.completed) ? fmtInt(c.completed) : "0");
    // An aborted checkpoint (subsumed, a failover, the job's end) is not a failure: its own
    // count, as its rows say ABORTED (older statistics have only "failed": all of them).
    setText("failed-count", isNum(c.expired) ? fmtInt(c.expired) : (isNum(c.failed) ? fmtInt(c.failed) : "0"));
    setText("aborted-count", isNum(c.aborted) ? fmtInt(c.aborted) : "0");
    setText("in-progress-count", isNum(c.in_progress) ? fmtInt(c.in_progress) : "0");
    setText("restored-count", isNum(c.restored) ? fmtInt(c.restored) : "0");
    setText("total-count", isNum(c.total) ? fmtInt(c.total) : "0");

    var latest = obj(cps.latest);
    var box = $("checkpoint-latest");
    clear(box);
    function line(label, text) {
      var p = h("div", { "class": "latest-line" });
      p.appendChild(h("span", { "class": "latest-label" }, label));
      p.appendChild(document.createTextNode(text));
      box.appendChild(p);
    }
    var lc = latest.completed;
    line("latest completed", lc && isNum(lc.id) ? "#" + fmtInt(lc.id) + " at " + fmtClock(lc.trigger_timestamp) +
      ", " + fmtMs(lc.end_to_end_duration) + ", " + fmtBytes(lc.state_size) : DASH);
    var lf = latest.failed;
    line("latest failed", lf && isNum(lf.id) ? "#" + fmtInt(lf.id) + " (" + str(lf.status) + ") at " +
      fmtClock(lf.failure_timestamp || lf.trigger_timestamp) : DASH);
    var ls = latest.savepoint;
    if (ls && isNum(ls.id)) { line("latest savepoint", "#" + fmtInt(ls.id) + " at " + fmtClock(ls.trigger_timestamp)); }
    var lr = latest.restored;
    line("latest restore", lr && isNum(lr.id) ? "#" + fmtInt(lr.id) + (lr.is_savepoint ? " (savepoint)" : "") + " at " +
      fmtClock(lr.restore_timestamp) : DASH);

    var sum = obj(cps.summary);
    var tbody = $("summary-table").tBodies[0];
    clear(tbody);
    [["end to end", "end_to_end_duration", fmtMs], ["state size", "state_size", fmtBytes],
      ["checkpointed size", "checkpointed_size", fmtBytes], ["persisted in-flight", "persisted_data", fmtBytes]]
      .forEach(function (row) {
        var m = sum[row[1]];
        var tr = h("tr");
        tr.appendChild(h("th", { scope: "row" }, row[0]));
        ["min", "avg", "p50", "p99", "max"].forEach(function (k) {
          tr.appendChild(td(m && typeof m === "object" ? row[2](m[k]) : DASH, "num"));
        });
        tbody.appendChild(tr);
      });
  }

  function renderCheckpointTable() {
    var table = $("checkpoint-table");
    var tbody = table.tBodies[0];
    var all = historyEntries();
    var rows = all.slice(0, HISTORY_ROWS);
    var frag = document.createDocumentFragment();
    rows.forEach(function (e) {
      var sel = e.id === model.selected && (model.selectedAttempt === null || attemptOf(e) === model.selectedAttempt);
      var tr = h("tr", {
        "data-id": e.id, "data-attempt": attemptOf(e), tabindex: 0, "class": sel ? "selected" : null, "aria-selected": sel ? "true" : "false",
        title: "show the details of checkpoint " + e.id
      });
      tr.appendChild(td(fmtInt(e.id), "num"));
      var st = h("td");
      st.appendChild(h("span", { "class": "status " + statusClass(e.status) }, str(e.status)));
      tr.appendChild(st);
      tr.appendChild(td(typeLabel(e.checkpoint_type), null, e.checkpoint_type ? String(e.checkpoint_type) : null));
      tr.appendChild(td(fmtClock(e.trigger_timestamp), "mono"));
      tr.appendChild(td(fmtMs(e.end_to_end_duration), "num"));
      tr.appendChild(td(fmtBytes(e.state_size), "num"));
      tr.appendChild(td(fmtBytes(e.checkpointed_size), "num"));
      tr.appendChild(td(fmtBytes(e.persisted_data), "num"));
      tr.appendChild(td(fmtInt(e.num_acknowledged_subtasks) + "/" + fmtInt(e.num_subtasks), "num"));
      var msg = e.failure_message ? String(e.failure_message) : null;
      tr.appendChild(td(msg === null ? DASH : msg, "failure", msg));
      frag.appendChild(tr);
    });
    clear(tbody);
    tbody.appendChild(frag);
    emptyNote(table, rows.length === 0, "No checkpoints yet.");
    setText("history-hint", all.length > HISTORY_ROWS ?
      "(newest " + HISTORY_ROWS + " of " + fmtInt(all.length) + " listed; click a row for its details)" :
      "(newest first; click a row for its details)");
  }

  function renderRecoveries() {
    var job = obj(model.job);
    var table = $("recovery-table");
    var tbody = table.tBodies[0];
    var recs = arr(job.recoveries).filter(function (r) { return r && typeof r === "object"; });
    var newestFirst = recs.slice().reverse();
    var restarting = job.state === "RESTARTING";
    var frag = document.createDocumentFragment();
    newestFirst.forEach(function (r, i) {
      var tr = h("tr");
      tr.appendChild(td(fmtClock(r.time), "mono", fmtDateTime(r.time)));
      tr.appendChild(td(fmtInt(r.attempt), "num"));
      tr.appendChild(td(str(r.failed_task), "mono"));
      tr.appendChild(td(str(r.reason), "reason"));
      var from;
      if (isNum(r.restored_from)) {
        from = "checkpoint #" + fmtInt(r.restored_from);
      } else if (i === 0 && restarting && r.running_after_ms === null) {
        from = DASH;
      } else {
        from = "none: started empty";
      }
      tr.appendChild(td(from));
      var after = isNum(r.running_after_ms) ? fmtMs(r.running_after_ms) :
        (i === 0 && restarting ? "not running yet" : DASH);
      tr.appendChild(td(after, "num"));
      frag.appendChild(tr);
    });
    clear(tbody);
    tbody.appendChild(frag);
    emptyNote(table, recs.length === 0, "No restarts: the job has not failed over.");
  }

  // ---------------------------------------------------------------------------------
  // checkpoint detail

  var SEGMENTS = [
    { key: "delay", label: "start delay", title: "trigger to the first barrier" },
    { key: "align", label: "alignment", title: "first barrier to the last" },
    { key: "sync", label: "sync", title: "snapshot on the task thread" },
    { key: "async", label: "async", title: "encoding and writing, to the acknowledgement" },
    { key: "other", label: "other", title: "the rest of the time until the acknowledgement" }
  ];

  function niceStep(max, n) {
    if (!(max > 0)) { return 1; }
    var raw = max / n;
    var mag = Math.pow(10, Math.floor(Math.log10(raw)));
    var r = raw / mag;
    var step = r <= 1 ? 1 : r <= 2 ? 2 : r <= 2.5 ? 2.5 : r <= 5 ? 5 : 10;
    return step * mag;
  }

  function subtaskSegments(st) {
    var e2e = st.end_to_end_duration;
    var parts = [
      ["delay", st.start_delay],
      ["align", obj(st.alignment).duration],
      ["sync", obj(st.checkpoint).sync],
      ["async", obj(st.checkpoint).async]
    ];
    var out = [], at = 0;
    parts.forEach(function (p) {
      var ms = isNum(p[1]) && p[1] > 0 ? p[1] : 0;
      if (isNum(e2e) && at + ms > e2e) { ms = Math.max(0, e2e - at); }
      if (ms > 0) { out.push({ key: p[0], start: at, ms: ms, raw: p[1] }); }
      at += ms;
    });
    if (isNum(e2e) && e2e - at > Math.max(0.5, e2e * 0.01)) {
      out.push({ key: "other", start: at, ms: e2e - at, raw: e2e - at });
    }
    return out;
  }

  function selectedDoc() {
    var id = model.selected;
    if (id === null) { return null; }
    if (model.liveDetail && model.liveDetail.id === id) { return model.liveDetail; }
    return model.details[String(id)] || null;
  }

  function renderDetail() {
    var id = model.selected;
    var head = $("detail-head");
    var msg = $("detail-message");
    var tl = $("timeline");
    var tbody = $("subtask-table").tBodies[0];
    $("follow-latest").hidden = !model.userSelected;
    clear(head);
    clear(tl);
    clear(tbody);
    msg.hidden = true;
    $("subtask-table").parentNode.hidden = true;
    renderTimelineLegend(false);
    emptyNote($("subtask-table"), false, "");

    if (id === null) {
      head.appendChild(h("span", { "class": "muted" }, "No checkpoint to show yet."));
      return;
    }
    var doc = selectedDoc();
    var entry = findEntry(id, model.selectedAttempt) || doc;
    var otherAttempt = doc && model.selectedAttempt !== null && isNum(doc.attempt) && doc.attempt !== model.selectedAttempt;
    if (entry) {
      head.appendChild(h("span", { "class": "detail-id" }, "Checkpoint #" + fmtInt(entry.id)));
      head.appendChild(h("span", { "class": "status " + statusClass(entry.status) }, str(entry.status)));
      var facts = [
        typeLabel(entry.checkpoint_type),
        "triggered " + fmtClock(entry.trigger_timestamp),
        "end to end " + fmtMs(entry.end_to_end_duration),
        "state " + fmtBytes(entry.state_size),
        "acknowledged " + fmtInt(entry.num_acknowledged_subtasks) + "/" + fmtInt(entry.num_subtasks),
        "attempt " + fmtInt(entry.attempt)
      ];
      if (isNum(entry.unaligned_subtasks) && entry.unaligned_subtasks > 0) {
        facts.push(fmtInt(entry.unaligned_subtasks) + " unaligned");
      }
      head.appendChild(h("span", { "class": "detail-facts" }, facts.join(" \u00b7 ")));
      if (entry.failure_message) {
        head.appendChild(h("div", { "class": "detail-failure" }, "failure: " + String(entry.failure_message)));
      }
    } else {
      head.appendChild(h("span", { "class": "detail-id" }, "Checkpoint #" + fmtInt(id)));
    }

    var err = model.detailErrors[String(id)];
    if (otherAttempt) {
      msg.textContent = "No subtask details for this checkpoint #" + fmtInt(id) + " of attempt " +
        fmtInt(model.selectedAttempt) + ": after the restart, attempt " + fmtInt(doc.attempt) +
        " took checkpoint id " + fmtInt(id) + " again, and details are kept for the newest of the two only.";
      msg.className = "message";
      msg.hidden = false;
      return;
    }
    if (!doc) {
      msg.textContent = err ? err : (REPORT ? "The report holds no subtask details for checkpoint " + fmtInt(id) +
        " (they are kept for the most recent checkpoints only)." : "Loading\u2026");
      msg.className = err ? "message message-error" : "message";
      msg.hidden = false;
      return;
    }
    var order = vertexOrder(obj(model.job));
    var subs = arr(doc.subtasks).filter(function (x) { return x && typeof x === "object"; })
      .map(function (x, i) { return { st: x, i: i }; })
      .sort(function (a, b) {
        var va = order[a.st.vertex], vb = order[b.st.vertex];
        va = va === undefined ? 1e9 : va;
        vb = vb === undefined ? 1e9 : vb;
        return (va - vb) || a.i - b.i;
      })
      .map(function (x) { return x.st; });
    if (!subs.length) {
      msg.textContent = "No subtask details for checkpoint " + fmtInt(id) +
        " (they are kept for the most recent checkpoints only, and a checkpoint that ended before any acknowledgement has none).";
      msg.className = "message";
      msg.hidden = false;
      return;
    }
    renderTimeline(tl, doc, subs);
    renderTimelineLegend(true);
    $("subtask-table").parentNode.hidden = false;
    subs.forEach(function (st) {
      var acked = st.status !== "PENDING";
      function v(x, f) { return acked ? f(x) : DASH; }
      var tr = h("tr", { "class": acked ? null : "pending-row" });
      tr.appendChild(td(str(st.task), "mono"));
      tr.appendChild(td(fmtInt(st.index), "num"));
      tr.appendChild(td(str(st.status), "task-status " + statusClass(st.status)));
      tr.appendChild(td(fmtClock(st.ack_timestamp), "mono"));
      tr.appendChild(td(fmtMs(st.end_to_end_duration), "num"));
      tr.appendChild(td(v(st.start_delay, fmtMs), "num"));
      tr.appendChild(td(v(obj(st.alignment).duration, fmtMs), "num"));
      tr.appendChild(td(v(obj(st.checkpoint).sync, fmtMs), "num"));
      tr.appendChild(td(v(obj(st.checkpoint).async, fmtMs), "num"));
      tr.appendChild(td(v(st.state_size, fmtBytes), "num"));
      tr.appendChild(td(v(st.persisted_data, fmtBytes), "num"));
      tr.appendChild(td(!acked ? DASH : st.unaligned_checkpoint === true ? "yes" :
        st.unaligned_checkpoint === false ? "no" : DASH));
      tbody.appendChild(tr);
    });
  }

  function renderTimeline(tl, doc, subs) {
    var max = 0;
    subs.forEach(function (st) {
      if (isNum(st.end_to_end_duration)) { max = Math.max(max, st.end_to_end_duration); }
      var sum = subtaskSegments(st).reduce(function (a, g) { return Math.max(a, g.start + g.ms); }, 0);
      max = Math.max(max, sum);
    });
    var pendingUntil = doc.status === "IN_PROGRESS" && isNum(doc.end_to_end_duration) ? doc.end_to_end_duration : null;
    if (pendingUntil !== null) { max = Math.max(max, pendingUntil); }
    if (!(max > 0)) { max = 1; }
    var step = niceStep(max, 6);
    var axisMax = Math.ceil(max / step - 1e-9) * step;
    if (axisMax <= 0) { axisMax = step; }
    function pct(ms) { return Math.max(0, Math.min(100, ms / axisMax * 100)); }

    var axis = h("div", { "class": "timeline-axis" });
    axis.appendChild(h("div", { "class": "timeline-label axis-caption" }, "ms since the trigger"));
    var ticks = h("div", { "class": "timeline-track axis-track" });
    var nTicks = Math.round(axisMax / step);
    for (var ti = 0; ti <= nTicks; ti += 1) {
      var t = Math.round(ti * step * 1000) / 1000;
      var tick = h("span", { "class": "tick" }, fmtAxis(t, "ms-short"));
      tick.style.left = pct(t) + "%";
      if (ti === 0) { tick.classList.add("tick-first"); }
      if (ti === nTicks) { tick.classList.add("tick-last"); }
      ticks.appendChild(tick);
    }
    axis.appendChild(ticks);
    tl.appendChild(axis);

    subs.forEach(function (st) {
      var row = h("div", { "class": "timeline-row", "data-task": str(st.task) });
      var label = h("div", { "class": "timeline-label mono", title: str(st.task) + " (" + str(st.vertex) + ", subtask " +
        str(st.index) + ")" }, str(st.task));
      row.appendChild(label);
      var track = h("div", { "class": "timeline-track" });
      for (var gi = 1; gi < nTicks; gi += 1) {
        var gl = h("span", { "class": "gridline" });
        gl.style.left = pct(gi * step) + "%";
        track.appendChild(gl);
      }
      var segs = subtaskSegments(st);
      if (st.status === "PENDING" || !isNum(st.end_to_end_duration)) {
        var live = doc.status === "IN_PROGRESS";
        var pend = h("div", { "class": "seg seg-pending", title: live ? "pending: no acknowledgement yet" +
          (pendingUntil !== null ? " (" + fmtMs(pendingUntil) + " since the trigger)" : "") :
          "never acknowledged: the checkpoint " + (doc.status === "FAILED" ? "failed" : "ended") + " first" });
        pend.style.left = "0%";
        pend.style.width = pct(pendingUntil !== null ? pendingUntil : axisMax) + "%";
        track.appendChild(pend);
        row.appendChild(track);
        row.appendChild(h("div", { "class": "timeline-total muted" }, live ? "pending" : "no ack"));
        tl.appendChild(row);
        return;
      }
      segs.forEach(function (sg) {
        var meta = SEGMENTS.filter(function (m) { return m.key === sg.key; })[0];
        var div = h("div", {
          "class": "seg seg-" + sg.key,
          title: meta.label + ": " + fmtMs(sg.ms) + " (" + fmtMs(sg.start) + " \u2192 " + fmtMs(sg.start + sg.ms) + "; " +
            meta.title + ")"
        });
        div.style.left = pct(sg.start) + "%";
        div.style.width = pct(sg.ms) + "%";
        track.appendChild(div);
      });
      var ack = h("span", { "class": "ack-mark", title: "acknowledged at " + fmtMs(st.end_to_end_duration) +
        (isNum(st.ack_timestamp) ? " (" + fmtClock(st.ack_timestamp) + ")" : "") });
      ack.style.left = pct(st.end_to_end_duration) + "%";
      track.appendChild(ack);
      row.appendChild(track);
      row.appendChild(h("div", { "class": "timeline-total" }, fmtMs(st.end_to_end_duration)));
      tl.appendChild(row);
    });
  }

  function renderTimelineLegend(show) {
    var lg = $("timeline-legend");
    if (!lg.firstChild) {
      SEGMENTS.forEach(function (m) {
        var span = h("span", { "class": "legend-item", title: m.title });
        span.appendChild(h("span", { "class": "swatch seg-" + m.key }));
        span.appendChild(document.createTextNode(m.label));
        lg.appendChild(span);
      });
      var p = h("span", { "class": "legend-item" });
      p.appendChild(h("span", { "class": "swatch seg-pending" }));
      p.appendChild(document.createTextNode("pending"));
      lg.appendChild(p);
      var a = h("span", { "class": "legend-item" });
      a.appendChild(h("span", { "class": "swatch ack-sample" }));
      a.appendChild(document.createTextNode("acknowledgement (bar end = end-to-end duration)"));
      lg.appendChild(a);
    }
    lg.hidden = !show;
  }

  // ---------------------------------------------------------------------------------
  // selection

  function updateSelection() {
    if (model.userSelected && model.selected !== null) { return; }
    model.userSelected = false;
    var e = defaultSelection();
    model.selected = e ? e.id : null;
    model.selectedAttempt = attemptOf(e);
  }

  function rowKey(tr) {
    var id = Number(tr.getAttribute("data-id"));
    var a = tr.getAttribute("data-attempt");
    return { id: id, attempt: a === null || a === "" ? null : Number(a) };
  }

  function select(id, attempt) {
    if (!isNum(id)) { return; }
    model.selected = id;
    model.selectedAttempt = isNum(attempt) ? attempt : null;
    model.userSelected = true;
    if (!REPORT && model.liveDetail && model.liveDetail.id !== id) { model.liveDetail = null; }
    renderAll();
    if (!REPORT) { fetchDetail(true); }
  }

  function onTableClick(ev) {
    var tr = ev.target && ev.target.closest ? ev.target.closest("tr[data-id]") : null;
    if (!tr) { return; }
    var k = rowKey(tr);
    select(k.id, k.attempt);
  }

  function onTableKey(ev) {
    if (ev.key !== "Enter" && ev.key !== " ") { return; }
    var tr = ev.target && ev.target.closest ? ev.target.closest("tr[data-id]") : null;
    if (!tr) { return; }
    ev.preventDefault();
    var k = rowKey(tr);
    if (isNum(k.id)) {
      select(k.id, k.attempt);
      var again = $("checkpoint-table").querySelector("tr.selected");
      if (again) { again.focus(); }
    }
  }

  // ---------------------------------------------------------------------------------
  // drawing everything

  // ---------------------------------------------------------------------------------
  // pipelines: a tab each when there are several (executors/pipelined.py)

  function pipelineQuery() {
    return model.pipeline === null ? "" : "?pipeline=" + encodeURIComponent(model.pipeline);
  }

  var pipelineTabsKey = "";

  function renderPipelines() {
    var list = arr(model.pipelines).filter(function (p) { return p && typeof p.name === "string"; });
    $("pipelines").hidden = list.length < 2;
    var tabs = $("pipeline-tabs");
    // The buttons are made when the pipelines change and updated in place after: made anew
    // every poll, they would take the keyboard focus (or a click in progress) away each second.
    var key = JSON.stringify(list.map(function (p) { return p.name; }));
    if (key !== pipelineTabsKey) {
      pipelineTabsKey = key;
      clear(tabs);
      list.forEach(function (p) {
        var b = h("button", { type: "button", "class": "pipeline-tab", "data-pipeline": p.name });
        b.appendChild(h("span", { "class": "pipeline-name" }, p.name));
        b.appendChild(h("span", { "class": "badge" }, ""));
        b.appendChild(h("span", { "class": "pipeline-restarts" }, ""));
        b.addEventListener("click", function () { selectPipeline(p.name); });
        tabs.appendChild(b);
      });
    }
    list.forEach(function (p, i) {
      var b = tabs.children[i], c = obj(p.checkpoints);
      var current = model.pipeline === null ? i === 0 : p.name === model.pipeline;
      b.className = "pipeline-tab" + (current ? " active" : "");
      b.setAttribute("aria-pressed", current ? "true" : "false");
      b.title = arr(p.vertices).join(", ") + ": attempt " + str(p.attempt) + ", " + fmtInt(c.completed) +
        " checkpoints completed (latest " + str(c.latest_completed) + ")";
      b.children[1].className = "badge " + stateClass(p.state);
      b.children[1].textContent = str(p.state);
      b.children[2].textContent = fmtInt(p.restarts) + (p.restarts === 1 ? " restart" : " restarts");
    });
  }

  function selectPipeline(name) {
    if (name === model.pipeline) { return; }
    model.pipeline = name;
    try { window.history.replaceState(null, "", "#pipeline=" + encodeURIComponent(name)); } catch (e) { /* file: */ }
    // another pipeline: its checkpoints' ids are its own, so nothing cached carries over
    model.details = {};
    model.detailErrors = {};
    model.liveDetail = null;
    model.selected = null;
    model.selectedAttempt = null;
    model.userSelected = false;
    model.job = null;
    model.cps = null;
    if (REPORT) {
      loadReport(name);
      renderAll();
      return;
    }
    if (pollTimer !== null) { window.clearTimeout(pollTimer); pollTimer = null; }
    renderAll();
    poll();
  }

  // A report's document: the job's, or the named pipeline's (the first if none is named).
  function loadReport(name) {
    var parts = arr(REPORT.pipelines).filter(function (p) { return p && typeof p.name === "string"; });
    var doc = REPORT;
    if (parts.length) {
      model.pipelines = parts.map(function (p) {
        var j = obj(p.job), c = obj(obj(p.checkpoints).counts), latest = obj(obj(p.checkpoints).latest).completed;
        return { name: p.name, state: j.state, attempt: j.attempt, restarts: j.restarts,
          vertices: arr(j.vertices).map(function (v) { return obj(v).id; }),
          checkpoints: { completed: c.completed, latest_completed: latest ? obj(latest).id : null } };
      });
      doc = parts.filter(function (p) { return p.name === name; })[0] || parts[0];
      model.pipeline = doc.name;
    }
    model.job = obj(doc.job);
    model.cps = obj(doc.checkpoints);
    model.details = {};
    var details = obj(doc.details);
    Object.keys(details).forEach(function (k) { if (details[k] && typeof details[k] === "object") { model.details[k] = details[k]; } });
    updateSelection();
  }

  function renderAll() {
    guard("pipelines", renderPipelines);
    guard("header", renderHeader);
    guard("job graph", renderGraph);
    guard("graph legend", renderGraphLegend);
    guard("task charts", renderTaskCharts);
    guard("task table", renderTaskTable);
    guard("checkpoint counts", renderCounts);
    guard("checkpoint chart", renderCheckpointChart);
    guard("checkpoint table", renderCheckpointTable);
    guard("checkpoint detail", renderDetail);
    guard("recoveries", renderRecoveries);
    guard("controls", renderControls);
  }

  // ---------------------------------------------------------------------------------
  // live mode: polling

  function HttpError(status, message) {
    this.status = status;
    this.message = message;
  }

  function getJSON(url) {
    return fetch(url, { cache: "no-store", headers: { Accept: "application/json" } }).then(function (r) {
      if (r.ok) { return r.json(); }
      return r.json().catch(function () { return {}; }).then(function (body) {
        var m = body && typeof body.error === "string" ? body.error : "HTTP " + r.status;
        throw new HttpError(r.status, m);
      });
    });
  }

  var retryMs = POLL_MS;
  var detailInFlight = false;

  function fetchDetail(force) {
    var id = model.selected;
    if (id === null || REPORT) { return Promise.resolve(); }
    var key = String(id);
    var entry = findEntry(id, model.selectedAttempt);
    var inProgress = entry ? entry.status === "IN_PROGRESS" : false;
    if (!force && (model.details[key] || model.detailErrors[key]) && !inProgress) { return Promise.resolve(); }
    if (detailInFlight && !force) { return Promise.resolve(); }
    detailInFlight = true;
    var asked = model.pipeline;
    return getJSON("api/checkpoints/" + encodeURIComponent(key) + pipelineQuery()).then(function (doc) {
      if (asked !== model.pipeline) { detailInFlight = false; return; }  // another pipeline's by now
      detailInFlight = false;
      doc = obj(doc);
      delete model.detailErrors[key];
      if (doc.status === "IN_PROGRESS") {
        model.liveDetail = doc;
        delete model.details[key];
      } else {
        model.details[key] = doc;
        if (model.liveDetail && model.liveDetail.id === id) { model.liveDetail = null; }
      }
      if (model.selected === id) { guard("checkpoint detail", renderDetail); }
    }, function (e) {
      detailInFlight = false;
      if (e instanceof HttpError) {
        model.detailErrors[key] = "Checkpoint " + key + ": " + e.message;
        if (model.selected === id) { guard("checkpoint detail", renderDetail); }
      }
      // a network failure: the next poll notices it and shows the job as disconnected
    });
  }

  var pollSeq = 0;

  function poll() {
    // one request after the other: a stopped server costs one failed request per retry
    var seq = ++pollSeq, asked = model.pipeline;
    getJSON("api/pipelines").then(function (ps) {
      model.pipelines = arr(obj(ps).pipelines);
      if (model.pipeline !== null && !model.pipelines.some(function (p) { return p && p.name === model.pipeline; })) {
        model.pipeline = null;  // (an address naming a pipeline this job does not have)
        asked = null;
      }
      return getJSON("api/job" + pipelineQuery());
    }).then(function (job) {
      return getJSON("api/checkpoints" + pipelineQuery()).then(function (cps) { return [job, cps]; });
    }).then(function (docs) {
      if (seq !== pollSeq) { return "stale"; }  // a pipeline was selected meanwhile: its own poll runs
      if (asked !== model.pipeline) { return "stale"; }
      model.job = obj(docs[0]);
      model.cps = obj(docs[1]);
      model.connected = true;
      model.lastUpdate = Date.now();
      retryMs = POLL_MS;
      // an in-progress checkpoint's cached detail is stale once it ended
      var entry = model.selected !== null ? findEntry(model.selected, model.selectedAttempt) : null;
      if (entry && entry.status !== "IN_PROGRESS" && model.liveDetail && model.liveDetail.id === entry.id) {
        model.liveDetail = null;
      }
      updateSelection();
      renderAll();
      return fetchDetail(false);
    }).then(function (outcome) {
      // only the newest loop goes on: a poll overtaken by a pipeline switch (in its detail
      // request, say) must not schedule a second loop beside the new one
      if (outcome !== "stale" && seq === pollSeq) { schedule(POLL_MS); }
    }).catch(function (e) {
      if (seq !== pollSeq) { return; }
      var wasConnected = model.connected;
      model.connected = false;
      guard("status", renderConn);
      if (wasConnected !== false && window.console && console.info) {
        console.info("dashboard: the job's server does not answer (" + (e && e.message ? e.message : e) + "); retrying");
      }
      retryMs = Math.min(MAX_RETRY_MS, wasConnected === false ? retryMs * 2 : POLL_MS);
      schedule(retryMs);
    });
  }

  var pollTimer = null;

  function schedule(ms) { pollTimer = window.setTimeout(poll, ms); }

  // ---------------------------------------------------------------------------------
  // start

  // ---------------------------------------------------------------------------------
  // controls (monitor/controls.py): each asks for a confirmation, then posts; the answer
  // (the savepoint's location, or why there is none) is shown beside the buttons.

  var CONTROLS = {
    savepoint: "Take a savepoint of this job now? It keeps running.",
    stop: "Take a savepoint, commit the sinks, then STOP this job?",
    cancel: "CANCEL this job at once, without a savepoint? Its checkpoints stay; resume from them later."
  };
  var controlBusy = false;

  function renderControls() {
    var job = obj(model.job);
    var live = !REPORT && model.connected === true && !ENDED[job.state];
    Object.keys(CONTROLS).forEach(function (op) {
      var b = $("control-" + op);
      if (b) { b.disabled = !live || controlBusy; }
    });
  }

  function control(op) {
    var several = arr(model.pipelines).length > 1;
    if (controlBusy || !window.confirm(CONTROLS[op] + (several ? " (Every pipeline of the job: one savepoint set.)" : ""))) {
      return;
    }
    controlBusy = true;
    renderControls();
    setText("control-status", op === "cancel" ? "cancelling…" : "taking a savepoint…");
    fetch("api/controls/" + op, { method: "POST", cache: "no-store",
      headers: { "Content-Type": "application/json", Accept: "application/json" }, body: "{}" })
      .then(function (r) {
        return r.json().catch(function () { return {}; }).then(function (body) {
          if (!r.ok) { throw new Error(typeof body.error === "string" ? body.error : "HTTP " + r.status); }
          return body;
        });
      })
      .then(function (body) {
        setText("control-status", body.savepoint ? "savepoint: " + String(body.savepoint) +
          (body.stopping ? " (stopping)" : "") : "cancel asked for");
      }, function (e) {
        setText("control-status", "not done: " + (e && e.message ? e.message : String(e)));
      })
      .then(function () { controlBusy = false; renderControls(); });
  }

  function start() {
    Object.keys(CONTROLS).forEach(function (op) {
      var b = $("control-" + op);
      if (b) { b.addEventListener("click", function () { control(op); }); }
    });
    var table = $("checkpoint-table");
    table.addEventListener("click", onTableClick);
    table.addEventListener("keydown", onTableKey);
    $("follow-latest").addEventListener("click", function () {
      model.userSelected = false;
      model.liveDetail = null;
      updateSelection();
      renderAll();
      if (!REPORT) { fetchDetail(false); }
    });
    var resizeTimer = null;
    window.addEventListener("resize", function () {
      if (resizeTimer) { window.clearTimeout(resizeTimer); }
      resizeTimer = window.setTimeout(function () {
        guard("chart size", resizeCharts);
        guard("graph size", fitGraph);
      }, 120);
    });
    document.body.classList.add(REPORT ? "mode-report" : "mode-live");

    var m = /(?:^#|&)pipeline=([^&]*)/.exec(window.location.hash || "");
    if (m) { try { model.pipeline = decodeURIComponent(m[1]); } catch (e) { model.pipeline = null; } }
    if (REPORT) {
      loadReport(model.pipeline);
      renderAll();
      return;
    }
    renderAll();
    poll();
  }

  if (document.readyState === "loading") {
    document.addEventListener("DOMContentLoaded", start);
  } else {
    start();
  }
}());
