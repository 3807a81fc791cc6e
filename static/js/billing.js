// Usage page: the daily spend chart (Plotly, served locally). Amounts arrive as decimal
// strings; they become numbers only to be drawn.
(function () {
  "use strict";
  document.addEventListener("DOMContentLoaded", () => {
    const target = document.getElementById("usage-chart");
    const source = document.getElementById("usage-daily");
    if (!target || !source || !window.Plotly) return;
    const days = JSON.parse(source.textContent);
    if (!days.length) return;
    const x = days.map((day) => day.date);
    const daily = days.map((day) => Number(day.amount));
    let running = 0;
    const cumulative = daily.map((amount) => (running += amount));
    const DAY = 86400000;
    // The whole month on the axis, one tick a day, so that its first day is one bar of one day
    // (Plotly alone stretches a lone bar over two days and labels it twice).
    const [year, month] = x[0].split("-").map(Number);
    const last = new Date(Date.UTC(year, month, 0)).getUTCDate();
    const at = (ms) => new Date(ms).toISOString().slice(0, 19).replace("T", " ");
    const first = Date.UTC(year, month - 1, 1);
    const monthName = new Date(first).toLocaleString("en", { month: "long", year: "numeric", timeZone: "UTC" });
    const traces = [
      { type: "bar", name: "Daily", x, y: daily, width: 0.7 * DAY, marker: { color: "#4f46e5" },
        hovertemplate: "%{x|%b %d}: %{y:.2f}<extra></extra>" },
      { type: "scatter", mode: days.length === 1 ? "lines+markers" : "lines", name: "Month to date", x, y: cumulative, yaxis: "y2",
        line: { color: "#d97706", width: 2 }, marker: { size: 8 }, hovertemplate: "to date: %{y:.2f}<extra></extra>" },
    ];
    const layout = {
      height: 260,
      margin: { l: 52, r: 52, t: 10, b: 44 },
      legend: { orientation: "h", y: 1.12, x: 0 },
      xaxis: { type: "date", tickformat: "%-d", dtick: DAY, tick0: at(first), showgrid: false, fixedrange: true,
        range: [at(first - DAY / 2), at(first + (last - 1) * DAY + DAY / 2)], title: { text: monthName, standoff: 6 } },
      yaxis: { title: { text: "per day" }, rangemode: "tozero", fixedrange: true },
      yaxis2: { title: { text: "to date" }, overlaying: "y", side: "right", rangemode: "tozero", showgrid: false, fixedrange: true },
      paper_bgcolor: "rgba(0,0,0,0)",
      plot_bgcolor: "rgba(0,0,0,0)",
      font: { family: "system-ui, sans-serif", size: 11, color: "#17202c" },
    };
    window.Plotly.newPlot(target, traces, layout, { displayModeBar: false, responsive: true });
    target.dataset.rendered = "true";
  });
})();
