"""`manage.py create_api_token --scope … --instance-prefix …`: an operator issues a scoped
token from the shell; a scope beyond the user's role is refused."""

from io import StringIO

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError

from accounts.roles import Role
from accounts.services import authenticate_token

pytestmark = pytest.mark.django_db


def test_an_operator_issues_a_scoped_token(tenant, make_member):
    member = make_member(tenant, Role.MEMBER, username="zoe")
    out = StringIO()
    call_command(
        "create_api_token", "zoe", "--tenant", tenant.slug, "--scope", "instances:read",
        "--scope", "metrics:read", "--instance-prefix", "ci-", stdout=out, stderr=StringIO(),
    )  # fmt: skip
    token, membership = authenticate_token(out.getvalue().strip())
    assert token.scopes == ["instances:read", "metrics:read"]
    assert token.instance_prefix == "ci-" and membership.pk == member.pk
    with pytest.raises(CommandError, match=r"Your role \(member\) cannot grant audit:read"):
        call_command(
            "create_api_token", "zoe", "--tenant", tenant.slug, "--scope", "audit:read",
            stdout=StringIO(), stderr=StringIO(),
        )  # fmt: skip
