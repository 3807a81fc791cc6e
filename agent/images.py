"""`make images`: images built on this machine from package registries only (Debian's apt mirror
and PyPI), never pulled from an image registry.

`localhost/gpucloud/jupyter:latest` is a Debian root file system of this machine's release from
its own apt mirror (debootstrap), with Python and a venv at /opt/jupyter holding JupyterLab from
PyPI. Its command starts JupyterLab on 8888 over /workspace; Jupyter Server reads the token the
console gives each instance from JUPYTER_TOKEN (without one it makes its own and logs it).

An engine that has this recipe's image already is left alone. The root file system is kept as
a tar in the cache directory (with debootstrap's packages), so building it again into another
engine's storage (the tests') is an import of seconds.
"""

import argparse
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from agent.podman import EngineError, podman_command, podman_env

JUPYTER_IMAGE = "localhost/gpucloud/jupyter:latest"
JUPYTERLAB = "jupyterlab==4.6.6"
PACKAGES = ("python3", "python3-venv", "ca-certificates")
VENV = "/opt/jupyter"
JUPYTER_COMMAND = [
    f"{VENV}/bin/jupyter",
    "lab",
    "--ip=0.0.0.0",
    "--port=8888",
    "--no-browser",
    "--allow-root",
    "--ServerApp.root_dir=/workspace",
]
JUPYTER_ENV = {
    "PATH": f"{VENV}/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
    "LANG": "C.UTF-8",
    "SHELL": "/bin/bash",
}
CACHE = Path("/var/cache/gpucloud")
SOURCES = Path("/etc/apt")
HOST_CAS = "/etc/ssl/certs/ca-certificates.crt"
# what the build needed and the image does not: this machine's settings, apt's files
LEFTOVERS = (
    "etc/resolv.conf",
    "etc/host-cas.pem",
    "var/cache/apt",
    "var/lib/apt/lists",
    "root/.cache",
)
PROXY_ENV = ("http_proxy", "https_proxy", "no_proxy", "HTTP_PROXY", "HTTPS_PROXY", "NO_PROXY")
LABEL = "gpucloud.image"
LABEL_FORMAT = f'{{{{index .Config.Labels "{LABEL}"}}}}'


def debian_source(apt_dir: Path = SOURCES) -> tuple[str, str]:
    """(mirror, release) of this machine's first Debian source of packages (not its security or
    updates suites), from sources.list (one-line entries) or sources.list.d/*.sources (deb822)."""
    entries = []
    files = [apt_dir / "sources.list", *sorted((apt_dir / "sources.list.d").glob("*.list"))]
    for path in filter(Path.is_file, files):
        for line in path.read_text().splitlines():
            words = re.sub(r"\[[^]]*\]", "", line.split("#")[0]).split()  # no [options]
            if words[:1] == ["deb"] and len(words) > 3:
                entries.append((words[1], words[2]))
    for path in sorted((apt_dir / "sources.list.d").glob("*.sources")):
        for stanza in path.read_text().split("\n\n"):
            fields = {}
            for line in stanza.splitlines():
                name, _, value = line.partition(":")
                if value and not line.startswith(("#", " ")):
                    fields[name.strip().lower()] = value.split()
            if "deb" in fields.get("types", []):
                entries += [(uri, suite) for uri in fields["uris"] for suite in fields["suites"]]
    for mirror, suite in entries:
        if "-" not in suite:
            return mirror, suite
    raise EngineError(f"no Debian source of packages in {apt_dir}/sources.list*")


def recipe_version(release: str) -> str:
    """What the image is made of: another recipe (or release) builds it anew."""
    recipe = [release, PACKAGES, JUPYTERLAB, JUPYTER_COMMAND, JUPYTER_ENV]
    return hashlib.sha256(json.dumps(recipe).encode()).hexdigest()[:12]


