"""The SSH gateway: `ssh -p PORT <instance>@host` into an instance's container, without the
image shipping an SSH server.

The user name is the instance; a session is let in with one of the keys the console pushed for
that instance (`PUT /v1/instances/{id}/ssh-keys`), and only while the instance runs here. It
gets a login shell (with a PTY when the client asks for one) or runs the given command, with
its exit status; the SFTP subsystem serves the instance's volume at /workspace (so `scp` and
`sftp` work on any image). Every session is an event for the console, and so is its end.
"""

import asyncio
import contextlib
import logging
import os
from pathlib import Path

import asyncssh

from agent.errors import ApiError, invalid
from agent.shell import STDERR, Shell

log = logging.getLogger(__name__)

HOST_KEY = "ssh_host_ed25519_key"
KEY_TYPES = ("ssh-ed25519", "ecdsa-sha2-nistp256", "ecdsa-sha2-nistp384", "ecdsa-sha2-nistp521")
MIN_RSA_BITS = 2048
WORKSPACE = b"/workspace"


def host_key(state_dir: Path) -> asyncssh.SSHKey:
    """This host's SSH key: generated once, kept in the state directory."""
    path = state_dir / HOST_KEY
    if not path.exists():
        key = asyncssh.generate_private_key("ssh-ed25519")
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "wb") as f:
            f.write(key.export_private_key())
        log.info("SSH host key generated: %s", key.get_fingerprint("sha256"))
    return asyncssh.read_private_key(str(path))


def fingerprint(key: asyncssh.SSHKey) -> str:
    return key.get_fingerprint("sha256")


def parse_keys(body) -> list[dict]:
    """The body of `PUT /v1/instances/{id}/ssh-keys`: `{"keys": [{name, public_key, …}]}`."""
    if not isinstance(body, dict) or not isinstance(body.get("keys"), list):
        raise invalid('the body must be {"keys": [{"name": …, "public_key": …}, …]}')
    keys = []
    for n, item in enumerate(body["keys"]):
        if not isinstance(item, dict) or not isinstance(item.get("public_key"), str):
            raise invalid(f"keys[{n}] must be an object with a public_key string")
        try:
            key = asyncssh.import_public_key(item["public_key"])
        except (asyncssh.KeyImportError, ValueError) as exc:
            raise invalid(f"keys[{n}]: not an SSH public key: {exc}", "invalid_key") from exc
        algorithm = key.get_algorithm()
        if algorithm == "ssh-rsa" and key.pyca_key.key_size < MIN_RSA_BITS:
            raise invalid(f"keys[{n}]: RSA keys need at least {MIN_RSA_BITS} bits", "weak_key")
        if algorithm not in (*KEY_TYPES, "ssh-rsa"):
            raise invalid(f"keys[{n}]: {algorithm} keys are not accepted", "invalid_key")
        name = str(item.get("name") or "")[:100]
        keys.append(
            {"name": name, "public_key": item["public_key"], "fingerprint": fingerprint(key)}
        )
    return keys


class _Server(asyncssh.SSHServer):
    """One connection: public keys only, checked against the instance's keys."""

    def __init__(self, host):
        self.host = host
        self.conn = None

    def connection_made(self, conn) -> None:
        self.conn = conn

    def begin_auth(self, username: str) -> bool:
        return True

    def password_auth_supported(self) -> bool:
        return False

    def public_key_auth_supported(self) -> bool:
        return True

    def validate_public_key(self, username: str, key: asyncssh.SSHKey) -> bool:
        """One of the instance's keys, while the instance runs here: else refused."""
        try:
            self.host.running_allocation(username)
        except ApiError:
            return False
        offered = fingerprint(key)
        for known in self.host.ssh_keys.get(username, []):
            if known["fingerprint"] == offered:
                self.conn.set_extra_info(gpucloud_key=known)
                return True
        return False


