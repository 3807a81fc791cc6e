"""`gpucloud volumes …`, `launch --volume` and `terminate --keep-disk` against the live API
(the agents' side is the end-to-end tests')."""

import json

import pytest

from accounts.roles import Role
from cli.main import main
from console.fleet.models import Host
from console.instances.models import Instance, State
from console.volumes.models import Volume
from tests.factories import ImageFactory, RegionFactory, SpecFactory

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def cli(live_server, tenant, make_member, token_client, monkeypatch, tmp_path, capsys):
    region = RegionFactory()
    host = Host(name="h1", region=region, address="http://127.0.0.1:9")
    host.set_secret("secret-h1")
    host.save()
    Instance.objects.create(
        tenant=tenant, name="keeper", spec=SpecFactory(code="a100-quarter"),
        image=ImageFactory(), region=region, state=State.STOPPED, disk_host=host, disk_gib=20,
    )  # fmt: skip
    client = token_client(make_member(tenant, Role.MEMBER))
    monkeypatch.setenv("GPUCLOUD_CONFIG", str(tmp_path / "config.json"))
    monkeypatch.setenv("GPUCLOUD_URL", live_server.url)
    monkeypatch.setenv("GPUCLOUD_TOKEN", client.raw_token)

    def run(*args: str) -> tuple[int, str, str]:
        code = main(list(args))
        out, err = capsys.readouterr()
        return code, out, err

    return run


def test_create_attach_detach_delete(cli):
    code, out, err = cli("volumes", "create", "data", "--size-gib", "30")
    assert code == 0, err
    assert "data" in out and "Billed 3.00 a month (0.100000 per GiB-month)" in out
    keeper = Instance.objects.get(name="keeper")
    code, out, err = cli("volumes", "attach", "data", "keeper", "--mount-path", "/data")
    assert code == 0, err
    assert "/data" in out and Volume.objects.get().instance == keeper
    code, out, err = cli("volumes", "delete", "data", "--yes")
    assert code != 0 and "detach it first" in err
    code, out, err = cli("volumes", "detach", "data")
    assert code == 0, err
    code, out, err = cli("--json", "volumes", "list")
    assert code == 0 and json.loads(out)[0]["state"] == "available"
    code, out, err = cli("volumes", "delete", "data", "--yes")
    assert code == 0 and "Deleted volume data." in out
    assert Volume.objects.get().deleted_at is not None


def test_field_errors_and_quota(cli, tenant):
    tenant.quota.storage_quota_gib = 10
    tenant.quota.save()
    code, _, err = cli("volumes", "create", "../etc", "--size-gib", "1")
    assert code != 0 and "name" in err
    code, _, err = cli("volumes", "create", "big", "--size-gib", "11")
    assert code != 0 and "storage quota is 10 GiB" in err


def test_terminate_keep_disk(cli):
    code, out, err = cli("terminate", "keeper", "--yes", "--keep-disk")
    assert code == 0, err
    kept = Volume.objects.get()
    assert (kept.name, kept.size_gib, kept.kept_from.name) == ("keeper-disk", 20, "keeper")
