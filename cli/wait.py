"""`gpucloud launch --wait`: follow a new instance until it runs or fails, printing each state
it passes through and each new reason within it (on stderr, so that stdout stays the table or
JSON). While its image is pulled, the API's `pull_progress` is drawn as a bar with the ETA:
one line redrawn in place on a terminal, a plain line for each new report otherwise (a log, a
pipe)."""

import math
import sys
import time

from cli.errors import CliError

POLL_SECONDS = 0.5
# States a launch does not leave by itself: it will not run unless someone acts.
GAVE_UP = ("failed", "stopping", "stopped", "terminating", "terminated")
BAR_WIDTH = 24
UNITS = ("B", "kB", "MB", "GB", "TB")


def reason(instance: dict) -> str:
    """Why the instance is in its state, in words where the API gives them."""
    return instance.get("reason_text") or instance.get("state_reason") or ""


def human_size(size: float) -> str:
    """Bytes in decimal units, as the agent words an image's: `3.4 GB`."""
    for unit in UNITS[:-1]:
        if abs(size) < 1000:
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1000
    return f"{size:.1f} {UNITS[-1]}"


def fraction(pull: dict) -> float:
    """How far the pull got, 0 to 1: by bytes where their total is known, else by layers."""
    if pull.get("done"):
        return 1.0
    if pull.get("bytes_total"):
        return min(pull["bytes_done"] / pull["bytes_total"], 1.0)
    if pull.get("layers_total"):
        return min(pull["layers_done"] / pull["layers_total"], 1.0)
    return 0.0


def eta(seconds: int | None) -> str:
    """`ETA 40 s`, `ETA 3 min`; "" while unknown."""
    if seconds is None:
        return ""
    return f"ETA {seconds} s" if seconds < 60 else f"ETA {math.ceil(seconds / 60)} min"


def bar(pull: dict) -> str:
    """`[#########---------------]  38% 2 of 5 layers · 1.2 GB of 3.4 GB · ETA 40 s`."""
    share = fraction(pull)
    filled = math.floor(share * BAR_WIDTH)
    parts = [f"{pull['layers_done']} of {pull['layers_total']} layers"]
    if pull.get("bytes_total"):
        parts.append(f"{human_size(pull['bytes_done'])} of {human_size(pull['bytes_total'])}")
    if not pull.get("done") and (left := eta(pull.get("eta_seconds"))):
        parts.append(left)
    drawn = "#" * filled + "-" * (BAR_WIDTH - filled)
    return f"[{drawn}] {math.floor(share * 100):3d}% {' · '.join(parts)}"


class Printer:
    """Lines on stderr; a pull's bar redrawn in place where stderr is a terminal."""

    def __init__(self, stream=None):
        self.stream = stream or sys.stderr
        self.in_place = self.stream.isatty()
        self.open = False  # a bar drawn in place, with no newline after it yet

    def line(self, text: str) -> None:
        self.end_bar()
        print(text, file=self.stream, flush=True)

    def bar(self, text: str) -> None:
        if not self.in_place:
            self.line(text)
            return
        self.stream.write(f"\r{text}\x1b[K")
        self.stream.flush()
        self.open = True

    def end_bar(self) -> None:
        if self.open:
            self.stream.write("\n")
            self.open = False


def wait_until_running(client, instance: dict, timeout: float) -> dict:
    """The instance once running; CliError when it fails (with the reason) or when `timeout`
    seconds pass first."""
    deadline = time.monotonic() + timeout
    label = instance.get("name") or str(instance["id"])
    out = Printer()
    shown = drawn = None
    try:
        while True:
            state, why, pull = instance["state"], reason(instance), instance.get("pull_progress")
            if pull:
                text = f"{label}: pulling {pull['reference']} {bar(pull)}"
                if text != drawn:
                    drawn = text
                    out.bar(text)
            elif (state, why) != shown:
                shown, drawn = (state, why), None
                out.line(f"{label}: {state}{f' ({why})' if why else ''}")
            if state == "running":
                return instance
            if state in GAVE_UP:
                raise CliError(f"{label} is {state}: {why or 'no reason given'}")
            if time.monotonic() >= deadline:
                raise CliError(
                    f"{label} is still {state} after {timeout:g} s: follow it with "
                    f"`gpucloud show {instance['id']}`"
                )
            time.sleep(POLL_SECONDS)
            instance = client.call("GET", f"instances/{instance['id']}/")
    finally:
        out.end_bar()
