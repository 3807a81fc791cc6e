// Usage page: the daily spend chart (Plotly, served locally). Amounts arrive as decimal
// strings; they become numbers only to be drawn.
(function () {
  "use strict";
  document.addEventListener("DOMContentLoaded", () => {
    const target = document.getElementById("usage-chart");
    const source = document.getElementById("usage-daily");
    if (!target || !source || !window.Plotly) return;
    const days = JSON.parse(source.textContent);
    const x = days.map((day) => day.date);
    const daily = days.map((day) => Number(day.amount));
    let running = 0;
    const cumulative = daily.map((amount) => (running += amount));
    const traces = [
      { type: "bar", name: "Daily", x, y: daily, marker: { color: "#4f46e5" },
        hovertemplate: "%{x|%b %d}: %{y:.2f}<extra></extra>" },
      { type: "scatter", mode: "lines", name: "Month to date", x, y: cumulative, yaxis: "y2",
        line: { color: "#d97706", width: 2 }, hovertemplate: "to date: %{y:.2f}<extra></extra>" },
    ];
    const layout = {
      height: 260,
      margin: { l: 52, r: 52, t: 10, b: 36 },
      legend: { orientation: "h", y: 1.12, x: 0 },
      xaxis: { type: "date", tickformat: "%b %d", showgrid: false },
      yaxis: { title: { text: "per day" }, rangemode: "tozero", fixedrange: true },
      yaxis2: { title: { text: "to date" }, overlaying: "y", side: "right", rangemode: "tozero", showgrid: false, fixedrange: true },
      paper_bgcolor: "rgba(0,0,0,0)",
      plot_bgcolor: "rgba(0,0,0,0)",
      font: { family: "system-ui, sans-serif", size: 11, color: "#17202c" },
      bargap: 0.25,
    };
    window.Plotly.newPlot(target, traces, layout, { displayModeBar: false, responsive: true });
    target.dataset.rendered = "true";
  });
})();
