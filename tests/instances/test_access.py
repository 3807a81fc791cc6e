"""Getting into an instance, on the console's side: the keys a launch grants (default, by
name, another member's, refused ones), keys pushed to the host before the allocation and
again when they change, the `ssh` and `ports` of the API, and ssh session events."""

import asyncssh
import pytest
from django.utils import timezone

from accounts import services as accounts_services
from accounts.roles import Role
from accounts.ssh_keys import add_ssh_key, delete_ssh_key
from console.catalog.models import Mode
from console.fleet import ssh_authority
from console.instances import tasks
from console.instances.models import Allocation, Instance, State
from tests.instances.fakes import FakeAgents
from tests.instances.test_agent_events import event, push

URL = "/api/v1/instances/"


def key_text(comment="k") -> str:
    return (
        asyncssh.generate_private_key("ssh-ed25519", comment=comment).export_public_key().decode()
    )


@pytest.fixture
def agents(monkeypatch):
    return FakeAgents().install(monkeypatch)


@pytest.fixture
def eager(settings):
    from console.celery import app

    settings.CELERY_TASK_ALWAYS_EAGER = True
    app.conf.task_always_eager = True
    yield
    app.conf.task_always_eager = False


@pytest.fixture
def keys(member):
    return {name: add_ssh_key(member, name, key_text(name)) for name in ("laptop", "desktop")}


def launch(client, **overrides):
    body = {"name": "trainer", "spec": "a100-quarter", "image": "pytorch-2.5-cuda12.4"}
    return client.post(URL, {**body, **overrides}, format="json")


def pushed(agents, host, instance_id) -> list[str]:
    return [k["name"] for k in agents.ssh_keys[host.name][str(instance_id)]]


class TestLaunchKeys:
    def test_by_default_all_of_the_launchers_keys_reach_the_host_before_the_allocation(
        self, catalog, member, keys, token_client, agents, no_tasks
    ):
        host = catalog.host(gpus=1, mode=Mode.SHARED)
        data = launch(token_client(member)).json()
        assert sorted(data["ssh_keys"]) == ["desktop", "laptop"]
        agents.calls.clear()
        tasks.provision.apply(args=[data["id"]])
        assert sorted(pushed(agents, host, data["id"])) == ["desktop", "laptop"]
        sent = agents.ssh_keys[host.name][str(data["id"])][0]
        assert set(sent) == {"name", "fingerprint", "public_key"}
        assert sent["fingerprint"].startswith("SHA256:")
        assert agents.calls == [host.name, host.name]  # the keys, then the allocation
        assert Instance.objects.get(pk=data["id"]).state == State.RUNNING

    def test_named_keys_only(self, catalog, member, keys, token_client, agents, no_tasks):
        host = catalog.host(gpus=1, mode=Mode.SHARED)
        data = launch(token_client(member), ssh_keys=["laptop"]).json()
        assert data["ssh_keys"] == ["laptop"]
        tasks.provision.apply(args=[data["id"]])
        assert pushed(agents, host, data["id"]) == ["laptop"]

    def test_an_unknown_name_is_a_field_error_and_nothing_is_launched(
        self, catalog, member, keys, token_client, no_tasks
    ):
        catalog.host(gpus=1, mode=Mode.SHARED)
        answer = launch(token_client(member), ssh_keys=["laptop", "phone"])
        assert answer.status_code == 400
        assert answer.json()["errors"]["ssh_keys"] == [
            "You have no SSH key named phone in this tenant."
        ]
        assert not Instance.objects.exists()

    def test_another_members_key_but_never_a_viewers(
        self, catalog, tenant, member, keys, make_member, token_client, no_tasks
    ):
        catalog.host(gpus=2, mode=Mode.SHARED)
        max_ = make_member(tenant, Role.ADMIN, username="max")
        add_ssh_key(max_, "work", key_text())
        vic = make_member(tenant, Role.VIEWER, username="vic")
        add_ssh_key(vic, "home", key_text())
        client = token_client(member)
        data = launch(client, ssh_keys=["laptop", "max/work"]).json()
        assert sorted(data["ssh_keys"]) == ["laptop", "max/work"]
        refused = launch(client, name="other", ssh_keys=["vic/home"])
        assert refused.status_code == 400
        assert "vic is a viewer" in refused.json()["errors"]["ssh_keys"][0]

    def test_keys_of_another_tenant_are_unknown(
        self, catalog, member, other_tenant, make_member, token_client, no_tasks
    ):
        catalog.host(gpus=1, mode=Mode.SHARED)
        stranger = make_member(other_tenant, Role.OWNER, username="eve")
        add_ssh_key(stranger, "laptop", key_text())
        answer = launch(token_client(member), ssh_keys=["eve/laptop", "laptop"])
        assert answer.status_code == 400
        assert answer.json()["errors"]["ssh_keys"] == [
            "eve has no SSH key named laptop in this tenant.",
            "You have no SSH key named laptop in this tenant.",
        ]


