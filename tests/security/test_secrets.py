"""Secret env values: stored sealed, given to the container, and never shown again: not in the
API (instances, events, templates), the console's pages (the instance page, the launch form
shown again after an error, the templates page), nor the console's own logs; masked for every
role, viewers included. A plain env name that says it holds a credential (HF_TOKEN) is a secret
too: a read-only member used to read an HF_TOKEN in clear."""

import hashlib
import json
import logging
from importlib import import_module

import pytest
from django.apps import apps as django_apps
from django.core.exceptions import ImproperlyConfigured

from accounts.roles import Role
from agent.devtools.engine import DEMO_IMAGE
from console import secret_env
from console.catalog.models import Mode
from console.instances import outcomes, placement, services, tasks
from console.instances.models import Allocation, Instance, InstanceEvent, State
from console.launch_templates.models import LaunchTemplate
from tests.clients import signed_in
from tests.factories import ImageFactory
from tests.instances.e2e import api_client, make_catalog, make_tenant, start_agent, wait_for
from tests.instances.fakes import FakeAgents

TOKEN = "hf_sEcReTvAlUe0123456789"
WANDB = "wandb-key-9876543210abcdef"
MASK = secret_env.MASK


@pytest.fixture
def agents(monkeypatch):
    return FakeAgents().install(monkeypatch)


def _launch_body(**extra) -> dict:
    return {
        "name": "trainer",
        "spec": "a100-quarter",
        "image": "pytorch-2.5-cuda12.4",
        "env": {"SEED": "7"},
        "secret_env": {"HF_TOKEN": TOKEN},
        **extra,
    }


def _clear(text: str) -> None:
    assert TOKEN not in text and WANDB not in text


@pytest.fixture
def launched(catalog, member, token_client, agents, django_capture_on_commit_callbacks):
    """An instance launched through the API with a secret and a credential in plain env,
    provisioned by its task against the fake agent."""
    catalog.host(gpus=1, mode=Mode.SHARED)
    body = _launch_body(env={"SEED": "7", "WANDB_API_KEY": WANDB})
    with django_capture_on_commit_callbacks(execute=False):
        response = token_client(member).post("/api/v1/instances/", body, format="json")
    assert response.status_code == 202, response.json()
    tasks.provision.apply(args=[response.json()["id"]])
    return Instance.objects.get(pk=response.json()["id"])


def test_a_secret_is_sealed_at_rest_and_sent_only_to_the_agent(launched, agents):
    stored = Instance.objects.filter(pk=launched.pk).values("env", "secret_env").get()
    assert stored["env"] == {"SEED": "7"}
    assert sorted(stored["secret_env"]) == ["HF_TOKEN", "WANDB_API_KEY"]
    _clear(json.dumps(stored))
    _clear(json.dumps(list(Allocation.objects.values("request"))))
    (sent,) = [a["body"] for allocations in agents.hosts.values() for a in allocations.values()]
    assert sent["env"]["HF_TOKEN"] == TOKEN and sent["env"]["WANDB_API_KEY"] == WANDB
    assert sent["env"]["SEED"] == "7"
    assert launched.state == State.RUNNING
    assert TOKEN not in repr(outcomes.job(launched.pk, (State.RUNNING,)))


@pytest.mark.parametrize("role", [Role.VIEWER, Role.MEMBER, Role.OWNER])
def test_no_role_reads_a_secret_from_the_api(launched, tenant, make_member, token_client, role):
    client = token_client(make_member(tenant, role))
    detail = client.get(f"/api/v1/instances/{launched.pk}/")
    assert detail.json()["secret_env"] == {"HF_TOKEN": MASK, "WANDB_API_KEY": MASK}
    assert detail.json()["env"] == {"SEED": "7"}
    for path in (
        f"/api/v1/instances/{launched.pk}/",
        "/api/v1/instances/",
        f"/api/v1/instances/{launched.pk}/events/",
    ):
        response = client.get(path)
        assert response.status_code == 200
        _clear(response.content.decode())


