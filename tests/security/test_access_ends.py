"""Access that ends, ends everything (issue 41): through the console's real path (web, Celery
worker, agent, Podman), a member lowered to viewer or removed while their browser terminal and
their SSH session run loses both at once — the terminal closes with 4403 within seconds, not at
the console's next look (RECHECK_SECONDS, 30 s) — and what those sessions started with setsid
ends with them."""

import asyncio
import re
import secrets
import shlex
import subprocess
import time

import httpx
import pytest
import websockets

from accounts.models import Membership
from accounts.roles import Role
from agent.shell import HANGUP_GRACE_SECONDS
from tests.factories import MembershipFactory, UserFactory
from tests.instances.conftest import stack, stack_env  # noqa: F401 - the instance tests' stack
from tests.instances.e2e import api_client
from tests.instances.test_e2e_access import SSH_OPTIONS, run_async, running  # noqa: F401
from tests.security.gateway import until

pytestmark = [pytest.mark.integration, pytest.mark.containers]
CSRF = re.compile(r'name="csrfmiddlewaretoken" value="([^"]+)"')
PASSWORD = "correct-horse-battery"


def _admin_signed_in(stack, tenant) -> httpx.Client:  # noqa: F811
    """A web session of an admin of the tenant (who removes members on the members page)."""
    user = UserFactory(username="ada")
    user.set_password(PASSWORD)
    user.save()
    MembershipFactory(user=user, tenant=tenant, role=Role.ADMIN)
    client = httpx.Client(base_url=stack.url, follow_redirects=True, timeout=10)
    token = CSRF.search(client.get("/login/").text)[1]
    form = {"username": "ada", "password": PASSWORD, "csrfmiddlewaretoken": token}
    assert "Log out" in client.post("/login/", data=form).text
    return client


def _post(client: httpx.Client, path: str, **form) -> str:
    token = CSRF.search(client.get("/members/").text)[1]
    answer = client.post(path, data={"csrfmiddlewaretoken": token, **form})
    assert answer.status_code == 200, answer.text
    return answer.text


async def _detach(ws, marker: str) -> None:
    await ws.send(f"busybox setsid {marker} </dev/null >/dev/null 2>&1 & echo STA''RTED\r".encode())
    seen = b""
    while b"STARTED\r\n" not in seen:
        seen += await asyncio.wait_for(ws.recv(), 10)


async def _closed_within(ws, seconds: float) -> tuple[float, int]:
    started = time.monotonic()
    with pytest.raises(websockets.ConnectionClosed) as closed:
        while True:
            await asyncio.wait_for(ws.recv(), seconds)
    return time.monotonic() - started, closed.value.rcvd.code


def test_a_lowered_or_removed_members_sessions_end_at_once_with_what_they_started(
    stack,  # noqa: F811
    running,  # noqa: F811
    container_engine,
):
    iid, tenant = running["id"], running["tenant"]
    mia = Membership.objects.get(tenant=tenant, user__username="mia")
    bob = MembershipFactory(tenant=tenant, role=Role.MEMBER)
    admin = _admin_signed_in(stack, tenant)
    by_ssh, by_mia, by_bob = (f"sleep 3{secrets.randbelow(10**6):06d}" for _ in range(3))

    def inside(marker: str) -> bool:
        listed = container_engine.podman("exec", f"gpucloud-{iid}", "ps", "-o", "args")
        return marker in listed.stdout

    ssh = shlex.split(running["instance"]["ssh"]["command"])
    login = [ssh[0], "-i", str(running["key"]), *SSH_OPTIONS, *ssh[1:]]
    detached = f"busybox setsid {by_ssh} </dev/null >/dev/null 2>&1 & exec sleep 600"
    client = subprocess.Popen([*login, detached], stderr=subprocess.DEVNULL)
    url = f"ws://127.0.0.1:{stack.port}/ws/instances/{iid}/terminal/"

    tokens = {
        member.pk: api_client(stack, member).headers["Authorization"] for member in (mia, bob)
    }

    def terminal(member):
        return websockets.connect(url, additional_headers={"Authorization": tokens[member.pk]})

    async def scenario():
        async with terminal(mia) as mine, terminal(bob) as theirs:
            await _detach(mine, by_mia)
            await _detach(theirs, by_bob)
            everything = (by_ssh, by_mia, by_bob)
            await asyncio.to_thread(until, lambda: all(map(inside, everything)), 20, "all run")
            await asyncio.to_thread(_post, admin, f"/members/{bob.pk}/role/", role="viewer")
            lowered = await _closed_within(theirs, 10)
            await asyncio.to_thread(_post, admin, f"/members/{mia.pk}/remove/")
            removed = await _closed_within(mine, 10)
        return lowered, removed

    lowered, removed = run_async(scenario())
    assert lowered[1] == removed[1] == 4403
    assert lowered[0] < 3 and removed[0] < 3, (lowered, removed)
    assert client.wait(timeout=5) == 255  # the SSH connection was cut
    for marker in (by_ssh, by_mia, by_bob):
        until(lambda m=marker: not inside(m), HANGUP_GRACE_SECONDS + 3, f"{marker} ends")
