from decimal import Decimal
from io import StringIO

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError

from accounts.models import ApiToken, Membership, Tenant
from accounts.services import authenticate_token
from console.catalog.models import Spec, SpecPrice

pytestmark = pytest.mark.django_db


def run(*args) -> str:
    out = StringIO()
    call_command(*args, stdout=out, stderr=StringIO())
    return out.getvalue()


def test_create_tenant_then_again_is_idempotent():
    run(
        "create_tenant", "deep", "--name", "Deep Labs", "--gpu-quota", "1.5", "--max-instances", "3"
    )
    run(
        "create_tenant", "deep", "--name", "Deep Labs", "--gpu-quota", "1.5", "--max-instances", "3"
    )
    tenant = Tenant.objects.get(slug="deep")
    assert (tenant.name, tenant.quota.gpu_quota, tenant.quota.max_instances) == (
        "Deep Labs",
        Decimal("1.5"),
        3,
    )
    assert Tenant.objects.count() == 1


@pytest.mark.parametrize(
    "args",
    [
        ["--gpu-quota", "-1"],
        ["--gpu-quota", "1.23456"],
        ["--gpu-quota", "lots"],
        ["--monthly-budget", "1.999"],
    ],
)
def test_create_tenant_bad_input_writes_nothing(args):
    with pytest.raises(CommandError):
        run("create_tenant", "broke", *args)
    assert not Tenant.objects.filter(slug="broke").exists()


def test_create_tenant_bad_update_keeps_old_quota():
    run("create_tenant", "deep", "--gpu-quota", "2")
    with pytest.raises(CommandError):
        run("create_tenant", "deep", "--gpu-quota", "-3")
    assert Tenant.objects.get(slug="deep").quota.gpu_quota == Decimal("2")


def test_create_user_and_token():
    run("create_tenant", "deep")
    run("create_user", "zoe", "--tenant", "deep", "--role", "admin", "--password", "s3cret-pass!")
    run("create_user", "zoe", "--tenant", "deep", "--role", "admin")
    assert Membership.objects.get(user__username="zoe").role == "admin"
    output = run("create_api_token", "zoe", "--tenant", "deep")
    raw = output.strip().splitlines()[-1]
    token, membership = authenticate_token(raw)
    assert membership.user.username == "zoe"
    assert ApiToken.objects.count() == 1


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["create_user", "zoe", "--tenant", "deep", "--role", "god"], "Unknown role"),
        (["create_user", "zoe", "--tenant", "nope", "--role", "member"], "No tenant"),
        (["create_api_token", "ghost", "--tenant", "deep"], "No user"),
    ],
)
def test_commands_refuse_bad_input(args, message):
    run("create_tenant", "deep")
    with pytest.raises(CommandError, match=message):
        run(*args)
    assert not Membership.objects.exists()


def test_seed_demo_is_idempotent():
    first = run("seed_demo")
    counts = (Spec.objects.count(), SpecPrice.objects.count(), Membership.objects.count())
    run("seed_demo")
    assert (Spec.objects.count(), SpecPrice.objects.count(), Membership.objects.count()) == counts
    assert "alice" in first
    modes = set(Spec.objects.values_list("mode", flat=True))
    assert modes == {"whole", "mig", "shared"}
