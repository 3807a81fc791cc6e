"""An engine outage end to end (issue 50 item 2): a real agent with the `oci` runtime, on a
Podman API service of the test's own (over the worker's engine storage, so that stopping it
disturbs no other test), whose service is stopped for a while and started again. Meanwhile
the host says its engine is down, /healthz is degraded, the instance is unreachable with the
reason in words and not billed as running; once the engine answers again the instance, whose
container outlived the service (conmon runs it, as Docker's live-restore keeps its own), is
adopted back: the same container and process, billed for the outage, since the engine vouches
that it ran. The same on a Docker Engine of the test's own with live-restore, stopped and
started again. On Docker Engine without it (the worker's, its socket taken away by a proxy,
tests/engine_proxy.py, since its other Docker tests share it), a container that dies
meanwhile, as dockerd without live-restore kills every container when it stops, is reported
ended once the engine answers: the instance follows its restart policy and the outage stays
unbilled."""

import tempfile
from pathlib import Path

import docker
import httpx
import pytest

from agent.devtools import engine
from agent.devtools.engine import DEMO_IMAGE
from console.fleet.models import Host
from console.instances import recovery, tasks
from console.instances.models import Instance
from tests.conftest import LAYER_STORAGE_GIB, _remove_containers
from tests.engine_proxy import EngineProxy
from tests.factories import ImageFactory
from tests.instances.e2e import (
    api_client,
    make_catalog,
    make_tenant,
    start_agent,
    wait_for,
    wait_state,
)

pytestmark = [pytest.mark.integration, pytest.mark.containers]


def _service(container_engine, run):
    """Another `podman system service` over the worker engine's storage and settings."""
    return engine.start_podman_service(
        run / "podman.sock",
        run / "podman.log",
        container_engine.storage,
        CONTAINERS_REGISTRIES_CONF=str(container_engine.registries_conf),
        CONTAINERS_CONF=str(container_engine.storage.parent / "containers.conf"),
    )


def _pid(container_engine, name: str) -> str:
    return container_engine.podman("inspect", "--format", "{{.State.Pid}}", name).stdout.strip()


def _healthz(stack) -> str:
    return httpx.get(f"{stack.url}/healthz", timeout=10).json()["status"]


def test_an_engine_outage_is_shown_unbilled_and_its_surviving_container_adopted_back(
    stack, container_engine, tmp_path
):
    make_catalog()
    ImageFactory(name="demo-busybox", reference=DEMO_IMAGE, command=[], cuda_version="-")
    _, membership = make_tenant()
    run = tmp_path / "own-engine"
    service = _service(container_engine, run)
    url = f"unix://{run / 'podman.sock'}"
    try:
        _, host = start_agent(stack, "gpu-1", gpus=1, mode="shared", runtime="oci", engine_url=url)
        api = api_client(stack, membership)
        body = {"name": "box", "spec": "a100-quarter", "image": "demo-busybox"}
        body["command"] = ["sleep", "1000"]
        iid = api.post("/instances/", json=body).json()["id"]
        wait_state(api, iid, "running", stack, timeout=40)
        pid = _pid(container_engine, f"gpucloud-{iid}")
        assert pid not in ("", "0")
        assert _healthz(stack) == "ok"

        service.terminate()
        service.wait(10)
        down = wait_for(
            lambda: Host.objects.filter(pk=host.pk, engine_down_since__isnull=False).first(),
            what="the host's engine down",
            stack=stack,
        )
        assert down.status == Host.Status.ACTIVE  # its agent is heard
        assert _healthz(stack) == "degraded"
        recovery.fail_over_hosts()  # the watchdog's beat
        seen = wait_state(api, iid, "unreachable", stack)
        assert seen["state_reason"].startswith(
            "engine_down: the container engine on host gpu-1 does not answer since"
        )
        instance = Instance.objects.get(pk=iid)
        gone = instance.events.order_by("-at", "-pk").first()
        assert gone.to_state == "unreachable" and gone.at == down.engine_down_since
        assert tasks.reconcile_host(host.pk) == {}  # no adoption while the engine is down
        assert _pid(container_engine, f"gpucloud-{iid}") == pid  # conmon keeps it running

        service = _service(container_engine, run)
        wait_for(
            lambda: Host.objects.filter(pk=host.pk, engine_down_since__isnull=True).exists(),
            what="the engine answering again",
            stack=stack,
        )
        assert tasks.reconcile_host(host.pk)["adopted"] == [iid]
        back = wait_state(api, iid, "running", stack)
        assert back["state_reason"] == ""
        assert _pid(container_engine, f"gpucloud-{iid}") == pid  # the same process
        adopted = instance.events.order_by("-pk").first()
        assert (adopted.to_state, adopted.at) == ("running", gone.at)  # the outage billed
        assert _healthz(stack) == "ok"
        assert api.post(f"/instances/{iid}/terminate/").status_code == 202
        wait_state(api, iid, "terminated", stack)
    finally:
        service.terminate()
        service.wait(10)


