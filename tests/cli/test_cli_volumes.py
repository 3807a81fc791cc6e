"""`gpucloud volumes …`, `launch --volume` and `terminate --keep-disk` against the live API
(the agents' side is the end-to-end tests')."""

import json

import pytest

from console.instances.models import Instance
from console.volumes.models import Volume

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def cli(member_cli, keeper):
    return member_cli


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
