"""What a tenant runs and reads through /api/v1/instances/: the launch's command and env
(400 field errors for bad ones), what the instance shows (image reference, command, exit
code, disk), and its logs (who may read them, when they are gone, a host that is down)."""

import re

import pytest

from accounts.roles import Role
from console.catalog.models import Mode
from console.fleet.models import Host
from console.instances import tasks
from console.instances.models import Instance
from tests.instances.fakes import FakeAgents
from tests.instances.helpers import make_instance

URL = "/api/v1/instances/"


@pytest.fixture
def agents(monkeypatch):
    return FakeAgents().install(monkeypatch)


@pytest.fixture
def client(member, token_client):
    return token_client(member)


def launch(client, **overrides):
    body = {"name": "trainer", "spec": "a100-quarter", "image": "pytorch-2.5-cuda12.4"}
    return client.post(URL, {**body, **overrides}, format="json")


class TestLaunch:
    def test_command_and_env_reach_the_agent_over_the_images_defaults(
        self, client, catalog, agents, no_tasks
    ):
        host = catalog.host(gpus=1, mode=Mode.SHARED)
        image = catalog.image
        image.env, image.command = {"LANG": "C.UTF-8", "MODE": "image"}, ["sleep", "infinity"]
        image.save()
        response = launch(
            client, command=["sh", "-c", "echo hi; exit 3"], env={"MODE": "mine", "SEED": "7"}
        )
        assert response.status_code == 202, response.json()
        data = response.json()
        assert data["command"] == ["sh", "-c", "echo hi; exit 3"]
        assert data["env"] == {"MODE": "mine", "SEED": "7"}
        assert data["image_reference"] == "pytorch/pytorch:2.5.1-cuda12.4-cudnn9-runtime"
        assert data["disk"] == {"size_gib": 50, "host": host.name}
        assert data["exit_code"] is None
        request = Instance.objects.get(pk=data["id"]).current_allocation().request
        assert request["image"] == image.reference
        assert request["command"] == ["sh", "-c", "echo hi; exit 3"]
        assert request["env"] == {"LANG": "C.UTF-8", "MODE": "mine", "SEED": "7"}
        assert request["resources"] == {
            "vcpus": 4,
            "memory_mib": 16384,
            "pids": 4096,
            "layer_gib": 20,
        }
        disk_name = Instance.objects.get(pk=data["id"]).disk_name
        assert re.fullmatch("gpucloud-[0-9a-f]{32}", disk_name)  # no other install's, ever
        assert request["volume"] == {"name": disk_name, "size_gib": 50}

    def test_without_a_command_the_images_default_or_none(self, client, catalog, no_tasks):
        catalog.host(gpus=2, mode=Mode.SHARED)
        first = launch(client, name="a").json()
        request = Instance.objects.get(pk=first["id"]).current_allocation().request
        assert first["command"] is None and request["command"] is None  # the image's own CMD
        catalog.image.command = ["jupyter", "lab"]
        catalog.image.save()
        second = launch(client, name="b").json()
        request = Instance.objects.get(pk=second["id"]).current_allocation().request
        assert request["command"] == ["jupyter", "lab"]

    @pytest.mark.parametrize(
        "overrides, field",
        [
            ({"command": []}, "command"),
            ({"command": "echo hi"}, "command"),
            ({"command": [None]}, "command"),
            ({"command": [["nested"]]}, "command"),
            ({"command": ["x"] * 65}, "command"),
            ({"command": ["x" * 4097]}, "command"),
            ({"env": {"lower": "x"}}, "env"),
            ({"env": {"1ST": "x"}}, "env"),
            ({"env": {"A-B": "x"}}, "env"),
            ({"env": {"OK": "x" * 4097}}, "env"),
            ({"env": {f"V{n}": "x" for n in range(65)}}, "env"),
            ({"env": ["A=1"]}, "env"),
        ],
    )
    def test_bad_command_or_env_is_a_field_error(self, client, catalog, no_tasks, overrides, field):
        response = launch(client, **overrides)
        assert response.status_code == 400, response.json()
        assert response.json()["code"] == "invalid"
        assert list(response.json()["errors"]) == [field]
        assert not Instance.objects.exists()


