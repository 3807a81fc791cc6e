"""What a tenant gets, end to end with real containers: the API, a Celery worker, a real agent
with the `oci` runtime on Podman. The workload's own exit is a state change billed to the
second it happened; its output stays readable; /workspace outlives stop and start."""

import secrets
from datetime import datetime

import pytest

from agent.devtools.engine import DEMO_IMAGE
from billing.models import UsageSegment
from console.catalog.models import Spec
from console.instances.models import Instance
from tests.factories import ImageFactory, SpecFactory
from tests.instances.e2e import (
    api_client,
    make_catalog,
    make_tenant,
    start_agent,
    wait_for,
    wait_state,
)

pytestmark = [pytest.mark.integration, pytest.mark.containers]
MEMORY_HOG = "echo eating; x=$(dd if=/dev/zero bs=1M count=256 | tr '\\0' a); echo survived"


@pytest.fixture
def cloud(stack, container_engine):
    """A region with one real container host, a tenant's API client, the demo image and a
    spec with 64 MiB of RAM."""
    make_catalog()
    quarter = Spec.objects.get(code="a100-quarter")
    SpecFactory(
        code="a100-quarter-tiny", name="A100 1/4, 64 MiB", mode=quarter.mode, milli=250,
        gpu_memory_mib=20480, gpu_model=quarter.gpu_model, vcpus=1, ram_mib=64, disk_gib=1,
        price_per_hour=quarter.current_price(),
    )  # fmt: skip
    ImageFactory(name="demo-busybox", reference=DEMO_IMAGE, command=[], cuda_version="-")
    _, membership = make_tenant()
    start_agent(stack, "gpu-1", gpus=2, runtime="oci", engine_url=container_engine.url)
    return api_client(stack, membership)


def _launch(api, name: str, command: list[str], spec: str = "a100-quarter") -> int:
    body = {"name": name, "spec": spec, "image": "demo-busybox", "command": command}
    created = api.post("/instances/", json=body)
    assert created.status_code == 202, created.text
    return created.json()["id"]


def _logs(api, iid: int) -> list[str]:
    answer = api.get(f"/instances/{iid}/logs/", params={"tail": 50})
    assert answer.status_code == 200, answer.text
    return answer.json()["lines"]


def _billed_until(iid: int) -> datetime:
    segment = UsageSegment.objects.filter(instance_id=iid, kind="gpu").get()
    assert segment.ended_at is not None
    return segment.ended_at


def test_a_failing_command_fails_the_instance_with_its_exit_code_and_keeps_its_log(stack, cloud):
    iid = _launch(cloud, "crasher", ["sh", "-c", "echo hi; sleep 1; exit 3"])
    failed = wait_state(cloud, iid, "failed", stack)
    assert failed["state_reason"] == "exit code 3"
    assert failed["exit_code"] == 3
    assert failed["image_reference"] == DEMO_IMAGE
    assert failed["command"] == ["sh", "-c", "echo hi; sleep 1; exit 3"]
    assert _logs(cloud, iid) == ["hi"]
    events = cloud.get(f"/instances/{iid}/events/").json()
    assert any("exit code 3" in e["message"] for e in events["results"])


def test_an_exit_0_stops_the_instance_and_billing_at_the_exit(stack, cloud):
    iid = _launch(cloud, "batch", ["sh", "-c", "sleep 2; echo finished"])
    wait_state(cloud, iid, "running", stack)
    stopped = wait_state(cloud, iid, "stopped", stack)
    assert stopped["state_reason"] == "exited"
    assert stopped["exit_code"] == 0
    assert _logs(cloud, iid) == ["finished"]
    started = UsageSegment.objects.get(instance_id=iid, kind="gpu").started_at
    ran = (_billed_until(iid) - started).total_seconds()
    assert 1.5 < ran < 4.0  # the workload's 2 s, not the time until someone noticed


