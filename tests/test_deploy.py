"""The deployment an operator installs (deploy/): the systemd units and the console's image
with its compose file. No systemd runs here and no registry can be reached (the image's base
images cannot be pulled), so what can be is tested: the units pass `systemd-analyze verify`,
and each unit's ExecStart, and each command the image and compose run, is started here as
systemd or the container would start it (specifiers, Environment=, the EnvironmentFile's
variables; /opt/gpucloud being this checkout) on a PostgreSQL and a Redis of the test's own,
long enough to see it serve."""

import configparser
import os
import re
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
import yaml

from console import processes
from tests.backing import own_postgres_and_redis
from tests.harness import Proc

ROOT = Path(__file__).resolve().parent.parent
DEPLOY = ROOT / "deploy"
UNITS = DEPLOY / "systemd"
INSTALLED_AT = "/opt/gpucloud"
# a GPU host's venv of the agent's own package (the agent unit's instructions); here the
# checkout's venv, which has the same `gpucloud-agent` (tests/test_agent_package.py installs
# the package itself)
AGENT_INSTALLED_AT = "/opt/gpucloud-agent"
REDIS_DB = 14
CONSOLE_UNITS = [
    "gpucloud-web@.service",
    "gpucloud-worker@.service",
    "gpucloud-beat.service",
    "gpucloud-ssh-front.service",
    "gpucloud-collectstatic.service",
]


def _unit(name: str) -> configparser.ConfigParser:
    parser = configparser.ConfigParser(interpolation=None, strict=True, delimiters=("=",))
    parser.optionxform = str  # systemd's keys are case-sensitive
    parser.read(UNITS / name)
    return parser


def _env_file(path: Path) -> dict[str, str]:
    """KEY=VALUE lines as systemd's EnvironmentFile= reads them (comments, quotes)."""
    env = {}
    for line in path.read_text().splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        key, _, value = line.partition("=")
        env[key.strip()] = value.strip().strip("\"'")
    return env


def _specifiers(text: str, instance: str, state: Path) -> str:
    table = {"%i": instance, "%H": socket.gethostname(), "%S": str(state), "%%": "%"}
    return re.sub(r"%[iHS%]", lambda m: table[m.group()], text)


def _here(word: str) -> str:
    word = word.replace(AGENT_INSTALLED_AT, str(ROOT / ".venv"))
    return word.replace(INSTALLED_AT, str(ROOT))


def _service(name: str, instance: str, state: Path, env_file: dict[str, str]):
    """(argv, environment, working directory) of a unit's ExecStart, as systemd runs it:
    Environment= then the EnvironmentFile's variables, `${X}` one word, `$X` split."""
    service = _unit(name)["Service"]
    environ = {"PATH": os.environ["PATH"], "HOME": str(state), "LANG": "C.UTF-8"}
    for assignment in shlex.split(_specifiers(service.get("Environment", ""), instance, state)):
        key, _, value = assignment.partition("=")
        environ[key] = value
    environ.update(env_file)
    argv = []
    for word in shlex.split(_specifiers(service["ExecStart"], instance, state)):
        whole = re.fullmatch(r"\$(\w+)", word)
        if whole:
            argv += environ.get(whole.group(1), "").split()
        else:
            argv.append(re.sub(r"\$\{(\w+)\}", lambda m: environ.get(m.group(1), ""), word))
    for directory in shlex.split(service.get("StateDirectory", "")):
        (state / directory).mkdir(mode=0o700, parents=True, exist_ok=True)
    cwd = _here(_specifiers(service["WorkingDirectory"], instance, state))
    return [_here(word) for word in argv], environ, cwd


