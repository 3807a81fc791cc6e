// The instance page's Logs panel: the workload's last lines, fetched from the API every 2 s
// (most recent last; it stays scrolled to the end unless the reader scrolled up).
(() => {
  "use strict";
  const panel = document.querySelector("[data-logs]");
  if (!panel) return;
  const lines = panel.querySelector("[data-logs-lines]");
  const status = panel.querySelector("[data-logs-status]");
  const PERIOD = 2000;

  function show(text, note) {
    const atEnd = lines.scrollTop + lines.clientHeight >= lines.scrollHeight - 4;
    if (text !== null && lines.textContent !== text) {
      lines.textContent = text;
      if (atEnd) lines.scrollTop = lines.scrollHeight;
    }
    status.textContent = note;
  }

  function poll() {
    if (document.hidden) {
      setTimeout(poll, PERIOD);
      return;
    }
    fetch(panel.dataset.logsUrl, { credentials: "same-origin", headers: { Accept: "application/json" } })
      .then((response) => response.json().then((body) => ({ response, body })))
      .then(({ response, body }) => {
        if (response.ok) {
          show(body.lines.length ? body.lines.join("\n") : "No output yet.", "· live");
        } else if (response.status === 404) {
          show("Deleted with the instance.", "");
          return; // terminated: nothing more will come
        } else {
          show(null, `· ${body.detail || "not available now"}`);
        }
        setTimeout(poll, PERIOD);
      })
      .catch(() => {
        show(null, "· reconnecting…");
        setTimeout(poll, PERIOD);
      });
  }

  poll();
})();
