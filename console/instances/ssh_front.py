"""The SSH front: one stable address for every instance's SSH, wherever the instance runs.

`ssh -J 42@FRONT 42@gpucloud` logs in to the front as instance 42 with one of the keys the
instance grants, then asks it for a tunnel to `gpucloud` port 22; the front opens it to the SSH
gateway of the host that instance 42 runs on now (agent/ssh.py), and the client logs in there
end to end with the same key. The client trusts the front by its one host key and every gateway
through the console's CA (console/fleet/ssh_authority.py), so neither the line nor the client's
known_hosts changes when an unshelve or a failover moves the instance to another host.

The front is a router, not a shell: it grants no session, forwards nowhere but to the gateway of
the instance it logged in as, and never where the client's request says; a key withdrawn from
the instance opens no tunnel (and the gateway closes those it carries). The gateway's caps on
connections per instance and per key bound the tunnels too: each carries one connection."""

import asyncio
import logging
from urllib.parse import urlsplit

import asyncssh
from channels.db import database_sync_to_async

from console import integers
from console.fleet import ssh_authority
from console.fleet.ssh_authority import INSTANCE_HOST
from console.instances import access
from console.instances.models import Allocation, Instance, State

log = logging.getLogger(__name__)

LOGIN_TIMEOUT_SECONDS = 30


def admits(instance: str, key_fingerprint: str) -> bool:
    """Whether the key is one the instance grants now (as its host's gateway would let in); the
    user name is the instance's id as the console writes it, nothing else."""
    pk = integers.reference_id(instance)
    if pk is None or str(pk) != instance:
        return False
    return any(k["fingerprint"] == key_fingerprint for k in access.granted_keys(pk))


def gateway_of(instance: str, key_fingerprint: str) -> tuple[str, int] | str:
    """Where the gateway of the host the instance runs on listens, or why there is none."""
    if not admits(instance, key_fingerprint):
        return f"this key no longer opens instance {instance}"
    state = Instance.objects.filter(pk=int(instance)).values_list("state", flat=True).first()
    if state != State.RUNNING:
        return f"instance {instance} is {state}: start it first, ssh needs it running"
    allocation = (
        Allocation.objects.filter(instance_id=int(instance), released_at__isnull=True)
        .select_related("host")
        .first()
    )
    host = allocation.host if allocation else None
    if host is None or not host.ssh_port:
        return f"instance {instance} runs on a host without an SSH gateway"
    return urlsplit(host.address).hostname or host.name, host.ssh_port


class _Connection(asyncssh.SSHServer):
    """One client: logged in as an instance with one of its keys; tunnels to its gateway."""

    def __init__(self):
        self.conn = None
        self.key = ""

    def connection_made(self, conn) -> None:
        self.conn = conn

    def begin_auth(self, username: str) -> bool:
        return True

    def password_auth_supported(self) -> bool:
        return False

    def public_key_auth_supported(self) -> bool:
        return True

    async def validate_public_key(self, username: str, key: asyncssh.SSHKey) -> bool:
        offered = ssh_authority.fingerprint(key)
        if await database_sync_to_async(admits)(username, offered):
            self.key = offered
            return True
        return False

    def connection_requested(self, dest_host: str, dest_port: int, orig_host: str, orig_port: int):
        instance = self.conn.get_extra_info("username")
        if (dest_host, dest_port) != (INSTANCE_HOST, 22):
            raise asyncssh.ChannelOpenError(
                asyncssh.OPEN_ADMINISTRATIVELY_PROHIBITED,
                f"this front reaches {INSTANCE_HOST} port 22 only: "
                f"ssh -J {instance}@FRONT {instance}@{INSTANCE_HOST}",
            )
        return self._tunnel(instance)

    async def _tunnel(self, instance: str):
        where = await database_sync_to_async(gateway_of)(instance, self.key)
        if isinstance(where, str):
            raise asyncssh.ChannelOpenError(asyncssh.OPEN_CONNECT_FAILED, where)
        peer = (self.conn.get_extra_info("peername") or ("?",))[0]
        log.info("instance %s: tunnel from %s (key %s) to %s:%d", instance, peer, self.key, *where)
        try:
            return await self.conn.forward_connection(*where)
        except asyncssh.ChannelOpenError as exc:
            raise asyncssh.ChannelOpenError(
                asyncssh.OPEN_CONNECT_FAILED, f"the gateway of instance {instance} does not answer"
            ) from exc


async def _no_shell(process: asyncssh.SSHServerProcess) -> None:
    """A session asked of the front itself: say how to go through it."""
    instance = process.get_extra_info("username")
    process.stderr.write(
        f"gpucloud: this is the SSH front; it opens no shell. Go through it to the instance:\r\n"
        f"  ssh -J {instance}@{_front_for_users()} {instance}@{INSTANCE_HOST}\r\n"
    )
    process.exit(1)


def _front_for_users() -> str:
    host, port = ssh_authority.front_address()
    host = f"[{host}]" if ":" in host else host
    return host if port == 22 else f"{host}:{port}"


async def serve(listen_host: str, listen_port: int) -> None:
    """Run the front until cancelled."""
    server = await asyncssh.create_server(
        _Connection,
        listen_host,
        listen_port,
        server_host_keys=[ssh_authority.front_key()],
        process_factory=_no_shell,
        allow_scp=False,
        agent_forwarding=False,
        x11_forwarding=False,
        login_timeout=LOGIN_TIMEOUT_SECONDS,
    )
    log.info(
        "SSH front on %s:%d (%s)",
        listen_host,
        listen_port,
        ssh_authority.fingerprint(ssh_authority.front_key()),
    )
    try:
        await asyncio.Future()
    finally:
        server.close()
        await server.wait_closed()
