"""The console's pages for getting in: the SSH keys page (add, refuse, delete; viewers
read only), the launch form's key choice, and the instance page's ssh command with its
copy button, its port links and its Terminal panel (members only)."""

import asyncssh
import pytest
from django.test import Client

from accounts.roles import Role
from accounts.ssh_keys import add_ssh_key
from console.catalog.models import Mode
from console.fleet import ssh_authority
from console.instances.models import Allocation, Instance, State
from tests.instances.helpers import make_instance

pytestmark = pytest.mark.usefixtures("no_tasks")


def key_text() -> str:
    return asyncssh.generate_private_key("ssh-ed25519").export_public_key().decode()


def signed_in(membership) -> Client:
    client = Client()
    client.force_login(membership.user)
    return client


def test_a_member_adds_and_deletes_keys_on_the_page(member):
    web = signed_in(member)
    added = web.post("/ssh-keys/", {"name": "laptop", "public_key": key_text()}, follow=True)
    page = added.content.decode()
    assert "Key laptop added (SHA256:" in page
    key = member.ssh_keys.get()
    assert key.fingerprint in page
    weak = asyncssh.generate_private_key("ssh-rsa", key_size=1024).export_public_key().decode()
    refused = web.post("/ssh-keys/", {"name": "old", "public_key": weak}).content.decode()
    assert "1024 bits, which is too weak" in refused
    web.post(f"/ssh-keys/{key.pk}/delete/")
    assert not member.ssh_keys.exists()


def test_a_viewer_cannot_add_keys_nor_delete_anothers(tenant, member, make_member):
    key = add_ssh_key(member, "laptop", key_text())
    viewer = make_member(tenant, Role.VIEWER)
    web = signed_in(viewer)
    page = web.get("/ssh-keys/").content.decode()
    assert "Viewers cannot open a shell" in page and "laptop" not in page
    web.post("/ssh-keys/", {"name": "mine", "public_key": key_text()})
    assert not viewer.ssh_keys.exists()
    admin = signed_in(make_member(tenant, Role.ADMIN))
    assert admin.post(f"/ssh-keys/{key.pk}/delete/").status_code == 404
    assert member.ssh_keys.exists()


def test_the_launch_form_offers_the_members_keys_all_checked(catalog, member):
    catalog.host(gpus=1, mode=Mode.SHARED)
    add_ssh_key(member, "laptop", key_text())
    add_ssh_key(member, "desktop", key_text())
    web = signed_in(member)
    page = web.get("/instances/launch/").content.decode()
    assert page.count('name="ssh_keys"') == 2 and page.count("checked") >= 2
    body = {"region": "local-1", "spec": "a100-quarter", "image": catalog.image.name}
    web.post("/instances/launch/", {**body, "name": "nb", "ssh_keys": ["laptop"]})
    assert [k.name for k in Instance.objects.get(name="nb").ssh_keys.all()] == ["laptop"]


@pytest.fixture
def running(catalog, tenant):
    host = catalog.host(gpus=1, mode=Mode.SHARED, address="http://gpu-1.example:8101")
    host.ssh_port, host.ssh_host_key_fingerprint = 2222, "SHA256:hostkey"
    host.save()
    catalog.image.ports = [{"port": 8888, "name": "Jupyter"}]
    catalog.image.save()
    instance = make_instance(catalog, tenant, state=State.RUNNING, name="nb")
    Allocation.objects.create(
        id=f"inst-{instance.pk}-a", instance=instance, host=host, mode="shared"
    )
    return instance


def test_the_instance_page_shows_ssh_jupyter_and_the_terminal_to_members(member, running):
    page = signed_in(member).get(f"/instances/{running.pk}/").content.decode()
    assert f"ssh -p 2222 {running.pk}@gpu-1.example" in page
    assert 'data-copy-from="#ssh-command"' in page and "SHA256:hostkey" in page
    assert f'href="/instances/{running.pk}/ports/8888/"' in page and "Open Jupyter" in page
    assert f'data-terminal-url="/ws/instances/{running.pk}/terminal/"' in page
    assert "vendor/xterm/xterm.js" in page and "<script>" not in page


def test_through_the_ssh_front_the_page_gives_the_line_and_its_known_hosts(
    member, running, settings, tmp_path
):
    settings.SSH_FRONT = "ssh.example:2200"
    settings.SSH_CA_KEY_FILE = str(tmp_path / "ca")
    settings.SSH_FRONT_HOST_KEY_FILE = str(tmp_path / "front")
    page = signed_in(member).get(f"/instances/{running.pk}/").content.decode()
    assert f"ssh -J {running.pk}@ssh.example:2200 {running.pk}@gpucloud" in page
    front, ca = (ssh_authority.public_line(k) for k in (ssh_authority.front_key(),
                                                         ssh_authority.authority()))  # fmt: skip
    assert f"[ssh.example]:2200 {front}\n@cert-authority gpucloud {ca}\n</pre>" in page
    assert 'data-copy-from="#known-hosts"' in page
    assert ssh_authority.front_key().get_fingerprint("sha256") in page


def test_a_viewer_sees_neither_ssh_nor_terminal(tenant, make_member, running):
    page = signed_in(make_member(tenant, Role.VIEWER)).get(f"/instances/{running.pk}/")
    text = page.content.decode()
    assert "ssh -p" not in text and "data-terminal-url" not in text and "Open Jupyter" not in text
    assert "port 8888" in text