def _run(*command: str, **kwargs) -> None:
    result = subprocess.run(command, capture_output=True, text=True, **kwargs)
    if result.returncode != 0:
        raise EngineError(f"{' '.join(command[:3])} failed:\n{result.stdout}{result.stderr}")


def build_rootfs(tar: Path, mirror: str, release: str, cache: Path) -> None:
    """Debian with Python and JupyterLab, as a tar at `tar`."""
    if shutil.which("debootstrap") is None:
        raise EngineError("debootstrap is not installed (apt-get install debootstrap)")
    debs = cache / "debootstrap" / release
    debs.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=cache) as work:
        root = Path(work) / "root"
        _run(
            "debootstrap",
            "--variant=minbase",
            f"--include={','.join(PACKAGES)}",
            f"--cache-dir={debs}",
            release,
            str(root),
            mirror,
        )
        # pip reaches PyPI as this machine does: its resolver, its CAs (a proxy's included)
        shutil.copy("/etc/resolv.conf", root / "etc" / "resolv.conf")
        shutil.copy(os.environ.get("PIP_CERT", HOST_CAS), root / "etc" / "host-cas.pem")
        env = {"PATH": JUPYTER_ENV["PATH"], "HOME": "/root", "LANG": "C.UTF-8"}
        env |= {name: os.environ[name] for name in PROXY_ENV if name in os.environ}
        _run("chroot", str(root), "python3", "-m", "venv", VENV, env=env)
        pip = [f"{VENV}/bin/pip", "install", "--no-input", "--no-cache-dir"]
        _run("chroot", str(root), *pip, "--cert=/etc/host-cas.pem", JUPYTERLAB, env=env)
        for leftover in LEFTOVERS:
            target = root / leftover
            if target.is_dir():
                shutil.rmtree(target)
            else:
                target.unlink(missing_ok=True)
        (root / "workspace").mkdir()
        partial = tar.with_suffix(".partial")
        excluded = ["--exclude=./dev/*", "--exclude=./proc/*", "--exclude=./sys/*"]
        _run("tar", "--numeric-owner", *excluded, "-C", str(root), "-cf", str(partial), ".")
        partial.rename(tar)


def build_jupyter_image(
    reference: str = JUPYTER_IMAGE, storage: Path | None = None, cache: Path = CACHE
) -> bool:
    """Build the Jupyter image unless this recipe's is there; answer whether it was built now.
    The root file system comes from the cache when this recipe made one before."""
    mirror, release = debian_source()
    version = recipe_version(release)
    found = subprocess.run(
        podman_command(storage, "image", "inspect", "--format", LABEL_FORMAT, reference),
        env=podman_env(),
        capture_output=True,
        text=True,
    )
    if found.returncode == 0 and found.stdout.strip() == version:
        return False
    tar = cache / f"jupyter-{version}.tar"
    if not tar.exists():
        for stale in cache.glob("jupyter-*.tar"):
            stale.unlink()
        build_rootfs(tar, mirror, release, cache)
    changes = [
        f"--change=CMD {json.dumps(JUPYTER_COMMAND)}",
        *(f"--change=ENV {name}={value}" for name, value in JUPYTER_ENV.items()),
        "--change=WORKDIR /workspace",
        "--change=EXPOSE 8888",
        f"--change=LABEL {LABEL}={version}",
    ]
    _run(*podman_command(storage, "import", *changes, str(tar), reference), env=podman_env())
    return True


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--storage", type=Path, help="a podman storage of its own (root, run)")
    parser.add_argument("--cache", type=Path, default=CACHE, help=f"default {CACHE}")
    args = parser.parse_args(argv)
    started = time.monotonic()
    try:
        built = build_jupyter_image(storage=args.storage, cache=args.cache)
    except EngineError as error:
        print(error, file=sys.stderr)
        return 1
    took = time.monotonic() - started
    print(f"{JUPYTER_IMAGE}: {'built' if built else 'up to date'} ({took:.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
