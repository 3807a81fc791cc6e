// The instance page's Terminal panel (xterm.js, vendored in static/vendor/xterm) over
// /ws/instances/{id}/terminal/: keystrokes go out as binary frames, the shell's bytes come
// back the same way, and a {"type": "resize"} text frame follows the panel's size. Until the
// first connect, the screen holds a Connect prompt.
// Also the Access card's Copy button (delegated: the card is re-rendered live).
(() => {
  "use strict";
  document.addEventListener("click", async (event) => {
    const button = event.target.closest("[data-copy-from]");
    if (!button) return;
    await navigator.clipboard.writeText(document.querySelector(button.dataset.copyFrom).textContent.trim());
    button.textContent = "Copied";
  });

  const panel = document.querySelector("[data-terminal]");
  if (!panel || !window.Terminal) return;
  const screen = panel.querySelector("[data-terminal-screen]");
  const status = panel.querySelector("[data-terminal-status]");
  const buttons = panel.querySelectorAll("[data-terminal-connect]");
  const button = panel.querySelector(".card-title [data-terminal-connect]");
  const prompt = panel.querySelector("[data-terminal-prompt]");
  const REASONS = {
    4403: "your role cannot open a terminal",
    4404: "not running on its host",
    4409: "the instance is not running",
    4502: "its host is not answering",
  };
  // A console that restarts (1012) or a socket that drops: connect again by itself, with the
  // same session id, and the agent gives back the same shell if it is still kept (60 s).
  const COME_BACK = new Set([1006, 1011, 1012, 4502]);
  const session = sessionId();
  let term = null;
  let fit = null;
  let socket = null;
  let retries = 0;

  function sessionId() {
    const name = `terminal-session:${panel.dataset.terminalUrl}`;
    let id = sessionStorage.getItem(name);
    if (!id) {
      const bytes = crypto.getRandomValues(new Uint8Array(16));
      id = Array.from(bytes, (b) => b.toString(16).padStart(2, "0")).join("");
      sessionStorage.setItem(name, id);
    }
    return id;
  }

  function sendSize() {
    if (socket && socket.readyState === WebSocket.OPEN) {
      socket.send(JSON.stringify({ type: "resize", cols: term.cols, rows: term.rows }));
    }
  }

  function connect() {
    if (prompt) prompt.remove(); // the screen is the shell's from now on
    if (!term) {
      term = new window.Terminal({ cursorBlink: true, convertEol: false, scrollback: 5000 });
      fit = new window.FitAddon.FitAddon();
      term.loadAddon(fit);
      term.open(screen);
      const encoder = new TextEncoder();
      term.onData((data) => {
        if (socket && socket.readyState === WebSocket.OPEN) socket.send(encoder.encode(data));
      });
      term.onBinary((data) => {
        if (socket && socket.readyState === WebSocket.OPEN) {
          socket.send(Uint8Array.from(data, (c) => c.charCodeAt(0)));
        }
      });
      window.addEventListener("resize", () => {
        fit.fit();
        sendSize();
      });
    }
    fit.fit();
    const scheme = location.protocol === "https:" ? "wss" : "ws";
    const url = `${scheme}://${location.host}${panel.dataset.terminalUrl}?cols=${term.cols}&rows=${term.rows}&session=${session}`;
    socket = new WebSocket(url);
    socket.binaryType = "arraybuffer";
    status.textContent = "· connecting…";
    buttons.forEach((b) => { b.disabled = true; });
    socket.addEventListener("open", () => {
      retries = 0;
      status.textContent = "· connected";
      term.focus();
    });
    socket.addEventListener("message", (event) => {
      term.write(typeof event.data === "string" ? event.data : new Uint8Array(event.data));
    });
    socket.addEventListener("close", (event) => {
      socket = null;
      if (COME_BACK.has(event.code) && retries < 8) {
        retries += 1;
        status.textContent = "· reconnecting…";
        setTimeout(connect, Math.min(1000 * 2 ** (retries - 1), 15000));
        return;
      }
      const why = REASONS[event.code] || event.reason || (event.code === 1000 ? "the shell ended" : "disconnected");
      status.textContent = `· closed: ${why}`;
      buttons.forEach((b) => { b.disabled = false; });
      button.textContent = "Reconnect";
    });
  }

  buttons.forEach((b) => b.addEventListener("click", connect));
})();
