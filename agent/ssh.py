"""The SSH gateway: `ssh -p PORT <instance>@host` into an instance's container, without the
image shipping an SSH server.

The user name is the instance; a session is let in with one of the keys the console pushed for
that instance (`PUT /v1/instances/{id}/ssh-keys`), and only while the instance runs here. It
gets a login shell (with a PTY when the client asks for one) or runs the given command, with
its exit status; the SFTP subsystem serves the container's files (agent/sftp.py: paths are the
container's, relative ones in /workspace, so `scp` and `sftp` work on any image). Every session
is an event for the console, and so is its end.

An instance takes at most MAX_SESSIONS_PER_INSTANCE connections and as many sessions (shells,
commands, SFTP), at most MAX_SESSIONS_PER_KEY of each with one key; one more is refused with
the reason. When the console withdraws a key, every connection opened with it is closed at
once, and what its sessions ran in the container ends (agent/shell.py).

Users reach the gateway through the console's SSH front (console/ssh_front), which routes a
jump (`ssh -J ID@front ID@gpucloud`) to the instance's host of the moment. So that the client's
known_hosts survives a move to another host, the gateway presents a host certificate that the
console's CA signed for its key (`PUT /v1/ssh/host-certificate`, kept beside the key).
"""

import asyncio
import contextlib
import functools
import logging
import os
from collections import Counter
from pathlib import Path

import asyncssh
from asyncssh.public_key import CERT_TYPE_HOST
from asyncssh.sftp import SFTPPermissionDenied

from agent.errors import ApiError, invalid
from agent.sftp import ContainerSFTP, Root
from agent.shell import STDERR, Shell, until_either_ends

log = logging.getLogger(__name__)

HOST_KEY = "ssh_host_ed25519_key"
HOST_CERTIFICATE = "ssh_host_ed25519_key-cert.pub"
KEY_TYPES = ("ssh-ed25519", "ecdsa-sha2-nistp256", "ecdsa-sha2-nistp384", "ecdsa-sha2-nistp521")
MIN_RSA_BITS = 2048
MAX_SESSIONS_PER_INSTANCE = 16
MAX_SESSIONS_PER_KEY = 8
WITHDRAWN = "access to this instance was withdrawn"


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


def parse_certificate(body, key: asyncssh.SSHKey) -> asyncssh.SSHCertificate:
    """The body of `PUT /v1/ssh/host-certificate`: `{"certificate": "<OpenSSH certificate>"}`,
    a host certificate of `key` (this gateway's), valid now."""
    if not isinstance(body, dict) or not isinstance(body.get("certificate"), str):
        raise invalid('the body must be {"certificate": "<an OpenSSH host certificate>"}')
    try:
        certificate = asyncssh.import_certificate(body["certificate"])
    except (asyncssh.KeyImportError, ValueError) as exc:
        raise invalid(f"not an SSH certificate: {exc}", "invalid_certificate") from exc
    if certificate.key.public_data != key.public_data:
        raise invalid("the certificate is of another key than this gateway's", "wrong_key")
    try:
        certificate.validate(CERT_TYPE_HOST, None)  # its type and its validity now
    except ValueError as exc:
        raise invalid(f"not a host certificate valid now: {exc}", "invalid_certificate") from exc
    return certificate


def certificate_info(certificate: asyncssh.SSHCertificate | None) -> dict | None:
    """What the inventory says of the host certificate: whose CA signed it, until when."""
    if certificate is None:
        return None
    return {
        "authority": fingerprint(certificate.signing_key),
        "valid_before": certificate._valid_before,  # asyncssh keeps it private
    }


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

    def __init__(self, gateway: "Gateway"):
        self.gateway = gateway
        self.host = gateway.host
        self.conn = None

    def connection_made(self, conn) -> None:
        self.conn = conn

    def connection_lost(self, exc) -> None:
        self.gateway.disconnected(self.conn)

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

    def auth_completed(self) -> None:
        self.gateway.connected(self.conn)