class TestKeysChange:
    def running(self, catalog, member, keys, token_client, agents, no_tasks):
        host = catalog.host(gpus=1, mode=Mode.SHARED)
        data = launch(token_client(member)).json()
        tasks.provision.apply(args=[data["id"]])
        return host, data["id"]

    def test_a_deleted_key_leaves_the_host(
        self, catalog, member, keys, token_client, agents, no_tasks, eager,
        django_capture_on_commit_callbacks,
    ):  # fmt: skip
        host, pk = self.running(catalog, member, keys, token_client, agents, no_tasks)
        with django_capture_on_commit_callbacks(execute=True):
            delete_ssh_key(keys["laptop"])
        assert pushed(agents, host, pk) == ["desktop"]

    def test_a_member_lowered_to_viewer_or_removed_is_locked_out(
        self, catalog, tenant, member, keys, token_client, agents, no_tasks, eager,
        make_member, django_capture_on_commit_callbacks,
    ):  # fmt: skip
        make_member(tenant, Role.OWNER)
        host, pk = self.running(catalog, member, keys, token_client, agents, no_tasks)
        with django_capture_on_commit_callbacks(execute=True):
            accounts_services.change_role(member, Role.VIEWER)
        assert pushed(agents, host, pk) == []
        with django_capture_on_commit_callbacks(execute=True):
            accounts_services.change_role(member, Role.MEMBER)
        assert sorted(pushed(agents, host, pk)) == ["desktop", "laptop"]
        with django_capture_on_commit_callbacks(execute=True):
            accounts_services.remove_member(member)
        assert pushed(agents, host, pk) == []

    def test_a_keyless_member_lowered_or_removed_leaves_the_terminals_members(
        self, catalog, tenant, member, keys, token_client, agents, no_tasks, eager,
        make_member, django_capture_on_commit_callbacks,
    ):  # fmt: skip
        """The push names who may hold the instance's terminals (the agent ends the others'):
        a member without an SSH key is pushed out too, at once."""
        host, pk = self.running(catalog, member, keys, token_client, agents, no_tasks)
        kim = make_member(tenant, Role.MEMBER, username="kim")
        viewer = make_member(tenant, Role.VIEWER, username="vic")
        with django_capture_on_commit_callbacks(execute=True):
            accounts_services.change_role(kim, Role.ADMIN)
        assert agents.members[host.name][str(pk)] == [str(member.pk), str(kim.pk)]
        assert str(viewer.pk) not in agents.members[host.name][str(pk)]
        with django_capture_on_commit_callbacks(execute=True):
            accounts_services.change_role(kim, Role.VIEWER)
        assert agents.members[host.name][str(pk)] == [str(member.pk)]
        with django_capture_on_commit_callbacks(execute=True):
            accounts_services.remove_member(member)
        assert agents.members[host.name][str(pk)] == []

    def test_a_deactivated_users_keys_leave_the_host(
        self, catalog, member, keys, token_client, agents, no_tasks, eager,
        django_capture_on_commit_callbacks,
    ):  # fmt: skip
        host, pk = self.running(catalog, member, keys, token_client, agents, no_tasks)
        member.user.is_active = False
        with django_capture_on_commit_callbacks(execute=True):
            member.user.save()
        assert pushed(agents, host, pk) == []

    def test_a_stopped_instance_gets_its_keys_at_its_next_start(
        self, catalog, member, keys, token_client, agents, no_tasks
    ):
        host, pk = self.running(catalog, member, keys, token_client, agents, no_tasks)
        instance = Instance.objects.get(pk=pk)
        from console.instances import services

        services.stop_instance(instance)
        tasks.stop.apply(args=[pk])
        delete_ssh_key(keys["desktop"])
        assert tasks.push_ssh_keys.apply(args=[pk]).get() is False  # on no host now
        services.start_instance(Instance.objects.get(pk=pk))
        tasks.provision.apply(args=[pk])
        assert pushed(agents, host, pk) == ["laptop"]


