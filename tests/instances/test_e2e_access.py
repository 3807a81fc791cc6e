"""Getting into an instance, end to end: the tenant's key through the API, the console's ssh
command run by OpenSSH against the host agent's gateway, scp to /workspace, the browser
terminal through the console's websocket relay, and the container's web server through the
port's own origin — to its tenant only."""

import asyncio
import contextlib
import re
import shlex
import shutil
import signal
import subprocess
import time
from concurrent.futures import ThreadPoolExecutor
from urllib.parse import urlsplit

import asyncssh
import httpx
import pytest
import websockets
from playwright.sync_api import expect

from accounts.roles import Role
from agent.devtools.engine import DEMO_IMAGE
from console import processes
from tests.factories import ImageFactory, MembershipFactory
from tests.instances.e2e import api_client, make_catalog, make_tenant, start_agent, wait_for
from tests.instances.e2e import wait_state as wait_api_state
from tests.pages import screenshot, sign_in

pytestmark = [pytest.mark.integration, pytest.mark.containers]


def run_async(coroutine):
    """asyncio.run in a thread of its own: the module's Playwright browser may keep an event
    loop running in this one."""
    with ThreadPoolExecutor(1) as thread:
        return thread.submit(asyncio.run, coroutine).result()


SSH_OPTIONS = ["-o", "StrictHostKeyChecking=no", "-o", "UserKnownHostsFile=/dev/null",
               "-o", "BatchMode=yes", "-o", "LogLevel=ERROR"]  # fmt: skip


@pytest.fixture
def running(stack, container_engine, tmp_path):
    """A tenant member with an SSH key, and their instance of the demo image running on a real
    container host (the image serves HTTP on 8888, declared as Jupyter)."""
    make_catalog()
    ImageFactory(
        name="demo-busybox", reference=DEMO_IMAGE, command=[], cuda_version="-",
        ports=[{"port": 8888, "name": "Jupyter"}],
    )  # fmt: skip
    tenant, membership = make_tenant()
    api = api_client(stack, membership)
    key = asyncssh.generate_private_key("ssh-ed25519", comment="laptop")
    private = tmp_path / "laptop"
    private.write_bytes(key.export_private_key())
    private.chmod(0o600)
    added = api.post(
        "/ssh-keys/", json={"name": "laptop", "public_key": key.export_public_key().decode()}
    )
    assert added.status_code == 201, added.text
    start_agent(stack, "gpu-1", gpus=2, runtime="oci", engine_url=container_engine.url)
    body = {"name": "notebook", "spec": "a100-quarter", "image": "demo-busybox"}
    created = api.post("/instances/", json=body)
    assert created.status_code == 202, created.text
    iid = created.json()["id"]
    instance = wait_api_state(api, iid, "running", stack)
    return {"api": api, "id": iid, "instance": instance, "key": private, "tenant": tenant}


def test_the_consoles_ssh_command_logs_in_with_the_tenants_key(running, tmp_path):
    ssh = running["instance"]["ssh"]
    assert ssh["user"] == str(running["id"]) and ssh["host_key_fingerprint"].startswith("SHA256:")
    command = shlex.split(ssh["command"])
    assert command[0] == "ssh"
    login = [*command[:1], "-i", str(running["key"]), *SSH_OPTIONS, *command[1:]]
    result = subprocess.run([*login, "echo $((6*7)); exit 7"], capture_output=True, text=True)
    assert (result.stdout, result.returncode) == ("42\n", 7), result.stderr

    sent = tmp_path / "weights.bin"
    sent.write_bytes(b"w" * 100_000)
    target = f"{ssh['user']}@{ssh['host']}:/workspace/weights.bin"
    scp = ["scp", "-P", str(ssh["port"]), "-i", str(running["key"]), *SSH_OPTIONS]
    copied = subprocess.run([*scp, str(sent), target], capture_output=True, text=True)
    assert copied.returncode == 0, copied.stderr
    size = subprocess.run(
        [*login, "wc -c < /workspace/weights.bin"], capture_output=True, text=True
    )
    assert size.stdout.strip() == "100000"

    events = running["api"].get(f"/instances/{running['id']}/events/").json()["results"]
    sessions = [e["message"] for e in events if "ssh session" in e["message"]]
    assert any("with key laptop (SHA256:" in m for m in sessions), sessions
    assert any("ended (exit status 7)" in m for m in sessions), sessions


