"""A local container engine for machines that have Podman but no engine service running (the
demo, the tests, a single GPU host): `podman system service` on a socket of our own, with the
settings this project ships, and the small demo image built from busybox (no registry needed).
"""

import hashlib
import io
import os
import shutil
import subprocess
import tarfile
import time
from pathlib import Path

CONTAINERS_CONF = Path(__file__).with_name("podman") / "containers.conf"
DEMO_IMAGE = "localhost/gpucloud/demo:latest"
# The demo image's default command: a tiny HTTP server standing in for Jupyter on 8888.
DEMO_COMMAND = '["httpd", "-f", "-v", "-p", "8888", "-h", "/srv"]'
DEMO_APPLETS = (
    "sh",
    "ash",
    "cat",
    "cp",
    "dd",
    "echo",
    "env",
    "false",
    "head",
    "hostname",
    "httpd",
    "id",
    "kill",
    "ls",
    "mkdir",
    "mv",
    "nc",
    "ps",
    "pwd",
    "rm",
    "seq",
    "sleep",
    "tail",
    "tee",
    "touch",
    "tr",
    "true",
    "uname",
    "wc",
    "wget",
    "yes",
)
START_SECONDS = 15.0


class EngineError(Exception):
    pass


def podman() -> str | None:
    return shutil.which("podman")


def podman_env() -> dict[str, str]:
    return {**os.environ, "CONTAINERS_CONF": str(CONTAINERS_CONF)}


def podman_command(storage: Path | None, *args: str) -> list[str]:
    """A podman command line; with `storage`, on images, containers, networks and libpod's
    state of its own there (the tests keep theirs apart from the demo's, and their `system
    reset` removes no network or state of another install: Podman keeps both apart from its
    storage by default)."""
    where = []
    if storage:
        where = ["--root", str(storage / "root"), "--runroot", str(storage / "run")]
        where += ["--network-config-dir", str(storage / "networks")]
        where += ["--tmpdir", str(storage / "tmp")]
    return ["podman", *where, *args]


def start_podman_service(
    socket_path: Path, log_path: Path, storage: Path | None = None, **env: str
) -> subprocess.Popen:
    """Start `podman system service` on `socket_path` (with `env` added to its environment,
    e.g. CONTAINERS_REGISTRIES_CONF); answer the process once it serves."""
    if podman() is None:
        raise EngineError("podman is not installed (apt-get install podman runc)")
    socket_path.parent.mkdir(parents=True, exist_ok=True)
    socket_path.unlink(missing_ok=True)
    with open(log_path, "ab") as log:
        proc = subprocess.Popen(
            podman_command(storage, "system", "service", "--time=0", f"unix://{socket_path}"),
            env={**podman_env(), **env},
            cwd=socket_path.parent,  # conmon leaves files (an `oom` marker) where it runs
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    deadline = time.monotonic() + START_SECONDS
    while not socket_path.exists():
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            raise EngineError(f"podman system service did not start; see {log_path}")
        time.sleep(0.05)
    return proc


def _demo_tar(busybox: Path) -> bytes:
    """A root file system with busybox, its applets and a page for the HTTP server."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as tar:
        for folder in ("bin", "srv", "tmp", "workspace"):
            info = tarfile.TarInfo(folder)
            info.type, info.mode = tarfile.DIRTYPE, 0o1777 if folder == "tmp" else 0o755
            tar.addfile(info)
        tar.add(busybox, "bin/busybox")
        for applet in DEMO_APPLETS:
            info = tarfile.TarInfo(f"bin/{applet}")
            info.type, info.linkname = tarfile.SYMTYPE, "busybox"
            tar.addfile(info)
        page = b"<h1>gpucloud demo</h1><p>Served from inside the instance.</p>\n"
        info = tarfile.TarInfo("srv/index.html")
        info.size, info.mode = len(page), 0o644
        tar.addfile(info, io.BytesIO(page))
    return buffer.getvalue()


def _demo_version() -> str:
    """What the demo image is made of: a new recipe builds it anew."""
    return hashlib.sha256(f"{DEMO_COMMAND} {DEMO_APPLETS}".encode()).hexdigest()[:12]


def build_demo_image(reference: str = DEMO_IMAGE, storage: Path | None = None) -> bool:
    """Build the demo image from the host's static busybox unless this recipe's is there;
    answer whether it was built now."""
    env = podman_env()
    label = '{{index .Config.Labels "gpucloud.demo"}}'
    found = subprocess.run(
        podman_command(storage, "image", "inspect", "--format", label, reference),
        env=env,
        capture_output=True,
        text=True,
    )
    if found.returncode == 0 and found.stdout.strip() == _demo_version():
        return False
    busybox = shutil.which("busybox")
    if busybox is None:
        raise EngineError("busybox is not installed (apt-get install busybox-static)")
    result = subprocess.run(
        podman_command(
            storage,
            "import",
            "--change",
            f"CMD {DEMO_COMMAND}",
            "--change",
            "ENV PATH=/bin",
            "--change",
            f"LABEL gpucloud.demo={_demo_version()}",
            "-",
            reference,
        ),
        input=_demo_tar(Path(busybox).resolve()),
        env=env,
        capture_output=True,
    )
    if result.returncode != 0:
        raise EngineError(f"podman import failed: {result.stderr.decode(errors='replace')}")
    return True
