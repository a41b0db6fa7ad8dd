// Skyhive dashboard: draws the snapshots that /events streams. Everything
// a peer wrote about itself is untrusted text: it only ever goes into
// textContent and attribute values, never into HTML.
'use strict';

const MAX_POINTS = 600;
const SVG = 'http://www.w3.org/2000/svg';
const state = { snap: null, series: new Map(), received: 0, at: 0 };

// el makes an element with attributes (and class via "class") and
// children (strings become text).
function el(tag, attrs, ...children) {
  const e = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (v !== undefined && v !== null) e.setAttribute(k, v);
  }
  for (const c of children) e.append(c instanceof Node ? c : String(c));
  return e;
}

function svg(tag, attrs, text) {
  const e = document.createElementNS(SVG, tag);
  for (const [k, v] of Object.entries(attrs || {})) e.setAttribute(k, v);
  if (text !== undefined) e.textContent = text;
  return e;
}

function byId(id) { return document.getElementById(id); }

// colour gives every peer its own colour for the page's lifetime: the
// palette's in the order peers appear, then hues from a hash of the ID.
const PALETTE = ['#1f77b4', '#d62728', '#2ca02c', '#ff7f0e', '#9467bd', '#17becf', '#8c564b', '#e377c2', '#7f7f7f', '#bcbd22', '#393b79', '#ad494a'];
const colours = new Map();
function colour(id) {
  let c = colours.get(id);
  if (!c) {
    if (colours.size < PALETTE.length) {
      c = PALETTE[colours.size];
    } else {
      let h = 2166136261;
      for (let i = 0; i < id.length; i++) h = Math.imul(h ^ id.charCodeAt(i), 16777619) >>> 0;
      c = `hsl(${h % 360}, 60%, 42%)`;
    }
    colours.set(id, c);
  }
  return c;
}

function fmt(v, digits) {
  if (v === undefined || v === null) return '–';
  return Number(v).toFixed(digits);
}

function fmtRate(v) {
  if (!v) return '0';
  if (v >= 1000) return (v / 1000).toFixed(1) + 'k';
  return v.toFixed(v >= 100 ? 0 : 1);
}

function ago(seconds) {
  if (seconds < 1) return 'just now';
  if (seconds < 90) return Math.round(seconds) + 's ago';
  if (seconds < 5400) return Math.round(seconds / 60) + 'm ago';
  return Math.round(seconds / 3600) + 'h ago';
}

function mergeSeries(series, append) {
  if (!append) state.series = new Map();
  for (const s of series || []) {
    const old = state.series.get(s.peer);
    if (!old || !append) {
      state.series.set(s.peer, { peer: s.peer, short: s.short, role: s.role, points: s.points.slice(-MAX_POINTS) });
      continue;
    }
    const last = old.points.length ? old.points[old.points.length - 1].t : -Infinity;
    for (const p of s.points) if (p.t > last) old.points.push(p);
    if (old.points.length > MAX_POINTS) old.points.splice(0, old.points.length - MAX_POINTS);
  }
  // Peers the dashboard forgot leave the curves too.
  if (append && state.snap) {
    const known = new Set((series || []).map(s => s.peer));
    for (const id of state.series.keys()) if (!known.has(id)) state.series.delete(id);
  }
}

function receive(data, append) {
  const snap = JSON.parse(data);
  mergeSeries(snap.series, append);
  state.snap = snap;
  state.received++;
  state.at = Date.now();
  document.body.dataset.updates = String(state.received);
  render();
}

function connect() {
  const conn = byId('conn');
  const es = new EventSource('events');
  es.addEventListener('full', e => { conn.textContent = 'live'; conn.className = 'conn on'; receive(e.data, false); });
  es.addEventListener('update', e => receive(e.data, true));
  es.onerror = () => { conn.textContent = 'reconnecting…'; conn.className = 'conn off'; };
}

function render() {
  const s = state.snap;
  if (!s) return;
  const alive = s.peers.filter(p => p.alive).length;
  byId('peer-count').textContent = s.peers.length;
  byId('alive-count').textContent = alive;
  byId('regions-count').textContent = s.regions.filter(r => r.name).length;
  const err = byId('error');
  const problems = [];
  if (s.error) problems.push('last poll failed: ' + s.error);
  if (s.dropped) problems.push(s.dropped + ' invalid, forged or expired records left out');
  err.textContent = problems.join(' · ');
  err.hidden = problems.length === 0;
  tick();
  renderPeers(s);
  renderCurves();
  renderExperts(s);
  renderPipelines(s);
  renderRuns(s);
}