class TestSshAndPorts:
    def test_the_ssh_command_of_a_running_instance_for_members_not_viewers(
        self, catalog, tenant, member, token_client, agents, no_tasks, make_member
    ):
        host = catalog.host(gpus=1, mode=Mode.SHARED, address="http://gpu-7.lab.example:8101")
        host.ssh_port, host.ssh_host_key_fingerprint = 2222, "SHA256:abc"
        host.ssh_host_key = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIGateway"
        host.save()
        client = token_client(member)
        data = launch(client).json()
        assert data["ssh"] is None  # provisioning
        tasks.provision.apply(args=[data["id"]])
        ssh = client.get(f"{URL}{data['id']}/").json()["ssh"]
        pk = data["id"]
        assert ssh == {
            "host": "gpu-7.lab.example",
            "port": 2222,
            "user": str(pk),
            "proxy_jump": None,
            "command": f"ssh -p 2222 {pk}@gpu-7.lab.example",
            "host_key_fingerprint": "SHA256:abc",
            "known_hosts": [
                "[gpu-7.lab.example]:2222 ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIGateway"
            ],
        }
        assert client.get(URL).json()["results"][0]["ssh"] == ssh  # the list says the same
        viewer = token_client(make_member(tenant, Role.VIEWER))
        assert viewer.get(f"{URL}{pk}/").json()["ssh"] is None
        host.ssh_port = None  # the gateway is off
        host.save()
        assert client.get(f"{URL}{pk}/").json()["ssh"] is None

    def test_through_the_ssh_front_the_line_stays_when_the_instance_moves(
        self, catalog, member, token_client, agents, no_tasks, settings, tmp_path
    ):
        settings.SSH_FRONT = "ssh.lab.example:2200"
        settings.SSH_CA_KEY_FILE = str(tmp_path / "ca")
        settings.SSH_FRONT_HOST_KEY_FILE = str(tmp_path / "front")
        first = catalog.host(gpus=1, mode=Mode.SHARED, address="http://gpu-7.lab.example:8101")
        first.ssh_port = 2222
        first.save()
        client = token_client(member)
        pk = launch(client).json()["id"]
        tasks.provision.apply(args=[pk])
        ssh = client.get(f"{URL}{pk}/").json()["ssh"]
        front = ssh_authority.front_key()
        assert ssh == {
            "host": "gpucloud",
            "port": 22,
            "user": str(pk),
            "proxy_jump": f"{pk}@ssh.lab.example:2200",
            "command": f"ssh -J {pk}@ssh.lab.example:2200 {pk}@gpucloud",
            "host_key_fingerprint": front.get_fingerprint("sha256"),
            "known_hosts": [
                f"[ssh.lab.example]:2200 {ssh_authority.public_line(front)}",
                f"@cert-authority gpucloud {ssh_authority.public_line(ssh_authority.authority())}",
            ],
        }
        second = catalog.host(gpus=1, mode=Mode.SHARED, address="http://gpu-8.lab.example:8101")
        second.ssh_port = 2022
        second.save()
        Allocation.objects.filter(instance_id=pk).update(host=second)  # as an unshelve moves it
        assert client.get(f"{URL}{pk}/").json()["ssh"] == ssh

    def test_ports_of_the_image_and_the_launch_with_their_urls(
        self, catalog, member, token_client, no_tasks
    ):
        catalog.host(gpus=1, mode=Mode.SHARED)
        catalog.image.ports = [{"port": 8888, "name": "Jupyter"}]
        catalog.image.save()
        data = launch(token_client(member), ports=[{"port": 8080, "name": "app"}]).json()
        pk = data["id"]
        assert data["ports"] == [
            {
                "port": 8888,
                "name": "Jupyter",
                "url": f"http://testserver/instances/{pk}/ports/8888/",
                "origin_url": f"http://i{pk}-8888.ports.localhost/",
            },
            {
                "port": 8080,
                "name": "app",
                "url": f"http://testserver/instances/{pk}/ports/8080/",
                "origin_url": f"http://i{pk}-8080.ports.localhost/",
            },
        ]

    @pytest.mark.parametrize(
        ("ports", "error"),
        [
            ([{"port": 0, "name": "x"}], "A whole number from 1 to 65535"),
            ([{"port": 70000, "name": "x"}], "65535"),
            ([{"port": 8080, "name": ""}], "name"),
            ([{"port": 8080, "name": "a"}, {"port": 8080, "name": "b"}], "twice"),
            ([{"port": 8888, "name": "mine"}], "already served"),
            ([{"port": 1000 + n, "name": f"p{n}"} for n in range(17)], "16"),
        ],
    )
    def test_bad_ports_are_field_errors(
        self, catalog, member, token_client, no_tasks, ports, error
    ):
        catalog.host(gpus=1, mode=Mode.SHARED)
        catalog.image.ports = [{"port": 8888, "name": "Jupyter"}]
        catalog.image.save()
        answer = launch(token_client(member), ports=ports)
        assert answer.status_code == 400, answer.json()
        assert error in str(answer.json()["errors"]["ports"])
        assert not Instance.objects.exists()


