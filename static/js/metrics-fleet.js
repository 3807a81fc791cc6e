// The operators' heatmap: every GPU's utilization by host (rows) and GPU index (columns), live
// over /ws/fleet/metrics/; unhealthy GPUs marked ✕; a click on a row opens the host's charts.
(function () {
  "use strict";
  const div = document.querySelector("[data-fleet-heatmap]");
  if (!div) return;
  const status = document.querySelector("[data-metrics-status]");
  const tbody = document.querySelector("[data-fleet-hosts]");
  const { connect, CONFIG } = window.GpuMetrics;

  let hosts = []; // [{id, name, status, gpus: [{index, healthy}]}]
  const cells = new Map(); // "host:gpu" -> {gpu_util, healthy, ts, ...}
  let dirty = false;

  function key(host, gpu) { return `${host}:${gpu}`; }

  function setFleet(message) {
    hosts = message.hosts;
    for (const host of hosts) {
      for (const gpu of host.gpus) {
        const k = key(host.id, gpu.index);
        if (!cells.has(k)) cells.set(k, { gpu_util: null, healthy: gpu.healthy });
      }
    }
    for (const s of message.latest || []) cells.set(key(s.host, s.gpu), s);
    dirty = true;
  }

  function addSamples(message) {
    for (const s of message.samples) cells.set(key(message.host, s.gpu), s);
    dirty = true;
  }

  function draw() {
    if (!dirty) return;
    dirty = false;
    const width = Math.max(1, ...hosts.map((h) => h.gpus.length ? Math.max(...h.gpus.map((g) => g.index)) + 1 : 1));
    const columns = Array.from({ length: width }, (_, i) => `gpu${i}`);
    const rows = hosts.map((h) => h.name);
    const z = [], text = [], badX = [], badY = [];
    let reporting = 0, sum = 0, unhealthy = 0;
    const perHost = [];
    for (const host of hosts) {
      const row = new Array(width).fill(null);
      const labels = new Array(width).fill("");
      let hostSum = 0, hostCount = 0, hostBad = 0;
      for (const gpu of host.gpus) {
        const cell = cells.get(key(host.id, gpu.index)) || {};
        const util = cell.gpu_util;
        row[gpu.index] = util === undefined ? null : util;
        labels[gpu.index] = `${host.name} gpu${gpu.index}<br>util ${util ?? "–"} %` +
          (cell.mem_used_mib != null ? `<br>mem ${cell.mem_used_mib} / ${cell.mem_total_mib} MiB` : "") +
          (cell.temperature_c != null ? `<br>${cell.temperature_c} °C` : "") +
          (cell.power_w != null ? ` · ${cell.power_w} W` : "");
        if (util != null) { reporting += 1; sum += util; hostSum += util; hostCount += 1; }
        if (cell.healthy === false) { unhealthy += 1; hostBad += 1; badX.push(`gpu${gpu.index}`); badY.push(host.name); }
      }
      z.push(row);
      text.push(labels);
      perHost.push({ host, mean: hostCount ? hostSum / hostCount : null, bad: hostBad });
    }
    const data = [
      { type: "heatmap", x: columns, y: rows, z, text, hoverinfo: "text", zmin: 0, zmax: 100,
        colorscale: "Viridis", colorbar: { title: { text: "%" } }, xgap: 2, ygap: 2 },
      { type: "scatter", mode: "text", x: badX, y: badY, text: badX.map(() => "✕"), hoverinfo: "skip",
        textfont: { color: "#dc2626", size: 18 } },
    ];
    const layout = {
      height: Math.max(220, 60 + 28 * rows.length),
      margin: { l: 120, r: 20, t: 10, b: 40 },
      yaxis: { autorange: "reversed", type: "category" },
      xaxis: { type: "category", side: "bottom" },
      paper_bgcolor: "rgba(0,0,0,0)",
      showlegend: false,
    };
    Plotly.react(div, data, layout, CONFIG);
    div.dataset.reporting = String(reporting);
    div.dataset.unhealthy = String(unhealthy);
    document.querySelector("[data-stat=gpus]").textContent = String(reporting);
    document.querySelector("[data-stat=mean]").textContent = reporting ? `${(sum / reporting).toFixed(1)} %` : "–";
    document.querySelector("[data-stat=unhealthy]").textContent = String(unhealthy);
    tbody.replaceChildren(...perHost.map(({ host, mean, bad }) => {
      const tr = document.createElement("tr");
      const link = document.createElement("a");
      link.href = `/metrics/hosts/${host.id}/`;
      link.textContent = host.name;
      const cellsOf = [link, badge(host.status), String(host.gpus.length),
        mean == null ? "–" : `${mean.toFixed(1)} %`, bad ? badge("unhealthy", String(bad)) : "0"];
      cellsOf.forEach((content, i) => {
        const td = document.createElement("td");
        if (i >= 2) td.className = "num";
        td.append(content);
        tr.append(td);
      });
      return tr;
    }));
    if (!perHost.length) tbody.innerHTML = '<tr><td colspan="5" class="empty">No hosts yet.</td></tr>';
  }

  function badge(state, label) {
    const span = document.createElement("span");
    span.className = `badge badge-${state}`;
    span.textContent = label || state;
    return span;
  }

  connect("/ws/fleet/metrics/", {
    onMessage: (message) => {
      if (message.type === "fleet") setFleet(message);
      else if (message.type === "gpus") addSamples(message);
    },
    onStatus: (text) => { status.textContent = text; },
  });

  // Redraw at most once a second, however many hosts report.
  setInterval(draw, 1000);
  const first = setInterval(() => {
    if (!div.on) return;
    clearInterval(first);
    div.on("plotly_click", (event) => {
      const point = event.points && event.points[0];
      const host = point && hosts.find((h) => h.name === point.y);
      if (host) location.href = `/metrics/hosts/${host.id}/`;
    });
  }, 200);
})();
