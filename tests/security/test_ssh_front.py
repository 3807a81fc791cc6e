"""The SSH front routes a login of instance N only to the gateway of the host N runs on: no
other destination, no other tenant's instance, no key the instance does not grant, no shell of
its own. The front runs in this process against the test database; a TCP listener stands in for
the host's gateway and records who reached it (the end-to-end path is
tests/instances/test_ssh_front_e2e.py)."""

import asyncio
import contextlib

import asyncssh
import pytest

from accounts.roles import Role
from accounts.ssh_keys import add_ssh_key, delete_ssh_key
from console import processes
from console.instances import ssh_front
from console.instances.models import Allocation, State
from tests.instances.helpers import make_instance

pytestmark = pytest.mark.django_db(transaction=True)
BANNER = b"SSH-2.0-standin-gateway\r\n"


@pytest.fixture
def front(settings, tmp_path):
    settings.SSH_FRONT = f"127.0.0.1:{processes.free_port()}"
    settings.SSH_CA_KEY_FILE = str(tmp_path / "ca")
    settings.SSH_FRONT_HOST_KEY_FILE = str(tmp_path / "front")
    return settings.SSH_FRONT


def _key(membership, name: str) -> asyncssh.SSHKey:
    key = asyncssh.generate_private_key("ssh-ed25519")
    add_ssh_key(membership, name, key.export_public_key().decode())
    return key


@pytest.fixture
def world(catalog, tenant, other_tenant, make_member, front):
    """Two tenants' running instances on two hosts whose gateways are stand-ins here."""
    gateways = [processes.free_port(), processes.free_port()]
    made = {}
    for tenant_, port, who in (
        (tenant, gateways[0], "mine"),
        (other_tenant, gateways[1], "theirs"),
    ):
        host = catalog.host(address="http://127.0.0.1:9")
        host.ssh_port = port
        host.save()
        membership = make_member(tenant_, Role.MEMBER)
        key = _key(membership, "laptop")
        instance = make_instance(catalog, tenant_, state=State.RUNNING)
        instance.ssh_keys.set(membership.ssh_keys.all())
        Allocation.objects.create(
            id=f"i{instance.pk}-a", instance=instance, host=host, mode="shared"
        )
        made[who] = (instance, key, port, membership)
    return made


async def _with_front(scenario, gateway_ports):
    """Run the front and stand-in gateways (which send a banner and count who came) around
    `scenario(reached)`."""
    reached: list[int] = []

    def standin(port):
        async def answer(reader, writer):
            reached.append(port)
            writer.write(BANNER)
            await writer.drain()
            writer.close()

        return answer

    servers = [await asyncio.start_server(standin(p), "127.0.0.1", p) for p in gateway_ports]
    host, port = ssh_front.ssh_authority.front_address()
    serving = asyncio.create_task(ssh_front.serve(host, port))
    try:
        for _ in range(100):  # the front listens within a moment
            with contextlib.suppress(OSError):
                _, writer = await asyncio.open_connection(host, port)
                writer.close()
                break
            await asyncio.sleep(0.05)
        return await scenario(reached)
    finally:
        serving.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await serving
        for server in servers:
            server.close()


def _connect(user: str, key) -> asyncssh.SSHClientConnection:
    host, port = ssh_front.ssh_authority.front_address()
    return asyncssh.connect(
        host, port, username=user, client_keys=[key], known_hosts=None, agent_path=None
    )


async def _banner(conn, host="gpucloud", port=22) -> bytes:
    reader, writer = await conn.open_connection(host, port)
    try:
        return await asyncio.wait_for(reader.readline(), 5)
    finally:
        writer.close()


def test_a_granted_key_reaches_its_instances_gateway_and_nothing_else(world):
    instance, key, gateway, _ = world["mine"]

    async def scenario(reached):
        async with _connect(str(instance.pk), key) as conn:
            assert await _banner(conn) == BANNER
            for host, port in (("127.0.0.1", gateway), ("127.0.0.1", 5432), ("gpucloud", 2222),
                               ("localhost", 22), (f"{instance.pk}.gpucloud", 22)):  # fmt: skip
                with pytest.raises(asyncssh.ChannelOpenError, match="gpucloud port 22 only"):
                    await _banner(conn, host, port)
        return reached

    assert asyncio.run(_with_front(scenario, [world["mine"][2], world["theirs"][2]])) == [gateway]


def test_no_key_opens_another_tenants_instance_nor_a_made_up_user(world):
    mine, my_key = world["mine"][0], world["mine"][1]
    theirs = world["theirs"][0]
    users = [str(theirs.pk), f"{mine.pk} ", f"0{mine.pk}", f"{mine.pk}x", "../1", "root", "",
             "9" * 40, "-1", "\u00b2", f"+{mine.pk}", f"{mine.pk}.0"]  # fmt: skip

    async def scenario(reached):
        for user in users:
            with pytest.raises(asyncssh.PermissionDenied):
                async with _connect(user, my_key):
                    pass
        return reached

    assert asyncio.run(_with_front(scenario, [world["mine"][2], world["theirs"][2]])) == []


def test_a_withdrawn_key_opens_no_tunnel_on_a_connection_it_opened(world):
    instance, key, gateway, membership = world["mine"]

    async def scenario(reached):
        async with _connect(str(instance.pk), key) as conn:
            assert await _banner(conn) == BANNER
            await asyncio.to_thread(lambda: delete_ssh_key(membership.ssh_keys.get()))
            with pytest.raises(asyncssh.ChannelOpenError, match="no longer opens"):
                await _banner(conn)
        return reached

    assert asyncio.run(_with_front(scenario, [gateway])) == [gateway]


def test_a_stopped_instance_is_named_not_reached(world):
    instance, key, gateway, _ = world["mine"]
    instance.state = State.STOPPED
    instance.save()

    async def scenario(reached):
        async with _connect(str(instance.pk), key) as conn:
            with pytest.raises(asyncssh.ChannelOpenError, match="is stopped: start it first"):
                await _banner(conn)
        return reached

    assert asyncio.run(_with_front(scenario, [gateway])) == []


def test_the_front_opens_no_shell_and_says_how_to_go_through_it(world, front):
    instance, key, gateway, _ = world["mine"]

    async def scenario(reached):
        async with _connect(str(instance.pk), key) as conn:
            shell = await conn.run("id", check=False)
            assert shell.exit_status == 1
            assert f"ssh -J {instance.pk}@{front} {instance.pk}@gpucloud" in shell.stderr
            assert shell.stdout == ""
            with pytest.raises(asyncssh.ChannelOpenError):
                await conn.start_sftp_client()
            with pytest.raises(asyncssh.ChannelListenError):
                await conn.forward_remote_port("127.0.0.1", 0, "127.0.0.1", gateway)
        return reached

    assert asyncio.run(_with_front(scenario, [gateway])) == []
