"""A local container engine for machines that have Podman but no engine service running (the
demo, the tests, a single GPU host): `podman system service` on a socket of our own, with the
settings this project ships, and the small demo image built from busybox (no registry needed).
The tests also run Docker Engine (`dockerd`) on a socket, data root and exec root of their own,
with the settings the README asks of an operator, and import the same image into it.
Podman's settings and command line are the agent's own (agent/podman).
"""

import hashlib
import io
import shutil
import subprocess
import tarfile
import time
from pathlib import Path

import docker

from agent.podman import EngineError, mount_type, podman_command, podman_env, storage_driver

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
DOCKER_START_SECONDS = 60.0
# the chains Docker adds to iptables (dockerd leaves them behind when it stops)
DOCKER_CHAINS = {
    "filter": ("DOCKER-USER", "DOCKER-ISOLATION-STAGE-1", "DOCKER-ISOLATION-STAGE-2", "DOCKER"),
    "nat": ("DOCKER",),
}


# the umask an engine runs with as a system service, whatever its starter's
ENGINE_UMASK = 0o022


def podman() -> str | None:
    return shutil.which("podman")


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
            umask=ENGINE_UMASK,  # make run's own 077 is not the engine's
        )
    deadline = time.monotonic() + START_SECONDS
    while not socket_path.exists():
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            raise EngineError(f"podman system service did not start; see {log_path}")
        time.sleep(0.05)
    return proc


def dockerd() -> str | None:
    return shutil.which("dockerd")


def start_docker_daemon(
    root: Path, *, live_restore: bool = False, address_pool: str = "172.30.0.0/16"
) -> subprocess.Popen:
    """Start Docker Engine with everything of its own under `root` (data, exec root, pid file,
    its containerd's namespace, the socket `root/docker.sock`) and the settings the README asks
    of an operator: user namespaces remapped (`dockremap`), tenant networks of /24s from
    `address_pool` (one of its own for each engine that runs beside another), no default
    bridge (the agent puts every container on its tenant's network), and with `live_restore`
    containers that outlive the daemon; answer it once it serves. Started again on the same
    `root`, it finds what it left there."""
    if dockerd() is None:
        raise EngineError("dockerd is not installed (apt-get install docker.io)")
    root.mkdir(parents=True, exist_ok=True)
    root.chmod(0o711)  # the remapped root must get through to its part of the data root
    socket_path = root / "docker.sock"
    command = ["dockerd", "--data-root", str(root / "data"), "--exec-root", str(root / "exec")]
    command += ["--pidfile", str(root / "dockerd.pid"), "-H", f"unix://{socket_path}"]
    command += ["--config-file", str(root / "daemon.json"), "--userns-remap=default"]
    command += ["--bridge=none", "--default-address-pool", f"base={address_pool},size=24"]
    command += ["--containerd-namespace", "gpucloud-test"]
    command += ["--containerd-plugins-namespace", "gpucloud-test-plugins"]
    if storage_driver(root / "data"):  # a data root on btrfs (layer_storage)
        command += ["--storage-driver", storage_driver(root / "data")]
    # not the host's /etc/docker/daemon.json
    (root / "daemon.json").write_text('{"live-restore": true}\n' if live_restore else "{}\n")
    with open(root / "dockerd.log", "ab") as log:
        proc = subprocess.Popen(
            command, stdout=log, stderr=subprocess.STDOUT, cwd=root, umask=ENGINE_UMASK
        )
    deadline = time.monotonic() + DOCKER_START_SECONDS
    while True:
        try:
            docker.DockerClient(base_url=f"unix://{socket_path}", timeout=5).close()
            return proc
        except docker.errors.DockerException:
            if proc.poll() is not None or time.monotonic() > deadline:
                said = (root / "dockerd.log").read_text().splitlines()[-3:]
                stop_docker_daemon(proc, root)
                raise EngineError("dockerd did not start: " + " / ".join(said)) from None
            time.sleep(0.2)


def docker_chains() -> set[tuple[str, str]]:
    """The (table, chain) of Docker's iptables chains that are there now."""
    found = set()
    for table, chains in DOCKER_CHAINS.items():
        listed = subprocess.run(["iptables", "-t", table, "-S"], capture_output=True, text=True)
        found |= {
            (table, line.split()[1])
            for line in listed.stdout.splitlines()
            if line.startswith("-N ") and line.split()[1] in chains
        }
    return found


def stop_docker_daemon(proc: subprocess.Popen, root: Path) -> None:
    """Stop a dockerd from start_docker_daemon and remove what it leaves under `root`: its
    mounts, then `root` itself."""
    proc.terminate()
    try:
        proc.wait(30)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(10)
    points = [line.split(" ")[1] for line in Path("/proc/self/mounts").read_text().splitlines()]
    for point in sorted((p for p in points if p.startswith(f"{root}/")), reverse=True):
        subprocess.run(["umount", "--lazy", point], capture_output=True)
    shutil.rmtree(root, ignore_errors=True)