class _Workspace(asyncssh.SFTPServer):
    """SFTP on the instance's volume: `/workspace/…` and relative paths land in it."""

    def __init__(self, chan, root: Path):
        super().__init__(chan, chroot=bytes(root))

    def map_path(self, path: bytes) -> bytes:
        if path == WORKSPACE or path.startswith(WORKSPACE + b"/"):
            path = path[len(WORKSPACE) :] or b"/"
        return super().map_path(path)

    def exit(self) -> None:
        """The session ends with exit status 0, as OpenSSH's sftp-server's does: scp and
        sftp count a session without one as failed."""
        super().exit()
        self.channel.exit(0)


class Gateway:
    def __init__(self, host, state_dir: Path, listen_host: str, port: int):
        self.host = host
        self.key = host_key(state_dir)
        self.listen_host = listen_host
        self.port = port
        self.server = None

    @property
    def info(self) -> dict:
        return {"port": self.port, "host_key_fingerprint": fingerprint(self.key)}

    async def start(self) -> None:
        self.server = await asyncssh.create_server(
            lambda: _Server(self.host),
            self.listen_host,
            self.port,
            server_host_keys=[self.key],
            process_factory=self._session,
            sftp_factory=self._sftp,
            allow_scp=False,
            encoding=None,
            line_editor=False,
        )
        log.info("SSH gateway on %s:%d (%s)", self.listen_host, self.port, fingerprint(self.key))

    async def stop(self) -> None:
        if self.server is not None:
            self.server.close()
            await self.server.wait_closed()

    def _sftp(self, chan):
        instance = chan.get_extra_info("username")
        root = None
        with contextlib.suppress(ApiError):
            self.host.running_allocation(instance)
            root = self.host.runtime.volume_path(instance)
        if root is None:
            raise asyncssh.ChannelOpenError(
                asyncssh.OPEN_ADMINISTRATIVELY_PROHIBITED, f"instance {instance} is not running"
            )
        return _Workspace(chan, root)

    def _describe(self, process) -> str:
        peer = (process.get_extra_info("peername") or ("?",))[0]
        key = process.get_extra_info("gpucloud_key") or {}
        name = key.get("name") or "?"
        return f"ssh session from {peer} with key {name} ({key.get('fingerprint')})"

    async def _session(self, process: asyncssh.SSHServerProcess) -> None:
        instance = process.get_extra_info("username")
        command = ["/bin/sh", "-c", process.command] if process.command else None
        size = process.get_terminal_size()
        tty = process.get_terminal_type() is not None
        try:
            shell = await Shell.open(
                self.host,
                instance,
                command,
                tty=tty,
                cols=size[0] or 80,
                rows=size[1] or 24,
                term=process.get_terminal_type() or "xterm",
            )
        except ApiError as exc:
            process.stderr.write(f"gpucloud: {exc.detail}\r\n".encode())
            process.exit(1)
            return
        description = self._describe(process)
        self.host.session_event(instance, description)
        status = None
        try:
            status = await self._relay(process, shell)
        finally:
            shell.close()
            self.host.session_event(instance, f"{description} ended (exit status {status})")
        process.exit(status if status is not None else 255)

    async def _relay(self, process, shell: Shell) -> int | None:
        """Client input to the command, its output back, until the output ends."""

        async def forward_input() -> None:
            while True:
                try:
                    data = await process.stdin.read(65536)
                except asyncssh.TerminalSizeChanged as change:
                    await shell.resize(change.width, change.height)
                    continue
                except asyncssh.BreakReceived:
                    continue
                except asyncssh.SignalReceived:
                    continue
                if not data:
                    shell.close_input()
                    return
                await shell.write(data)

        feeder = asyncio.create_task(forward_input())
        try:
            while (chunk := await shell.read()) is not None:
                stream, data = chunk
                (process.stderr if stream == STDERR else process.stdout).write(data)
        finally:
            feeder.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await feeder
        return await shell.exit_code()
