"""`make images`: the demo catalog's images, built on this machine from package registries only
(Debian's apt mirror and PyPI), never pulled from an image registry.

Both are a Debian root file system of this machine's release from its own apt mirror
(debootstrap, with Python), with a venv of their own on top:

- `localhost/gpucloud/jupyter:latest`: JupyterLab from PyPI at /opt/jupyter. Its command starts
  JupyterLab on 8888 over /workspace; Jupyter Server reads the token the console gives each
  instance from JUPYTER_TOKEN (without one it makes its own and logs it).
- `localhost/gpucloud/pytorch:latest`: the CPU build of PyTorch at /opt/pytorch, from a local
  folder of wheels (GPUCLOUD_WHEELS, /opt/wheels: CI's machine holds it there), else from
  PyTorch's own index; its dependencies and NumPy from PyPI. Its command trains a small
  network on synthetic data (on the GPU where the container has one), printing the loss as it
  falls, then stays up for the instance's terminal.

An engine that has a recipe's image already is left alone. The Debian base (with debootstrap's
packages) and each image's root file system are kept as tars in the cache directory, so building
again into another engine's storage (make run's, the tests') is an import of seconds, and the
second image's build skips debootstrap.
"""

import argparse
import contextlib
import fcntl
import hashlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from agent.podman import EngineError, podman_command, podman_env

PACKAGES = ("python3", "python3-venv", "ca-certificates")
CACHE = Path("/var/cache/gpucloud")
SOURCES = Path("/etc/apt")
HOST_CAS = "/etc/ssl/certs/ca-certificates.crt"
# where pip finds wheels on this machine's disk (its pip.conf's find-links): PyTorch's CPU
# wheel is 190 MB, which CI's machine has there and need not download
WHEELS = Path(os.environ.get("GPUCLOUD_WHEELS", "/opt/wheels"))
TORCH_INDEX = "https://download.pytorch.org/whl/cpu"
# what the build needed and the image does not: this machine's settings, apt's files, wheels
LEFTOVERS = (
    "etc/resolv.conf",
    "etc/host-cas.pem",
    "var/cache/apt",
    "var/lib/apt/lists",
    "root/.cache",
    "tmp/wheels",
)
PROXY_ENV = ("http_proxy", "https_proxy", "no_proxy", "HTTP_PROXY", "HTTPS_PROXY", "NO_PROXY")
LABEL = "gpucloud.image"
LABEL_FORMAT = f'{{{{index .Config.Labels "{LABEL}"}}}}'
SYSTEM_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
# the steps of one image's build, as its progress names them
STEPS = ("Debian base", "Python packages (pip)", "packing", "importing")

# The PyTorch image's command: a real, if small, training run. Seeded, so every instance prints
# the same falling losses on a CPU; a few seconds on a laptop's core. Then it waits for a stop
# (SIGTERM: as PID 1 it has to ask for it), so that the instance stays up for its terminal.
TRAIN_SCRIPT = '''\
"""Fit a two-layer network to y = sin(x0) + x1 * x2 on synthetic data; print the loss."""

import signal
import sys

import torch

STEPS, EVERY = 300, 25
torch.manual_seed(0)
device = "cuda" if torch.cuda.is_available() else "cpu"
x = torch.randn(2048, 3, device=device)
y = (torch.sin(x[:, 0]) + x[:, 1] * x[:, 2]).unsqueeze(1)
model = torch.nn.Sequential(
    torch.nn.Linear(3, 64), torch.nn.Tanh(), torch.nn.Linear(64, 64), torch.nn.Tanh(),
    torch.nn.Linear(64, 1),
).to(device)
optimizer = torch.optim.Adam(model.parameters(), lr=0.01)
print(f"training on {device} with torch {torch.__version__}: {STEPS} steps", flush=True)
for step in range(1, STEPS + 1):
    optimizer.zero_grad()
    loss = torch.nn.functional.mse_loss(model(x), y)
    loss.backward()
    optimizer.step()
    if step % EVERY == 0 or step == 1:
        print(f"step {step:4d}  loss {loss.item():.4f}", flush=True)
print("done: run python /opt/pytorch/train.py --once in the terminal to train again", flush=True)
if "--once" not in sys.argv:
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    signal.pause()
'''


