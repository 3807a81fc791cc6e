"""An image registry of our own (Debian's docker-registry) on a loopback port, speaking plain
HTTP: where the tests and the launch benchmark pull images from, no outside registry needed."""

import subprocess
from pathlib import Path

from console import processes


def start_registry(root: Path, address: str, proxy: str = "") -> subprocess.Popen:
    """Serve a registry at `address` (host:port) with its blobs under `root`; answer the
    process once it answers. `proxy`: the registry (host:port, plain HTTP) it is a
    pull-through cache of, as a region's registry mirror is."""
    root.mkdir(parents=True, exist_ok=True)
    config = root / "config.yml"
    config.write_text(
        f"version: 0.1\nstorage:\n  filesystem:\n    rootdirectory: {root / 'data'}\n"
        f"http:\n  addr: {address}\n" + (f"proxy:\n  remoteurl: http://{proxy}\n" if proxy else "")
    )
    with open(root / "registry.log", "ab") as log:
        server = subprocess.Popen(
            ["docker-registry", "serve", str(config)], stdout=log, stderr=subprocess.STDOUT
        )
    processes.wait_http(f"http://{address}/v2/", timeout=15, proc=server)
    return server
