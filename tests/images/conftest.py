"""Fixtures of the image tests: a second Podman engine of its own storage (a host that lacks
what the first one holds), a registry mirror (Debian's docker-registry as a pull-through
cache of the test registry), and images of random layers pushed to the test registry."""

import secrets
import subprocess

import pytest

from agent.devtools import engine
from agent.devtools.engine import DEMO_IMAGE
from agent.podman import podman_command, podman_env
from console import processes
from tests.conftest import LAYER_STORAGE_GIB, ContainerEngine, _remove_test_networks
from tests.registry import start_registry

LAYER_MB = 2


@pytest.fixture(scope="module")
def mirror_address():
    """Where the registry mirror listens (started by `mirror`)."""
    return f"127.0.0.1:{processes.free_port()}"


@pytest.fixture(scope="module")
def second_engine(container_engine, registry, mirror_address, tmp_path_factory):
    """Another Podman engine, of its own storage, with the demo image: it may pull from the
    test registry and from the mirror over plain HTTP."""
    run = tmp_path_factory.mktemp("podman-b")
    storage = run / "storage"
    engine.layer_storage(storage, LAYER_STORAGE_GIB)
    registries = run / "registries.conf"
    registries.write_text(
        "".join(
            f'[[registry]]\nlocation = "{where}"\ninsecure = true\n'
            for where in (registry, mirror_address)
        )
    )
    service = engine.start_podman_service(
        run / "podman.sock", run / "podman.log", storage, CONTAINERS_REGISTRIES_CONF=str(registries)
    )
    engine.build_demo_image(storage=storage)
    url = f"unix://{run / 'podman.sock'}"
    yield ContainerEngine(url, storage, container_engine.registry_port, registries)
    _remove_test_networks(url)
    service.terminate()
    service.wait(10)
    env = podman_env()
    subprocess.run(podman_command(storage, "rm", "--all", "--force"), env=env)
    subprocess.run(podman_command(storage, "system", "reset", "--force"), env=env)
    subprocess.run(["umount", "--lazy", str(storage / "root" / "overlay")], capture_output=True)
    engine.unmount_layer_storage(storage, remove=True)


@pytest.fixture(scope="module")
def mirror(registry, mirror_address, tmp_path_factory):
    """A pull-through cache of the test registry; answers (its address, its storage)."""
    root = tmp_path_factory.mktemp("mirror")
    server = start_registry(root, mirror_address, proxy=registry)
    yield mirror_address, root / "data"
    server.terminate()
    server.wait(10)


@pytest.fixture
def push_image(container_engine, registry, tmp_path):
    """push_image(name) → the reference of a new image (the demo image and a layer of random
    data) in the test registry only: no engine holds it."""

    def push(name: str, megabytes: int = LAYER_MB) -> str:
        reference = f"{registry}/gpucloud/{name}:{secrets.token_hex(3)}"
        context = tmp_path / f"image-{name}"
        context.mkdir()
        (context / "blob").write_bytes(secrets.token_bytes(megabytes * 1_000_000))
        (context / "Containerfile").write_text(f"FROM {DEMO_IMAGE}\nCOPY blob /blob\n")
        for step in (("build", "-t", reference, str(context)), ("push", reference)):
            done = container_engine.podman(*step)
            assert done.returncode == 0, done.stderr
        assert container_engine.podman("rmi", reference).returncode == 0
        return reference

    return push
