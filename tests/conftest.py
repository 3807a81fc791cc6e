import contextlib
import os
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

import docker
import pytest
from rest_framework.test import APIClient

from accounts import services
from accounts.roles import Role
from agent import firewall
from agent.devtools import engine
from agent.networks import LABEL_INSTALL
from agent.podman import CONTAINERS_CONF, podman_command, podman_env
from console import processes
from tests.budgets import PROCESS_MARKERS
from tests.clients import signed_in
from tests.factories import MembershipFactory, TenantFactory, UserFactory
from tests.harness import running_stack
from tests.instances.conftest import Catalog
from tests.notifications.receiver import Receiver, serve
from tests.pages import steady
from tests.registry import start_registry

pytest_plugins = ["tests.budgets"]

# the test engines' storage (sparse: it takes of the host what they write)
LAYER_STORAGE_GIB = 40
ROLES = [Role.VIEWER, Role.MEMBER, Role.ADMIN, Role.OWNER]


@pytest.fixture(autouse=True)
def _fresh_cache():
    """Throttles count in the cache: each test starts with none of another's counts."""
    from django.core.cache import cache

    cache.clear()


@pytest.fixture(autouse=True)
def _no_agent_call_inside_a_transaction(monkeypatch):
    """Nothing that talks to a host runs inside a transaction: it would hold the database's
    locks (SQLite's write lock, for everyone) for as long as an agent takes to answer. Every
    agent call in every test checks it (the test case's own wrapping transaction aside)."""
    from django.db import connection

    from console.fleet import agent_client

    real = agent_client._request

    def checked(host, method, path, json=None):
        ours = [b for b in connection.atomic_blocks if not getattr(b, "_from_testcase", False)]
        assert not ours, f"agent call {method} {path} inside a transaction"
        return real(host, method, path, json)

    monkeypatch.setattr(agent_client, "_request", checked)


# A test that starts a process (a server, a worker, Chromium, a container, any program) carries
# one of PROCESS_MARKERS (pyproject.toml); `make test-fast` runs the tests that carry none.
# Every way this code (and asyncio, Playwright, multiprocessing) starts a child
PROCESS_STARTS = [
    (subprocess.Popen, "_execute_child"),
    (os, "fork"),
    (os, "forkpty"),
    (os, "posix_spawn"),
    (os, "posix_spawnp"),
    (os, "system"),
]


@contextlib.contextmanager
def _no_process_unless_marked(item):
    """An unmarked test that starts a process fails, naming the markers: otherwise it would
    slip into the fast tier and slow it down (or need what only the full run has)."""
    if any(item.get_closest_marker(name) for name in PROCESS_MARKERS):
        yield
        return

    def refuse(*args, **kwargs):
        command = args[1] if args and isinstance(args[0], subprocess.Popen) else ""
        pytest.fail(
            f"{item.nodeid} starts a process {command}: mark the test (or its module's pytestmark)"
            f" with one of {', '.join(f'pytest.mark.{m}' for m in PROCESS_MARKERS)}",
            pytrace=False,
        )

    real = [(owner, name, getattr(owner, name)) for owner, name in PROCESS_STARTS]
    for owner, name, _ in real:
        setattr(owner, name, refuse)
    try:
        yield
    finally:
        for owner, name, start in real:
            setattr(owner, name, start)


# The modules that install and run whole consoles (pip, collectstatic, many processes each, for
# minutes): side by side on a busy 2-core machine each took twice its time, past its timeout.
INSTALLS = {
    "tests.test_deploy",
    "tests.test_install",
    "tests.test_distributed",
    "tests.test_benches",
    "tests.test_agent_package",
    "tests.browser.test_make_run_images",
}


# before pytest-xdist's own, which reads the groups
@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(items):
    """Under pytest-xdist (`--dist loadgroup`, `make test`), keep together what shares a process
    or a resource: a module that starts processes runs in one worker (its module-scoped stacks,
    browsers and agents start once; tests/backing.py's Redis database is the module's); the
    JupyterLab and PyTorch images' tests share their build cache (agent/images.py); the INSTALLS
    run one after another; every Docker test runs in one worker (dockerd's iptables chains are
    the host's).
    Each worker has a Podman engine of its own, on subnets of its own (container_engine)."""
    for item in items:
        starts_processes = any(item.get_closest_marker(name) for name in PROCESS_MARKERS)
        callspec = getattr(item, "callspec", None)
        if "docker_engine" in item.fixturenames or (
            callspec and callspec.params.get("oci_engine") == "docker"
        ):
            item.add_marker(pytest.mark.xdist_group("docker"))
        elif {"jupyter_image", "pytorch_image"} & set(item.fixturenames):
            item.add_marker(pytest.mark.xdist_group("jupyter"))
        elif item.module.__name__ in INSTALLS:
            item.add_marker(pytest.mark.xdist_group("installs"))
        elif starts_processes:
            item.add_marker(pytest.mark.xdist_group(item.module.__name__))
        if starts_processes:
            # real processes on a busy 2-core machine: one that failed runs once more, and the
            # run's summary names it (R), so that a flaky test shows without failing CI
            item.add_marker(pytest.mark.flaky(reruns=1))


