"""The API against its own OpenAPI document, with schemathesis generating the requests (bounded,
every check): no answer is a server error, and every answer is one the document describes
(status code, content type, headers, body schema)."""

import json

import pytest
import schemathesis
from django.core import signals
from django.core.wsgi import get_wsgi_application
from django.db import close_old_connections
from drf_spectacular.generators import SchemaGenerator
from drf_spectacular.renderers import OpenApiJsonRenderer
from hypothesis import HealthCheck, settings
from schemathesis.specs.openapi.checks import positive_data_acceptance

from accounts import services
from accounts.roles import Role
from tests.factories import MembershipFactory, TenantFactory, UserFactory

pytestmark = pytest.mark.slow  # property-based: many examples

document = json.loads(OpenApiJsonRenderer().render(SchemaGenerator().get_schema(public=True)))
schema = schemathesis.openapi.from_dict(document)
schema.app = get_wsgi_application()


@pytest.fixture
def bearer(db):
    """An owner's API token; requests run in this thread, on the test's database connection
    (kept open across requests, as Django's test client keeps it)."""
    signals.request_started.disconnect(close_old_connections)
    signals.request_finished.disconnect(close_old_connections)
    owner = MembershipFactory(
        user=UserFactory(), tenant=TenantFactory(slug="fuzz"), role=Role.OWNER
    )
    yield {"Authorization": f"Bearer {services.issue_token(owner.user, owner.tenant, 'fuzz').raw}"}
    signals.request_started.connect(close_old_connections)
    signals.request_finished.connect(close_old_connections)


@schema.parametrize()
@settings(max_examples=8, deadline=None, suppress_health_check=list(HealthCheck))
def test_every_answer_is_documented_and_none_is_a_server_error(case, bearer):
    # Every check but "a schema-valid request is accepted": a spec code, an image name or a
    # public key can match the schema and still name nothing that exists (a 400 is right).
    case.call_and_validate(headers=bearer, excluded_checks=[positive_data_acceptance])