def test_no_role_reads_a_secret_from_the_pages(launched, tenant, make_member, viewer):
    for membership in (viewer, make_member(tenant, Role.OWNER)):
        page = signed_in(membership).get(f"/instances/{launched.pk}/")
        assert page.status_code == 200
        html = page.content.decode()
        _clear(html)
        assert f"HF_TOKEN={MASK}" in html and "SEED=7" in html


def test_events_hold_no_secret(launched):
    _clear(json.dumps(list(InstanceEvent.objects.values("message"))))


def test_the_launch_form_never_shows_a_secret_again(catalog, member):
    catalog.host(gpus=1, mode=Mode.SHARED)
    form = {"region": "local-1", "spec": "a100-quarter", "image": catalog.image.name,
            "name": "No!", "secret_env": f"HF_TOKEN={TOKEN}", "env": "SEED=7"}  # fmt: skip
    page = signed_in(member).post("/instances/launch/", form)
    assert page.status_code == 200 and "lowercase letters" in page.content.decode()
    _clear(page.content.decode())  # the secrets textarea never shows what was typed
    assert "SEED=7" in page.content.decode()  # the plain one does
    form["name"] = "ok"
    launched = signed_in(member).post("/instances/launch/", form)
    assert launched.status_code == 302
    instance = Instance.objects.get(name="ok")
    assert secret_env.open_all(instance.secret_env) == {"HF_TOKEN": TOKEN}


def test_the_console_logs_no_secret(catalog, member, token_client, agents, caplog):
    caplog.set_level(logging.DEBUG)
    catalog.host(gpus=1, mode=Mode.SHARED)
    response = token_client(member).post("/api/v1/instances/", _launch_body(), format="json")
    assert response.status_code == 202
    tasks.provision.apply(args=[response.json()["id"]])
    assert Instance.objects.get(pk=response.json()["id"]).state == State.RUNNING
    assert caplog.records  # the launch and its task did log
    _clear(caplog.text)
    _clear("\n".join(repr(record.args) for record in caplog.records))


def test_templates_hold_and_show_no_secret(launched, member, viewer, token_client):
    saved = token_client(member).post(
        f"/api/v1/instances/{launched.pk}/save-template/", {"name": "trainer"}, format="json"
    )
    assert saved.status_code == 201, saved.json()
    assert saved.json()["secret_env"] == {"HF_TOKEN": MASK, "WANDB_API_KEY": MASK}
    _clear(saved.content.decode())
    _clear(json.dumps(list(LaunchTemplate.objects.values("env", "secret_env"))))
    for membership in (member, viewer):
        _clear(token_client(membership).get("/api/v1/templates/").content.decode())
        _clear(signed_in(membership).get("/templates/").content.decode())
    # launched again from it, the secret goes with it (sealed)
    again = token_client(member).post(
        "/api/v1/instances/", {"template": "trainer", "name": "again"}, format="json"
    )
    assert again.status_code == 202, again.json()
    _clear(again.content.decode())
    sealed = Instance.objects.get(name="again").secret_env
    assert secret_env.open_all(sealed) == {"HF_TOKEN": TOKEN, "WANDB_API_KEY": WANDB}


def test_the_mask_is_not_a_value(catalog, member, token_client):
    catalog.host(gpus=1, mode=Mode.SHARED)
    body = _launch_body(secret_env={"HF_TOKEN": MASK})
    response = token_client(member).post("/api/v1/instances/", body, format="json")
    assert response.status_code == 400
    assert "is how a secret is shown" in response.json()["errors"]["secret_env"][0]
    both = _launch_body(env={"HF_HOME": "/x"}, secret_env={"HF_HOME": "/y"})
    response = token_client(member).post("/api/v1/instances/", both, format="json")
    assert response.json()["errors"]["secret_env"] == ["HF_HOME is both in env and a secret."]
    reserved = _launch_body(secret_env={"NVIDIA_VISIBLE_DEVICES": "all"})
    response = token_client(member).post("/api/v1/instances/", reserved, format="json")
    assert "is the platform's" in response.json()["errors"]["secret_env"][0]
    assert not Instance.objects.exists()


