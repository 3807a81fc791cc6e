// The instance page's Terminal panel (xterm.js, vendored in static/vendor/xterm) over
// /ws/instances/{id}/terminal/: keystrokes go out as binary frames, the shell's bytes come
// back the same way, and a {"type": "resize"} text frame follows the panel's size.
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
  const button = panel.querySelector("[data-terminal-connect]");
  const REASONS = {
    4403: "your role cannot open a terminal",
    4404: "not running on its host",
    4409: "the instance is not running",
    4502: "its host is not answering",
  };
  let term = null;
  let fit = null;
  let socket = null;

  function sendSize() {
    if (socket && socket.readyState === WebSocket.OPEN) {
      socket.send(JSON.stringify({ type: "resize", cols: term.cols, rows: term.rows }));
    }
  }

  function connect() {
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
    const url = `${scheme}://${location.host}${panel.dataset.terminalUrl}?cols=${term.cols}&rows=${term.rows}`;
    socket = new WebSocket(url);
    socket.binaryType = "arraybuffer";
    status.textContent = "· connecting…";
    button.disabled = true;
    socket.addEventListener("open", () => {
      status.textContent = "· connected";
      term.focus();
    });
    socket.addEventListener("message", (event) => {
      term.write(typeof event.data === "string" ? event.data : new Uint8Array(event.data));
    });
    socket.addEventListener("close", (event) => {
      const why = REASONS[event.code] || event.reason || (event.code === 1000 ? "the shell ended" : "disconnected");
      status.textContent = `· closed: ${why}`;
      button.disabled = false;
      button.textContent = "Reconnect";
      socket = null;
    });
  }

  button.addEventListener("click", connect);
})();
