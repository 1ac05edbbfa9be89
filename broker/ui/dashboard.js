// The p2pfaas live dashboard (docs/dashboard.md). Plain JavaScript, no build step; charts by uPlot.
// Events arrive on the WebSocket /ui/live: hello, history (a batch), then heartbeat, telemetry,
// scale, weights and a tick every second. The page keeps the last `history_s` seconds and redraws
// once a second; operator controls POST to /ui/api/... and show the node's answer.
"use strict";

const SCHEDULERS = {   // P2PFaaS algorithms and a sensible first set of parameters (docs/scheduling.md)
  NoScheduler: "true", ForwardScheduler: "1", PowerOfNScheduler: "1, 2, true, 1",
  PowerOfNSchedulerTau: "1, 2, true, 1, 100ms", RoundRobinWithMasterScheduler: "false, n1, true",
  LearningScheduler: "2, 2, true",
};
const LEARNING_WINDOW = 10;          // ticks (seconds) the learner charts average over
const SHOWN_DECISIONS = 12;
const COLORS = ["#1c7ed6", "#e8590c", "#2f9e44", "#7048e8", "#c2255c", "#0c8599", "#5c940d", "#862e9c"];

const state = {
  historyS: 600, bridgeNode: "", forwardWindowS: 60,
  nodes: new Map(),      // name -> {hb, status, scheduler, series, el, chart}
  pools: new Map(),      // "node/pool" -> {last, target, policy, decisions, series, el, charts}
  models: new Map(),     // "node/model" -> {node, model, algorithm, version, at, versions: [[at, version]]}
  learning: {t: [], keys: new Map()},   // key -> {label, count: [], sum: []}, aligned with t
  forwards: null, malformed: 0, events: 0, firstAt: 0, lastAt: 0,
  view: [0, 1],          // the time span every chart shows (aligned, so decisions line up with their effects)
  charts: {},            // learner charts
};

const $ = (selector, root = document) => root.querySelector(selector);
const field = (root, name) => root.querySelector(`[data-field="${name}"]`);

function fmt(value, digits = 0) {
  return value == null || Number.isNaN(value) ? "–" : Number(value).toFixed(digits);
}

function setField(root, name, value, text) {
  const el = field(root, name);
  el.dataset.value = value;
  el.textContent = text ?? String(value);
}

function trim(series, cutoff) {       // drop points older than the history window from every column
  let drop = 0;
  while (drop < series.t.length && series.t[drop] < cutoff) drop++;
  if (drop) for (const column of Object.values(series)) column.splice(0, drop);
}

function push(series, values) {
  for (const [name, value] of Object.entries(values)) series[name].push(value);
}

// -- charts -----------------------------------------------------------------------------------
function makeChart(el, series, {yRange, plugins = [], height = 140} = {}) {
  const axis = {stroke: "#6a737d", grid: {stroke: "#eef0f2"}, ticks: {stroke: "#eef0f2"}, size: 24, font: "11px system-ui"};
  const opts = {
    width: Math.max(200, el.clientWidth), height, plugins,
    legend: {live: false}, cursor: {drag: {x: false, y: false}},
    scales: {x: {time: true, range: () => state.view}, y: yRange ? {range: yRange} : {}},
    axes: [{...axis, values: (u, splits) => splits.map(clock)}, {...axis, size: 48}],
    series: [{}, ...series.map((s, i) => ({stroke: s.color || COLORS[i % COLORS.length], width: 1.5, spanGaps: true, ...s}))],
  };
  return new uPlot(opts, [[], ...series.map(() => [])], el);
}

function clock(unixSeconds) {   // 16:08:25, one line: the charts span minutes, not days
  return new Date(unixSeconds * 1000).toTimeString().slice(0, 8);
}