# Setup as well as the call: session fixtures (an engine, a registry) start for their first test.
# Not teardown: what it stops was started in a setup that was already checked.
@pytest.hookimpl(wrapper=True)
def pytest_runtest_setup(item):
    with _no_process_unless_marked(item):
        return (yield)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item):
    with _no_process_unless_marked(item):
        return (yield)


@pytest.fixture(autouse=True, scope="session")
def _no_collected_static(tmp_path_factory):
    """The tests serve static/ as it is (STATIC_COLLECTED=false), not what `make run` last
    collected into var/static; and WhiteNoise looks a file up when it is asked for, instead of
    indexing every file again for each test's client (a tenth of the fast tier's time)."""
    from django.test import override_settings

    with override_settings(
        STATIC_ROOT=tmp_path_factory.mktemp("static-root"), WHITENOISE_AUTOREFRESH=True
    ):
        yield


@pytest.fixture(autouse=True)
def fast_passwords(request, settings):
    """Test users' passwords are hashed fast (the default hasher takes half a second a user
    on this machine); not where a process of the test's checks one with its own hashers."""
    if any(request.node.get_closest_marker(name) for name in PROCESS_MARKERS):
        return
    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]


@pytest.fixture
def tenant(db):
    return TenantFactory(slug="acme", name="Acme AI")


@pytest.fixture
def other_tenant(db):
    return TenantFactory(slug="globex", name="Globex")


@pytest.fixture
def make_member(db):
    def make(tenant, role=Role.MEMBER, username=None):
        user = UserFactory(username=username) if username else UserFactory()
        return MembershipFactory(user=user, tenant=tenant, role=role)

    return make


@pytest.fixture
def token_client():
    """An APIClient authenticated with a fresh API token of the given membership."""

    def make(membership):
        issued = services.issue_token(membership.user, membership.tenant, "test")
        client = APIClient()
        client.credentials(HTTP_AUTHORIZATION=f"Bearer {issued.raw}")
        client.raw_token = issued.raw
        return client

    return make


@pytest.fixture
def catalog(db):
    """The instance tests' small catalog (tests/instances/conftest.py), for any package's."""
    return Catalog()


@pytest.fixture
def member(tenant, make_member):
    return make_member(tenant, Role.MEMBER, username="mia")


@pytest.fixture
def viewer(tenant, make_member):
    return make_member(tenant, Role.VIEWER, username="vic")


@pytest.fixture
def web(member):
    """The console's pages, signed in as `member`."""
    return signed_in(member)


@pytest.fixture
def no_tasks(monkeypatch):
    """Record the tasks services queue instead of sending them; answers the list."""
    from console.instances import queue

    sent = []

    def enqueue(name, *args, countdown=None):
        sent.append((name, *args))

    monkeypatch.setattr(queue, "enqueue", enqueue)
    return sent


@pytest.fixture
def receiver():
    """A local webhook receiver (answers 200 unless its `statuses` say otherwise)."""
    found = Receiver()
    server, _ = serve(found)
    yield found
    server.shutdown()
    server.server_close()


@pytest.fixture(params=[True, False], ids=["prepared", "plain"])
def prepared_queries(request, settings):
    """The test twice: the token check and the instances' lists run compiled once, then as
    plain querysets (PREPARED_QUERIES off, console/speedups/prepared.py). The API's tests ask
    for it, so that either way it answers the same."""
    settings.PREPARED_QUERIES = request.param
    return request.param


@pytest.fixture(scope="session")
def redis_url():
    """REDIS_URL when set (CI: a real Redis; this xdist worker's database: tests/settings.py),
    else an embedded Redis-protocol server."""
    url = os.environ.get("REDIS_URL")
    if url:
        import redis

        redis.Redis.from_url(url).flushdb()
        return url
    return processes.start_embedded_redis()


@dataclass(frozen=True)
class ContainerEngine:
    url: str
    storage: Path
    registry_port: int
    registries_conf: Path
    # a second registry the engine may reach over plain HTTP: one that asks for credentials
    # (tests/images/test_private_registry.py)
    private_registry_port: int = 0

    def podman(self, *args: str) -> subprocess.CompletedProcess:
        return subprocess.run(
            podman_command(self.storage, *args),
            env={**podman_env(), "CONTAINERS_REGISTRIES_CONF": str(self.registries_conf)},
            capture_output=True,
            text=True,
        )

    cli = podman