// tick refreshes the ages between snapshots.
function tick() {
  if (!state.snap) return;
  const since = (Date.now() - state.at) / 1000;
  byId('updated').textContent = ago(since);
  for (const td of document.querySelectorAll('td.seen')) {
    td.textContent = ago(Number(td.dataset.age) + since) + (td.dataset.gone ? ' (gone?)' : '');
  }
}

function renderPeers(s) {
  const tbody = document.querySelector('#peers tbody');
  tbody.replaceChildren();
  for (const p of s.peers) {
    const tr = el('tr', { 'data-peer': p.peer, class: p.alive ? '' : 'gone' });
    const sw = el('span', { class: 'swatch' });
    sw.style.background = colour(p.peer);
    tr.append(
      el('td', { class: 'mono', title: p.peer }, sw, p.short),
      el('td', {}, p.role),
      el('td', {}, p.region || '–'),
      el('td', { class: 'mono' }, p.version || '–'),
      el('td', { class: 'num' }, p.step),
      el('td', { class: 'num' }, fmtRate(p.samples_per_second)),
      el('td', { class: 'num' }, fmt(p.loss, 4)),
      el('td', { class: 'num' }, p.accuracy === undefined ? '–' : (100 * p.accuracy).toFixed(1) + '%'),
      el('td', { title: (p.addrs || []).join('\n') }, p.reach || '–'),
      el('td', { class: 'num' }, (p.links || []).length),
      el('td', { class: 'seen', 'data-age': p.age_seconds, 'data-gone': p.alive ? null : '1' }, ''));
    tbody.append(tr);
  }
  byId('peers-empty').hidden = s.peers.length > 0;
  byId('peers').hidden = s.peers.length === 0;
  tick();
  renderMap(s);
  const rl = byId('region-links');
  rl.replaceChildren();
  const between = s.region_links.filter(l => l.a !== l.b || l.a);
  if (between.length) {
    const t = el('table', {}, el('thead', {}, el('tr', {}, el('th', {}, 'from'), el('th', {}, 'to'), el('th', { class: 'num' }, 'median RTT'), el('th', { class: 'num' }, 'links'))));
    const b = el('tbody');
    for (const l of between) {
      b.append(el('tr', {}, el('td', {}, l.a || '(no region)'), el('td', {}, l.b || '(no region)'),
        el('td', { class: 'num' }, fmt(l.rtt_ms, 2) + ' ms'), el('td', { class: 'num' }, l.links)));
    }
    t.append(b);
    rl.append(t);
  }
}