@pytest.mark.parametrize("name", sorted(p.name for p in UNITS.glob("*.service")))
def test_each_unit_restarts_runs_as_its_user_with_its_state_and_env_files(name):
    service = _unit(name)["Service"]
    agent = name == "gpucloud-agent.service"
    assert service["User"] == ("root" if agent else "gpucloud")
    assert service["EnvironmentFile"] == f"/etc/gpucloud/{'agent.env' if agent else 'env'}"
    assert service["StateDirectory"] == ("gpucloud-agent" if agent else "gpucloud")
    assert service["StateDirectoryMode"] == "0700"
    venv = f"{AGENT_INSTALLED_AT}/" if agent else f"{INSTALLED_AT}/.venv/"
    assert service["ExecStart"].startswith(f"{venv}bin/")
    if service.get("Type") == "oneshot":
        assert "Restart" not in service
    else:
        assert service["Restart"] == "always"


@pytest.mark.integration  # runs systemd-analyze
def test_the_units_pass_systemd_analyze_verify(tmp_path):
    if shutil.which("systemd-analyze") is None:
        pytest.skip("systemd-analyze is not installed")
    for unit in UNITS.glob("*.service"):  # installed here: the programs must exist
        (tmp_path / unit.name).write_text(_here(unit.read_text()))
    for name in ("gpucloud-web@8000.service", "gpucloud-worker@worker1.service",
                 "gpucloud-beat.service", "gpucloud-collectstatic.service",
                 "gpucloud-ssh-front.service", "gpucloud-agent.service"):  # fmt: skip
        done = subprocess.run(
            ["systemd-analyze", "verify", f"./{name}"],
            cwd=tmp_path, capture_output=True, text=True,
        )  # fmt: skip
        complaints = [line for line in done.stderr.splitlines() if "gpucloud" in line]
        assert done.returncode == 0 and not complaints, (name, done.stderr)


@pytest.fixture(scope="module")
def backing_services():
    with own_postgres_and_redis(REDIS_DB) as urls:
        yield urls


def _manage(environ: dict, cwd: str, *args: str) -> str:
    done = subprocess.run(
        [sys.executable, "manage.py", *args], cwd=cwd, env=environ,
        capture_output=True, text=True, timeout=180,
    )  # fmt: skip
    assert done.returncode == 0, (args, done.stderr)
    return done.stdout


class Started:
    """Processes started as systemd or the container engine would; SIGTERMed at the end (what
    both send to stop one), each expected to exit within its unit's TimeoutStopSec."""

    def __init__(self, log_dir: Path):
        self.log_dir = log_dir
        self.procs: list[Proc] = []

    def start(self, name: str, argv: list[str], environ: dict, cwd: str) -> Proc:
        proc = Proc(name, argv, {**environ, "PYTHONUNBUFFERED": "1"}, self.log_dir, cwd)
        self.procs.append(proc)
        return proc

    def logs(self) -> str:
        return "\n".join(f"===== {p.name} =====\n{p.log()[-3000:]}" for p in self.procs)

    def stop(self) -> dict[str, int | None]:
        codes = {}
        for proc in reversed(self.procs):
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGTERM)
                try:
                    codes[proc.name] = proc.popen.wait(30)
                except subprocess.TimeoutExpired:
                    codes[proc.name] = None
            proc.stop()
        return codes


def _healthz(url: str) -> dict:
    """/healthz with its details, as monitoring reads it (env.example's HEALTHZ_TOKEN)."""
    token = _env_file(DEPLOY / "env.example")["HEALTHZ_TOKEN"]
    headers = {"Authorization": f"Bearer {token}"}
    return httpx.get(f"{url}/healthz", headers=headers, timeout=10).json()


def _wait_agents_ok(url: str, started: Started) -> None:
    processes.wait_http(f"{url}/healthz", timeout=60)
    for _ in range(120):
        if _healthz(url)["components"]["agents"]["status"] == "ok":
            return
        time.sleep(0.5)
    raise AssertionError(f"no agent heard at {url}\n{started.logs()}")