@dataclass(frozen=True)
class DockerEngine:
    url: str
    storage: Path  # its data root

    def cli(self, *args: str) -> subprocess.CompletedProcess:
        return subprocess.run(["docker", "-H", self.url, *args], capture_output=True, text=True)


def _remove_test_networks(url: str) -> None:
    """Remove the test agents' networks and their nftables chains."""
    client = docker.DockerClient(base_url=url)
    networks = client.networks.list(filters={"label": LABEL_INSTALL})
    for install in {n.attrs["Labels"][LABEL_INSTALL] for n in networks}:
        firewall.remove(install)
    for network in networks:
        with contextlib.suppress(docker.errors.APIError):
            network.remove()
    client.close()


# the engines this worker has started, by API URL
_ENGINES_STARTED: list[str] = []


@pytest.fixture(autouse=True, scope="module")
def _no_container_outlives_its_module():
    """A stopped stack leaves its containers running, as a host's agent that stops does: remove
    them once the module that made them is done, so that they do not pile up in this worker's
    engines (with what still runs in them: a detached terminal's shell, a load) until the end."""
    yield
    for url in _ENGINES_STARTED:
        _remove_containers(url)


def _remove_containers(url: str) -> None:
    client = docker.DockerClient(base_url=url)
    for container in client.containers.list(all=True):
        with contextlib.suppress(docker.errors.APIError):
            container.remove(force=True)
    client.close()


@pytest.fixture(scope="session")
def container_engine(tmp_path_factory, worker_id):
    """A Podman engine's API URL, with the demo image built. Without podman the tests that
    need it are skipped, except in CI, which installs it. Each pytest-xdist worker's engine
    gives its networks subnets of its own: an engine picks the first subnet free in its own
    records and among the host's live bridges, so two would pick the same one while neither
    runs a container on it."""
    if engine.podman() is None:
        if os.environ.get("CI"):
            pytest.fail("podman is not installed: .ci/run installs podman, runc, busybox-static")
        pytest.skip("podman is not installed (apt-get install podman runc busybox-static)")
    run = tmp_path_factory.mktemp("podman")
    storage = run / "storage"
    engine.layer_storage(storage, LAYER_STORAGE_GIB)  # bounds each container's layer
    registry_port, private_port = processes.free_port(), processes.free_port()
    registries = run / "registries.conf"  # the test registries (tests/registry.py) speak HTTP
    registries.write_text(
        "".join(
            f'[[registry]]\nlocation = "127.0.0.1:{port}"\ninsecure = true\n'
            for port in (registry_port, private_port)
        )
    )
    conf = run / "containers.conf"
    worker = 0 if worker_id == "master" else int(worker_id.removeprefix("gw"))
    conf.write_text(
        f"{CONTAINERS_CONF.read_text()}\n[network]\n"
        f'default_subnet_pools = [{{"base" = "10.{100 + worker}.0.0/16", "size" = 24}}]\n'
    )
    service = engine.start_podman_service(
        run / "podman.sock",
        run / "podman.log",
        storage,
        CONTAINERS_REGISTRIES_CONF=str(registries),
        CONTAINERS_CONF=str(conf),
    )
    engine.build_demo_image(storage=storage)
    url = f"unix://{run / 'podman.sock'}"
    _ENGINES_STARTED.append(url)
    yield ContainerEngine(url, storage, registry_port, registries, private_port)
    _ENGINES_STARTED.remove(url)
    _remove_test_networks(url)
    service.terminate()
    service.wait(10)
    env = podman_env()
    subprocess.run(podman_command(storage, "rm", "--all", "--force"), env=env)
    subprocess.run(podman_command(storage, "system", "reset", "--force"), env=env)
    # the overlay driver keeps its directory bind-mounted on itself: let pytest clean it up
    subprocess.run(["umount", "--lazy", str(storage / "root" / "overlay")], capture_output=True)
    engine.unmount_layer_storage(storage, remove=True)
    _unmount_disks(tmp_path_factory)


def _unmount_disks(tmp_path_factory) -> None:
    """The test agents' disks (agent/volumes.py) stay mounted until their instance is deleted."""
    base = f"{tmp_path_factory.getbasetemp()}/"
    for line in Path("/proc/self/mounts").read_text().splitlines():
        point = line.split(" ")[1]
        if point.startswith(base) and "/disks/" in point:
            subprocess.run(["umount", "--lazy", point], capture_output=True)