@pytest.mark.skipif(shutil.which("ssh") is None, reason="needs OpenSSH's client")
def test_another_key_and_a_stopped_instance_get_no_shell(stack, running, tmp_path):
    ssh = running["instance"]["ssh"]
    stranger = tmp_path / "stranger"
    stranger.write_bytes(asyncssh.generate_private_key("ssh-ed25519").export_private_key())
    stranger.chmod(0o600)
    base = ["ssh", "-p", str(ssh["port"]), *SSH_OPTIONS, f"{ssh['user']}@{ssh['host']}"]
    refused = subprocess.run([*base, "-i", str(stranger), "true"], capture_output=True, text=True)
    assert refused.returncode == 255 and "Permission denied" in refused.stderr

    api = running["api"]
    assert api.post(f"/instances/{running['id']}/stop/").status_code == 202
    stopped = wait_api_state(api, running["id"], "stopped", stack)
    assert stopped["ssh"] is None
    closed = subprocess.run(
        [*base, "-i", str(running["key"]), "true"], capture_output=True, text=True
    )
    assert closed.returncode == 255


def test_the_browser_terminal_runs_a_shell_through_the_console(stack, running):
    token = running["api"].headers["Authorization"]
    url = f"ws://127.0.0.1:{stack.port}/ws/instances/{running['id']}/terminal/"

    async def session() -> bytes:
        async with websockets.connect(url, additional_headers={"Authorization": token}) as ws:
            await ws.send('{"type": "resize", "cols": 100, "rows": 30}')
            seen = b""
            # the engine applies a resize on its own time (Podman's conmon): ask until it has
            for _ in range(20):
                await ws.send(b"stty size; echo $((6*7))\r")
                while seen.count(b"42\r\n") <= _:
                    seen += await asyncio.wait_for(ws.recv(), 10)
                if b"30 100" in seen:
                    break
                await asyncio.sleep(0.2)
            return seen

    assert b"30 100" in run_async(session())
    events = running["api"].get(f"/instances/{running['id']}/events/").json()["results"]
    assert any("terminal session" in e["message"] for e in events)


def test_the_port_origin_serves_the_containers_web_server_to_its_tenant_only(stack, running):
    (jupyter,) = running["instance"]["ports"]
    assert jupyter["port"] == 8888 and jupyter["name"] == "Jupyter"
    origin = urlsplit(jupyter["origin_url"]).netloc  # *.localhost: reached here by its Host

    def get(token, host=origin):
        return httpx.get(f"{stack.url}/", headers={"Host": host, "Authorization": token})

    token = running["api"].headers["Authorization"]
    page = wait_for(
        lambda: (r := get(token)).status_code == 200 and r, what="the demo server's page"
    )
    assert "gpucloud demo" in page.text

    _, outsider = make_tenant(slug="globex", username="olga")
    other = api_client(stack, outsider).headers["Authorization"]
    assert get(other).status_code == 404
    assert get(token, origin.replace("-8888.", "-9999.")).status_code == 404


