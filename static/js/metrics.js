// Live metric charts (Plotly, served locally). Shared helpers in window.GpuMetrics, and the
// instance charts of templates/metrics/instance_charts.html.
(function () {
  "use strict";
  if (window.GpuMetrics) return; // included twice on one page: once is enough

  const CHARTS = {
    gpu_util: { title: "GPU utilization", unit: "%", range: [0, 100] },
    mem_used_mib: { title: "GPU memory", unit: "MiB", total: "mem_total_mib" },
    temperature_c: { title: "Temperature", unit: "°C" },
    power_w: { title: "Power", unit: "W" },
  };
  const LIVE_SECONDS = 600;
  const COLORS = ["#4f46e5", "#0891b2", "#16a34a", "#d97706", "#dc2626", "#7c3aed", "#db2777", "#475569"];

  function wsUrl(path) {
    return (location.protocol === "https:" ? "wss://" : "ws://") + location.host + path;
  }

  function layout(key) {
    const chart = CHARTS[key];
    return {
      title: { text: chart.title, font: { size: 13 }, x: 0.02, xanchor: "left" },
      height: 220,
      margin: { l: 48, r: 12, t: 30, b: 32 },
      showlegend: false,
      xaxis: { type: "date", showgrid: false },
      yaxis: { title: { text: chart.unit }, range: chart.range, rangemode: "tozero", fixedrange: true },
      paper_bgcolor: "rgba(0,0,0,0)",
      plot_bgcolor: "rgba(0,0,0,0)",
      font: { family: "system-ui, sans-serif", size: 11, color: "#17202c" },
    };
  }

  const CONFIG = { displayModeBar: false, responsive: true };

  // A chart with samples but no value in them (NVML has no utilization for a MIG device, say)
  // says "not available" rather than showing an empty or flat chart.
  const NOT_AVAILABLE = [{ text: "not available", xref: "paper", yref: "paper", x: 0.5, y: 0.5,
    showarrow: false, font: { size: 13, color: "#64748b" } }];

  function hasValue(values) {
    return (values || []).some((v) => v !== null && v !== undefined);
  }

  // Show or clear a chart's "not available" note; `look` is a layout about to be drawn.
  function availability(div, samples, valued, look) {
    const missing = samples && !valued;
    div.dataset.unavailable = String(missing);
    if (look) look.annotations = missing ? NOT_AVAILABLE : [];
    else Plotly.relayout(div, { annotations: missing ? NOT_AVAILABLE : [] });
  }

  // A socket that comes back after a drop (1 s, 2 s, … up to 15 s), unless it was refused.
  function connect(path, { onMessage, onStatus }) {
    let delay = 1000;
    let stopped = false;
    function open() {
      const socket = new WebSocket(wsUrl(path));
      let opened = false;
      socket.onopen = () => { opened = true; delay = 1000; onStatus("live"); };
      socket.onmessage = (event) => onMessage(JSON.parse(event.data));
      socket.onclose = (event) => {
        if (stopped) return;
        if (event.code === 4403 || event.code === 4404) { onStatus("not allowed"); return; }
        // A refused handshake looks like a dropped connection to a browser (1006): retry slowly.
        onStatus(opened ? "reconnecting…" : "cannot connect; retrying…");
        setTimeout(open, delay);
        delay = Math.min(delay * 2, 15000);
      };
    }
    open();
    return { stop: () => { stopped = true; } };
  }

  function dates(values) {
    return values.map((ts) => new Date(ts * 1000));
  }

  function rangeButtons(root, onChange) {
    root.querySelectorAll("[data-range]").forEach((button) => {
      button.addEventListener("click", () => {
        root.querySelectorAll("[data-range]").forEach((b) => b.setAttribute("aria-pressed", String(b === button)));
        onChange(button.dataset.range);
      });
    });
  }

  // One instance: four charts, each a mean line with its min-max band (+ total for memory).
  class InstanceCharts {
    constructor(root) {
      this.root = root;
      this.range = "10m";
      this.lastTs = -Infinity;
      this.ts = [];
      this.loading = false;
      this.pending = [];
      this.status = root.querySelector("[data-metrics-status]");
      this.divs = {};
      root.querySelectorAll("[data-chart]").forEach((div) => { this.divs[div.dataset.chart] = div; });
      rangeButtons(root, (name) => this.setRange(name));
      this.draw({ ts: [] });
      this.socket = connect(root.dataset.wsPath, {
        onMessage: (message) => this.onMessage(message),
        onStatus: (text) => { this.status.textContent = text; },
      });
    }

    traces(key, data) {
      const x = dates(data.ts);
      const mean = data[key] || [];
      const color = COLORS[0];
      const traces = [
        { x, y: mean, mode: "lines", name: CHARTS[key].title, line: { color, width: 1.8 }, connectgaps: false },
        { x, y: data[key + "_max"] || mean, mode: "lines", line: { width: 0 }, hoverinfo: "skip" },
        { x, y: data[key + "_min"] || mean, mode: "lines", line: { width: 0 }, fill: "tonexty", fillcolor: "rgba(79,70,229,.15)", hoverinfo: "skip" },
      ];
      if (CHARTS[key].total) {
        traces.push({ x, y: data[CHARTS[key].total] || [], mode: "lines", name: "total", line: { color: "#94a3b8", dash: "dot", width: 1 } });
      }
      return traces;
    }

    draw(data) {
      this.ts = (data.ts || []).slice();
      this.lastTs = this.ts.length ? this.ts[this.ts.length - 1] : -Infinity;
      for (const [key, div] of Object.entries(this.divs)) {
        const look = layout(key);
        availability(div, this.ts.length > 0, hasValue(data[key]), look);
        Plotly.react(div, this.traces(key, data), look, CONFIG);
      }
      this.mark();
    }

    mark() {
      this.root.dataset.points = String(this.ts.length);
      this.root.dataset.lastTs = String(this.lastTs);
    }

    // New samples, in ts order, at the end of every chart.
    append(samples) {
      const fresh = samples.filter((s) => s.ts > this.lastTs).sort((a, b) => a.ts - b.ts);
      if (!fresh.length) return;
      this.lastTs = fresh[fresh.length - 1].ts;
      for (const s of fresh) this.ts.push(s.ts);
      let keep;
      if (this.range === "10m") {
        const oldest = this.lastTs - LIVE_SECONDS;
        while (this.ts.length && this.ts[0] < oldest) this.ts.shift();
        keep = this.ts.length;
      }
      const x = dates(fresh.map((s) => s.ts));
      for (const [key, div] of Object.entries(this.divs)) {
        const y = fresh.map((s) => s[key]);
        const update = { x: [x, x, x], y: [y, y, y] };
        const indices = [0, 1, 2];
        if (CHARTS[key].total) {
          update.x.push(x);
          update.y.push(fresh.map((s) => s[CHARTS[key].total]));
          indices.push(3);
        }
        if (keep === undefined) Plotly.extendTraces(div, update, indices);
        else Plotly.extendTraces(div, update, indices, keep);
        const valued = hasValue(div.data[0].y);
        if (div.dataset.unavailable !== String(!valued)) availability(div, true, valued);
      }
      this.mark();
    }

    onMessage(message) {
      if (message.type === "window") { // on every (re)connection
        if (this.loading) this.pending.push(...message.samples);
        else if (this.range === "10m") this.draw(columns(message.samples));
        else this.append(message.samples);
      } else if (message.type === "sample") {
        if (this.loading) this.pending.push(message);
        else this.append([message]);
      }
    }

    async setRange(name) {
      this.range = name;
      this.loading = true;
      this.pending = [];
      try {
        const response = await fetch(`${this.root.dataset.historyUrl}?range=${encodeURIComponent(name)}`, {
          headers: { Accept: "application/json" },
          credentials: "same-origin",
        });
        if (!response.ok) throw new Error(`HTTP ${response.status}`);
        if (this.range !== name) return; // another range was chosen meanwhile
        this.draw(await response.json());
      } catch (error) {
        this.status.textContent = `could not load ${name}: ${error.message}`;
      } finally {
        if (this.range === name) {
          this.loading = false;
          this.append(this.pending);
          this.pending = [];
        }
      }
    }
  }

  // Samples (objects) as the columns that `draw` takes.
  function columns(samples) {
    const data = { ts: [] };
    for (const key of Object.keys(CHARTS)) { data[key] = []; data[key + "_min"] = []; data[key + "_max"] = []; }
    data.mem_total_mib = [];
    for (const s of samples) {
      data.ts.push(s.ts);
      for (const key of Object.keys(CHARTS)) {
        data[key].push(s[key]);
        data[key + "_min"].push(s[key]);
        data[key + "_max"].push(s[key]);
      }
      data.mem_total_mib.push(s.mem_total_mib);
    }
    return data;
  }

  window.GpuMetrics = { CHARTS, COLORS, LIVE_SECONDS, layout, CONFIG, connect, dates, rangeButtons, wsUrl, hasValue, availability };

  function start() {
    document.querySelectorAll("[data-metrics-instance]").forEach((root) => {
      if (!root.metricsCharts) root.metricsCharts = new InstanceCharts(root);
    });
  }
  if (document.readyState === "loading") document.addEventListener("DOMContentLoaded", start);
  else start();
})();
