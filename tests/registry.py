"""An image registry of our own (Debian's docker-registry) on a loopback port, speaking plain
HTTP: where the tests and the launch benchmark pull images from, no outside registry needed."""

import subprocess
import warnings
from pathlib import Path

from console import processes


def start_registry(
    root: Path, address: str, proxy: str = "", users: dict[str, str] | None = None
) -> subprocess.Popen:
    """Serve a registry at `address` (host:port) with its blobs under `root`; answer the
    process once it answers. `proxy`: the registry (host:port, plain HTTP) it is a
    pull-through cache of, as a region's registry mirror is. `users` ({name: password}): it
    asks for basic auth (htpasswd, bcrypt hashes; docker-registry serves it over plain HTTP
    too)."""
    root.mkdir(parents=True, exist_ok=True)
    config = root / "config.yml"
    auth = ""
    if users:
        htpasswd = root / "htpasswd"
        htpasswd.write_text("".join(f"{name}:{bcrypt(pw)}\n" for name, pw in users.items()))
        auth = f"auth:\n  htpasswd:\n    realm: test\n    path: {htpasswd}\n"
    config.write_text(
        f"version: 0.1\nstorage:\n  filesystem:\n    rootdirectory: {root / 'data'}\n"
        f"http:\n  addr: {address}\n"
        + (f"proxy:\n  remoteurl: http://{proxy}\n" if proxy else "")
        + auth
    )
    with open(root / "registry.log", "ab") as log:
        server = subprocess.Popen(
            ["docker-registry", "serve", str(config)], stdout=log, stderr=subprocess.STDOUT
        )
    processes.wait_http(f"http://{address}/v2/", timeout=15, proc=server)  # 401: it asks
    return server


def bcrypt(password: str) -> str:
    """A bcrypt hash ($2b$), as htpasswd -B makes it: libxcrypt's, through Python's crypt
    (no bcrypt package needed)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        import crypt

    return crypt.crypt(password, crypt.mksalt(crypt.METHOD_BLOWFISH))  # noqa: S324 (bcrypt)
