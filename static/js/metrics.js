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
  const RANGE_SECONDS = { "10m": 600, "1h": 3600, "24h": 86400, "7d": 7 * 86400 };
  // Live samples come every second: a longer silence (a stopped instance, a host away) is a
  // gap in the line, never a straight line across it. Coarser history allows three points.
  const GAP_SECONDS = 10;
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

  function note(text) {
    return [{ text, xref: "paper", yref: "paper", x: 0.5, y: 0.5, showarrow: false,
      font: { size: 13, color: "#64748b" } }];
  }
  // A chart with no samples yet says so over the time range it covers (Plotly alone would show
  // an empty year 2000); one with samples but no value in them (NVML has no utilization for a
  // MIG device, say) says "not available" rather than showing an empty or flat chart.
  const NO_DATA = note("no data yet");
  const NOT_AVAILABLE = note("not available");

  function hasValue(values) {
    return (values || []).some((v) => v !== null && v !== undefined);
  }

  // Show or clear a chart's note; `look` is a layout about to be drawn, `span` the [from, to]
  // (epoch seconds) that an empty chart covers.
  function availability(div, samples, valued, look, span) {
    const missing = samples && !valued;
    const empty = !samples;
    const wasEmpty = div.dataset.empty === "true";
    div.dataset.unavailable = String(missing);
    div.dataset.empty = String(empty);
    const annotations = empty ? NO_DATA : missing ? NOT_AVAILABLE : [];
    if (look) {
      look.annotations = annotations;
      if (empty && span) {
        look.xaxis.range = dates(span);
        look.xaxis.autorange = false;
        look.yaxis.showticklabels = Boolean(look.yaxis.range);
      }
    } else if (wasEmpty && !empty) { // the first samples of a chart drawn empty: fit them
      Plotly.relayout(div, { annotations, "xaxis.autorange": true, "yaxis.showticklabels": true });
    } else {
      Plotly.relayout(div, { annotations });
    }
  }

  // The longest step between two points of a line drawn at `resolution` seconds (0: live).
  function gapAfter(resolution) {
    return Math.max(GAP_SECONDS, 3 * (resolution || 0));
  }

  // `data` (columns: ts and one array per field) with a null point between any two samples
  // further apart than `gap` seconds; `after` is the ts of the point drawn just before.
  function withGaps(data, gap, after = -Infinity) {
    const ts = data.ts || [];
    const keys = Object.keys(data).filter((k) => k !== "ts" && Array.isArray(data[k]) && data[k].length === ts.length);
    const out = { ts: [] };
    for (const key of keys) out[key] = [];
    let previous = after;
    ts.forEach((t, i) => {
      if (Number.isFinite(previous) && t - previous > gap) {
        out.ts.push((t + previous) / 2);
        for (const key of keys) out[key].push(null);
      }
      out.ts.push(t);
      for (const key of keys) out[key].push(data[key][i]);
      previous = t;
    });
    return out;
  }

  // Calls `apply` with everything pushed since its last call, once per animation frame and at
  // most every `interval` ms: a chart is redrawn once per batch however many samples arrive,
  // and not at all while the tab is hidden. What waits is bounded (the oldest is dropped).
  function batcher(apply, interval = 0, most = 20000) {
    let queue = [];
    let scheduled = false;
    let last = -Infinity;
    function frame(now) {
      scheduled = false;
      if (now - last < interval) { schedule(interval - (now - last)); return; }
      last = now;
      const items = queue;
      queue = [];
      if (items.length) apply(items);
    }
    function schedule(wait) {
      if (scheduled) return;
      scheduled = true;
      if (wait > 0) setTimeout(() => requestAnimationFrame(frame), wait);
      else requestAnimationFrame(frame);
    }
    return {
      push(items) {
        queue.push(...items);
        if (queue.length > most) queue = queue.slice(queue.length - most);
        schedule(0);
      },
      clear() { queue = []; },
    };
  }

  // A socket that comes back after a drop (1 s, 2 s, … up to 15 s), unless it was refused.
  function connect(path, { onMessage, onStatus }) {
    let delay = 1000;
    let stopped = false;
    let socket = null;
    function open() {
      socket = new WebSocket(wsUrl(path));
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
    return { stop: () => { stopped = true; socket.close(); } };
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
  // An instance that has ended (data-ended) shows its history and opens no socket.
  class InstanceCharts {
    constructor(root) {
      this.root = root;
      this.range = "10m";
      this.lastTs = -Infinity;
      this.ts = [];
      this.loading = false;
      this.pending = [];
      this.gap = gapAfter(0);
      this.status = root.querySelector("[data-metrics-status]");
      this.divs = {};
      root.querySelectorAll("[data-chart]").forEach((div) => { this.divs[div.dataset.chart] = div; });
      rangeButtons(root, (name) => this.setRange(name));
      this.batch = batcher((samples) => this.append(samples));
      const now = Date.now() / 1000;
      this.draw({ ts: [], from: now - LIVE_SECONDS, to: now });
      if (root.dataset.ended === "true") {
        this.status.textContent = "ended · not live";
        this.setRange(this.range);
        return;
      }
      this.socket = connect(root.dataset.wsPath, {
        onMessage: (message) => this.onMessage(message),
        onStatus: (text) => { this.status.textContent = text; },
      });
    }

    // The instance was terminated while the page was open: no more samples will come.
    end() {
      if (this.socket) this.socket.stop();
      this.socket = null;
      this.root.dataset.ended = "true";
      this.status.textContent = "ended · not live";
    }

    traces(key, data) {
      const x = dates(data.ts);
      const mean = data[key] || [];
      const color = COLORS[0];
      const traces = [
        { x, y: mean, mode: "lines", name: CHARTS[key].title, line: { color, width: 1.8 }, connectgaps: false },
        { x, y: data[key + "_max"] || mean, mode: "lines", line: { width: 0 }, hoverinfo: "skip", connectgaps: false },
        { x, y: data[key + "_min"] || mean, mode: "lines", line: { width: 0 }, fill: "tonexty", fillcolor: "rgba(79,70,229,.15)", hoverinfo: "skip", connectgaps: false },
      ];
      if (CHARTS[key].total) {
        traces.push({ x, y: data[CHARTS[key].total] || [], mode: "lines", name: "total", line: { color: "#94a3b8", dash: "dot", width: 1 }, connectgaps: false });
      }
      return traces;
    }

    // `data`: columns, and the [from, to] it covers (an empty chart shows that span).
    draw(data) {
      this.ts = (data.ts || []).slice();
      this.lastTs = this.ts.length ? this.ts[this.ts.length - 1] : -Infinity;
      this.gap = gapAfter(data.resolution_seconds);
      const drawn = withGaps(data, this.gap);
      for (const [key, div] of Object.entries(this.divs)) {
        const look = layout(key);
        availability(div, this.ts.length > 0, hasValue(data[key]), look, [data.from, data.to]);
        Plotly.react(div, this.traces(key, drawn), look, CONFIG);
      }
      this.mark();
    }

    mark() {
      this.root.dataset.points = String(this.ts.length);
      this.root.dataset.lastTs = String(this.lastTs);
    }

    // New samples, in ts order, at the end of every chart: one update of each per batch.
    append(samples) {
      const fresh = samples.filter((s) => s.ts > this.lastTs).sort((a, b) => a.ts - b.ts);
      if (!fresh.length) return;
      const after = this.lastTs;
      this.lastTs = fresh[fresh.length - 1].ts;
      for (const s of fresh) this.ts.push(s.ts);
      const oldest = this.lastTs - RANGE_SECONDS[this.range];
      while (this.ts.length && this.ts[0] < oldest) this.ts.shift();
      const data = columns(fresh);
      const drawn = withGaps(data, this.gap, after);
      const x = dates(drawn.ts);
      for (const [key, div] of Object.entries(this.divs)) {
        const y = drawn[key];
        const update = { x: [x, x, x], y: [y, y, y] };
        const indices = [0, 1, 2];
        if (CHARTS[key].total) {
          update.x.push(x);
          update.y.push(drawn[CHARTS[key].total]);
          indices.push(3);
        }
        const kept = div.data[0].x.filter((d) => d >= oldest * 1000).length + x.length;
        Plotly.extendTraces(div, update, indices, kept);
        const valued = (div.dataset.empty !== "true" && div.dataset.unavailable !== "true") || hasValue(y);
        if (div.dataset.empty === "true" || div.dataset.unavailable !== String(!valued)) availability(div, true, valued);
      }
      this.mark();
    }

    onMessage(message) {
      if (message.type === "window") { // on every (re)connection
        const now = Date.now() / 1000;
        if (this.loading) this.pending.push(...message.samples);
        else if (this.range === "10m") {
          this.batch.clear();
          this.draw({ ...columns(message.samples), from: now - message.window_seconds, to: now });
        } else this.batch.push(message.samples);
      } else if (message.type === "sample") {
        if (this.loading) this.pending.push(message);
        else this.batch.push([message]);
      }
    }

    async setRange(name) {
      this.range = name;
      this.loading = true;
      this.pending = [];
      this.batch.clear();
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
          this.batch.push(this.pending);
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

  window.GpuMetrics = {
    CHARTS, COLORS, LIVE_SECONDS, RANGE_SECONDS, layout, CONFIG, connect, dates, rangeButtons, wsUrl,
    hasValue, availability, gapAfter, withGaps, batcher,
  };

  function start() {
    document.querySelectorAll("[data-metrics-instance]").forEach((root) => {
      if (!root.metricsCharts) root.metricsCharts = new InstanceCharts(root);
    });
  }
  if (document.readyState === "loading") document.addEventListener("DOMContentLoaded", start);
  else start();
})();
