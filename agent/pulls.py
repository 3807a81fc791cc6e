"""An image pull's progress as a person reads it: layers and bytes done of total, from the
engine's pull stream (Docker's, or Podman's Docker-compatible one), reported at most once a
second so that a pull of many GB does not flood the console. Each report is text (the
instance's events keep it) and the same figures as numbers, with an ETA from the rate so far
(`snapshot`: what the instance page's bar and `gpucloud launch --wait` draw)."""

import math
import time
from dataclasses import dataclass

REPORT_SECONDS = 1.0
UNITS = ("B", "kB", "MB", "GB", "TB")
# a layer's statuses in the stream; other lines (`Pulling from …`, `Digest: …`) are the image's
LAYER_STATUSES = frozenset(
    {
        "Pulling fs layer",
        "Waiting",
        "Downloading",
        "Verifying Checksum",
        "Download complete",
        "Extracting",
        "Pull complete",
        "Already exists",
    }
)
# Docker extracts after `Download complete` and ends with `Pull complete`; Podman reports
# no extraction, so its `Download complete` is the layer's end.
LAYER_DONE = frozenset({"Download complete", "Pull complete", "Already exists"})


def human_size(size: float) -> str:
    """Bytes in decimal units, as engines and registries give image sizes: `3.4 GB`."""
    for unit in UNITS[:-1]:
        if abs(size) < 1000:
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1000
    return f"{size:.1f} {UNITS[-1]}"


def eta(done: int, total: int, elapsed: float) -> int | None:
    """Whole seconds until `total` bytes are there at the rate so far (`done` in `elapsed`
    seconds), rounded up; None when no rate is known yet (nothing came, or no total)."""
    if done <= 0 or total <= 0 or elapsed <= 0:
        return None
    left = max(total - done, 0) / (done / elapsed)
    return math.ceil(left)


@dataclass
class _Layer:
    current: int = 0
    total: int = 0  # 0 while the engine has not said (and for a layer the host has already)
    done: bool = False


class PullProgress:
    """Feed it the pull stream's lines; `due()` says when a report is worth sending."""

    def __init__(
        self,
        reference: str,
        clock=time.monotonic,
        interval: float = REPORT_SECONDS,
        via: str = "",
    ):
        """`via`: the registry mirror the pull goes through, named in every report."""
        self.reference = reference
        self.label = f"{reference} (via mirror {via})" if via else reference
        self.clock = clock
        self.interval = interval
        self.started = clock()
        self.layers: dict[str, _Layer] = {}
        self._reported_at: float | None = None
        self._reported = ""

    def start(self) -> str:
        """The first report, before the engine says anything: the next is a second later."""
        self._reported_at = self.clock()
        return f"pulling {self.label}"

    def feed(self, line: dict) -> None:
        status = line.get("status") or ""
        if not line.get("id") or not (status in LAYER_STATUSES or status.startswith("Retrying")):
            return
        layer = self.layers.setdefault(line["id"], _Layer())
        detail = line.get("progressDetail") or {}
        # Docker's `Extracting` lines count bytes too, but those of the extraction, not the fetch
        if status == "Downloading" and detail.get("total"):
            layer.current, layer.total = int(detail.get("current") or 0), int(detail["total"])
        if status in LAYER_DONE:
            layer.done = True
            layer.current = layer.total

    def summary(self) -> str:
        """`3 of 5 layers · 1.2 GB of 3.4 GB` (bytes summed over the layers whose size is
        known)."""
        layers = self.layers.values()
        text = f"{sum(layer.done for layer in layers)} of {len(self.layers)} layers"
        total = sum(layer.total for layer in layers)
        if total:
            done = sum(layer.current for layer in layers)
            text += f" · {human_size(done)} of {human_size(total)}"
        return text

    def snapshot(self, done: bool = False) -> dict:
        """The figures of `summary` as numbers, and the seconds left at the rate so far (None
        until some bytes came, or while no layer's size is known): `{"reference",
        "layers_done", "layers_total", "bytes_done", "bytes_total", "eta_seconds", "done"}`."""
        layers = self.layers.values()
        total = sum(layer.total for layer in layers)
        fetched = sum(layer.current for layer in layers)
        return {
            "reference": self.reference,
            "layers_done": sum(layer.done for layer in layers),
            "layers_total": len(self.layers),
            "bytes_done": fetched,
            "bytes_total": total,
            "eta_seconds": 0 if done else eta(fetched, total, self.clock() - self.started),
            "done": done,
        }

    def due(self) -> str | None:
        """The report to send now (`pulling <reference>: <summary>`), or None: nothing new,
        or one was sent less than `interval` ago."""
        if not self.layers:
            return None
        now = self.clock()
        if self._reported_at is not None and now - self._reported_at < self.interval:
            return None
        text = f"pulling {self.label}: {self.summary()}"
        if text == self._reported:
            return None
        self._reported_at, self._reported = now, text
        return text

    def finished(self, image_id: str = "") -> str:
        """The last report, once the image `image_id` is there: always sent, however soon
        after the previous one. Podman streams the image's config as one more blob after its
        layers, named by the image's id: it is no layer."""
        self.layers.pop(image_id.removeprefix("sha256:")[:12], None)
        text = f"pulled {self.label} in {self.clock() - self.started:.0f} s"
        return f"{text}: {self.summary()}" if self.layers else text
