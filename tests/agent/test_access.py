"""Ways into a running container through the agent, with real containers and real clients:
the SSH gateway (asyncssh and OpenSSH as clients: commands, a PTY shell, SFTP and scp), the
terminal websocket and the web-port proxy."""

import asyncio
import json
import os
import secrets
import shutil
import subprocess
import time

import asyncssh
import httpx
import pytest
import websockets

from agent import grants
from tests.agent.agents import SECRET, free_port, wait_for
from tests.agent.test_oci_runtime import launch_body

pytestmark = pytest.mark.containers
QUERY, ANSWER = "\x1b[6n", "\x1b[1;1R"  # busybox's shell asks where the cursor is


def grant(*scope) -> dict[str, str]:
    """The console's credential for a terminal or a port: a grant of that scope."""
    expires = int(time.time()) + 60
    token = f"{expires}.{grants.signature(grants.data_key(SECRET), scope, expires)}"
    return {"Authorization": f"Grant {token}"}


@pytest.fixture
def keys(tmp_path):
    """Two users' ed25519 keys as files (for OpenSSH) and objects (for asyncssh)."""
    made = {}
    for name in ("laptop", "stranger"):
        key = asyncssh.generate_private_key("ssh-ed25519", comment=name)
        path = tmp_path / name
        path.write_bytes(key.export_private_key())
        path.chmod(0o600)
        made[name] = (key, path)
    return made


@pytest.fixture
def gateway(start_agent, container_engine, keys):
    """An agent with the oci runtime and its SSH gateway, one instance running `sleep` with
    the `laptop` key allowed; (agent, ssh port, instance)."""
    port = free_port()
    agent = start_agent(
        "--gpus", "2", "--runtime", "oci", "--engine-url", container_engine.url,
        "--ssh-listen", f"127.0.0.1:{port}",
    )  # fmt: skip
    instance = f"t{secrets.token_hex(4)}"
    laptop = keys["laptop"][0].export_public_key().decode()
    allowed = agent.client.put(
        f"/v1/instances/{instance}/ssh-keys",
        json={"keys": [{"name": "laptop", "public_key": laptop}]},
    )
    assert allowed.status_code == 200, allowed.text
    body = launch_body(instance, None)  # the image's own command: the demo web server on 8888
    assert agent.client.put(f"/v1/allocations/{instance}-a", json=body).json()["state"] == "running"
    return agent, port, instance


async def _connect(port: int, user: str, key) -> asyncssh.SSHClientConnection:
    return await asyncssh.connect(
        "127.0.0.1", port, username=user, client_keys=[key], known_hosts=None, agent_path=None
    )


def test_the_host_key_is_kept_and_its_fingerprint_offered(gateway, keys):
    agent, port, _ = gateway
    offered = agent.client.get("/v1/inventory").json()["ssh"]
    assert offered["port"] == port
    key = asyncssh.read_private_key(str(agent.state_dir / "ssh_host_ed25519_key"))
    assert offered["host_key_fingerprint"] == key.get_fingerprint("sha256")

    async def seen() -> str:
        async with await _connect(port, gateway[2], keys["laptop"][0]) as conn:
            return conn.get_server_host_key().get_fingerprint("sha256")

    assert asyncio.run(seen()) == offered["host_key_fingerprint"]


def test_a_command_runs_with_its_output_and_exit_status(gateway, keys):
    _, port, instance = gateway

    async def run():
        async with await _connect(port, instance, keys["laptop"][0]) as conn:
            done = await conn.run("echo $((6*7)); echo oops >&2; exit 3")
            fed = await conn.run("cat", input="from stdin\n")
            return done, fed

    done, fed = asyncio.run(run())
    assert (done.stdout, done.stderr, done.exit_status) == ("42\n", "oops\n", 3)
    assert fed.stdout == "from stdin\n" and fed.exit_status == 0  # stdin EOF reaches cat


def test_a_pty_shell_answers_and_resizes(gateway, keys):
    _, port, instance = gateway

    async def session():
        async with await _connect(port, instance, keys["laptop"][0]) as conn:
            process = await conn.create_process(term_type="xterm", term_size=(100, 30))

            async def type_and_read(line: str, until: str) -> str:
                """Type a line once the shell prompts, answering its cursor-position queries as
                a terminal does; read until `until` and the next prompt."""
                process.stdin.write(line)
                seen = ""
                while until not in seen or not seen.rstrip().endswith(QUERY):
                    seen += await asyncio.wait_for(process.stdout.read(4096), 10)
                process.stdin.write(ANSWER)
                return seen

            first = await type_and_read("stty size; echo $((6*7))\n", "42")
            process.change_terminal_size(120, 40)
            second = await type_and_read("stty size\n", "size")
            started = asyncio.get_running_loop().time()
            process.stdin.write("sleep 100; echo slept\n")
            await asyncio.sleep(0.5)
            interrupted = await type_and_read("\x03", "\n")  # Ctrl-C stops the sleep
            assert asyncio.get_running_loop().time() - started < 5
            assert "^C" in interrupted and "\nslept" not in interrupted
            process.stdin.write("exit 5\n")
            await asyncio.wait_for(process.wait(), 10)
            return first, second, process.exit_status

    first, second, status = asyncio.run(session())
    assert "30 100" in first and "42" in first
    assert "40 120" in second
    assert status == 5