// renderMap draws the regions on an ellipse, their peers around each
// region's centre, and the links between peers.
function renderMap(s) {
  const map = byId('map');
  map.replaceChildren();
  const W = 900, H = 380;
  const regions = s.regions;
  const pos = new Map();
  const centres = new Map();
  const n = regions.length;
  regions.forEach((r, i) => {
    const a = n === 1 ? 0 : (2 * Math.PI * i) / n - Math.PI / 2;
    const cx = n === 1 ? W / 2 : W / 2 + (W / 2 - 150) * Math.cos(a);
    const cy = n === 1 ? H / 2 : H / 2 + (H / 2 - 90) * Math.sin(a);
    const k = r.peers.length;
    const rad = Math.min(75, 26 + 10 * k);
    centres.set(r.name, { x: cx, y: cy, r: rad });
    r.peers.forEach((id, j) => {
      const b = (2 * Math.PI * j) / Math.max(k, 1) + Math.PI / 2;
      const pr = k === 1 ? 0 : rad - 16;
      // Labels sit outside the peer, away from the region's centre.
      pos.set(id, { x: cx + pr * Math.cos(b), y: cy + pr * Math.sin(b), lx: k === 1 ? 0 : Math.cos(b), ly: k === 1 ? 1 : Math.sin(b) });
    });
  });
  const gRegions = svg('g'), gLinks = svg('g'), gRTT = svg('g'), gPeers = svg('g');
  for (const r of regions) {
    const c = centres.get(r.name);
    gRegions.append(svg('circle', { cx: c.x, cy: c.y, r: c.r + 10, fill: '#eef3fb', stroke: '#c9d6ea' }));
    gRegions.append(svg('text', { x: c.x, y: c.y - c.r - 16, 'text-anchor': 'middle', class: 'region-name' },
      `${r.name || '(no region)'} · ${r.alive}/${r.peers.length}`));
  }
  for (const l of s.links) {
    const a = pos.get(l.a), b = pos.get(l.b);
    if (!a || !b) continue;
    const line = svg('line', { x1: a.x, y1: a.y, x2: b.x, y2: b.y, stroke: '#8aa0bd', 'stroke-width': 1, 'stroke-opacity': 0.7 });
    line.append(svg('title', {}, `${l.a.slice(-8)} – ${l.b.slice(-8)}: ${l.rtt_ms.toFixed(2)} ms`));
    gLinks.append(line);
  }
  // Median round trips between regions, on the line between their centres.
  for (const l of s.region_links) {
    const a = centres.get(l.a), b = centres.get(l.b);
    if (!a || !b) continue;
    if (l.a === l.b) {
      gRTT.append(svg('text', { x: a.x, y: a.y + a.r + 24, 'text-anchor': 'middle', class: 'rtt' }, `${l.rtt_ms.toFixed(1)} ms inside`));
      continue;
    }
    gRTT.append(svg('line', { x1: a.x, y1: a.y, x2: b.x, y2: b.y, stroke: '#4b6a92', 'stroke-width': 3, 'stroke-opacity': 0.35 }));
    const t = svg('text', { x: (a.x + b.x) / 2, y: (a.y + b.y) / 2 - 4, 'text-anchor': 'middle', class: 'rtt' }, `${l.rtt_ms.toFixed(1)} ms`);
    gRTT.append(t);
  }
  for (const p of s.peers) {
    const q = pos.get(p.peer);
    if (!q) continue;
    const c = svg('circle', { cx: q.x, cy: q.y, r: 7, fill: p.alive ? colour(p.peer) : '#fff', stroke: p.alive ? '#fff' : '#d64545', 'stroke-width': 2, 'data-peer': p.peer });
    c.append(svg('title', {}, `${p.short} ${p.role}${p.region ? ' in ' + p.region : ''}${p.alive ? '' : ' (gone?)'}`));
    gPeers.append(c);
    const anchor = q.lx > 0.3 ? 'start' : q.lx < -0.3 ? 'end' : 'middle';
    gPeers.append(svg('text', { x: q.x + 11 * q.lx, y: q.y + 13 * q.ly + 4, 'text-anchor': anchor, class: 'peer-label' }, `${p.role} ${p.short.slice(-4)}`));
  }
  map.append(gRegions, gRTT, gLinks, gPeers);
}

// renderCurves draws loss and accuracy against time, one line per peer.
function renderCurves() {
  const series = [...state.series.values()];
  const nLoss = drawChart(byId('loss-chart'), series, p => p.loss);
  const nAcc = drawChart(byId('accuracy-chart'), series, p => p.accuracy, [0, 1]);
  const legend = byId('legend');
  legend.replaceChildren();
  for (const s of series) {
    if (!s.points.some(p => p.loss !== undefined || p.accuracy !== undefined)) continue;
    const sw = el('span', { class: 'swatch' });
    sw.style.background = colour(s.peer);
    legend.append(el('span', { 'data-peer': s.peer }, sw, `${s.short} (${s.role})`));
  }
  byId('curves-empty').hidden = nLoss + nAcc > 0;
}