@dataclass(frozen=True)
class Recipe:
    """One image: the venv it adds to the Debian base, its files, and its configuration."""

    name: str
    reference: str
    venv: str
    requirements: tuple[str, ...]
    command: tuple[str, ...]
    ports: tuple[int, ...] = ()
    files: dict[str, str] = field(default_factory=dict)  # path in the image: its text

    @property
    def env(self) -> dict[str, str]:
        return {"PATH": f"{self.venv}/bin:{SYSTEM_PATH}", "LANG": "C.UTF-8", "SHELL": "/bin/bash"}

    def version(self, release: str) -> str:
        """What the image is made of: another recipe (or release) builds it anew."""
        made_of = [release, PACKAGES, *self.requirements, self.command, self.env]
        made_of += [self.files] if self.files else []  # the JupyterLab image's as it was
        return hashlib.sha256(json.dumps(made_of).encode()).hexdigest()[:12]


JUPYTER = Recipe(
    name="jupyter",
    reference="localhost/gpucloud/jupyter:latest",
    venv="/opt/jupyter",
    requirements=("jupyterlab==4.6.6",),
    command=(
        "/opt/jupyter/bin/jupyter",
        "lab",
        "--ip=0.0.0.0",
        "--port=8888",
        "--no-browser",
        "--allow-root",
        "--ServerApp.root_dir=/workspace",
    ),
    ports=(8888,),
)
PYTORCH = Recipe(
    name="pytorch",
    reference="localhost/gpucloud/pytorch:latest",
    venv="/opt/pytorch",
    requirements=("torch==2.13.0+cpu", "numpy==2.4.6"),  # torch warns without NumPy
    command=("/opt/pytorch/bin/python", "/opt/pytorch/train.py"),
    files={"opt/pytorch/train.py": TRAIN_SCRIPT},
)
RECIPES = (JUPYTER, PYTORCH)


class Progress:
    """Where a build says how far it is: a JSON file that make run's console reads (the fleet
    page's banner), written whole each time (renamed into place), so a reader never sees half."""

    def __init__(self, path: Path | None, recipes: tuple[Recipe, ...]):
        self.path = path
        self.state = {
            "images": {
                recipe.reference: {"state": "waiting", "step": 0, "steps": len(STEPS)}
                for recipe in recipes
            },
        }

    def __call__(self, reference: str, **changes) -> None:
        image = self.state["images"][reference]
        if changes.get("step"):
            changes.setdefault("doing", STEPS[changes["step"] - 1])
        image.update(changes, updated=time.time())
        if self.path:
            partial = self.path.with_name(f".{self.path.name}")
            # its reader's alone (make run's state directory), whatever the build's umask
            with os.fdopen(
                os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600), "w"
            ) as f:
                f.write(json.dumps(self.state))
            partial.rename(self.path)


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


def base_version(release: str) -> str:
    return hashlib.sha256(json.dumps([release, PACKAGES]).encode()).hexdigest()[:12]


def local_wheels(requirements: tuple[str, ...], wheels: Path = WHEELS) -> list[Path]:
    """The wheels in `wheels` that are exactly a pinned requirement's (name==version), for the
    chroot's pip to install offline."""
    found = []
    for requirement in requirements:
        name, _, version = requirement.partition("==")
        if version:
            found += sorted(wheels.glob(f"{name.replace('-', '_')}-{version}-*.whl"))
    return found


