"""The agent's own package (agent/pyproject.toml, `make agent-wheel`): what a GPU host installs
instead of the console. Its wheel is built and installed into a fresh venv outside the
checkout, as deploy/systemd/gpucloud-agent.service's instructions say, and that venv's agent
joins a running console."""

import ast
import os
import re
import subprocess
import sys
import tomllib
import zipfile
from importlib.metadata import packages_distributions
from pathlib import Path

import pytest

from console import processes
from console.fleet import agent_client
from console.fleet import services as fleet
from console.fleet.models import Host
from tests.harness import Proc
from tests.instances.e2e import make_catalog, wait_for

ROOT = Path(__file__).resolve().parent.parent
AGENT = ROOT / "agent"
# found at run time where DCGM is installed (agent/backends/nvml/dcgm.py), never a dependency
OPTIONAL = {"dcgm_agent", "dcgm_fields", "dcgm_structs"}
CONSOLE_DISTRIBUTIONS = {
    "gpucloud",
    "django",
    "djangorestframework",
    "channels",
    "celery",
    "psycopg",
}


def _name(requirement: str) -> str:
    """A requirement's distribution name, normalised (PEP 503)."""
    return re.sub(r"[-_.]+", "-", re.match(r"[A-Za-z0-9._-]+", requirement).group()).lower()


def _third_party_imports() -> set[str]:
    modules = set()
    for path in AGENT.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                modules.update(alias.name.split(".")[0] for alias in node.names)
            elif isinstance(node, ast.ImportFrom) and node.level == 0:
                modules.add(node.module.split(".")[0])
    return modules - set(sys.stdlib_module_names) - {"agent"} - OPTIONAL


def test_the_agents_package_depends_on_exactly_what_the_agent_imports():
    declared = {
        _name(r)
        for r in tomllib.loads((AGENT / "pyproject.toml").read_text())["project"]["dependencies"]
    }
    provided = packages_distributions()
    imported = {_name(provided[module][0]) for module in _third_party_imports()}
    assert imported == declared
    assert "django" not in declared


def _run(argv: list, **kwargs) -> subprocess.CompletedProcess:
    done = subprocess.run(argv, capture_output=True, text=True, timeout=300, **kwargs)
    assert done.returncode == 0, (argv, done.stdout, done.stderr)
    return done


def _clean_env(home: Path) -> dict[str, str]:
    """A GPU host's environment: nothing that points Python at the checkout."""
    return {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "HOME": str(home), "LANG": "C.UTF-8"}


@pytest.fixture(scope="module")
def agent_venv(tmp_path_factory) -> Path:
    """`make agent-wheel`, then a fresh venv with that wheel, as on a GPU host (PyPI, or the
    pip configuration's mirror, gives its dependencies)."""
    dist = tmp_path_factory.mktemp("dist")
    _run(["make", "agent-wheel", f"AGENT_WHEEL_DIR={dist}", f"PYTHON={sys.executable}"], cwd=ROOT)
    (wheel,) = dist.glob("gpucloud_agent-*-py3-none-any.whl")
    names = zipfile.ZipFile(wheel).namelist()
    assert "agent/podman/containers.conf" in names
    assert "agent/backends/nvml/__init__.py" in names
    assert not [name for name in names if name.startswith("agent/devtools/")]  # stays behind
    dist_info = wheel.name.removesuffix("-py3-none-any.whl") + ".dist-info"
    assert {name.split("/")[0] for name in names} == {"agent", dist_info}  # the agent alone
    assert not list(AGENT.glob("build")), "the build leaves nothing in the checkout"
    venv = tmp_path_factory.mktemp("host") / "gpucloud-agent"
    _run([sys.executable, "-m", "venv", str(venv)])
    _run(
        [str(venv / "bin" / "pip"), "install", "-q", str(wheel)],
        env={**os.environ, "PYTHONPATH": ""},
    )
    return venv


@pytest.mark.integration
@pytest.mark.timeout(360)
def test_the_agents_wheel_installs_the_agent_without_the_console(agent_venv, tmp_path):
    env, cwd = _clean_env(tmp_path), tmp_path
    usage = _run([str(agent_venv / "bin" / "gpucloud-agent"), "--help"], env=env, cwd=cwd).stdout
    assert "--join-token" in usage and "--backend" in usage
    python = str(agent_venv / "bin" / "python")
    # a host builds the catalog's JupyterLab image with the package's own builder (make images)
    images = _run([python, "-m", "agent.images", "--help"], env=env, cwd=cwd).stdout
    assert "--cache" in images
    where = _run([python, "-c", "import agent; print(agent.__file__)"], env=env, cwd=cwd).stdout
    assert where.startswith(str(agent_venv))
    installed = _run([python, "-m", "pip", "list", "--format=freeze"], env=env, cwd=cwd).stdout
    names = {_name(line) for line in installed.splitlines()}
    assert "gpucloud-agent" in names
    assert not names & CONSOLE_DISTRIBUTIONS
    for console_module in ("django", "console"):
        done = subprocess.run([python, "-c", f"import {console_module}"], env=env, cwd=cwd,
                              capture_output=True, text=True)  # fmt: skip
        assert "ModuleNotFoundError" in done.stderr


def _allocations(host: Host) -> list | None:
    try:
        return agent_client.list_allocations(Host.objects.get(pk=host.pk))
    except agent_client.AgentError:
        return None


@pytest.mark.integration
@pytest.mark.timeout(360)
def test_the_wheels_agent_joins_a_running_console(agent_venv, stack, tmp_path):
    make_catalog()  # region local-1 and the A100 the simulated GPUs are
    _, token = fleet.create_join_token("local-1", note="from its own package")
    argv = [
        str(agent_venv / "bin" / "gpucloud-agent"), "--server", stack.url, "--join-token", token,
        "--region", "local-1", "--backend", "sim", "--gpus", "2", "--hostname", "pkg-host",
        "--listen", f"127.0.0.1:{processes.free_port()}", "--ssh-listen", "off",
        "--state-dir", str(tmp_path / "state"), "--heartbeat-interval", "0.5",
    ]  # fmt: skip
    agent = Proc("agent-pkg-host", argv, _clean_env(tmp_path), tmp_path, cwd=str(tmp_path))
    stack.procs.append(agent)  # stopped with the stack, its log printed if the test fails
    host = wait_for(
        lambda: Host.objects.filter(name="pkg-host", status=Host.Status.ACTIVE).first(),
        timeout=60,
        what="the packaged agent registered",
        stack=stack,
    )
    wait_for(lambda: host.gpus.count() == 2, what="its GPUs", stack=stack)
    # the console calls it back on the address it registered, with the secret it was given
    wait_for(lambda: _allocations(host) is not None, what="its API", stack=stack)
    assert _allocations(host) == []
    assert (tmp_path / "state" / "identity.json").exists()
