"""File transfer stays inside the container (issue: SFTP read and wrote the host as root).

Every attack runs against a real agent on Podman with OpenSSH's sftp/scp or asyncssh's SFTP
client. The container plants the links (`busybox ln`, as a tenant would); the host has a
marker file in the agent's state directory that must never be read, and a directory outside
the container where nothing may be written."""

import asyncio
import secrets
import shutil

import asyncssh
import pytest

from tests.security.gateway import host_file

pytestmark = [
    pytest.mark.integration,
    pytest.mark.containers,
    pytest.mark.skipif(shutil.which("sftp") is None, reason="needs OpenSSH's client"),
]
MARKER = "host-only-secret"


@pytest.fixture
def planted(gateway, tmp_path):
    """A host marker (in the agent's state dir), a host directory outside the container, and
    in the container `/workspace/hostroot -> /`; answers (marker, outside)."""
    marker = gateway.agent.state_dir / "marker"
    marker.write_text(MARKER)
    outside = tmp_path / "outside"
    outside.mkdir()
    made = gateway.inside("busybox ln -s / /workspace/hostroot && echo made > /workspace/f")
    assert made.returncode == 0, made.stderr
    return marker, outside


def test_a_symlink_to_root_reads_the_containers_files_never_the_hosts(gateway, planted, tmp_path):
    marker, _ = planted
    for path in (marker, gateway.agent.state_dir / "ssh_host_ed25519_key", "/etc/shadow"):
        got = tmp_path / "got"
        gateway.sftp(f"get /workspace/hostroot/{host_file(path)} {got}")
        seen = got.read_bytes() if got.exists() else b""
        in_container = gateway.ssh(f"cat /{host_file(path)}").stdout.encode()
        assert seen == in_container, f"{path}: the host's file came out"
        assert MARKER.encode() not in seen and b"PRIVATE KEY" not in seen
        got.unlink(missing_ok=True)


def test_puts_renames_links_and_mkdirs_through_links_or_dot_dots_leave_the_host_alone(
    gateway, planted, tmp_path
):
    marker, outside = planted
    sent = tmp_path / "sent"
    sent.write_text("payload")
    linked = gateway.inside(f"busybox ln -s {outside} /workspace/outdir")
    assert linked.returncode == 0
    escape = f"/workspace/hostroot/{host_file(outside)}"
    dot_dots = "../../../../../.." + str(outside)
    result = gateway.sftp(
        f"-put {sent} /workspace/outdir/through-dir-link",
        f"-put {sent} {escape}/through-root-link",
        f"-put {sent} {dot_dots}/through-dot-dots",
        f"-rename /workspace/f {escape}/renamed",
        f"-mkdir {escape}/made",
        f"-mkdir {dot_dots}/made-too",
        f"-ln /workspace/hostroot/{host_file(marker)} /workspace/hardlink",
        f"-ln /workspace/hostroot/{host_file(marker)} {escape}/hardlink",
        f"-symlink /workspace/f {escape}/symlink",
    )
    assert result.returncode == 0, result.stderr
    assert list(outside.iterdir()) == []
    assert marker.read_text() == MARKER
    assert MARKER not in gateway.ssh("cat /workspace/hardlink").stdout
    assert gateway.ssh("cat /workspace/f").stdout == "made\n"  # it was not renamed out


def test_dot_dots_and_absolute_paths_are_the_containers(gateway, planted, tmp_path):
    name = f"x-{secrets.token_hex(4)}"
    sent = tmp_path / "sent"
    sent.write_text("to the container's /tmp")
    assert gateway.scp(str(sent), f"{gateway.target}:/tmp/{name}").returncode == 0
    assert gateway.ssh(f"cat /tmp/{name}").stdout == "to the container's /tmp"
    assert gateway.sftp(f"put {sent} ../../../../../tmp/{name}-up").returncode == 0
    assert gateway.ssh(f"cat /tmp/{name}-up").stdout == "to the container's /tmp"
    assert gateway.sftp(f"put {sent} relative-{name}").returncode == 0
    assert gateway.ssh(f"cat /workspace/relative-{name}").stdout == "to the container's /tmp"
    back = tmp_path / "back"
    assert gateway.sftp(f"get /workspace/../tmp/{name} {back}").returncode == 0
    assert back.read_text() == "to the container's /tmp"
    listed = gateway.sftp("cd /workspace/../../..", "pwd")
    assert "Remote working directory: /\n" in listed.stdout


def test_proc_root_links_are_refused(gateway, planted, tmp_path):
    marker, outside = planted
    assert gateway.inside("busybox ln -s /proc/1/root /workspace/init-root").returncode == 0
    got = tmp_path / "got"
    for path in (
        f"/proc/self/root/{host_file(marker)}",
        f"/proc/1/root/{host_file(marker)}",
        f"/workspace/init-root/{host_file(marker)}",
        "/proc/1/root/etc/hostname",
    ):
        gateway.sftp(f"get {path} {got}")
        assert not got.exists() or MARKER not in got.read_text(), path
    gateway.sftp(f"-put {marker} /workspace/init-root/{host_file(outside)}/via-proc")
    assert list(outside.iterdir()) == []


def test_a_symlink_swapped_in_a_loop_never_lets_a_transfer_out(gateway, planted):
    """The container flips /workspace/flip between / and a directory of its own while the
    client reads and writes through it: every read is the container's file or an error."""
    marker, outside = planted
    decoy = f"/workspace/inside/{host_file(marker)}"
    made = gateway.inside(
        f"mkdir -p $(dirname {decoy}) /workspace/inside/{host_file(outside)}"
        f" && echo decoy > {decoy}"
    )
    assert made.returncode == 0, made.stderr
    flipper = gateway.ssh_background(
        "while :; do busybox ln -sfn / /workspace/flip; busybox ln -sfn /workspace/inside"
        " /workspace/flip; done"
    )

    async def attack() -> set[bytes]:
        seen = set()
        async with await gateway.connect() as conn, conn.start_sftp_client() as sftp:
            for n in range(300):
                try:
                    async with sftp.open(f"/workspace/flip/{host_file(marker)}", "rb") as f:
                        seen.add(await f.read())
                except (asyncssh.SFTPError, OSError):
                    seen.add(b"error")
                try:
                    target = f"/workspace/flip/{host_file(outside)}/put-{n}"
                    async with sftp.open(target, "wb") as f:
                        await f.write(b"raced")
                except (asyncssh.SFTPError, OSError):
                    pass
        return seen

    try:
        seen = asyncio.run(attack())
    finally:
        flipper.kill()
    assert seen <= {b"decoy\n", b"error"}, seen
    assert list(outside.iterdir()) == []


def test_what_sftp_creates_belongs_to_the_containers_root(gateway, planted, tmp_path):
    sent = tmp_path / "sent"
    sent.write_text("mine")
    sent.chmod(0o644)
    assert gateway.sftp(f"put {sent} /workspace/owned", "mkdir /workspace/dir").returncode == 0
    listed = gateway.ssh("ls -lnd /workspace/owned /workspace/dir").stdout.splitlines()
    assert [line.split()[2:4] for line in listed] == [["0", "0"], ["0", "0"]], listed
    # made with an SSH server's umask (022), not the agent's own (077, for its state directory)
    assert sorted(line.split()[0] for line in listed) == ["-rw-r--r--", "drwxr-xr-x"], listed