class _Refused(asyncssh.SFTPServer):
    """What a refused SFTP session is given: its channel is closed already; nothing is served."""

    def map_path(self, path: bytes) -> bytes:
        raise SFTPPermissionDenied("refused")


class Gateway:
    def __init__(self, host, state_dir: Path, listen_host: str, port: int):
        self.host = host
        self.key = host_key(state_dir)
        self.certificate_path = state_dir / HOST_CERTIFICATE
        self.certificate = self._stored_certificate()
        self.listen_host = listen_host
        self.port = port
        self.server = None
        self.connections: dict = {}  # connection -> (instance, key fingerprint)
        self.sessions: Counter = Counter()  # connection -> its open sessions
        host.key_listeners.append(self.keys_changed)
        host.gateway = self
        host.ssh = self.info

    @property
    def info(self) -> dict:
        return {
            "port": self.port,
            "host_key_fingerprint": fingerprint(self.key),
            "host_key": self.key.export_public_key().decode().strip(),
            "certificate": certificate_info(self.certificate),
        }

    def _stored_certificate(self) -> asyncssh.SSHCertificate | None:
        """The certificate kept from an earlier run, while it is still valid for this key."""
        try:
            return parse_certificate({"certificate": self.certificate_path.read_text()}, self.key)
        except FileNotFoundError:
            return None
        except ApiError as exc:
            log.warning("SSH host certificate in %s not used: %s", self.certificate_path, exc)
            return None

    def _host_keys(self) -> list:
        """The key, with its certificate when it has one (offered as both)."""
        return [(self.key, self.certificate)] if self.certificate else [self.key]

    def certify(self, body) -> dict:
        """Present a new host certificate from now on (new connections), and keep it."""
        certificate = parse_certificate(body, self.key)
        partial = self.certificate_path.with_suffix(".new")
        partial.write_bytes(certificate.export_certificate())
        partial.replace(self.certificate_path)
        self.certificate = certificate
        if self.server is not None:
            self.server.update(server_host_keys=self._host_keys())
        self.host.ssh = self.info
        log.info("SSH host certificate from CA %s", fingerprint(certificate.signing_key))
        return self.info

    async def start(self) -> None:
        self.server = await asyncssh.create_server(
            lambda: _Server(self),
            self.listen_host,
            self.port,
            server_host_keys=self._host_keys(),
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

    # --- connections and the caps on them ------------------------------------------------

    def connected(self, conn) -> None:
        """A connection authenticated: kept (to be closed if its key goes), unless its key went
        meanwhile or the instance or the key has all the connections it may."""
        instance = conn.get_extra_info("username")
        key = conn.get_extra_info("gpucloud_key")["fingerprint"]
        if key not in {k["fingerprint"] for k in self.host.ssh_keys.get(instance, [])}:
            conn.disconnect(asyncssh.DISC_BY_APPLICATION, WITHDRAWN)
        elif refusal := self._full(instance, key, lambda _: 1, "connections"):
            conn.disconnect(asyncssh.DISC_TOO_MANY_CONNECTIONS, refusal)
        else:
            self.connections[conn] = (instance, key)

    def disconnected(self, conn) -> None:
        self.connections.pop(conn, None)
        self.sessions.pop(conn, None)

    def keys_changed(self, instance: str, keys: list[dict], members) -> None:
        """The instance's keys were replaced: close every connection of a key that went (a
        member's going takes their keys: `members` name the terminals' holders)."""
        allowed = {key["fingerprint"] for key in keys}
        for conn, (held, key) in list(self.connections.items()):
            if held == instance and key not in allowed:
                log.info("instance %s: closing an SSH connection of withdrawn key %s", held, key)
                self.disconnected(conn)
                conn.disconnect(asyncssh.DISC_BY_APPLICATION, WITHDRAWN)

    def _full(self, instance: str, key: str, count, what: str) -> str | None:
        """Why one more of `what` is refused (`count(connection)` of them are open), or None."""
        mine = [(k, count(c)) for c, (i, k) in self.connections.items() if i == instance]
        if sum(n for _, n in mine) >= MAX_SESSIONS_PER_INSTANCE:
            return f"instance {instance} has {MAX_SESSIONS_PER_INSTANCE} SSH {what} open, its most"
        if sum(n for k, n in mine if k == key) >= MAX_SESSIONS_PER_KEY:
            return f"this key has {MAX_SESSIONS_PER_KEY} SSH {what} open on {instance}, its most"
        return None

    # --- sessions ------------------------------------------------------------------------

    def _describe(self, chan, kind: str) -> str:
        peer = (chan.get_extra_info("peername") or ("?",))[0]
        key = chan.get_extra_info("gpucloud_key") or {}
        name = key.get("name") or "?"
        return f"{kind} session from {peer} with key {name} ({key.get('fingerprint')})"

    def _admit(self, chan) -> str | None:
        """Count a new session of the channel's connection in (out when its channel closes),
        or say why it is refused."""
        conn = chan.get_connection()
        if conn not in self.connections:  # closed meanwhile
            return WITHDRAWN
        instance, key = self.connections[conn]
        refusal = self._full(instance, key, self.sessions.__getitem__, "sessions")
        if refusal:
            return refusal
        self.sessions[conn] += 1

        async def release() -> None:
            await chan.wait_closed()
            if conn in self.sessions:
                self.sessions[conn] -= 1

        conn.create_task(release())
        return None

    async def _session(self, process: asyncssh.SSHServerProcess) -> None:
        """A shell or a command, within the caps."""
        refusal = self._admit(process.channel)
        if process.subsystem is not None:
            refusal = f"no {process.subsystem} subsystem here"
        if refusal:
            process.stderr.write(f"gpucloud: {refusal}\r\n".encode())
            process.exit(1)
            return
        await self._shell(process, process.get_extra_info("username"))

    async def _sftp(self, chan) -> asyncssh.SFTPServer:
        """SFTP in the container (agent/sftp.py), within the caps; a refused session gets the
        reason and nothing else."""
        instance = chan.get_extra_info("username")
        refusal = self._admit(chan)
        if not refusal:
            try:
                root = await asyncio.to_thread(self._container_root, instance)
            except (ApiError, OSError) as exc:
                refusal = getattr(exc, "detail", None) or str(exc)
            else:
                description = self._describe(chan, "sftp")
                self.host.session_event(instance, description, "ssh.opened")
                ended = functools.partial(
                    self.host.session_event, instance, f"{description} ended", "ssh.ended"
                )
                return ContainerSFTP(chan, root, ended)
        chan.write_stderr(f"gpucloud: {refusal}\r\n".encode())
        chan.exit(1)
        return _Refused(chan)

    def _container_root(self, instance: str) -> Root:
        runtime = self.host.runtime
        alloc = self.host.running_allocation(instance)
        container = runtime.running_container(alloc)
        if container is None:
            raise ApiError(404, "not_running", f"instance {instance} is not running here")
        pid = container.attrs["State"]["Pid"]

        def still_init() -> bool:
            again = runtime.running_container(alloc)
            return again is not None and again.attrs["State"]["Pid"] == pid

        return Root(pid, still_init)

    async def _shell(self, process: asyncssh.SSHServerProcess, instance: str) -> None:
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
        description = self._describe(process, "ssh")
        self.host.session_event(instance, description, "ssh.opened")
        status = None
        try:
            status = await self._relay(process, shell)
        finally:
            shell.close()
            ended = f"{description} ended (exit status {status})"
            self.host.session_event(instance, ended, "ssh.ended")
        process.exit(status if status is not None else 255)

    async def _relay(self, process, shell: Shell) -> int | None:
        """Client input to the command, its output back, until the output ends (answer the
        exit status) or the client goes (None)."""
        ended = asyncio.Event()

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

        async def forward_output() -> None:
            while (chunk := await shell.read()) is not None:
                stream, data = chunk
                (process.stderr if stream == STDERR else process.stdout).write(data)
            ended.set()

        feeder = asyncio.create_task(forward_input())
        try:
            await until_either_ends(forward_output(), process.wait_closed())
        finally:
            feeder.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await feeder
        return await shell.exit_code() if ended.is_set() else None