@pytest.mark.parametrize(
    "name, secret",
    [("HF_TOKEN", True), ("WANDB_API_KEY", True), ("DB_PASSWORD", True), ("AWS_SECRET", True),
     ("KEY", True), ("SEED", False), ("HF_HOME", False), ("KEYBOARD", False), ("MONKEY", False)],
)  # fmt: skip
def test_names_that_say_they_hold_a_credential(name, secret):
    assert secret_env.looks_secret(name) is secret


def test_a_rotated_key_still_opens_what_the_old_one_sealed(settings):
    sealed = secret_env.seal({"HF_TOKEN": TOKEN})
    settings.SECRET_ENV_KEY = "a-new-key-of-the-operators"
    assert secret_env.open_all(sealed) == {"HF_TOKEN": TOKEN}  # SECRET_KEY still opens it
    newer = secret_env.seal({"HF_TOKEN": TOKEN})
    settings.SECRET_ENV_KEY = ""
    settings.SECRET_KEY, settings.SECRET_KEY_FALLBACKS = "another", [settings.SECRET_KEY]
    assert secret_env.open_all(sealed) == {"HF_TOKEN": TOKEN}
    with pytest.raises(ImproperlyConfigured):
        secret_env.open_all(newer)  # sealed with a key the console no longer has


def test_existing_credentials_in_plain_env_are_sealed_by_the_migration(catalog, tenant, agents):
    catalog.host(gpus=1, mode=Mode.SHARED)
    instance = services.launch_instance(tenant, name="old", spec=catalog.quarter)
    tasks.provision.apply(args=[instance.pk])
    # as an instance of before secrets kept it: the token in plain env and in its request
    Instance.objects.filter(pk=instance.pk).update(env={"HF_TOKEN": TOKEN, "SEED": "1"})
    allocation = Allocation.objects.get(instance=instance)
    allocation.request["env"] = {**allocation.request["env"], "HF_TOKEN": TOKEN}
    allocation.save()
    migration = import_module("console.instances.migrations.0012_instance_secret_env")
    migration.seal_credentials(django_apps, None)
    stored = Instance.objects.get(pk=instance.pk)
    assert stored.env == {"SEED": "1"}
    assert secret_env.open_all(stored.secret_env) == {"HF_TOKEN": TOKEN}
    request = Allocation.objects.get(pk=allocation.pk).request
    _clear(json.dumps(request))
    assert placement.agent_body(request, stored.secret_env)["env"]["HF_TOKEN"] == TOKEN


@pytest.mark.integration
@pytest.mark.containers
def test_the_container_gets_the_secret_in_its_environment(stack, container_engine):
    make_catalog()
    ImageFactory(name="demo-busybox", reference=DEMO_IMAGE, command=[], cuda_version="-")
    _, membership = make_tenant()
    start_agent(stack, "gpu-1", gpus=2, runtime="oci", engine_url=container_engine.url)
    api = api_client(stack, membership)
    # the workload compares the variable with the secret's digest: nothing shown holds the value
    digest = hashlib.sha256(TOKEN.encode()).hexdigest()
    check = (f'test "$(printf %s "$HF_TOKEN" | sha256sum | cut -d" " -f1)" = {digest} '
             "&& echo secret-arrived; sleep 1000")  # fmt: skip
    body = {"name": "reader", "spec": "a100-quarter", "image": "demo-busybox",
            "command": ["sh", "-c", check], "secret_env": {"HF_TOKEN": TOKEN}}  # fmt: skip
    created = api.post("/instances/", json=body)
    assert created.status_code == 202, created.text
    _clear(created.text)
    iid = created.json()["id"]

    def arrived():
        answer = api.get(f"/instances/{iid}/logs/", params={"tail": 20})
        return answer.status_code == 200 and "secret-arrived" in answer.json()["lines"]

    wait_for(arrived, timeout=90, what="the workload seeing its secret", stack=stack)
    shown = api.get(f"/instances/{iid}/")
    assert shown.json()["secret_env"] == {"HF_TOKEN": MASK}
    _clear(shown.text)
    _clear(api.get("/instances/").text)
    _clear(api.get(f"/instances/{iid}/events/").text)
    for proc in stack.procs:  # the console's processes: web server and worker
        if not proc.name.startswith("agent"):
            _clear(proc.log())