class TestSessionEvents:
    def test_ssh_sessions_become_instance_events_once(
        self, catalog, member, keys, token_client, agents, no_tasks
    ):
        host = catalog.host(gpus=1, mode=Mode.SHARED)
        data = launch(token_client(member)).json()
        tasks.provision.apply(args=[data["id"]])
        instance = Instance.objects.get(pk=data["id"])
        opened = event(
            instance,
            kind="session",
            at=timezone.now(),
            message="ssh session from 203.0.113.7 with key laptop (SHA256:x)",
        )
        assert push(host, opened).json()["applied"] == 1
        assert push(host, opened).json()["ignored"] == 1  # the agent retried
        ended = {**opened, "message": "ssh session from 203.0.113.7 ended (exit status 0)"}
        push(host, ended)
        notes = list(
            instance.events.filter(message__startswith="ssh session").values_list(
                "from_state", "to_state", "message"
            )
        )
        assert notes == [
            ("running", "running", opened["message"]),
            ("running", "running", ended["message"]),
        ]

    def test_another_hosts_session_event_is_ignored(
        self, catalog, member, token_client, agents, no_tasks
    ):
        catalog.host(gpus=1, mode=Mode.SHARED)
        other = catalog.host(gpus=1, mode=Mode.SHARED)
        data = launch(token_client(member)).json()
        tasks.provision.apply(args=[data["id"]])
        instance = Instance.objects.get(pk=data["id"])
        if instance.current_allocation().host_id == other.pk:
            other = catalog.host(gpus=1, mode=Mode.SHARED)
        body = event(instance, kind="session", message="ssh session from 198.51.100.1")
        assert push(other, body).json()["ignored"] == 1
        assert not instance.events.filter(message__startswith="ssh session").exists()

    def test_a_session_event_without_a_message_is_a_400(
        self, catalog, member, token_client, agents, no_tasks
    ):
        host = catalog.host(gpus=1, mode=Mode.SHARED)
        data = launch(token_client(member)).json()
        tasks.provision.apply(args=[data["id"]])
        body = event(Instance.objects.get(pk=data["id"]), kind="session")
        assert push(host, body).status_code == 400


class TestGateway:
    def test_the_hosts_gateway_comes_from_its_inventory(self, catalog):
        from console.fleet import services as fleet_services

        host = catalog.host(gpus=0)
        gateway = {"port": 2201, "host_key_fingerprint": "SHA256:hostkey"}
        inventory = {"gpus": [], "ssh": gateway, "digest": "d1"}
        fleet_services.record_heartbeat(host, inventory=inventory)
        host.refresh_from_db()
        assert (host.ssh_port, host.ssh_host_key_fingerprint) == (2201, "SHA256:hostkey")
        for off in (None, {"port": "22"}, {"port": 0}, "yes"):
            fleet_services.record_heartbeat(host, inventory={**inventory, "ssh": off, "digest": ""})
            host.refresh_from_db()
            assert (host.ssh_port, host.ssh_host_key_fingerprint) == (None, "")
