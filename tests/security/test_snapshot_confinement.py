"""A tenant cannot steer the host's work on its files (agent/confine.py), with real containers,
the real agent over HTTP and the real restic. A running container keeps swapping
(renameat2 RENAME_EXCHANGE, tests/security/swap.c) folders of decoys named as host files with
symlinks to those host folders (a canary's, the canary's again through /proc/1/root, the
agent's state directory, /etc) and a decoy with a symlink to a host file, while the agent
snapshots its disk: no snapshot holds a byte of the host's. A FIFO swapped in for a file ends
the job instead of hanging it. A restore into a tree the tenant made never writes through its
symlinks. A hostile snapshot (device node, setuid-root file, symlinks out, hard links, odd
names) restores inside its new disk only, and nothing in it is usable as a device or a setuid
file, on the host or in a container. A disk in use by a running container is given to no
other (Podman chowns a disk's tree as a container starts)."""

import json
import os
import secrets
import shutil
import stat
import subprocess
import time
from pathlib import Path

import pytest

from agent.snapshots import SnapshotJobs
from agent.volumes import Disks
from tests.agent.test_oci_runtime import launch_body, new_instance_id
from tests.security.test_containers_confined import running_agent

pytestmark = [pytest.mark.integration, pytest.mark.containers]
PASSWORD = "confinement-test-password"
PAIRS = 3  # of each kind
CANARIES = 300  # files in the canary's folder, each with a decoy of its name in the tenant's
ROUNDS = 3
FIFOS = 2000  # files swapped with FIFOs: restic meets one in most rounds
SWAP = ".swap"
HOST_KEY = "ssh_host_ed25519_key"
# the tenant's tree: folders of decoys named as the files of a host folder (a byte each:
# restic 0.14 opens no empty file), each swapped with a symlink to that folder; a decoy file
# swapped with a symlink to a host file; and hard links. `.names-T`: the decoys' names of
# target T, `.target-T`: its host path (the test writes them)
TREE = """
cd /workspace
while [ ! -x {swap} ]; do sleep 0.1; done
pairs=""
i=0
while [ $i -lt {count} ]; do
  for target in {targets}; do
    mkdir d$i.$target
    for name in $(cat .names-$target); do echo > d$i.$target/$name; done
    ln -s "$(cat .target-$target)" l$i.$target
    pairs="$pairs d$i.$target l$i.$target"
  done
  echo > f$i; ln -s "$(cat .target-file)" s$i
  pairs="$pairs f$i s$i"
  i=$((i+1))
done
echo > plain; ln plain hard
touch ready
exec ./{swap} $pairs
"""


@pytest.fixture(scope="module")
def swap(tmp_path_factory) -> Path:
    """The swapping program, static (the container's image is busybox)."""
    binary = tmp_path_factory.mktemp("swap") / "swap"
    source = Path(__file__).with_name("swap.c")
    subprocess.run(["gcc", "-static", "-O2", "-o", str(binary), str(source)], check=True)
    return binary


@pytest.fixture(scope="module")
def agent(container_engine, tmp_path_factory):
    with running_agent(container_engine, tmp_path_factory.mktemp("confine") / "state") as running:
        yield running


@pytest.fixture(scope="module")
def store(tmp_path_factory) -> dict:
    return {"repository": str(tmp_path_factory.mktemp("store") / "restic"), "password": PASSWORD}


@pytest.fixture(scope="module")
def canary(tmp_path_factory) -> Path:
    """A host folder of secret files."""
    folder = tmp_path_factory.mktemp("host-secret")
    for index in range(CANARIES):
        (folder / f"canary-{index}").write_text(f"host-only {secrets.token_hex(16)}\n")
    return folder


def restic(store: dict, *args: str, cwd: Path | None = None) -> str:
    env = {**os.environ, "RESTIC_REPOSITORY": store["repository"]}
    env["RESTIC_PASSWORD"] = store["password"]
    result = subprocess.run(
        ["restic", *args], env=env, cwd=cwd, capture_output=True, text=True, check=True
    )
    return result.stdout


def run_job(agent, job: str, body: dict, within: float = 120) -> dict:
    answer = agent.client.put(f"/v1/snapshot-jobs/{job}", json=body)
    assert answer.status_code == 202, answer.text
    deadline = time.monotonic() + within
    while (view := agent.client.get(f"/v1/snapshot-jobs/{job}").json())["state"] == "running":
        assert time.monotonic() < deadline, f"snapshot job {job} hangs: {view}"
        time.sleep(0.2)
    return view


def files_over_a_byte(store: dict, snapshot: str) -> dict[str, int]:
    """The snapshot's files of more than one byte: path -> size."""
    nodes = [json.loads(line) for line in restic(store, "ls", "--json", snapshot).splitlines()]
    return {
        node["path"]: node["size"]
        for node in nodes
        if node.get("struct_type") == "node" and node["type"] == "file" and node["size"] > 1
    }


def disk(agent, name: str) -> Path:
    return agent.state_dir / "disks" / name / "mnt"