@pytest.fixture(scope="module")
def console_state(backing_services, tmp_path_factory):
    """systemd's %S (/var/lib) with the console's state directory, on a database that the
    README's step 1 set up, and the static files that gpucloud-collectstatic.service collected
    there (collecting takes a while: the image test serves the same ones, as the image serves
    those it collected when it was built). Answers (%S, the console's environment)."""
    database, broker = backing_services
    state = tmp_path_factory.mktemp("state")
    console_env = {
        **_env_file(DEPLOY / "env.example"),
        "DATABASE_URL": database,
        "REDIS_URL": broker,
        "ALLOWED_HOSTS": "console.example.com,127.0.0.1",  # the agent calls 127.0.0.1 here
    }
    argv, environ, cwd = _service("gpucloud-collectstatic.service", "", state, console_env)
    _manage(environ, cwd, "migrate", "--noinput")
    _manage(environ, cwd, "apply_catalog", "console/catalog/examples/catalog.example.toml")
    collect = subprocess.run(argv, env=environ, cwd=cwd, capture_output=True, text=True)
    assert collect.returncode == 0, collect.stderr
    assert any((state / "gpucloud" / "static").rglob("*.js"))
    return state, console_env


@pytest.mark.integration
@pytest.mark.timeout(420)
def test_the_units_start_what_they_say_on_postgres_and_redis(console_state, tmp_path):
    state, console_env = console_state
    port = processes.free_port()
    url = f"http://127.0.0.1:{port}"
    started = Started(tmp_path)
    try:
        _, environ, cwd = _service("gpucloud-beat.service", "", state, console_env)
        token = _manage(environ, cwd, "create_join_token", "--region", "local-1").split()[-1]
        web = started.start(
            "web", *_service("gpucloud-web@.service", str(port), state, console_env)
        )
        processes.wait_http(f"{url}/healthz", timeout=60, proc=web.popen)
        worker = started.start(
            "worker", *_service("gpucloud-worker@.service", "worker1", state, console_env)
        )
        worker.wait_for_log("ready.", timeout=60)
        assert f"worker1@{socket.gethostname()}" in worker.log()
        beat = started.start("beat", *_service("gpucloud-beat.service", "", state, console_env))
        beat.wait_for_log("beat: Starting", timeout=60)

        agent_env = {
            **_env_file(DEPLOY / "agent.env.example"),
            "GPUCLOUD_SERVER": url,  # a plain-HTTP web process, with HTTPS=on in the console's
            "GPUCLOUD_JOIN_TOKEN": token,
            "GPUCLOUD_AGENT_OPTIONS": f"--backend sim --gpus 2 --hostname deploy-1 --listen "
            f"127.0.0.1:{processes.free_port()} --ssh-listen off",
        }
        started.start("agent", *_service("gpucloud-agent.service", "", state, agent_env))
        _wait_agents_ok(url, started)
        health = _healthz(url)
        assert health["components"]["database"]["vendor"] == "postgresql", health
        assert health["components"]["broker"]["status"] == "ok", health
        assert (state / "gpucloud-agent" / "identity.json").exists()
        assert list((state / "gpucloud").glob("celerybeat-schedule*"))
    except BaseException:
        print(started.logs())
        started.stop()
        raise
    codes = started.stop()
    assert all(code is not None for code in codes.values()), (codes, started.logs())


def _containerfile() -> tuple[list[str], dict[str, str], str, list[str]]:
    """(FROM images, ENV, WORKDIR, CMD) of deploy/Containerfile."""
    text = (DEPLOY / "Containerfile").read_text().replace("\\\n", " ")
    froms, env, workdir, cmd = [], {}, "", []
    for line in text.splitlines():
        keyword, _, rest = line.strip().partition(" ")
        if keyword == "FROM":
            froms.append(rest.split()[0])
        elif keyword == "ENV":
            env.update(word.split("=", 1) for word in shlex.split(rest))
        elif keyword == "WORKDIR":
            workdir = rest.strip()
        elif keyword == "CMD":
            cmd = yaml.safe_load(rest)
    return froms, env, workdir, cmd