function decisionMarkers(pool) {   // every scaling decision on the workers chart: a line and a label when it changed the target
  return {hooks: {draw: [u => {
    const ctx = u.ctx, {left, top, width, height} = u.bbox, dpr = window.devicePixelRatio || 1;
    ctx.save();
    ctx.beginPath(); ctx.rect(left, top, width, height); ctx.clip();
    ctx.font = `${10 * dpr}px system-ui, sans-serif`; ctx.textBaseline = "top";
    const rowEnds = [-Infinity, -Infinity, -Infinity];   // where the last label of each text row ends
    for (const d of pool.decisions) {
      if (d.at < u.scales.x.min || d.at > u.scales.x.max) continue;
      const x = Math.round(u.valToPos(d.at, "x", true));
      if (d.delta === 0 && d.policy !== "manual") {            // target kept: a tick at the bottom
        ctx.fillStyle = "#adb5bd"; ctx.fillRect(x - dpr / 2, top + height - 6 * dpr, dpr, 6 * dpr);
        continue;
      }
      const color = d.policy === "manual" ? "#7048e8" : d.delta >= 0 ? "#2f9e44" : "#c92a2a";
      ctx.strokeStyle = ctx.fillStyle = color; ctx.lineWidth = dpr; ctx.setLineDash([4 * dpr, 3 * dpr]);
      ctx.beginPath(); ctx.moveTo(x, top); ctx.lineTo(x, top + height); ctx.stroke();
      const label = decisionLabel(d), start = x + 3 * dpr, row = rowEnds.findIndex(end => end < start);
      if (row < 0) continue;   // no room: the line alone (the list below has every decision)
      ctx.fillText(label, start, top + (2 + 11 * row) * dpr);
      rowEnds[row] = start + ctx.measureText(label).width + 4 * dpr;
    }
    ctx.restore();
  }]}};
}

function decisionLabel(d) {
  const sign = d.delta > 0 ? "+" : "";
  const version = d.model_version ? ` (model ${d.model_version})` : "";
  return `${d.delta == null ? "" : sign + d.delta + " "}→${d.target} ${d.policy}${version}`;
}

function card(kind, key) {   // a new node or pool card from its <template>, labelled data-node / data-pool
  const el = $(`#${kind}-template`).content.firstElementChild.cloneNode(true);
  el.dataset[kind] = key;
  field(el, "name").textContent = key;
  return el;
}

// -- nodes ------------------------------------------------------------------------------------
function nodeEntry(name) {
  let node = state.nodes.get(name);
  if (node) return node;
  node = {name, hb: null, status: "alive", scheduler: "", el: card("node", name), chart: null,
          series: {t: [], running: [], queued: [], k: [], qmax: []}};
  wireNodeControls(node);
  state.nodes.set(name, node);
  const cards = [...state.nodes.values()].sort(byBridgeFirst).map(n => n.el);
  $("#nodes").replaceChildren(...cards);
  return node;
}

function byBridgeFirst(a, b) {
  return (b.name === state.bridgeNode) - (a.name === state.bridgeNode) || a.name.localeCompare(b.name);
}

function onHeartbeat(hb) {
  const node = nodeEntry(hb.node);
  node.hb = hb;
  if (hb.scheduler) node.scheduler = hb.scheduler;
  push(node.series, {t: hb.time, running: hb.running, queued: hb.queued,
                     k: hb.parallel_running_functions_max, qmax: hb.queue_length_max});
}

function renderNode(node, now) {
  const {el, hb} = node;
  if (!hb) return;
  el.dataset.time = hb.time;
  setField(el, "running", hb.running);
  setField(el, "k", hb.parallel_running_functions_max);
  setField(el, "queued", hb.queued);
  setField(el, "queue_max", hb.queue_length_max);
  setField(el, "status", node.status);
  field(el, "status").dataset.state = node.status;
  setField(el, "scheduler", node.scheduler, node.scheduler || "scheduler unknown");
  setField(el, "silent", hb.time, `${fmt(Math.max(0, now - hb.time), 1)} s ago`);
  trim(node.series, now - state.historyS);
  node.chart ??= makeChart($('[data-chart="load"]', el), [
    {label: "running"}, {label: "queued"},
    {label: "K", dash: [6, 4], stroke: "#868e96"}, {label: "queue max", dash: [2, 3], stroke: "#adb5bd"},
  ], {height: 120});
  const s = node.series;
  node.chart.setData([s.t, s.running, s.queued, s.k, s.qmax]);
}

// -- pools ------------------------------------------------------------------------------------
function poolEntry(key) {
  let pool = state.pools.get(key);
  if (pool) return pool;
  pool = {key, last: null, target: null, policy: "", decisions: [], el: card("pool", key), charts: null,
          series: {t: [], ready: [], starting: [], stopping: [], queue: [], target: [],
                   arrivals: [], throughput: [], p95: [], qos: []}};
  wirePoolControls(pool);
  state.pools.set(key, pool);
  return pool;
}