def remove_docker_chains(chains: set[tuple[str, str]]) -> None:
    """Remove Docker's iptables `chains` (from docker_chains) and the rules that jump to them."""
    for table in {table for table, _ in chains}:
        names = {chain for t, chain in chains if t == table}
        listed = subprocess.run(["iptables", "-t", table, "-S"], capture_output=True, text=True)
        for line in listed.stdout.splitlines():
            words = line.split()
            if words[0] == "-A" and names & {words[1], *words[2:]}:
                subprocess.run(["iptables", "-t", table, "-D", *words[1:]], capture_output=True)
        for chain in names:
            subprocess.run(["iptables", "-t", table, "-X", chain], capture_output=True)


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


def _demo_changes() -> list[str]:
    """The image's configuration, as `import --change` takes it (Podman's and Docker's)."""
    return [f"CMD {DEMO_COMMAND}", "ENV PATH=/bin", f"LABEL gpucloud.demo={_demo_version()}"]


def _busybox() -> Path:
    busybox = shutil.which("busybox")
    if busybox is None:
        raise EngineError("busybox is not installed (apt-get install busybox-static)")
    return Path(busybox).resolve()


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
    changes = [arg for change in _demo_changes() for arg in ("--change", change)]
    result = subprocess.run(
        podman_command(storage, "import", *changes, "-", reference),
        input=_demo_tar(_busybox()),
        env=env,
        capture_output=True,
    )
    if result.returncode != 0:
        raise EngineError(f"podman import failed: {result.stderr.decode(errors='replace')}")
    return True


def import_demo_image_docker(engine_url: str, reference: str = DEMO_IMAGE) -> None:
    """Import the demo image into a Docker Engine (the same file system and configuration)."""
    repository, _, tag = reference.rpartition(":")
    client = docker.APIClient(base_url=engine_url)
    try:
        client.import_image_from_data(
            _demo_tar(_busybox()), repository=repository, tag=tag, changes=_demo_changes()
        )
    finally:
        client.close()


def _make_fs(image: Path, size_gib: int, command: list[str]) -> None:
    partial = image.with_name(f".{image.name}")
    with open(partial, "wb") as file:
        file.truncate(size_gib * 1024**3)
    made = subprocess.run([*command, str(partial)], capture_output=True)
    if made.returncode != 0:
        partial.unlink(missing_ok=True)
        raise EngineError(f"{command[0]} failed: {made.stderr.decode(errors='replace')}")
    partial.replace(image)


def layer_storage(folder: Path, size_gib: int) -> str:
    """Make `folder` engine storage that can bound each container's writable layer (the
    storage option `size`), in a sparse image beside it mounted by loop; answer its type.
    xfs with project quotas (`pquota`: the overlay driver's `size`) where the kernel has XFS
    quotas, else btrfs with quota groups (the btrfs driver's `size`). Idempotent: a mounted
    folder is left as it is, an image already made is mounted again. Undo:
    unmount_layer_storage."""
    folder.mkdir(parents=True, exist_ok=True)
    kind = mount_type(folder)
    if kind:
        return kind
    xfs, btrfs = folder.with_name(f"{folder.name}.xfs"), folder.with_name(f"{folder.name}.btrfs")
    if not btrfs.exists() and shutil.which("mkfs.xfs"):
        if not xfs.exists():
            _make_fs(xfs, size_gib, ["mkfs.xfs", "-q", "-f"])
        mount = ["mount", "-o", "loop,pquota", str(xfs), str(folder)]
        if subprocess.run(mount, capture_output=True).returncode == 0:
            return "xfs"
        xfs.unlink()  # this kernel has no XFS quotas ("quota support not available")
    if shutil.which("mkfs.btrfs") is None:
        raise EngineError(
            "no file system here bounds a container's layer: xfs with pquota needs a kernel "
            "with XFS quotas, btrfs needs btrfs-progs (apt-get install xfsprogs btrfs-progs)"
        )
    if not btrfs.exists():
        _make_fs(btrfs, size_gib, ["mkfs.btrfs", "-q", "-f"])
    for command in (
        ["mount", "-o", "loop", str(btrfs), str(folder)],
        ["btrfs", "quota", "enable", str(folder)],
    ):
        done = subprocess.run(command, capture_output=True)
        if done.returncode != 0:
            raise EngineError(f"{' '.join(command)}: {done.stderr.decode(errors='replace')}")
    return "btrfs"


def unmount_layer_storage(folder: Path, remove: bool = False) -> None:
    """Undo layer_storage: unmount what lies under `folder` (the drivers' own mounts), then
    `folder`; with `remove`, remove its image too."""
    points = [line.split(" ")[1] for line in Path("/proc/self/mounts").read_text().splitlines()]
    for point in sorted((p for p in points if p.startswith(f"{folder}/")), reverse=True):
        subprocess.run(["umount", "--lazy", point], capture_output=True)
    if mount_type(folder):
        subprocess.run(["umount", "--lazy", str(folder)], capture_output=True)
    if remove:
        for suffix in (".xfs", ".btrfs"):
            folder.with_name(f"{folder.name}{suffix}").unlink(missing_ok=True)
