from datetime import UTC, date, datetime
from decimal import Decimal
from io import StringIO

import pytest
import time_machine
from django.contrib.auth import get_user_model
from django.core.management import call_command, execute_from_command_line
from django.core.management.base import CommandError

from accounts.models import ApiToken, Membership, Tenant
from accounts.services import authenticate_token
from console.catalog.models import Spec, SpecPrice
from console.fleet.models import JoinToken
from tests.factories import RegionFactory

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
    assert not token.read_only and membership.role == "admin"
    raw = run("create_api_token", "zoe", "--tenant", "deep", "--read-only").strip().split()[-1]
    token, membership = authenticate_token(raw)
    assert token.read_only and membership.role == "viewer"  # acts as a viewer


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
    first = run("seed_demo", "--yes-demo")
    counts = (Spec.objects.count(), SpecPrice.objects.count(), Membership.objects.count())
    run("seed_demo", "--yes-demo")
    assert (Spec.objects.count(), SpecPrice.objects.count(), Membership.objects.count()) == counts
    assert "alice" in first
    modes = set(Spec.objects.values_list("mode", flat=True))
    assert modes == {"whole", "mig", "shared"}


def test_seed_demo_leaves_last_months_usage_invoiced_and_the_one_before_paid(client):
    from billing.models import Invoice
    from tests.billing.conftest import snapshot
    from tests.web.test_console_pages import login

    with time_machine.travel(datetime(2026, 11, 20, 10, tzinfo=UTC), tick=False):
        output = run("seed_demo", "--yes-demo")
        september, october = Invoice.objects.filter(tenant__slug="acme").order_by("month")
        assert (september.month, september.number, september.status) == (
            date(2026, 9, 1),
            "GC-2026-000001",
            "paid",
        )
        assert (october.month, october.number, october.status) == (
            date(2026, 10, 1),
            "GC-2026-000002",
            "finalized",
        )
        assert september.issued_at == datetime(2026, 10, 1, 0, 15, tzinfo=UTC)
        assert september.total == Decimal("11.91")  # 6 h at 0.49 and 3 h at 2.99
        lines = {line.instance_name: line for line in october.lines.all() if line.kind == "gpu"}
        assert lines["sdxl-train"].seconds == 15 * 3600 and lines["vllm-bench"].seconds == 16200
        assert october.lines.filter(description__startswith="Disk while not running").exists()
        assert october.total == round(sum(line.amount for line in october.lines.all()), 2)
        assert "GC-2026-000002, finalized" in output

        before = snapshot()
        run("seed_demo", "--yes-demo")
        assert snapshot() == before  # nothing changes the second time

        login(client, Membership.objects.get(user__username="alice", tenant__slug="acme"))
        listed = client.get("/billing/invoices/").content.decode()
        assert "GC-2026-000001" in listed and "GC-2026-000002" in listed
        export = client.get(f"/billing/invoices/{october.pk}/download/csv/")
        assert export.status_code == 200 and b"sdxl-train" in export.content


def test_seed_demo_is_refused_with_debug_off_unless_asked(settings):
    settings.DEBUG = False
    with pytest.raises(CommandError, match="refused with DEBUG off"):
        run("seed_demo")
    assert not get_user_model().objects.filter(username="operator").exists()
    settings.DEBUG = True
    assert "login operator" in run("seed_demo")


@pytest.fixture
def command_line(monkeypatch, capsys):
    """Runs `manage.py ARGS` as a shell would: the exit status and what went to stderr."""
    monkeypatch.setattr("django.core.management.base.connections.close_all", lambda: None)
    # Django is set up already: setting it up again would configure logging anew, with handlers
    # on this test's captured stderr that later tests would write to once it is closed
    monkeypatch.setattr("django.setup", lambda set_prefix=True: None)

    def run_argv(*args: str) -> tuple[int, str]:
        try:
            execute_from_command_line(["manage.py", *args])
        except SystemExit as leaving:
            code = leaving.code
        else:
            code = 0
        return code, capsys.readouterr().err

    return run_argv


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["create_tenant", "deep", "--gpu-quota", "abc"], "'abc' is not a decimal number"),
        (["create_tenant", "deep", "--gpu-quota", "nan"], "'nan' is not a decimal number"),
        (["create_tenant", "deep", "--monthly-budget", "inf"], "'inf' is not a decimal number"),
        (["create_join_token", "--region", "local-1", "--ttl-hours", "nan"], "at most 720 hours"),
        (["create_join_token", "--region", "local-1", "--ttl-hours", "1e12"], "at most 720 hours"),
        (["create_join_token", "--region", "local-1", "--ttl-hours", "-1"], "at most 720 hours"),
        (
            ["create_user", "zoe", "--tenant", "deep", "--role", "member", "--password", "123"],
            "too short",
        ),
        (
            [
                "create_user",
                "zoehartmann",
                "--tenant",
                "deep",
                "--role",
                "member",
                "--password",
                "zoe.hartmann",
            ],
            "too similar",
        ),
        (
            [
                "create_user",
                "zoe",
                "--tenant",
                "deep",
                "--role",
                "member",
                "--password",
                "password",
            ],
            "too common",
        ),
        (["create_user", "zo e!", "--tenant", "deep", "--role", "member"], "valid username"),
    ],
)
def test_bad_command_line_input_is_one_clear_line_and_a_non_zero_exit(command_line, args, message):
    RegionFactory()
    run("create_tenant", "deep")
    code, err = command_line(*args)
    assert code != 0
    assert message in err
    assert "Traceback" not in err
    assert len(err.strip().splitlines()) == 1
    assert not get_user_model().objects.filter(username__startswith="zo").exists()
    assert not JoinToken.objects.exists()


def test_create_user_with_a_good_password_signs_in():
    run("create_tenant", "deep")
    run("create_user", "zoe", "--tenant", "deep", "--role", "member", "--password", "s3cret-pass!")
    assert get_user_model().objects.get(username="zoe").check_password("s3cret-pass!")