@pytest.fixture(scope="session")
def docker_engine(tmp_path_factory):
    """A Docker Engine (Debian's docker.io) of the tests' own, started as the README asks of an
    operator (user namespaces remapped), with the demo image imported. Without dockerd the
    tests that need it are skipped, except in CI, which installs it."""
    if engine.dockerd() is None:
        if os.environ.get("CI"):
            pytest.fail("dockerd is not installed: .ci/run installs docker.io")
        pytest.skip("dockerd is not installed (apt-get install docker.io)")
    # a short path of its own (the socket's must stay under 108 bytes), removed at the end
    root = Path(tempfile.mkdtemp(prefix="gpucloud-dockerd-"))
    chains = engine.docker_chains()
    engine.layer_storage(root / "data", LAYER_STORAGE_GIB)  # bounds each container's layer
    service = engine.start_docker_daemon(root)
    url = f"unix://{root / 'docker.sock'}"
    try:
        engine.import_demo_image_docker(url)
        _ENGINES_STARTED.append(url)
        yield DockerEngine(url, root / "data")
        _ENGINES_STARTED.remove(url)
    finally:
        _remove_containers(url)
        _remove_test_networks(url)
        _unmount_disks(tmp_path_factory)
        engine.stop_docker_daemon(service, root)
        engine.remove_docker_chains(engine.docker_chains() - chains)


@pytest.fixture
def oci_engine(request):
    """The engine a container test runs on: Podman (container_engine), or the one the test
    is parametrized with (BOTH_ENGINES: Podman, then Docker)."""
    kind = getattr(request, "param", "podman")
    return request.getfixturevalue("container_engine" if kind == "podman" else "docker_engine")


BOTH_ENGINES = pytest.mark.parametrize("oci_engine", ["podman", "docker"], indirect=True)


@pytest.fixture(scope="session")
def registry(container_engine, tmp_path_factory):
    """A real image registry (Debian's docker-registry) on loopback, which the test engine may
    pull from over plain HTTP; answers its host:port. Skipped where it is not installed, except
    in CI."""
    if shutil.which("docker-registry") is None:
        if os.environ.get("CI"):
            pytest.fail("docker-registry is not installed: .ci/run installs it")
        pytest.skip("docker-registry is not installed (apt-get install docker-registry)")
    address = f"127.0.0.1:{container_engine.registry_port}"
    server = start_registry(tmp_path_factory.mktemp("registry"), address)
    yield address
    server.terminate()
    server.wait(10)


@pytest.fixture
def stack(transactional_db, redis_url, tmp_path, request):
    """The real control plane: an ASGI server and a Celery worker on the test database."""
    with running_stack(redis_url, tmp_path, request.node) as running:
        yield running


@pytest.hookimpl(wrapper=True, tryfirst=True)
def pytest_runtest_makereport(item, call):
    report = yield
    setattr(item, f"rep_{report.when}", report)
    return report


CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--no-first-run",
]


@pytest.fixture(scope="module")
def browser():
    """Headless Debian Chromium driven by Playwright (never a downloaded browser)."""
    if not os.path.exists(CHROMIUM):
        pytest.fail(f"{CHROMIUM} is missing: apt-get install -y chromium (.ci/run does it)")
    # Playwright's sync API keeps an event loop in this thread while it runs (hence module
    # scope: later tests may run their own loops); the ORM calls the tests make around it are
    # still plain synchronous calls.
    os.environ["DJANGO_ALLOW_ASYNC_UNSAFE"] = "true"
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        launched = playwright.chromium.launch(
            executable_path=CHROMIUM, headless=True, args=CHROMIUM_ARGS
        )
        yield launched
        launched.close()
    del os.environ["DJANGO_ALLOW_ASYNC_UNSAFE"]  # later tests (and their children) run without


@pytest.fixture
def page(browser):
    context = browser.new_context(viewport={"width": 1280, "height": 860}, accept_downloads=True)
    page = steady(context.new_page())
    page.set_default_timeout(10_000)
    yield page
    context.close()


@pytest.fixture
def fake_mps_control(tmp_path, monkeypatch):
    """tests/fake_mps_control.py as `nvidia-cuda-mps-control`, first on PATH; answers the file
    where it records its starts and commands (name a command in `<it>.fail` to make it fail)."""
    bin_dir = tmp_path / "mps-bin"
    bin_dir.mkdir()
    calls = bin_dir / "calls"
    calls.touch()
    script = Path(__file__).parent / "fake_mps_control.py"
    control = bin_dir / "nvidia-cuda-mps-control"
    control.write_text(f'#!/bin/sh\nFAKE_MPS_CALLS={calls} exec {sys.executable} {script} "$@"\n')
    control.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    return calls