def wait_for_file(path: Path, within: float = 60) -> None:
    deadline = time.monotonic() + within
    while not path.exists():
        assert time.monotonic() < deadline, f"{path} never appeared"
        time.sleep(0.1)


def launch(agent, instance: str, command: str, gpu: int = 0, **body) -> None:
    put = {**launch_body(instance, ["sh", "-c", command], gpu=gpu), **body}
    answer = agent.client.put(f"/v1/allocations/{instance}-a", json=put).json()
    assert answer["state"] == "running", answer


def test_a_racing_tenant_never_gets_a_host_file_into_its_snapshot(agent, swap, store, canary):
    instance = new_instance_id()
    canaries = [path.name for path in canary.iterdir()]
    folders = {
        "canary": (canary, canaries),
        "proc": (f"/proc/1/root{canary}", canaries),
        "state": (agent.state_dir, [p.name for p in agent.state_dir.iterdir() if p.is_file()]),
        "etc": ("/etc", ["shadow", "passwd", "hostname", "hosts"]),
    }
    script = TREE.format(swap=SWAP, count=PAIRS, targets=" ".join(folders))
    launch(agent, instance, script)
    try:
        mount = disk(agent, f"gpucloud-{instance}")
        for name, (target, names) in folders.items():
            (mount / f".target-{name}").write_text(str(target))
            (mount / f".names-{name}").write_text("\n".join(names))
        (mount / ".target-file").write_text(str(canary / canaries[0]))
        race(agent, instance, swap, store)
    finally:  # the swapping ends with its container
        agent.client.delete(f"/v1/allocations/{instance}-a")


def race(agent, instance: str, swap: Path, store: dict) -> None:
    mount = disk(agent, f"gpucloud-{instance}")
    shutil.copy(swap, mount / f".{SWAP}")  # made whole, then in place: never run half-copied
    (mount / f".{SWAP}").rename(mount / SWAP)
    wait_for_file(mount / "ready")
    assert (agent.state_dir / HOST_KEY).stat().st_size > 0  # the gateway's key is there to take

    for turn in range(ROUNDS):
        body = {"kind": "backup", "store": store, "volume": f"gpucloud-{instance}"}
        backup = run_job(agent, f"race-{instance}-{turn}", body)
        assert backup["state"] == "done", backup["error"]
        held = files_over_a_byte(store, backup["result"]["snapshot"])
        not_the_tenants = {p for p in held if not p.startswith("/.")}
        assert not_the_tenants == set(), f"round {turn}: {held}"


def test_a_fifo_swapped_in_for_a_file_ends_the_backup(swap, store, tmp_path):
    """restic 0.14 opens a file it saw as a regular one without O_NONBLOCK: a FIFO swapped in
    meanwhile blocks that open forever. A folder of files is swapped with one of FIFOs of the
    same names, round after round until restic is caught: every job ends, and a caught one
    fails, saying why."""
    disks = Disks(tmp_path / "state" / "disks")
    jobs = SnapshotJobs(disks, tmp_path / "state", stall_seconds=3)
    mount = disks.ensure("fifos", "volume-1", "1", 1)
    (mount / "files").mkdir()
    (mount / "fifos").mkdir()
    for index in range(FIFOS):
        (mount / "files" / f"f{index}").write_text("x")
        os.mkfifo(mount / "fifos" / f"f{index}")
    swapping = subprocess.Popen([str(swap), "files", "fifos"], cwd=mount)
    views = []
    try:
        for turn in range(ROUNDS * 2):
            jobs.start(f"fifo-{turn}", {"kind": "backup", "store": store, "volume": "fifos"})
            deadline = time.monotonic() + 60
            while (view := jobs.get(f"fifo-{turn}").view())["state"] == "running":
                assert time.monotonic() < deadline, "the backup hangs on a FIFO"
                time.sleep(0.2)
            views.append(view)
            if view["state"] == "failed":
                break
    finally:
        swapping.kill()
        swapping.wait()
        disks.delete("fifos")
    assert views[-1]["state"] == "failed", "restic never met a FIFO: a race lost every round"
    assert "made no progress for 3 s" in views[-1]["error"]


def hostile_tree(root: Path, outside: Path) -> None:
    """What a snapshot may hold that a restore as root must not act on."""
    root.mkdir()
    os.mknod(root / "null", stat.S_IFCHR | 0o666, os.makedev(1, 3))
    shutil.copy("/usr/bin/busybox", root / "id")  # busybox's `id`, setuid root
    os.chown(root / "id", 0, 0)
    os.chmod(root / "id", 0o4755)  # noqa: S103 - the hostile file under test
    (root / "out").symlink_to(outside)
    (root / "up").symlink_to("../" * 12 + str(outside).lstrip("/"))
    (root / "root").symlink_to("/")
    (root / "sub").mkdir()
    (root / "sub" / "file").write_text("inside\n")
    os.link(root / "sub" / "file", root / "hard")
    (root / ("x" * 255)).write_text("long\n")
    (root / "new\nline").write_text("odd\n")
    os.mknod(bytes(root / "bad") + b"\xff\xfe", stat.S_IFREG | 0o644)


