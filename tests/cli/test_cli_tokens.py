"""`gpucloud tokens …`: create a scoped token, list it, log in with it, revoke it."""

import json
import os
from datetime import UTC, datetime

import pytest

from accounts.models import ApiToken
from cli.errors import CliError
from cli.tokens import expiry
from tests.cli.test_cli import cli  # noqa: F401 - a fixture of these tests

pytestmark = pytest.mark.django_db(transaction=True)


def test_create_list_use_and_revoke_a_scoped_token(cli, monkeypatch):  # noqa: F811
    code, out, err = cli(
        "--json", "tokens", "create", "ci", "--scope", "instances:read",
        "--scope", "instances:stop", "--prefix", "ci-", "--expires", "7d",
    )  # fmt: skip
    assert code == 0, err
    created = json.loads(out)
    assert created["scopes"] == ["instances:read", "instances:stop"]
    assert created["instance_prefix"] == "ci-" and created["expires_at"]
    code, out, _ = cli("tokens", "list")
    assert code == 0
    line = next(row for row in out.splitlines() if row.split()[1:2] == ["ci"])
    assert "instances:read instances:stop" in line and "ci-*" in line

    member_token = os.environ["GPUCLOUD_TOKEN"]
    monkeypatch.setenv("GPUCLOUD_TOKEN", created["token"])
    url = os.environ["GPUCLOUD_URL"]
    code, _, err = cli("login", "--url", url, "--token", created["token"])
    assert code == 0, err  # a scoped token logs in though it may not read the quota
    code, _, err = cli("quota")
    assert code == 1
    assert "This token lacks the scope quota:read. (scope_missing)" in err
    code, out, _ = cli("--json", "instances")
    assert code == 0 and json.loads(out) == []

    monkeypatch.setenv("GPUCLOUD_TOKEN", member_token)
    code, out, _ = cli("tokens", "revoke", str(created["id"]))
    assert (code, out) == (0, "Revoked ci.\n")
    assert ApiToken.objects.get(pk=created["id"]).is_revoked


def test_a_scope_beyond_the_role_is_refused_by_the_api(cli):  # noqa: F811
    code, _, err = cli("tokens", "create", "x", "--scope", "audit:read")
    assert code == 1
    assert "scopes: Your role (member) cannot grant audit:read." in err


def test_expiry_takes_a_duration_or_a_date():
    now = datetime(2026, 1, 1, tzinfo=UTC)
    assert expiry("30d", now) == "2026-01-31T00:00:00+00:00"
    assert expiry("12h", now) == "2026-01-01T12:00:00+00:00"
    assert expiry("2026-03-01", now) == "2026-03-01T00:00:00+00:00"
    with pytest.raises(CliError, match="write a duration"):
        expiry("soon", now)