function onTelemetry(t) {
  const pool = poolEntry(`${t.node}/${t.pool}`);
  pool.last = t;
  push(pool.series, {t: t.time, ready: t.workers_ready, starting: t.workers_starting, stopping: t.workers_stopping,
                     queue: t.queue_length, target: pool.target, arrivals: t.arrival_rate, throughput: t.throughput,
                     p95: t.completed ? t.latency_p95_s : null, qos: t.completed ? 100 * t.qos : null});
}

function onScale(command, at) {
  const pool = poolEntry(`${command.node}/${command.pool}`);
  const delta = command.previous == null ? null : command.target_workers - command.previous;
  pool.decisions.push({at: command.at || at, target: command.target_workers, previous: command.previous, delta,
                       policy: command.policy || "?", reason: command.reason, model_version: command.model_version});
  pool.target = command.target_workers;
  if (command.policy && command.policy !== "manual") pool.policy = command.policy;
}

function renderPool(pool, now) {
  const {el, last: t} = pool;
  if (t) {
    el.dataset.time = t.time;
    for (const name of ["workers_ready", "workers_starting", "workers_stopping", "queue_length", "in_service"]) {
      setField(el, name, t[name]);
    }
    setField(el, "arrival_rate", t.arrival_rate, fmt(t.arrival_rate, 2));
    setField(el, "latency_p95_s", t.latency_p95_s, t.completed ? `${fmt(1000 * t.latency_p95_s)} ms` : "–");
    setField(el, "qos", t.qos, t.completed ? `${fmt(100 * t.qos, 1)} %` : "–");
  }
  setField(el, "target", pool.target ?? "", pool.target ?? "–");
  setField(el, "policy", pool.policy, pool.policy ? `scaled by ${pool.policy}` : "no controller seen");
  el.classList.toggle("compact", !pool.decisions.length);   // a pool nobody scales: small charts
  pool.decisions = pool.decisions.filter(d => d.at >= now - state.historyS);
  renderDecisions(pool);
  trim(pool.series, now - state.historyS);
  const height = pool.decisions.length ? 140 : 90;
  if (pool.charts && pool.charts.workers.height !== height) {
    for (const chart of Object.values(pool.charts)) chart.destroy();
    pool.charts = null;
  }
  if (!pool.charts) {
    const chart = name => $(`[data-chart="${name}"]`, el);
    pool.charts = {
      workers: makeChart(chart("workers"), [
        {label: "ready", stroke: "#2f9e44"}, {label: "starting", stroke: "#f08c00"}, {label: "stopping", stroke: "#adb5bd"},
        {label: "target", stroke: "#7048e8", dash: [5, 3], paths: uPlot.paths.stepped({align: 1})},
        {label: "queue", stroke: "#1c7ed6"},
      ], {height, plugins: [decisionMarkers(pool)]}),
      rates: makeChart(chart("rates"), [{label: "arrivals"}, {label: "throughput", stroke: "#2f9e44"}], {height}),
      latency: makeChart(chart("latency"), [{label: "p95", stroke: "#e8590c"}], {height}),
      qos: makeChart(chart("qos"), [{label: "QoS", stroke: "#2f9e44"}], {height, yRange: [0, 100]}),
    };
  }
  const s = pool.series;
  pool.charts.workers.setData([s.t, s.ready, s.starting, s.stopping, s.target, s.queue]);
  pool.charts.rates.setData([s.t, s.arrivals, s.throughput]);
  pool.charts.latency.setData([s.t, s.p95]);
  pool.charts.qos.setData([s.t, s.qos]);
}

function renderDecisions(pool) {
  const items = pool.decisions.slice(-SHOWN_DECISIONS).reverse().map(d => {
    const li = document.createElement("li");
    Object.assign(li.dataset, {at: d.at, target: d.target, policy: d.policy});
    const kind = d.policy === "manual" ? "manual" : d.delta > 0 ? "up" : d.delta < 0 ? "down" : "";
    const when = new Date(d.at * 1000).toLocaleTimeString();
    li.innerHTML = `<span class="muted"></span> <span class="${kind}"></span> <span></span>`;
    const [time, change, rest] = li.children;
    time.textContent = when;
    change.textContent = d.delta == null || d.delta === 0 ? `${d.target}` : `${d.previous} → ${d.target}`;
    rest.textContent = `${d.policy}${d.model_version ? " (model " + d.model_version + ")" : ""} · ${d.reason || ""}`;
    return li;
  });
  field(pool.el, "decisions").replaceChildren(...items);
}