class TestLogs:
    def running(self, catalog, tenant, agents, client):
        host = catalog.host("gpu-a", gpus=1, mode=Mode.SHARED)
        instance = Instance.objects.get(pk=launch(client).json()["id"])
        tasks.provision.apply(args=[instance.pk])
        agents.logs[host.name] = {str(instance.pk): [f"line {n}" for n in range(1, 301)]}
        return host, instance

    def test_tail_most_recent_last(self, client, catalog, tenant, agents, no_tasks):
        _, instance = self.running(catalog, tenant, agents, client)
        response = client.get(f"{URL}{instance.pk}/logs/?tail=3")
        assert response.status_code == 200
        lines = ["line 298", "line 299", "line 300"]
        assert response.json() == {"instance": instance.pk, "lines": lines}
        assert len(client.get(f"{URL}{instance.pk}/logs/").json()["lines"]) == 100

    @pytest.mark.parametrize("tail", ["0", "10001", "x", "-1"])
    def test_a_bad_tail_is_a_field_error(self, client, catalog, tenant, agents, no_tasks, tail):
        _, instance = self.running(catalog, tenant, agents, client)
        response = client.get(f"{URL}{instance.pk}/logs/?tail={tail}")
        assert response.status_code == 400 and "tail" in response.json()["errors"]

    def test_a_viewer_reads_them_another_tenant_gets_404(
        self, client, catalog, tenant, other_tenant, make_member, token_client, agents, no_tasks
    ):
        _, instance = self.running(catalog, tenant, agents, client)
        viewer = token_client(make_member(tenant, Role.VIEWER))
        assert viewer.get(f"{URL}{instance.pk}/logs/?tail=1").json()["lines"] == ["line 300"]
        stranger = token_client(make_member(other_tenant, Role.OWNER))
        response = stranger.get(f"{URL}{instance.pk}/logs/")
        assert response.status_code == 404 and response.json()["code"] == "not_found"

    def test_readable_when_stopped_gone_once_terminated(
        self, client, catalog, tenant, agents, no_tasks
    ):
        host, instance = self.running(catalog, tenant, agents, client)
        client.post(f"{URL}{instance.pk}/stop/")
        tasks.stop.apply(args=[instance.pk])
        assert client.get(f"{URL}{instance.pk}/").json()["state"] == "stopped"
        assert client.get(f"{URL}{instance.pk}/logs/?tail=1").json()["lines"] == ["line 300"]
        client.post(f"{URL}{instance.pk}/terminate/")
        tasks.terminate.apply(args=[instance.pk])
        assert client.get(f"{URL}{instance.pk}/").json()["state"] == "terminated"
        assert agents.deleted_instances == [(host.name, str(instance.pk))]
        assert client.get(f"{URL}{instance.pk}/logs/").status_code == 404

    def test_a_host_that_does_not_answer_is_a_503(self, client, catalog, tenant, agents, no_tasks):
        host, instance = self.running(catalog, tenant, agents, client)
        agents.down.add(host.name)
        response = client.get(f"{URL}{instance.pk}/logs/")
        assert response.status_code == 503
        assert response.json()["code"] == "host_unavailable"
        assert host.name in response.json()["detail"]
        Host.objects.filter(pk=host.pk).update(status=Host.Status.UNREACHABLE)
        assert client.get(f"{URL}{instance.pk}/logs/").status_code == 503

    def test_never_placed_has_no_lines(self, client, catalog, tenant, no_tasks):
        instance = make_instance(catalog, tenant)
        assert client.get(f"{URL}{instance.pk}/logs/").json()["lines"] == []