def test_a_hostile_snapshot_restores_inside_its_disk_and_nothing_in_it_is_usable(
    agent, store, tmp_path
):
    outside = tmp_path / "outside"
    outside.mkdir()
    tree = tmp_path / "tree"
    hostile_tree(tree, outside)
    snapshot = backup_tree(store, tree)

    volume, owner = f"gpucloud-{secrets.token_hex(8)}", "volume-77"
    body = {"kind": "restore", "store": store, "volume": volume, "snapshot": snapshot,
            "instance": owner, "tenant": "1", "size_gib": 1}  # fmt: skip
    restored = run_job(agent, f"restore-{volume}", body)
    assert restored["state"] == "done", restored["error"]
    assert list(outside.iterdir()) == []
    mount = disk(agent, volume)
    assert os.readlink(mount / "out") == str(outside)
    assert (mount / "hard").stat().st_ino == (mount / "sub" / "file").stat().st_ino
    assert (mount / "id").stat().st_mode & stat.S_ISUID  # kept, but of no use:
    flags = os.statvfs(mount).f_flag
    assert flags & os.ST_NODEV and flags & os.ST_NOSUID
    with pytest.raises(PermissionError):
        (mount / "null").open("rb")

    # in a container, where the volume is mounted: no device, no setuid
    instance = new_instance_id()
    volumes = [{"name": volume, "owner": owner, "size_gib": 1, "mount_path": "/data"}]
    check = (
        "grep ' /data ' /proc/self/mountinfo; "
        "cat /data/null && echo DEVICE-OPENED; "
        "/data/id -u; echo checked; sleep 1000"
    )
    launch(agent, instance, check, gpu=1, volumes=volumes)
    deadline = time.monotonic() + 30
    while "checked" not in (lines := container_lines(agent, instance)):
        assert time.monotonic() < deadline, lines
        time.sleep(0.2)
    mountinfo = next(line for line in lines if " /data " in line)
    assert {"nodev", "nosuid"} <= set(mountinfo.split()[5].split(","))
    assert "DEVICE-OPENED" not in lines
    assert "0" in lines  # the container's own root, not raised by a setuid bit
    assert list(outside.iterdir()) == []


def test_a_restore_into_a_tree_the_tenant_made_never_writes_through_its_symlinks(
    agent, store, tmp_path
):
    """The agent takes a restore into a disk that exists for the same owner (a retried job),
    whose instance may be running: the tenant's symlink where the snapshot has a folder
    steers nothing (unconfined, restic makes the folder by following it, then writes into
    whatever it points at, as root)."""
    outside = tmp_path / "outside"
    outside.mkdir()
    tree = tmp_path / "tree"
    (tree / "out").mkdir(parents=True)
    (tree / "out" / "planted").write_text("written by a restore\n")
    snapshot = backup_tree(store, tree)
    instance = new_instance_id()
    launch(agent, instance, f"ln -s {outside} /workspace/out; touch /workspace/ready; sleep 1000")
    wait_for_file(disk(agent, f"gpucloud-{instance}") / "ready")

    body = {"kind": "restore", "store": store, "volume": f"gpucloud-{instance}",
            "snapshot": snapshot, "instance": instance, "tenant": "1", "size_gib": 1}  # fmt: skip
    run_job(agent, f"restore-{instance}", body)
    assert list(outside.iterdir()) == []
    agent.client.delete(f"/v1/allocations/{instance}-a")


def backup_tree(store: dict, tree: Path) -> str:
    """A snapshot of `tree` made with the test's own restic, as root; its id."""
    if not Path(store["repository"]).exists():
        restic(store, "init")
    said = restic(store, "backup", ".", "--json", "--host", "gpucloud", cwd=tree)
    return json.loads(said.splitlines()[-1])["snapshot_id"]


def container_lines(agent, instance: str) -> list[str]:
    return agent.client.get(f"/v1/instances/{instance}/logs", params={"tail": 50}).json()["lines"]


def test_a_disk_in_use_is_never_given_to_another_container(agent):
    """Podman chowns a disk's tree path by path (`U`) as a container that mounts it starts:
    the agent starts none while another running container holds that disk, whose processes
    could swap a folder for a symlink meanwhile."""
    volume = f"gpucloud-{secrets.token_hex(8)}"
    volumes = [{"name": volume, "owner": "volume-5", "size_gib": 1, "mount_path": "/data"}]
    first, second = new_instance_id(), new_instance_id()
    launch(agent, first, "sleep 1000", gpu=2, volumes=volumes)
    body = {**launch_body(second, ["sleep", "1000"], gpu=3), "volumes": volumes}
    refused = agent.client.put(f"/v1/allocations/{second}-a", json=body).json()
    assert refused["state"] == "failed"
    assert refused["reason"] == f"volume_busy: {volume} is in use"

    agent.client.delete(f"/v1/allocations/{first}-a")
    agent.client.delete(f"/v1/allocations/{second}-a")
    launch(agent, second, "sleep 1000", gpu=3, volumes=volumes)
    agent.client.delete(f"/v1/allocations/{second}-a")