def test_the_image_and_compose_run_what_the_units_run():
    froms, env, workdir, cmd = _containerfile()
    assert froms == ["docker.io/library/python:3.11-slim"]
    assert (workdir, env["GPUCLOUD_VAR_DIR"]) == (INSTALLED_AT, "/var/lib/gpucloud")
    web_unit = _unit("gpucloud-web@.service")["Service"]["ExecStart"]
    assert shlex.join(cmd) == web_unit.replace("%i", "8000")

    compose = yaml.safe_load((DEPLOY / "compose.yaml").read_text())
    services = compose["services"]
    assert set(services) == {"postgres", "redis", "migrate", "web", "worker", "beat", "ssh-front"}
    for name in ("migrate", "web", "worker", "beat", "ssh-front"):
        assert services[name]["build"]["dockerfile"] == "deploy/Containerfile"
        assert services[name]["image"] == "localhost/gpucloud-console:latest"
    for name in ("web", "worker", "beat", "ssh-front"):
        assert services[name]["depends_on"] == {
            "migrate": {"condition": "service_completed_successfully"}
        }
        assert services[name]["restart"] == "unless-stopped"
    worker_unit = _unit("gpucloud-worker@.service")["Service"]["ExecStart"]
    assert shlex.join(services["worker"]["command"]) == worker_unit.replace("%i@%H", "worker@%h")
    beat_unit = _unit("gpucloud-beat.service")["Service"]["ExecStart"]
    assert shlex.join(services["beat"]["command"]) == beat_unit
    front_unit = _unit("gpucloud-ssh-front.service")["Service"]["ExecStart"]
    assert shlex.join(services["ssh-front"]["command"]) == front_unit


@pytest.mark.integration
@pytest.mark.timeout(420)
def test_the_images_commands_serve_on_postgres_and_redis(console_state, tmp_path):
    """What compose runs in the image (migrate, then web's CMD, worker, beat) with its
    environment, the database and Redis being this test's."""
    state, console_env = console_state
    _, image_env, workdir, cmd = _containerfile()
    services = yaml.safe_load((DEPLOY / "compose.yaml").read_text())["services"]
    port = processes.free_port()
    environ = {
        "PATH": os.environ["PATH"],
        "HOME": str(tmp_path),
        **image_env,
        **services["web"]["environment"],
        "GPUCLOUD_VAR_DIR": str(state / "gpucloud"),  # with the static files collected
        "DATABASE_URL": console_env["DATABASE_URL"],
        "REDIS_URL": console_env["REDIS_URL"],
        "SECRET_KEY": "compose-test-" + "k" * 40,
        "ALLOWED_HOSTS": "localhost,127.0.0.1",
        "HEALTHZ_TOKEN": console_env["HEALTHZ_TOKEN"],
    }
    cwd = _here(workdir)
    migrate = subprocess.run(
        [_here(w) for w in services["migrate"]["command"]], env=environ, cwd=cwd,
        capture_output=True, text=True, timeout=180,
    )  # fmt: skip
    assert migrate.returncode == 0, migrate.stderr
    started = Started(tmp_path)
    try:
        web_argv = [_here(w) for w in cmd]
        web_argv[web_argv.index("--port") + 1] = str(port)  # the container's 8000, here
        web = started.start("web", web_argv, environ, cwd)
        processes.wait_http(f"http://127.0.0.1:{port}/healthz", timeout=60, proc=web.popen)
        worker = started.start(
            "worker", [_here(w) for w in services["worker"]["command"]], environ, cwd
        )
        worker.wait_for_log("ready.", timeout=60)
        beat = started.start("beat", [_here(w) for w in services["beat"]["command"]], environ, cwd)
        beat.wait_for_log("beat: Starting", timeout=60)
        health = _healthz(f"http://127.0.0.1:{port}")
        assert health["components"]["database"]["vendor"] == "postgresql", health
        assert health["components"]["broker"]["status"] == "ok", health
        assert httpx.get(f"http://127.0.0.1:{port}/login/", timeout=10).status_code == 200
    except BaseException:
        print(started.logs())
        started.stop()
        raise
    codes = started.stop()
    assert all(code is not None for code in codes.values()), (codes, started.logs())