def test_on_docker_a_container_that_died_with_the_engine_follows_its_restart_policy_unbilled(
    stack, docker_engine, tmp_path
):
    make_catalog()
    ImageFactory(name="demo-busybox", reference=DEMO_IMAGE, command=[], cuda_version="-")
    _, membership = make_tenant()
    proxy = EngineProxy(docker_engine.url, tmp_path / "docker.sock")
    proxy.restore()
    try:
        _, host = start_agent(
            stack, "gpu-1", gpus=1, mode="shared", runtime="oci", engine_url=proxy.url
        )
        api = api_client(stack, membership)
        body = {"name": "box", "spec": "a100-quarter", "image": "demo-busybox"}
        body["command"] = ["sleep", "1000"]
        iid = api.post("/instances/", json=body).json()["id"]
        wait_state(api, iid, "running", stack, timeout=40)

        proxy.cut()
        down = wait_for(
            lambda: Host.objects.filter(pk=host.pk, engine_down_since__isnull=False).first(),
            what="the host's engine down",
            stack=stack,
        )
        recovery.fail_over_hosts()
        assert wait_state(api, iid, "unreachable", stack)["state_reason"].startswith(
            "engine_down: "
        )
        engine_client = docker.DockerClient(base_url=docker_engine.url)
        try:  # what a dockerd without live-restore does to its containers when it stops
            engine_client.containers.get(f"gpucloud-{iid}").kill()
        finally:
            engine_client.close()

        proxy.restore()
        wait_for(
            lambda: Host.objects.filter(pk=host.pk, engine_down_since__isnull=True).exists(),
            what="the engine answering again",
            stack=stack,
        )
        outcome = tasks.reconcile_host(host.pk)
        assert outcome["adopted"] == []
        ended = wait_state(api, iid, "failed", stack)
        assert ended["state_reason"].startswith("exit code 137")
        instance = Instance.objects.get(pk=iid)
        assert instance.restart_at is not None  # on-failure: it runs again after its backoff
        states = list(instance.events.order_by("at", "pk").values_list("to_state", "at"))
        unreachable = next(at for state, at in states if state == "unreachable")
        assert unreachable == down.engine_down_since
        # nothing running (billed) from the outage on: unreachable, then failed
        after = [state for state, at in states if at >= unreachable]
        assert after[:2] == ["unreachable", "failed"] and "running" not in after, states
        # its restart policy runs it again once the backoff is over (10 s), from then billed
        wait_state(api, iid, "running", stack, timeout=60)
        assert api.post(f"/instances/{iid}/terminate/").status_code == 202
        wait_state(api, iid, "terminated", stack)
    finally:
        proxy.cut()


def _docker_pid(url: str, name: str) -> int:
    client = docker.DockerClient(base_url=url)
    try:
        return client.containers.get(name).attrs["State"]["Pid"]
    finally:
        client.close()


def test_on_docker_with_live_restore_the_same_container_is_adopted_back(stack, docker_engine):
    """docker_engine: the worker's Docker tests run one after another; this one starts a
    dockerd of its own beside it, on other subnets, and stops it under a running instance."""
    make_catalog()
    ImageFactory(name="demo-busybox", reference=DEMO_IMAGE, command=[], cuda_version="-")
    _, membership = make_tenant()
    root = Path(tempfile.mkdtemp(prefix="gpucloud-lr-"))  # a short path: the socket's
    chains = engine.docker_chains()
    engine.layer_storage(root / "data", LAYER_STORAGE_GIB)
    own = {"live_restore": True, "address_pool": "172.29.0.0/16"}
    dockerd = engine.start_docker_daemon(root, **own)
    url = f"unix://{root / 'docker.sock'}"
    try:
        engine.import_demo_image_docker(url)
        _, host = start_agent(stack, "gpu-1", gpus=1, mode="shared", runtime="oci", engine_url=url)
        api = api_client(stack, membership)
        body = {"name": "box", "spec": "a100-quarter", "image": "demo-busybox"}
        body["command"] = ["sleep", "1000"]
        iid = api.post("/instances/", json=body).json()["id"]
        wait_state(api, iid, "running", stack, timeout=40)
        pid = _docker_pid(url, f"gpucloud-{iid}")

        dockerd.terminate()
        dockerd.wait(30)
        down = wait_for(
            lambda: Host.objects.filter(pk=host.pk, engine_down_since__isnull=False).first(),
            what="the host's engine down",
            stack=stack,
        )
        recovery.fail_over_hosts()
        assert wait_state(api, iid, "unreachable", stack)["state_reason"].startswith(
            "engine_down: "
        )
        assert Path(f"/proc/{pid}").exists()  # live-restore: it runs on without dockerd

        dockerd = engine.start_docker_daemon(root, **own)
        wait_for(
            lambda: Host.objects.filter(pk=host.pk, engine_down_since__isnull=True).exists(),
            what="the engine answering again",
            stack=stack,
        )
        assert tasks.reconcile_host(host.pk)["adopted"] == [iid]
        wait_state(api, iid, "running", stack)
        assert _docker_pid(url, f"gpucloud-{iid}") == pid  # the same container and process
        adopted = Instance.objects.get(pk=iid).events.order_by("-pk").first()
        assert (adopted.to_state, adopted.at) == ("running", down.engine_down_since)
        assert api.post(f"/instances/{iid}/terminate/").status_code == 202
        wait_state(api, iid, "terminated", stack)
    finally:
        if dockerd.poll() is None:
            _remove_containers(url)  # with live-restore they would outlive the daemon
        engine.stop_docker_daemon(dockerd, root)
        engine.remove_docker_chains(engine.docker_chains() - chains)