function renderPools(now) {
  const pools = [...state.pools.values()].sort((a, b) =>
    (b.decisions.length > 0) - (a.decisions.length > 0) || a.key.localeCompare(b.key));
  const container = $("#pools");
  if (pools.some((p, i) => container.children[i] !== p.el)) container.replaceChildren(...pools.map(p => p.el));
  for (const pool of pools) renderPool(pool, now);
}

// -- forwards graph ---------------------------------------------------------------------------
const SVG = "http://www.w3.org/2000/svg";

function svgElement(name, attributes, text) {
  const el = document.createElementNS(SVG, name);
  for (const [key, value] of Object.entries(attributes)) el.setAttribute(key, value);
  if (text != null) el.textContent = text;
  return el;
}

function renderForwards() {
  const svg = $("#forwards"), names = [...state.nodes.keys()].sort();
  const cx = 160, cy = 125, ring = names.length > 1 ? 88 : 0, radius = 21;
  const at = new Map(names.map((name, i) => {
    const angle = -Math.PI / 2 + (2 * Math.PI * i) / names.length;
    return [name, [cx + ring * Math.cos(angle), cy + ring * Math.sin(angle)]];
  }));
  const parts = [svgElement("defs", {})];
  parts[0].append(svgElement("marker", {id: "arrow", viewBox: "0 0 10 10", refX: 9, refY: 5, markerWidth: 6,
                                        markerHeight: 6, orient: "auto-start-reverse"}));
  parts[0].firstChild.append(svgElement("path", {d: "M0,0 L10,5 L0,10 z", fill: "#1c7ed6"}));
  let total = 0;
  for (const [source, peers] of Object.entries(state.forwards || {})) {
    for (const [peer, count] of Object.entries(peers)) {
      if (!at.has(source) || !at.has(peer) || !count) continue;
      total += count;
      const [x1, y1] = at.get(source), [x2, y2] = at.get(peer);
      const dx = x2 - x1, dy = y2 - y1, length = Math.hypot(dx, dy) || 1, ux = dx / length, uy = dy / length;
      const bend = 22;   // A->B and B->A curve to opposite sides
      const mx = (x1 + x2) / 2 - uy * bend, my = (y1 + y2) / 2 + ux * bend;
      const d = `M${x1 + ux * radius},${y1 + uy * radius} Q${mx},${my} ${x2 - ux * (radius + 3)},${y2 - uy * (radius + 3)}`;
      parts.push(svgElement("path", {class: "edge", d, "stroke-width": 1 + 1.5 * Math.log2(1 + count),
                                     "marker-end": "url(#arrow)", "data-source": source, "data-peer": peer, "data-count": count}));
      parts.push(svgElement("text", {class: "edge-label", x: mx, y: my, "text-anchor": "middle"}, String(count)));
    }
  }
  for (const name of names) {
    const [x, y] = at.get(name);
    parts.push(svgElement("circle", {class: "node-dot", cx: x, cy: y, r: radius, "data-state": state.nodes.get(name).status}));
    parts.push(svgElement("text", {class: "node-label", x, y}, name));
  }
  svg.replaceChildren(...parts);
  $("#forwards-note").textContent = state.forwards == null
    ? "these nodes do not report forward counts (Heartbeat.forwards)"
    : total ? `${total} requests forwarded` : "no forwards in the last minute";
}

// -- learners ---------------------------------------------------------------------------------
function onTick(tick, at) {
  for (const [name, info] of Object.entries(tick.nodes)) {
    const node = nodeEntry(name);
    node.status = info.status;
    if (info.scheduler) node.scheduler = info.scheduler;
  }
  state.forwards = tick.forwards;
  state.malformed = tick.malformed;
  const learning = state.learning;
  learning.t.push(at);
  const seen = new Set();
  for (const [group, suffix] of [["rewards", "scheduling"], ["experiences", "scaling"]]) {
    for (const [key, counts] of Object.entries(tick.learning[group] || {})) {
      const id = `${key} ${suffix}`;
      if (!learning.keys.has(id)) {
        learning.keys.set(id, {count: learning.t.slice(0, -1).map(() => 0), sum: learning.t.slice(0, -1).map(() => 0)});
        state.charts.learnersStale = true;
      }
      const entry = learning.keys.get(id);
      entry.count.push(counts.count); entry.sum.push(counts.reward_sum);
      seen.add(id);
    }
  }
  for (const [id, entry] of learning.keys) if (!seen.has(id)) { entry.count.push(0); entry.sum.push(0); }
}

function onWeights(w, at) {
  const key = `${w.node}/${w.model}`;
  const model = state.models.get(key) || {versions: []};
  Object.assign(model, w, {seenAt: at});
  model.versions.push([at, w.version]);
  state.models.set(key, model);
}

