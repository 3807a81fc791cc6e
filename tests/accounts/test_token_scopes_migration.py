"""accounts 0006 (scoped tokens): the tokens issued before it keep exactly their powers, a
read-only one still a viewer's, any other its user's role's, on every instance."""

import pytest
from django.db import connection
from django.db.migrations.executor import MigrationExecutor

from accounts import scopes, services
from accounts.models import hash_token

BEFORE = [("accounts", "0005_quota_storage")]
AFTER = [("accounts", "0006_api_token_scopes")]


@pytest.mark.slow  # migrating back and forth takes seconds
@pytest.mark.django_db(transaction=True)
def test_tokens_issued_before_keep_their_powers():
    executor = MigrationExecutor(connection)
    executor.migrate(BEFORE)
    old = executor.loader.project_state(BEFORE).apps
    tenant = old.get_model("accounts", "Tenant").objects.create(slug="acme", name="Acme")
    user = old.get_model("auth", "User").objects.create(username="alice")
    old.get_model("accounts", "Membership").objects.create(user=user, tenant=tenant, role="admin")
    token_model = old.get_model("accounts", "ApiToken")
    raws = {}
    for prefix, read_only in (("0000aaaa", False), ("0000bbbb", True)):
        raws[read_only] = f"gpc_{prefix}_{'x' * 43}"
        token_model.objects.create(
            user=user, tenant=tenant, name=prefix, prefix=prefix,
            token_hash=hash_token(raws[read_only]), read_only=read_only,
        )  # fmt: skip
    executor = MigrationExecutor(connection)
    executor.migrate(AFTER)
    executor = MigrationExecutor(connection)
    executor.migrate(executor.loader.graph.leaf_nodes())

    token, membership = services.authenticate_token(raws[False])
    assert (token.scopes, token.instance_prefix, token.read_only) == (None, "", False)
    assert membership.role == "admin"
    assert all(scopes.allows(membership, name) for name in scopes.BY_NAME)
    assert scopes.covers_instance(membership, "any-name")
    token, membership = services.authenticate_token(raws[True])
    assert (token.scopes, token.instance_prefix, token.read_only) == (None, "", True)
    assert membership.role == "viewer"