@pytest.mark.browser
def test_the_terminal_panel_types_a_command_and_shows_its_output(stack, running, page):
    troubles = []  # what the page's scripts met, for the message of a failure below
    page.on("pageerror", lambda error: troubles.append(f"script error: {error}"))
    page.on("requestfailed", lambda request: troubles.append(f"{request.url}: {request.failure}"))
    page.on(
        "response",
        lambda answer: answer.status >= 400 and troubles.append(f"{answer.url}: {answer.status}"),
    )
    page.on(
        "console",
        lambda message: message.type in ("error", "warning") and troubles.append(message.text),
    )
    sign_in(page, stack.url, "mia")
    page.goto(f"{stack.url}/instances/{running['id']}/")
    # The page is live: wait for its socket, and for the Access card, before aiming at the button
    expect(page.locator("[data-live-status]")).to_have_text("● live")
    expect(page.locator("a", has_text="Open Jupyter")).to_be_visible()
    page.evaluate(
        "window.clicked = []; document.addEventListener('click', (event) =>"
        " window.clicked.push(event.target.outerHTML.slice(0, 120)), true)"
    )
    page.click("[data-terminal-connect]")
    try:
        expect(page.locator("[data-terminal-status]")).to_have_text("· connected", timeout=10_000)
    except AssertionError as failure:
        scripts = page.evaluate("[typeof window.Terminal, typeof window.FitAddon]")
        raise AssertionError(
            f"{failure}\nwhat the page met: {troubles}\nxterm's globals: {scripts}\n"
            f"what was clicked: {page.evaluate('window.clicked')}"
        ) from None
    page.keyboard.type("echo answer=$((6*7))\n")
    expect(page.get_by_test_id("terminal")).to_contain_text("answer=42", timeout=10_000)
    screenshot(page, "instances-terminal")


@pytest.mark.browser
def test_the_terminal_panel_reconnects_to_its_shell_across_a_web_restart(stack, running, page):
    """The panel connects again by itself when the console restarts under it, and its shell is
    the same one: what the tenant set in it is still there."""
    sign_in(page, stack.url, "mia")
    page.goto(f"{stack.url}/instances/{running['id']}/")
    expect(page.locator("[data-live-status]")).to_have_text("● live")
    page.click("[data-terminal-connect]")
    status = page.locator("[data-terminal-status]")
    expect(status).to_have_text("· connected", timeout=10_000)
    page.keyboard.type("export MARK=kept\n")
    stack.web.stop()  # SIGTERM: the console closes its sockets with 1012
    expect(status).not_to_have_text("· connected", timeout=10_000)
    stack.web = stack.start("web-again", processes.web_cmd(stack.port))
    expect(status).to_have_text("· connected", timeout=30_000)
    page.keyboard.type('echo "mark=$MARK"\n')
    expect(page.get_by_test_id("terminal")).to_contain_text("mark=kept", timeout=10_000)