def test_a_memory_hog_is_oom_killed_and_billed_to_the_second_it_died(stack, cloud):
    iid = _launch(cloud, "hog", ["sh", "-c", f"sleep 1; {MEMORY_HOG}"], spec="a100-quarter-tiny")
    failed = wait_state(cloud, iid, "failed", stack)
    assert failed["state_reason"] == "oom_killed"
    assert "survived" not in _logs(cloud, iid)
    started = UsageSegment.objects.get(instance_id=iid, kind="gpu").started_at
    assert (_billed_until(iid) - started).total_seconds() < 4.0


def test_workspace_survives_stop_and_start_and_goes_with_terminate(stack, cloud, container_engine):
    remember = "test -f /workspace/seen && echo 'found it'; touch /workspace/seen; sleep 1000"
    iid = _launch(cloud, "notebook", ["sh", "-c", remember])
    wait_state(cloud, iid, "running", stack)
    disk = stack.log_dir / "agent-gpu-1" / "disks" / Instance.objects.get(pk=iid).disk_name
    assert (disk / "disk.img").exists()
    assert cloud.post(f"/instances/{iid}/stop/").status_code == 202
    wait_state(cloud, iid, "stopped", stack)
    assert cloud.post(f"/instances/{iid}/start/").status_code == 202
    wait_state(cloud, iid, "running", stack)
    wait_for(lambda: "found it" in _logs(cloud, iid), what="the file from before the stop")

    assert cloud.post(f"/instances/{iid}/terminate/").status_code == 202
    wait_state(cloud, iid, "terminated", stack)
    wait_for(lambda: not disk.exists(), what="the disk deleted")
    assert (
        container_engine.podman("ps", "-a", "--filter", f"name=gpucloud-{iid}", "-q").stdout == ""
    )


def test_an_image_that_cannot_be_had_fails_the_launch_and_frees_the_slice(stack, cloud, registry):
    # a registry the host reaches, which has no such image: the launch is taken, its pull fails
    ImageFactory(name="ghost", reference=f"{registry}/gpucloud/ghost:1", cuda_version="-")
    body = {"name": "ghost", "spec": "a100-quarter", "image": "ghost"}
    iid = cloud.post("/instances/", json=body).json()["id"]
    failed = wait_state(cloud, iid, "failed", stack)
    assert failed["state_reason"].startswith(("image_not_found", "image_pull_failed"))
    assert cloud.get("/quota/").json()["gpu_used"] in ("0", "0.000", 0)  # nothing held


def test_an_image_the_host_lacks_is_pulled_with_progress_then_kept(
    stack, cloud, container_engine, registry
):
    reference = f"{registry}/gpucloud/pulled:{secrets.token_hex(3)}"
    assert container_engine.podman("tag", DEMO_IMAGE, reference).returncode == 0
    pushed = container_engine.podman("push", reference)
    assert pushed.returncode == 0, pushed.stderr
    assert container_engine.podman("rmi", reference).returncode == 0  # the host lacks it now
    ImageFactory(name="from-registry", reference=reference, command=["sleep", "1000"])

    body = {"name": "cold", "spec": "a100-quarter", "image": "from-registry"}
    cold = cloud.post("/instances/", json=body).json()["id"]
    wait_state(cloud, cold, "running", stack)
    notes = [e["message"] for e in cloud.get(f"/instances/{cold}/events/").json()["results"]]
    assert any(m.startswith(f"pulling {reference}") for m in notes), notes
    assert any(m.startswith(f"pulled {reference}") for m in notes), notes
    assert container_engine.podman("image", "exists", reference).returncode == 0

    warm = cloud.post("/instances/", json={**body, "name": "warm"}).json()["id"]
    wait_state(cloud, warm, "running", stack)
    notes = [e["message"] for e in cloud.get(f"/instances/{warm}/events/").json()["results"]]
    assert not any("pull" in m for m in notes), notes  # kept: a cold start pays once per host
