// One host's GPUs: utilization, memory, temperature and power, one line per GPU, live over
// /ws/fleet/hosts/<id>/metrics/, with the 1 h / 24 h / 7 d ranges from the history endpoint.
(function () {
  "use strict";
  const root = document.querySelector("[data-metrics-host]");
  if (!root) return;
  const { CHARTS, COLORS, LIVE_SECONDS, layout, CONFIG, connect, dates, rangeButtons, hasValue, availability } = window.GpuMetrics;
  const status = root.querySelector("[data-metrics-status]");
  const gpus = (root.dataset.gpus || "").split(",").filter((s) => s !== "").map(Number);
  const divs = {};
  root.querySelectorAll("[data-chart]").forEach((div) => { divs[div.dataset.chart] = div; });
  let range = "10m";
  let loading = false;
  let pending = [];
  const lastTs = new Map(); // gpu index -> last ts drawn
  const kept = new Map(); // gpu index -> ts drawn (10m: to trim)

  function draw(perGpu) { // {index: {ts: [], gpu_util: [], ...}}
    for (const [key, div] of Object.entries(divs)) {
      const traces = gpus.map((index, n) => {
        const data = perGpu[String(index)] || { ts: [] };
        return { x: dates(data.ts), y: data[key] || [], mode: "lines", name: `gpu${index}`,
          line: { color: COLORS[n % COLORS.length], width: 1.5 } };
      });
      const look = layout(key);
      look.showlegend = true;
      look.legend = { orientation: "h", y: -0.2 };
      look.height = 240;
      availability(div, traces.some((t) => t.x.length), traces.some((t) => hasValue(t.y)), look);
      Plotly.react(div, traces, look, CONFIG);
    }
    for (const index of gpus) {
      const ts = (perGpu[String(index)] || { ts: [] }).ts;
      kept.set(index, ts.slice());
      lastTs.set(index, ts.length ? ts[ts.length - 1] : -Infinity);
    }
    root.dataset.points = String([...kept.values()].reduce((n, ts) => n + ts.length, 0));
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

  function append(samples) {
    for (const s of samples) {
      const n = gpus.indexOf(s.gpu);
      if (n < 0 || s.ts <= (lastTs.get(s.gpu) ?? -Infinity)) continue;
      lastTs.set(s.gpu, s.ts);
      const ts = kept.get(s.gpu) || [];
      ts.push(s.ts);
      let keep;
      if (range === "10m") {
        while (ts.length && ts[0] < s.ts - LIVE_SECONDS) ts.shift();
        keep = ts.length;
      }
      kept.set(s.gpu, ts);
      const x = [[new Date(s.ts * 1000)]];
      for (const [key, div] of Object.entries(divs)) {
        if (keep === undefined) Plotly.extendTraces(div, { x, y: [[s[key]]] }, [n]);
        else Plotly.extendTraces(div, { x, y: [[s[key]]] }, [n], keep);
        const valued = div.data.some((t) => hasValue(t.y));
        if (div.dataset.unavailable !== String(!valued)) availability(div, true, valued);
      }
    }
    root.dataset.points = String([...kept.values()].reduce((n, ts) => n + ts.length, 0));
  }

  rangeButtons(root, async (name) => {
    range = name;
    loading = true;
    pending = [];
    try {
      const response = await fetch(`${root.dataset.historyUrl}?range=${encodeURIComponent(name)}`, { credentials: "same-origin" });
      if (!response.ok) throw new Error(`HTTP ${response.status}`);
      const body = await response.json();
      if (range === name) draw(body.gpus);
    } catch (error) {
      status.textContent = `could not load ${name}: ${error.message}`;
    } finally {
      if (range === name) { loading = false; append(pending); pending = []; }
    }
  });

  draw({});
  connect(root.dataset.wsPath, {
    onMessage: (message) => {
      if (message.type === "window") {
        if (range === "10m" && !loading) draw(fromSamples(message.gpus));
      } else if (message.type === "gpus") {
        if (loading) pending.push(...message.samples);
        else append(message.samples);
      }
    },
    onStatus: (text) => { status.textContent = text; },
  });
})();