// drawChart plots value(point) of every series on canvas and returns how
// many points it drew (also in the canvas's data-points).
function drawChart(canvas, series, value, fixed) {
  const dpr = window.devicePixelRatio || 1;
  const w = canvas.clientWidth || 600, h = canvas.clientHeight || 240;
  canvas.width = Math.round(w * dpr);
  canvas.height = Math.round(h * dpr);
  const ctx = canvas.getContext('2d');
  ctx.setTransform(dpr, 0, 0, dpr, 0, 0);
  ctx.clearRect(0, 0, w, h);
  let t0 = Infinity, t1 = -Infinity, lo = Infinity, hi = -Infinity, n = 0;
  for (const s of series) for (const p of s.points) {
    const v = value(p);
    if (v === undefined || v === null) continue;
    t0 = Math.min(t0, p.t); t1 = Math.max(t1, p.t);
    lo = Math.min(lo, v); hi = Math.max(hi, v);
    n++;
  }
  canvas.dataset.points = String(n);
  const L = 52, R = 12, T = 10, B = 26;
  ctx.strokeStyle = '#d8dde3';
  ctx.fillStyle = '#5f6b7a';
  ctx.font = '11px system-ui, sans-serif';
  ctx.strokeRect(L, T, w - L - R, h - T - B);
  if (n === 0) {
    ctx.fillText('no data yet', L + 10, T + 20);
    return 0;
  }
  if (fixed) { lo = Math.min(lo, fixed[0]); hi = Math.max(hi, fixed[1]); }
  if (hi - lo < 1e-9) { hi += 0.5; lo -= 0.5; }
  const pad = (hi - lo) * 0.05;
  if (!fixed) { lo -= pad; hi += pad; }
  if (t1 - t0 < 1000) t0 = t1 - 1000;
  const x = t => L + ((t - t0) / (t1 - t0)) * (w - L - R);
  const y = v => T + (1 - (v - lo) / (hi - lo)) * (h - T - B);
  // Grid and labels: four value lines, time relative to the newest point.
  ctx.textAlign = 'right';
  for (let i = 0; i <= 4; i++) {
    const v = lo + ((hi - lo) * i) / 4;
    ctx.beginPath(); ctx.moveTo(L, y(v)); ctx.lineTo(w - R, y(v)); ctx.stroke();
    ctx.fillText(Math.abs(v) >= 100 ? v.toFixed(0) : v.toFixed(3), L - 4, y(v) + 4);
  }
  ctx.textAlign = 'center';
  const span = (t1 - t0) / 1000;
  for (let i = 0; i <= 4; i++) {
    const t = t0 + ((t1 - t0) * i) / 4;
    const back = (t1 - t) / 1000;
    const label = i === 4 ? 'latest' : '-' + (back >= 120 ? (back / 60).toFixed(span >= 600 ? 0 : 1) + 'm' : back.toFixed(span >= 10 ? 0 : 1) + 's');
    ctx.textAlign = i === 4 ? 'right' : 'center';
    ctx.fillText(label, i === 4 ? w - R : x(t), h - 8);
  }
  ctx.lineWidth = 1.6;
  for (const s of series) {
    ctx.strokeStyle = colour(s.peer);
    ctx.beginPath();
    let started = false;
    for (const p of s.points) {
      const v = value(p);
      if (v === undefined || v === null) { started = false; continue; }
      if (started) ctx.lineTo(x(p.t), y(v)); else ctx.moveTo(x(p.t), y(v));
      started = true;
    }
    ctx.stroke();
  }
  return n;
}

// renderExperts draws every expert grid, a cell per expert coloured by
// its load, outlined red when its servers are gone.
function renderExperts(s) {
  const root = byId('grids');
  root.replaceChildren();
  for (const g of s.grids) {
    const alive = g.cells.filter(c => c.alive).length;
    root.append(el('h3', {}, `${g.prefix}: ${g.cells.length} experts (${g.rows}×${g.cols}), ${alive} alive, busiest ${fmtRate(g.max_load)} calls/s`));
    const grid = el('div', { class: 'grid', 'data-prefix': g.prefix });
    grid.style.gridTemplateColumns = `repeat(${Math.max(g.cols, 1)}, 18px)`;
    for (const c of g.cells) {
      const cell = el('div', { class: 'cell' + (c.alive ? '' : ' dead'), 'data-uid': c.uid,
        title: `${c.uid}\n${fmtRate(c.load)} calls/s, ${c.calls} calls${c.errors ? ', ' + c.errors + ' errors' : ''}\nservers: ${c.servers.join(', ')}${c.alive ? '' : '\n(servers gone)'}` });
      cell.style.gridRow = String(c.row + 1);
      cell.style.gridColumn = String(c.col + 1);
      const f = g.max_load > 0 ? c.load / g.max_load : 0;
      cell.style.background = c.alive ? `hsl(210, 75%, ${92 - 55 * f}%)` : '#f4dede';
      grid.append(cell);
    }
    root.append(grid);
  }
  if (s.grids.length) {
    const bar = el('span', { class: 'bar' });
    bar.style.background = 'linear-gradient(to right, hsl(210,75%,92%), hsl(210,75%,37%))';
    const dead = el('span', { class: 'cell dead' });
    dead.style.display = 'inline-block';
    root.append(el('div', { class: 'scale' }, 'idle', bar, 'busiest', dead, 'servers gone'));
  }
  byId('experts-empty').hidden = s.grids.length > 0;
}

