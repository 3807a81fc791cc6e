"""A tenant's own image in a private registry, end to end: Debian's docker-registry asking for
basic auth (htpasswd), a real agent with the `oci` runtime on Podman, the real web server and
Celery worker. The tenant's admin stores the registry's credential; a member launches the
image by reference; it runs, pinned to its first pull's digest, and still runs those bytes
after a stop and start although its tag has moved and the host lost its copy. A wrong
password is a clear reason, a registry the region does not allow a 400 on the field, and the
password is in no answer, page, event, audit entry, log line or state file. Another tenant,
without the credential, does not get the image although the host holds it."""

import json
import secrets

import pytest

from accounts.roles import Role
from agent.devtools.engine import DEMO_IMAGE
from console.audit.models import AuditEntry
from console.catalog.models import Region
from console.instances.models import InstanceEvent
from tests.clients import signed_in
from tests.factories import MembershipFactory, UserFactory
from tests.instances.e2e import (
    agent_allocations,
    api_client,
    make_catalog,
    make_tenant,
    start_agent,
    wait_state,
)
from tests.registry import start_registry

pytestmark = [pytest.mark.integration, pytest.mark.containers]
USER = "ci-bot"
PASSWORD = "pRiVaTe-8d41c2-REGISTRY-pw"
SLEEP = ["sleep", "1000"]


@pytest.fixture(scope="module")
def private_registry(container_engine, tmp_path_factory):
    """A registry that asks for USER's PASSWORD, on the port the test engine may reach over
    plain HTTP; answers its host:port."""
    address = f"127.0.0.1:{container_engine.private_registry_port}"
    server = start_registry(
        tmp_path_factory.mktemp("private-registry"), address, users={USER: PASSWORD}
    )
    yield address
    server.terminate()
    server.wait(10)


def push(engine, reference: str, marker: str, tmp_path) -> None:
    """Build an image of the demo image and a file saying `marker`, push it as `reference`
    with the credential, and leave the engine without it."""
    context = tmp_path / f"ctx-{secrets.token_hex(3)}"
    context.mkdir()
    (context / "marker").write_text(marker)
    (context / "Containerfile").write_text(f"FROM {DEMO_IMAGE}\nCOPY marker /marker\n")
    for step in (
        ("build", "-t", reference, str(context)),
        ("push", "--creds", f"{USER}:{PASSWORD}", reference),
        ("rmi", "--force", reference),
    ):
        done = engine.podman(*step)
        assert done.returncode == 0, done.stderr


def running_marker(engine, host, iid: int) -> str:
    (alloc,) = [
        alloc
        for alloc in agent_allocations(host).values()
        if alloc["labels"]["instance"] == str(iid) and alloc["state"] == "running"
    ]
    done = engine.podman("exec", alloc["container"], "cat", "/marker")
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


def test_a_private_image_with_stored_credentials(
    stack, container_engine, private_registry, tmp_path
):
    reference = f"{private_registry}/team/trainer:{secrets.token_hex(3)}"
    push(container_engine, reference, "v1", tmp_path)
    make_catalog()
    tenant, membership = make_tenant()
    admin = MembershipFactory(user=UserFactory(username="ada"), tenant=tenant, role=Role.ADMIN)
    _, host = start_agent(stack, "gpu-1", gpus=2, runtime="oci", engine_url=container_engine.url)
    api, admin_api = api_client(stack, membership), api_client(stack, admin)

    # the region allows this registry only: another is a 400 on the field
    Region.objects.filter(code="local-1").update(allowed_registries=[private_registry])
    refused = api.post(
        "/instances/",
        json={"name": "x", "spec": "a100-quarter", "image_ref": "registry.example.com/x/y:1"},
    )
    assert refused.status_code == 400
    assert refused.json()["errors"]["image_ref"] == [
        f"registry.example.com is not among the registries region local-1 allows: "
        f"{private_registry}."
    ]

    # a wrong password: the registry refuses it, and the tenant reads why
    saved = admin_api.post(
        "/registry-credentials/",
        json={"registry": private_registry, "username": USER, "password": "wrong-password"},
    )
    assert saved.status_code == 201, saved.text
    body = {"name": "bad", "spec": "a100-quarter", "image_ref": reference, "command": SLEEP}
    bad = api.post("/instances/", json=body).json()["id"]
    failed = wait_state(api, bad, "failed", stack=stack, timeout=90)
    assert failed["reason_text"].startswith(
        f"{private_registry} refused the credentials ‘{USER}’: "
    ), failed
    assert failed["reason_text"].endswith(
        "check the username and token under Registry credentials, then start it again."
    ), failed
    api.post(f"/instances/{bad}/terminate/")

    # the right one: it runs, pinned to the digest of its first pull
    saved = admin_api.post(
        "/registry-credentials/",
        json={"registry": private_registry, "username": USER, "password": PASSWORD},
    )
    assert saved.status_code == 201
    iid = api.post("/instances/", json={**body, "name": "good"}).json()["id"]
    shown = wait_state(api, iid, "running", stack=stack, timeout=90)
    digest = shown["image_digest"]
    assert digest.startswith("sha256:") and shown["image_reference"] == reference
    messages = [e["message"] for e in api.get(f"/instances/{iid}/events/").json()["results"]]
    assert f"Pinned {reference} to {digest}" in messages
    assert running_marker(container_engine, host, iid) == "v1"

    # the host holds it now, yet another tenant, without a credential, does not get it
    _, stranger = make_tenant(slug="globex", username="gus")
    theirs = api_client(stack, stranger).post("/instances/", json={**body, "name": "theirs"})
    refused = wait_state(api_client(stack, stranger), theirs.json()["id"], "failed", stack=stack)
    assert refused["reason_text"].startswith(
        f"{private_registry} asks for credentials to pull {reference} — add them under "
        "Registry credentials"
    ), refused

    # the tag moves, the host forgets its copy: a start runs the pinned bytes all the same
    assert api.post(f"/instances/{iid}/stop/").status_code == 202
    wait_state(api, iid, "stopped", stack=stack, timeout=60)
    push(container_engine, reference, "v2", tmp_path)
    container_engine.podman("rmi", "--force", f"{reference.rsplit(':', 1)[0]}@{digest}")
    assert api.post(f"/instances/{iid}/start/").status_code == 202
    again = wait_state(api, iid, "running", stack=stack, timeout=90)
    assert again["image_digest"] == digest
    assert running_marker(container_engine, host, iid) == "v1"

    # the password is nowhere but in the registry's own files
    answers = [
        admin_api.get("/registry-credentials/").text,
        api.get(f"/instances/{iid}/").text,
        api.get(f"/instances/{iid}/events/").text,
        api.get(f"/instances/{bad}/").text,
        api.get("/instances/").text,
    ]
    pages = [
        signed_in(admin).get(path).content.decode()
        for path in ("/registry-credentials/", f"/instances/{iid}/", f"/instances/{bad}/")
    ]
    rows = [
        json.dumps(list(InstanceEvent.objects.values("message"))),
        json.dumps(list(AuditEntry.objects.values()), default=str),
    ]
    for text in answers + pages + rows:
        assert PASSWORD not in text and "wrong-password" not in text
    for path in stack.log_dir.rglob("*"):  # every process's log, the agent's state directory
        if path.is_file() and path.stat().st_size < 50_000_000:  # not a disk's sparse image
            text = path.read_bytes().decode(errors="replace")
            assert PASSWORD not in text and "wrong-password" not in text, path