function rolling(values, window) {   // sum over the last `window` entries, at every index
  let sum = 0;
  return values.map((v, i) => (sum += v - (i >= window ? values[i - window] : 0)));
}

function renderLearners(now) {
  const learning = state.learning;
  let drop = 0;
  while (drop < learning.t.length && learning.t[drop] < now - state.historyS) drop++;
  learning.t.splice(0, drop);
  for (const entry of learning.keys.values()) { entry.count.splice(0, drop); entry.sum.splice(0, drop); }
  const ids = [...learning.keys.keys()];
  if (state.charts.learnersStale || !state.charts.experiences) {
    for (const chart of [state.charts.experiences, state.charts.rewards]) chart?.destroy();
    const series = ids.map(label => ({label}));
    state.charts.experiences = makeChart($("#experience-chart"), series, {height: 150});
    state.charts.rewards = makeChart($("#reward-chart"), series, {height: 150});
    state.charts.learnersStale = false;
  }
  const counts = ids.map(id => rolling(learning.keys.get(id).count, LEARNING_WINDOW));
  const sums = ids.map(id => rolling(learning.keys.get(id).sum, LEARNING_WINDOW));
  state.charts.experiences.setData([learning.t, ...counts.map(c => c.map(v => v / LEARNING_WINDOW))]);
  state.charts.rewards.setData([learning.t, ...sums.map((s, i) => s.map((v, j) => counts[i][j] ? v / counts[i][j] : null))]);

  const rows = [...state.models.values()].sort((a, b) => `${a.node}/${a.model}`.localeCompare(`${b.node}/${b.model}`)).map(m => {
    m.versions = m.versions.filter(([at]) => at >= now - 60);
    const gained = m.versions.length ? m.version - m.versions[0][1] : 0;
    const tr = document.createElement("tr");
    tr.dataset.model = `${m.node}/${m.model}`;
    for (const text of [m.node, m.model, m.algorithm, m.version, `+${gained}`, `${fmt(now - m.seenAt, 0)} s ago`]) {
      tr.append(Object.assign(document.createElement("td"), {textContent: String(text)}));
    }
    return tr;
  });
  $("#models").replaceChildren(...rows);
}

// -- operator controls ------------------------------------------------------------------------
// state changes need the operator token (`p2pfaas auth operator`): asked once, kept in this browser
function operatorHeaders() {
  const token = localStorage.getItem("p2pfaasOperatorToken");
  return token ? {"Authorization": `Bearer ${token}`} : {};
}

async function post(path, body, output) {
  output.className = "";
  output.textContent = "…";
  try {
    const send = () => fetch(path, {method: "POST", body: JSON.stringify(body),
                                    headers: {"Content-Type": "application/json", ...operatorHeaders()}});
    let response = await send();
    if (response.status === 401) {
      const token = window.prompt("Operator token (p2pfaas auth operator):");
      if (token) {
        localStorage.setItem("p2pfaasOperatorToken", token.trim());
        response = await send();
      }
    }
    const answer = await response.json().catch(() => ({}));
    output.className = response.ok ? "ok" : "error";
    output.textContent = response.ok ? `done: ${JSON.stringify(answer)}` : `${response.status}: ${answer.message || response.statusText}`;
    return response.ok ? answer : null;
  } catch (exc) {
    output.className = "error";
    output.textContent = `failed: ${exc}`;
    return null;
  }
}

function wireNodeControls(node) {
  const {el, name} = node;
  const output = $("output", el), configuration = $('[data-form="configuration"]', el), scheduler = $('[data-form="scheduler"]', el);
  const select = scheduler.elements.name;
  select.replaceChildren(...Object.keys(SCHEDULERS).map(n => new Option(n, n)));
  select.addEventListener("change", () => { scheduler.elements.parameters.value = SCHEDULERS[select.value]; });
  $("details", el).addEventListener("toggle", async event => {
    if (!event.target.open) return;
    const current = await fetch(`ui/api/nodes/${name}/configuration`).then(r => r.ok ? r.json() : null).catch(() => null);
    if (current) {
      configuration.elements.parallel_running_functions_max.value = current.parallel_running_functions_max;
      configuration.elements.queue_length_max.value = current.queue_length_max;
      configuration.elements.queue_enabled.checked = current.queue_enabled;
    }
    const match = /^(\w+)\((.*)\)$/.exec(node.scheduler || "");
    if (match && match[1] in SCHEDULERS) { select.value = match[1]; scheduler.elements.parameters.value = match[2]; }
  });
  configuration.addEventListener("submit", event => {
    event.preventDefault();
    const f = configuration.elements;
    post(`ui/api/nodes/${name}/configuration`, {parallel_running_functions_max: Number(f.parallel_running_functions_max.value),
      queue_length_max: Number(f.queue_length_max.value), queue_enabled: f.queue_enabled.checked}, output);
  });
  scheduler.addEventListener("submit", async event => {
    event.preventDefault();
    const parameters = scheduler.elements.parameters.value.split(",").map(p => p.trim()).filter(Boolean);
    const answer = await post(`ui/api/nodes/${name}/scheduler`, {name: select.value, parameters}, output);
    if (answer) node.scheduler = `${answer.name}(${answer.parameters.join(", ")})`;
  });
}