// renderPipelines draws each coordinator's stages: compute, communication
// and idle time of the last iteration, and the plan's layers.
function renderPipelines(s) {
  const root = byId('pipelines');
  root.replaceChildren();
  for (const p of s.pipelines) {
    const head = `coordinator ${p.short}${p.region ? ' in ' + p.region : ''}: iteration ${p.iter}, plan ${p.plan}, ` +
      `${(1000 * p.seconds).toFixed(0)} ms/iteration, ${p.workers} workers${p.alive ? '' : ' (gone?)'}`;
    root.append(el('h3', {}, head));
    if (p.event) root.append(el('p', { class: 'muted' }, 'last re-plan: ' + p.event));
    const stages = p.stages || [];
    if (!stages.length) root.append(el('p', { class: 'empty' }, 'no iteration yet'));
    const total = Math.max(...stages.map(t => t.compute + t.comm + t.idle), 1e-9);
    for (const t of stages) {
      const bars = el('div', { class: 'bars', 'data-stage': t.stage });
      for (const [k, v] of [['compute', t.compute], ['comm', t.comm], ['idle', t.idle]]) {
        const b = el('span', { class: k, title: `${k} ${(1000 * v).toFixed(1)} ms` });
        b.style.width = (100 * v / total) + '%';
        bars.append(b);
      }
      root.append(el('div', { class: 'stage' },
        el('span', {}, `stage ${t.stage} · ${t.worker} · layers [${t.first}, ${t.last})`),
        bars,
        el('span', { class: 'muted num' }, `${(1000 * (t.compute + t.comm + t.idle)).toFixed(0)} ms`)));
    }
    if (stages.length) {
      const legend = el('div', { class: 'legend' });
      for (const [k, c] of [['compute', 'var(--compute)'], ['communication', 'var(--comm)'], ['idle', 'var(--idle)']]) {
        const sw = el('span', { class: 'swatch' });
        sw.style.background = c;
        legend.append(el('span', {}, sw, k));
      }
      root.append(legend);
    }
  }
  byId('pipeline-empty').hidden = s.pipelines.length > 0;
}

// renderRuns lists the averaging peers of each run with their rounds and
// groups.
function renderRuns(s) {
  const root = byId('runs');
  root.replaceChildren();
  for (const r of s.runs) {
    root.append(el('h3', {}, `run ${r.run || '(unnamed)'}${r.algo ? ' · ' + r.algo : ''}: ${r.peers.length} peers, round ${r.max_round}`));
    const epochs = r.peers.some(p => p.epoch);
    const heads = ['peer', 'step', 'round', 'behind', 'groups', 'mean group', 'alone', 'failures', 'swarm peers'];
    if (epochs) heads.push('epoch');
    const t = el('table', {}, el('thead', {}, el('tr', {}, ...heads.map((h, i) => el('th', { class: i ? 'num' : '' }, h)))));
    const b = el('tbody');
    for (const p of r.peers) {
      const dot = el('span', { class: 'dot ' + (p.alive ? 'alive' : 'dead') });
      const row = el('tr', { class: p.alive ? '' : 'gone', 'data-peer': p.peer },
        el('td', { class: 'mono' }, dot, p.short),
        el('td', { class: 'num' }, p.step), el('td', { class: 'num' }, p.round), el('td', { class: 'num' }, r.max_round - p.round),
        el('td', { class: 'num' }, p.groups), el('td', { class: 'num' }, p.mean_group ? p.mean_group.toFixed(1) : '–'),
        el('td', { class: 'num' }, p.alone || 0), el('td', { class: 'num' }, p.failures || 0),
        el('td', { class: 'num' }, p.swarm_peers || '–'));
      if (epochs) row.append(el('td', { class: 'num' }, p.epoch || 0));
      b.append(row);
    }
    t.append(b);
    root.append(el('div', { class: 'table-wrap' }, t));
  }
  byId('averaging-empty').hidden = s.runs.length > 0;
}

window.addEventListener('resize', () => renderCurves());
setInterval(tick, 1000);
connect();