def test_a_terminal_comes_back_to_the_same_shell_after_the_web_process_restarts(stack, running):
    """A rolling restart of the console costs a terminal nothing: the panel's session id takes
    back the shell the agent kept, with what it printed meanwhile; another member with the same
    id gets a shell of their own; a panel closed on purpose ends its shell."""
    token = running["api"].headers["Authorization"]
    other_member = MembershipFactory(tenant=running["tenant"], role=Role.MEMBER)
    other = api_client(stack, other_member).headers["Authorization"]
    session = "0123456789abcdef0123456789abcdef"
    url = f"ws://127.0.0.1:{stack.port}/ws/instances/{running['id']}/terminal/?session={session}"

    def connect(who=token):
        return websockets.connect(url, additional_headers={"Authorization": who})

    async def until(ws, text: bytes) -> bytes:
        seen = b""
        while text not in seen:
            seen += await asyncio.wait_for(ws.recv(), 10)
        return seen

    async def ask(ws, command: bytes) -> bytes:
        await ws.send(command + b'; echo DO""NE\r')  # the echoed line is not the answer
        return await until(ws, b"DONE\r\n")

    def pid(answer: bytes) -> bytes:
        return re.findall(rb"PID=([0-9]+)", answer)[-1]

    def restart_web():
        stack.web.stop()  # SIGTERM: the console closes its sockets with 1012
        stack.web = stack.start("web-again", processes.web_cmd(stack.port))
        processes.wait_http(f"{stack.url}/healthz", proc=stack.web.popen)

    async def scenario():
        async with connect() as ws:  # closed on purpose (1000) at the end of the block
            closed_pid = pid(await ask(ws, b"echo PID=$$"))
        ws = await connect()
        said = await ask(ws, b"export MARK=kept; (sleep 4; echo LATE-$MARK) & echo PID=$$")
        kept_pid = pid(said)
        await asyncio.to_thread(restart_web)
        with pytest.raises(websockets.ConnectionClosed) as closed:
            while True:  # the rest of the prompt, then the close
                await asyncio.wait_for(ws.recv(), 10)
        assert closed.value.rcvd.code == 1012
        async with connect(other) as theirs:
            assert b"MARK=[]\r\n" in await ask(theirs, b"echo MARK=[$MARK]")
        await asyncio.sleep(4)
        async with connect() as back:
            answer = await ask(back, b"echo MARK=[$MARK] PID=$$")
            assert b"LATE-kept" in answer  # printed while no one was there
            assert b"MARK=[kept] PID=" + kept_pid in answer
            await back.send(b"exit\r")
            await asyncio.wait_for(back.wait_closed(), 10)
        return closed_pid, kept_pid

    closed_pid, kept_pid = run_async(scenario())

    async def alive(pid: bytes) -> bool:
        """Running or sleeping: an ended shell may stay a zombie of the image's init."""
        state = b"s=$(cut -d' ' -f3 /proc/%s/stat 2>/dev/null); [ -n \"$s\" ] && [ $s != Z ]" % pid
        async with connect() as ws:
            return b"ALIVE" in await ask(ws, state + b" && echo ALI''VE")

    def ended(pid: bytes) -> bool:
        return not run_async(alive(pid))

    wait_for(lambda: ended(closed_pid) and ended(kept_pid), what="the shells to end", interval=1)
    events = running["api"].get(f"/instances/{running['id']}/events/").json()["results"]
    messages = [e["message"] for e in events]
    assert any("waits 60 s to be taken back" in m for m in messages), messages
    assert any(m.startswith("terminal session taken back") for m in messages), messages


def test_a_web_restart_cuts_a_port_download_after_its_grace(stack, running):
    """A graceful stop of a web process does not wait on a tenant's long download from a port
    (here a CGI script of the container's web server that takes 40 s): the download is cut
    after WEB_SHUTDOWN_GRACE_SECONDS and the process exits well within systemd's 30 s."""
    token = running["api"].headers["Authorization"]
    terminal = f"ws://127.0.0.1:{stack.port}/ws/instances/{running['id']}/terminal/"
    script = (
        "mkdir -p /srv/cgi-bin && printf '#!/bin/sh\\necho Content-Type: text/plain\\necho\\n"
        "for i in $(seq 40); do echo line $i; sleep 1; done\\n' > /srv/cgi-bin/slow && "
        'chmod +x /srv/cgi-bin/slow && echo MA""DE\r'
    )

    async def make_slow_script():
        async with websockets.connect(terminal, additional_headers={"Authorization": token}) as ws:
            await ws.send(script.encode())
            seen = b""
            while b"MADE\r\n" not in seen:
                seen += await asyncio.wait_for(ws.recv(), 30)

    run_async(make_slow_script())
    (jupyter,) = running["instance"]["ports"]
    headers = {"Host": urlsplit(jupyter["origin_url"]).netloc, "Authorization": token}
    grace = processes.WEB_SHUTDOWN_GRACE_SECONDS
    with httpx.stream("GET", f"{stack.url}/cgi-bin/slow", headers=headers, timeout=60) as download:
        assert download.status_code == 200
        lines = download.iter_lines()
        assert next(lines) == "line 1"
        asked = time.monotonic()
        stack.web.popen.send_signal(signal.SIGTERM)
        stack.web.popen.wait(timeout=grace + 10)
        took = time.monotonic() - asked
        rest = []
        with contextlib.suppress(httpx.HTTPError):
            rest.extend(lines)
        assert "line 40" not in rest  # cut, not finished
    assert took < grace + 5, took
