// Live instance states on the instance list and detail pages, from the /ws/events/ socket.
// Every state change of the tenant's instances arrives as {"type": "instance.state", ...}.
(() => {
  "use strict";
  const list = document.querySelector("[data-live-list]");
  const statusMarks = document.querySelectorAll("[data-live-status]");
  let delay = 500;
  let refreshing = 0;

  function setStatus(live) {
    statusMarks.forEach((mark) => {
      if ("ended" in mark.dataset) return;
      mark.textContent = live ? "● live" : "○ reconnecting…";
      mark.title = live ? "live updates" : "live updates paused; reconnecting";
    });
  }

  // What on the detail page outside the live part depends on the state: the terminal (a
  // shell only while it runs; kept out of the refreshed part, so that a refresh does not cut
  // an open shell).
  function followState(state) {
    const terminal = document.querySelector("[data-terminal]");
    if (terminal) terminal.hidden = state !== "running";
  }

  // Fetch the page again and swap in the freshest copy of `selector` (no reload); `then`
  // gets the fresh copy.
  function refresh(selector, url, then) {
    const ticket = ++refreshing;
    fetch(url, { headers: { "X-Requested-With": "fetch" }, credentials: "same-origin" })
      .then((response) => (response.ok ? response.text() : Promise.reject(response.status)))
      .then((html) => {
        if (ticket !== refreshing) return; // a later refresh is on its way
        const fresh = new DOMParser().parseFromString(html, "text/html").querySelector(selector);
        const current = document.querySelector(selector);
        if (fresh && current) {
          current.replaceWith(fresh);
          if (then) then(fresh);
        }
      })
      .catch(() => {});
  }

  function refreshDetail() {
    // the state as the server renders it now: it also covers what changed before the
    // events socket was open (an instance that ran before its page listened)
    refresh("[data-live-detail]", `${location.pathname}?partial=1`, (fresh) => followState(fresh.dataset.state));
  }

  function refreshList() {
    refresh("[data-live-list] tbody", location.href);
  }

  function applyToList(instance) {
    const row = list.querySelector(`tr[data-instance-id="${instance.id}"]`);
    if (!row) {
      refreshList(); // a new instance (launched elsewhere): let the server render its row
      return;
    }
    const badge = row.querySelector("[data-role=state]");
    badge.className = `badge badge-${instance.state}`;
    badge.textContent = instance.state;
    const reason = row.querySelector("[data-role=reason]");
    if (reason) {
      const show = ["pending", "failed", "stopped", "unreachable"].includes(instance.state);
      reason.textContent = show ? instance.reason_text : "";
    }
  }

  function apply(instance) {
    if (list) applyToList(instance);
    const detail = document.querySelector("[data-live-detail]");
    if (detail && detail.dataset.instanceId === String(instance.id)) {
      followState(instance.state);
      if (instance.state === "terminated") {
        statusMarks.forEach((mark) => {
          mark.dataset.ended = "";
          mark.textContent = "○ ended · not live";
          mark.title = "a terminated instance changes no more";
        });
        const charts = document.querySelector("[data-metrics-instance]");
        if (charts && charts.metricsCharts) charts.metricsCharts.end();
      }
      const badge = detail.querySelector("[data-role=state]");
      if (badge) {
        badge.className = `badge badge-${instance.state}`;
        badge.textContent = instance.state;
      }
      refreshDetail(); // events, actions and reason follow
    }
  }

  function catchUp() {
    // whatever changed before the socket was open
    if (list) refreshList();
    if (document.querySelector("[data-live-detail]")) refreshDetail();
  }

  function connect() {
    const scheme = location.protocol === "https:" ? "wss" : "ws";
    const socket = new WebSocket(`${scheme}://${location.host}/ws/events/`);
    socket.addEventListener("open", () => {
      delay = 500;
      setStatus(true);
      catchUp();
    });
    socket.addEventListener("message", (event) => {
      let message;
      try {
        message = JSON.parse(event.data);
      } catch {
        return;
      }
      if (message.type === "instance.state") apply(message.instance);
    });
    socket.addEventListener("close", (event) => {
      setStatus(false);
      if (event.code === 4403) return; // not allowed: do not hammer the server
      setTimeout(connect, delay);
      delay = Math.min(delay * 2, 15000);
    });
  }

  window.gpucloudLive = { apply }; // for tests and other scripts
  // A terminated instance's page has nothing more to hear.
  if (list || [...statusMarks].some((mark) => !("ended" in mark.dataset))) connect();
})();
