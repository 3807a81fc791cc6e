// One host's GPUs: utilization, memory, temperature and power, one line per GPU, live over
// /ws/fleet/hosts/<id>/metrics/, with the 1 h / 24 h / 7 d ranges from the history endpoint.
// A full host sends eight GPUs' samples every second: they are batched and each chart is
// extended once per batch (at most once a second, on an animation frame), never redrawn whole,
// and keeps only its range's points. The GPUs' colours are one legend above the charts.
(function () {
  "use strict";
  const root = document.querySelector("[data-metrics-host]");
  if (!root) return;
  const { CHARTS, COLORS, LIVE_SECONDS, RANGE_SECONDS, layout, CONFIG, connect, dates, rangeButtons, hasValue,
    availability, gapAfter, withGaps, batcher } = window.GpuMetrics;
  const status = root.querySelector("[data-metrics-status]");
  const gpus = (root.dataset.gpus || "").split(",").filter((s) => s !== "").map(Number);
  const divs = {};
  root.querySelectorAll("[data-chart]").forEach((div) => { divs[div.dataset.chart] = div; });
  let range = "10m";
  let loading = false;
  let pending = [];
  let gap = gapAfter(0);
  let generation = 0; // counts whole redraws
  const lastTs = new Map(); // gpu index -> ts of its last sample drawn
  const kept = new Map(); // gpu index -> ts of each point its traces hold (gaps included)
  const batch = batcher(append, 1000);

  const legend = root.querySelector("[data-metrics-legend]");
  legend.replaceChildren(...gpus.map((index, n) => {
    const item = document.createElement("span");
    item.className = "metrics-legend-item";
    item.style.setProperty("--swatch", COLORS[n % COLORS.length]);
    item.textContent = `gpu${index}`;
    return item;
  }));

  function countPoints() {
    root.dataset.points = String([...kept.values()].reduce((n, ts) => n + ts.length, 0));
  }

  // perGpu: {index: {ts: [], gpu_util: [], ...}}; span: the [from, to] an empty chart shows.
  function draw(perGpu, span, resolution) {
    generation += 1;
    gap = gapAfter(resolution);
    const drawn = {};
    for (const index of gpus) {
      const data = perGpu[String(index)] || { ts: [] };
      drawn[index] = withGaps(data, gap);
      kept.set(index, drawn[index].ts.slice());
      lastTs.set(index, data.ts.length ? data.ts[data.ts.length - 1] : -Infinity);
    }
    for (const [key, div] of Object.entries(divs)) {
      const traces = gpus.map((index, n) => ({
        x: dates(drawn[index].ts), y: drawn[index][key] || [], mode: "lines", name: `gpu${index}`,
        line: { color: COLORS[n % COLORS.length], width: 1.5 }, connectgaps: false,
      }));
      const look = layout(key);
      look.height = 240;
      availability(div, traces.some((t) => t.x.length), traces.some((t) => hasValue(t.y)), look, span);
      Plotly.react(div, traces, look, CONFIG);
    }
    countPoints();
  }

  function fromSamples(samplesByGpu) {
    const out = {};
    for (const [index, samples] of Object.entries(samplesByGpu)) {
      const data = { ts: samples.map((s) => s.ts) };
      for (const key of Object.keys(CHARTS)) data[key] = samples.map((s) => s[key]);
      out[index] = data;
    }
    return out;
  }

  // A batch of samples of any GPUs: one extendTraces per chart for all of them.
  function append(samples) {
    const fresh = new Map(); // trace number -> that GPU's new samples, in ts order
    for (const s of [...samples].sort((a, b) => a.ts - b.ts)) {
      const n = gpus.indexOf(s.gpu);
      if (n < 0 || s.ts <= (lastTs.get(s.gpu) ?? -Infinity)) continue;
      if (!fresh.has(n)) fresh.set(n, { after: lastTs.get(s.gpu) ?? -Infinity, samples: [] });
      fresh.get(n).samples.push(s);
      lastTs.set(s.gpu, s.ts);
    }
    if (!fresh.size) return;
    const indices = [...fresh.keys()];
    const newest = Math.max(...indices.map((n) => lastTs.get(gpus[n])));
    const oldest = newest - RANGE_SECONDS[range];
    const columns = {};
    const keep = [];
    for (const n of indices) {
      const { after, samples: list } = fresh.get(n);
      const data = { ts: list.map((s) => s.ts) };
      for (const key of Object.keys(CHARTS)) data[key] = list.map((s) => s[key]);
      columns[n] = withGaps(data, gap, after);
      const ts = (kept.get(gpus[n]) || []).concat(columns[n].ts);
      let drop = 0;
      while (drop < ts.length && ts[drop] < oldest) drop += 1;
      kept.set(gpus[n], ts.slice(drop));
      keep.push(ts.length - drop);
    }
    const xs = indices.map((n) => dates(columns[n].ts));
    const charts = Object.entries(divs);
    const drawing = generation;
    function extendNext() { // one chart a frame: the page keeps painting between them
      if (drawing !== generation) return; // redrawn whole meanwhile
      const [key, div] = charts.shift();
      const ys = indices.map((n) => columns[n][key]);
      Plotly.extendTraces(div, { x: xs, y: ys }, indices, { x: keep, y: keep });
      const valued = (div.dataset.empty !== "true" && div.dataset.unavailable !== "true") || ys.some(hasValue);
      if (div.dataset.empty === "true" || div.dataset.unavailable !== String(!valued)) availability(div, true, valued);
      if (charts.length) requestAnimationFrame(extendNext);
    }
    extendNext();
    countPoints();
  }

  rangeButtons(root, async (name) => {
    range = name;
    loading = true;
    pending = [];
    batch.clear();
    try {
      const response = await fetch(`${root.dataset.historyUrl}?range=${encodeURIComponent(name)}`, { credentials: "same-origin" });
      if (!response.ok) throw new Error(`HTTP ${response.status}`);
      const body = await response.json();
      const any = Object.values(body.gpus)[0];
      const now = Date.now() / 1000;
      if (range === name) draw(body.gpus, any ? [any.from, any.to] : [now - RANGE_SECONDS[name], now], any && any.resolution_seconds);
    } catch (error) {
      status.textContent = `could not load ${name}: ${error.message}`;
    } finally {
      if (range === name) { loading = false; batch.push(pending); pending = []; }
    }
  });

  const now = Date.now() / 1000;
  draw({}, [now - LIVE_SECONDS, now], 0);
  connect(root.dataset.wsPath, {
    onMessage: (message) => {
      if (message.type === "window") {
        if (range === "10m" && !loading) {
          batch.clear();
          const at = Date.now() / 1000;
          draw(fromSamples(message.gpus), [at - LIVE_SECONDS, at], 0);
        }
      } else if (message.type === "gpus") {
        if (loading) pending.push(...message.samples);
        else batch.push(message.samples);
      }
    },
    onStatus: (text) => { status.textContent = text; },
  });
})();