def pip_sources(requirements: tuple[str, ...], wheels: Path = WHEELS) -> list[str]:
    """pip's options for where the requirements come from besides PyPI: the local wheels copied
    into the chroot's /tmp/wheels, else PyTorch's index for a CPU build (a `+cpu` version)."""
    if local_wheels(requirements, wheels):
        return ["--find-links=/tmp/wheels"]
    if any("+cpu" in requirement for requirement in requirements):
        return [f"--extra-index-url={TORCH_INDEX}"]
    return []


def _run(*command: str, **kwargs) -> None:
    result = subprocess.run(command, capture_output=True, text=True, **kwargs)
    if result.returncode != 0:
        said = (result.stdout + result.stderr).strip().splitlines()[-20:]
        raise EngineError(f"{' '.join(command[:3])} failed:\n" + "\n".join(said))


@contextlib.contextmanager
def _cache_lock(cache: Path):
    """One build at a time per cache (make run's in the background and make images, say)."""
    cache.mkdir(parents=True, exist_ok=True)
    with open(cache / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield


def _tar(root: Path, tar: Path) -> None:
    partial = tar.with_suffix(".partial")
    excluded = ["--exclude=./dev/*", "--exclude=./proc/*", "--exclude=./sys/*"]
    _run("tar", "--numeric-owner", *excluded, "-C", str(root), "-cf", str(partial), ".")
    partial.rename(tar)


def _fresh(cache: Path, prefix: str, version: str) -> Path:
    """The cache's tar for this version; those of other versions are removed."""
    tar = cache / f"{prefix}-{version}.tar"
    for stale in cache.glob(f"{prefix}-*.tar"):
        if stale != tar:
            stale.unlink()
    return tar


@contextlib.contextmanager
def _work_root(cache: Path):
    """A temporary folder for a root file system, removed at the end: after unmounting what a
    build that was stopped half-way left mounted in it (debootstrap's /proc, /sys), so that the
    removal never reaches into those."""
    with tempfile.TemporaryDirectory(dir=cache) as work:
        try:
            yield Path(work) / "root"
        finally:
            mounts = Path("/proc/self/mounts").read_text().splitlines()
            points = [line.split(" ")[1] for line in mounts]
            for point in sorted((p for p in points if p.startswith(f"{work}/")), reverse=True):
                subprocess.run(["umount", "--lazy", point], capture_output=True)


def build_base(tar: Path, mirror: str, release: str, cache: Path) -> None:
    """Debian with Python, as a tar at `tar` (debootstrap's packages kept in the cache)."""
    if shutil.which("debootstrap") is None:
        raise EngineError("debootstrap is not installed (apt-get install debootstrap)")
    debs = cache / "debootstrap" / release
    debs.mkdir(parents=True, exist_ok=True)
    with _work_root(cache) as root:
        _run(
            "debootstrap",
            "--variant=minbase",
            f"--include={','.join(PACKAGES)}",
            f"--cache-dir={debs}",
            release,
            str(root),
            mirror,
        )
        _tar(root, tar)


def build_rootfs(recipe: Recipe, tar: Path, base: Path, cache: Path, progress) -> None:
    """The Debian base with the recipe's venv and files, as a tar at `tar`."""
    with _work_root(cache) as root:
        root.mkdir()
        _run("tar", "--numeric-owner", "-C", str(root), "-xf", str(base))
        root.chmod(0o755)  # a root file system's, whatever the umask of who builds it
        # pip reaches PyPI as this machine does: its resolver, its CAs (a proxy's included)
        shutil.copy("/etc/resolv.conf", root / "etc" / "resolv.conf")
        shutil.copy(os.environ.get("PIP_CERT", HOST_CAS), root / "etc" / "host-cas.pem")
        wheels = root / "tmp" / "wheels"
        wheels.mkdir(parents=True)
        for wheel in local_wheels(recipe.requirements):  # a copy: never a mount rmtree could follow
            shutil.copy(wheel, wheels)
        env = {"PATH": recipe.env["PATH"], "HOME": "/root", "LANG": "C.UTF-8"}
        env |= {name: os.environ[name] for name in PROXY_ENV if name in os.environ}
        progress(recipe.reference, step=2)
        _run("chroot", str(root), "python3", "-m", "venv", recipe.venv, env=env)
        pip = [f"{recipe.venv}/bin/pip", "install", "--no-input", "--no-cache-dir"]
        pip += ["--cert=/etc/host-cas.pem", *pip_sources(recipe.requirements)]
        _run("chroot", str(root), *pip, *recipe.requirements, env=env)
        for path, text in recipe.files.items():
            (root / path).write_text(text)
        for leftover in LEFTOVERS:
            target = root / leftover
            if target.is_dir():
                shutil.rmtree(target)
            else:
                target.unlink(missing_ok=True)
        (root / "workspace").mkdir()
        progress(recipe.reference, step=3)
        _tar(root, tar)


def image_version(reference: str, storage: Path | None) -> str | None:
    """The recipe version an engine's image was built from, or None where it has none."""
    found = subprocess.run(
        podman_command(storage, "image", "inspect", "--format", LABEL_FORMAT, reference),
        env=podman_env(),
        capture_output=True,
        text=True,
    )
    return found.stdout.strip() if found.returncode == 0 else None


def build_image(
    recipe: Recipe, storage: Path | None = None, cache: Path = CACHE, progress=None
) -> bool:
    """Build the recipe's image unless this recipe's is there; answer whether it was built now.
    The root file system comes from the cache when this recipe made one before, and the Debian
    base when any recipe did."""
    progress = progress or Progress(None, (recipe,))
    mirror, release = debian_source()
    version = recipe.version(release)
    if image_version(recipe.reference, storage) == version:
        progress(recipe.reference, state="built", step=len(STEPS), doing="already built")
        return False
    progress(recipe.reference, state="building", step=1)
    with _cache_lock(cache):
        tar = _fresh(cache, recipe.name, version)
        if not tar.exists():
            base = _fresh(cache, f"debian-{release}", base_version(release))
            if not base.exists():
                build_base(base, mirror, release, cache)
            build_rootfs(recipe, tar, base, cache, progress)
    progress(recipe.reference, step=4)
    changes = [
        f"--change=CMD {json.dumps(list(recipe.command))}",
        *(f"--change=ENV {name}={value}" for name, value in recipe.env.items()),
        "--change=WORKDIR /workspace",
        *(f"--change=EXPOSE {port}" for port in recipe.ports),
        f"--change=LABEL {LABEL}={version}",
    ]
    _run(*podman_command(storage, "import", *changes, str(tar), recipe.reference), env=podman_env())
    progress(recipe.reference, state="built", doing="built")
    return True


def build_all(storage: Path | None, cache: Path = CACHE, progress_file: Path | None = None) -> int:
    """Build every recipe's image, saying how far on stdout and in `progress_file`; answer the
    exit status (1 where one failed: the others are still built)."""
    progress = Progress(progress_file, RECIPES)
    failed = 0
    for recipe in RECIPES:
        started = time.monotonic()
        try:
            built = build_image(recipe, storage, cache, progress)
        except EngineError as error:
            progress(recipe.reference, state="failed", error=str(error))
            print(f"{recipe.reference}: {error}", file=sys.stderr, flush=True)
            failed = 1
            continue
        took = time.monotonic() - started
        print(
            f"{recipe.reference}: {'built' if built else 'up to date'} ({took:.0f} s)", flush=True
        )
    return failed


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--storage", type=Path, help="a podman storage of its own (root, run)")
    parser.add_argument("--cache", type=Path, default=CACHE, help=f"default {CACHE}")
    parser.add_argument("--progress", type=Path, help="a JSON file to say how far the build is")
    args = parser.parse_args(argv)
    # a stop (make run's Ctrl-C) ends the build through its clean-up: no temporary root left
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    return build_all(args.storage, args.cache, args.progress)


if __name__ == "__main__":
    sys.exit(main())