def test_wrong_keys_and_stopped_instances_are_refused(gateway, keys):
    agent, port, instance = gateway

    async def refused(user, key) -> bool:
        try:
            await _connect(port, user, key)
        except asyncssh.PermissionDenied:
            return True
        return False

    assert asyncio.run(refused(instance, keys["stranger"][0]))
    assert asyncio.run(refused("t-someone-else", keys["laptop"][0]))
    agent.client.post(f"/v1/allocations/{instance}-a/stop")
    assert asyncio.run(refused(instance, keys["laptop"][0]))


@pytest.mark.skipif(shutil.which("ssh") is None, reason="needs OpenSSH's client")
def test_openssh_runs_commands_and_scp_round_trips_through_workspace(gateway, keys, tmp_path):
    _, port, instance = gateway
    options = ["-o", "StrictHostKeyChecking=no", "-o", "UserKnownHostsFile=/dev/null",
               "-o", "BatchMode=yes", "-i", str(keys["laptop"][1])]  # fmt: skip
    ssh = ["ssh", "-p", str(port), *options, f"{instance}@127.0.0.1"]
    result = subprocess.run(
        [*ssh, "echo hi from $(hostname); exit 4"], capture_output=True, text=True
    )
    assert result.returncode == 4, result.stderr
    assert result.stdout.startswith("hi from ")

    sent = tmp_path / "model.bin"
    sent.write_bytes(os.urandom(200_000))
    scp = ["scp", "-P", str(port), *options]
    to = subprocess.run(
        [*scp, str(sent), f"{instance}@127.0.0.1:/workspace/model.bin"], capture_output=True
    )
    assert to.returncode == 0, to.stderr
    size = subprocess.run([*ssh, "wc -c < /workspace/model.bin"], capture_output=True, text=True)
    assert size.stdout.strip() == "200000"
    back = tmp_path / "back.bin"
    fro = subprocess.run(
        [*scp, f"{instance}@127.0.0.1:/workspace/model.bin", str(back)], capture_output=True
    )
    assert fro.returncode == 0, fro.stderr
    assert back.read_bytes() == sent.read_bytes()


def test_the_terminal_websocket_is_a_pty_shell(gateway):
    agent, _, instance = gateway
    url = f"ws://127.0.0.1:{agent.port}/v1/instances/{instance}/terminal?cols=90&rows=20"
    auth = grant("terminal", instance)

    async def session():
        async with websockets.connect(url, additional_headers=auth) as ws:
            seen = b""
            for _ in range(40):  # the resize reaches the pty beside the input, not before it
                # sent again, as a browser does on each layout change: an engine that is busy
                # starting the session may refuse a resize for longer than the agent retries it
                await ws.send(json.dumps({"type": "resize", "cols": 132, "rows": 43}))
                await ws.send(b"stty size; echo $((6*7))\r")
                while b"42\r\n" not in seen:
                    seen += await asyncio.wait_for(ws.recv(), 10)
                if b"43 132" in seen:
                    break
                seen = b""
                await asyncio.sleep(0.1)
            await ws.send(b"exit\r")
            with pytest.raises(websockets.ConnectionClosedOK):
                while True:
                    await asyncio.wait_for(ws.recv(), 10)
            return seen

    seen = asyncio.run(session())
    assert b"43 132" in seen

    async def close_code(path, headers) -> int:
        async with websockets.connect(
            f"ws://127.0.0.1:{agent.port}{path}", additional_headers=headers
        ) as ws:
            with pytest.raises(websockets.ConnectionClosed) as closed:
                await asyncio.wait_for(ws.recv(), 10)
            return closed.value.rcvd.code

    nobody = grant("terminal", "t-nobody")
    assert asyncio.run(close_code("/v1/instances/t-nobody/terminal", nobody)) == 4404
    for refused in ({}, {"Authorization": f"Bearer {SECRET}"}, nobody):
        with pytest.raises(websockets.InvalidStatus):
            asyncio.run(close_code(f"/v1/instances/{instance}/terminal", refused))


def test_the_port_proxy_reaches_the_containers_web_server(gateway):
    agent, _, instance = gateway
    port = f"{agent.url}/v1/instances/{instance}/ports/8888/"
    jupyter = grant("port", instance, 8888)
    page = wait_for(lambda: (r := httpx.get(port, headers=jupyter)).status_code == 200 and r)
    assert "gpucloud demo" in page.text
    missing = httpx.get(f"{port}nothing-here", headers=jupyter)
    assert missing.status_code == 404  # the container's own answer, passed on
    closed = httpx.get(
        f"{agent.url}/v1/instances/{instance}/ports/9999/", headers=grant("port", instance, 9999)
    )
    assert closed.status_code == 502 and closed.json()["error"] == "port_unreachable"
    nobody = httpx.get(
        f"{agent.url}/v1/instances/t-nobody/ports/8888/", headers=grant("port", "t-nobody", 8888)
    )
    assert nobody.status_code == 404
    for refused in ({}, {"Authorization": f"Bearer {SECRET}"}, grant("port", instance, 9999)):
        assert httpx.get(port, headers=refused).status_code == 401