function wirePoolControls(pool) {
  const {el, key} = pool;
  const output = $("output", el);
  $('[data-form="policy"]', el).addEventListener("submit", event => {
    event.preventDefault();
    post(`ui/api/pools/${key}/policy`, {policy: event.target.elements.policy.value.trim()}, output);
  });
  $('[data-form="scale"]', el).addEventListener("submit", event => {
    event.preventDefault();
    post(`ui/api/pools/${key}/scale`, {target_workers: Number(event.target.elements.target_workers.value)}, output);
  });
}

// -- the live connection ----------------------------------------------------------------------
function reset() {
  for (const node of state.nodes.values()) for (const column of Object.values(node.series)) column.length = 0;
  for (const pool of state.pools.values()) {
    for (const column of Object.values(pool.series)) column.length = 0;
    pool.decisions = [];
  }
  state.learning = {t: [], keys: new Map()};
  state.charts.learnersStale = true;
  state.models.clear();
  state.firstAt = state.lastAt = 0;
}

function apply(event) {
  state.events++;
  state.firstAt ||= event.at;
  state.lastAt = Math.max(state.lastAt, event.at);
  const d = event.data;
  switch (event.type) {
    case "heartbeat": return onHeartbeat(d);
    case "telemetry": return onTelemetry(d);
    case "scale": return onScale(d, event.at);
    case "weights": return onWeights(d, event.at);
    case "tick": return onTick(d, event.at);
    case "hello":
      state.historyS = d.history_s; state.bridgeNode = d.node; state.forwardWindowS = d.forward_window_s;
      $("#bridge").textContent = `via node ${d.node} · prefix ${d.prefix}`;
      $("#forward-window").textContent = d.forward_window_s;
      return reset();
    case "history":
      for (const past of d) apply(past);
      return render();
  }
}

const MIN_VIEW_S = 60;

function render() {
  const now = state.lastAt || Date.now() / 1000;
  state.view = [Math.min(now - MIN_VIEW_S, Math.max(state.firstAt || now, now - state.historyS)), now];
  for (const node of state.nodes.values()) renderNode(node, now);
  renderPools(now);
  renderForwards();
  renderLearners(now);
  $("#footer").textContent = `${state.events} events · ${state.nodes.size} nodes · ${state.pools.size} pools` +
    (state.malformed ? ` · ${state.malformed} malformed messages ignored` : "") +
    ` · updated ${new Date(now * 1000).toLocaleTimeString()}`;
  document.body.dataset.rendered = String(now);
}

function connect(delay = 1000) {
  const url = new URL("ui/live", location.href);
  url.protocol = url.protocol === "https:" ? "wss:" : "ws:";
  const ws = new WebSocket(url);
  const badge = $("#connection");
  ws.onopen = () => { badge.dataset.state = "live"; badge.textContent = "live"; delay = 1000; };
  ws.onmessage = message => apply(JSON.parse(message.data));
  ws.onclose = event => {
    badge.dataset.state = "closed";
    badge.textContent = `reconnecting (${event.code})`;
    setTimeout(() => connect(Math.min(delay * 2, 10000)), event.code === 1013 ? 0 : delay);
  };
}

window.addEventListener("resize", () => {
  const charts = [...state.nodes.values()].map(n => n.chart)
    .concat(...[...state.pools.values()].map(p => Object.values(p.charts || {})), state.charts.experiences, state.charts.rewards);
  for (const chart of charts) if (chart) chart.setSize({width: Math.max(200, chart.root.parentElement.clientWidth), height: chart.height});
});
setInterval(render, 1000);
connect();
