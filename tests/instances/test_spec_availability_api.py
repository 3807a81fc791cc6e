"""GET /api/v1/specs/?region=: each spec's availability there for the caller's tenant."""

from decimal import Decimal

import pytest

from accounts.models import Quota
from console.catalog.models import Mode
from console.fleet.models import Host


@pytest.fixture
def client(member, token_client):
    return token_client(member)


class TestSpecAvailability:
    def test_availability_in_a_region(self, client, catalog, tenant):
        Quota.objects.filter(tenant=tenant).update(gpu_quota=Decimal("1"))
        catalog.host(gpus=1, mode=Mode.SHARED)
        catalog.host(gpus=2, mode=Mode.WHOLE, status=Host.Status.CORDONED)
        response = client.get("/api/v1/specs/", {"region": "local-1"})
        assert response.status_code == 200
        found = {s["code"]: s["availability"] for s in response.json()["results"]}
        assert {code: a["status"] for code, a in found.items()} == {
            "a100-quarter": "fits_now",
            "a100-half": "fits_now",
            "a100-1g10gb": "no_hardware",
            "a100-3g40gb": "no_hardware",
            "a100-1x": "queues",
            "a100-2x": "over_quota",
        }
        assert found["a100-2x"] == {
            "status": "over_quota",
            "launchable": False,
            "detail": "A100 x2 needs 2 GPU; your quota is 1 GPU.",
        }
        assert found["a100-1x"]["launchable"] is True

    def test_existing_fields_stay_and_no_region_means_null(self, client, catalog):
        spec = client.get("/api/v1/specs/a100-quarter/").json()
        assert spec["availability"] is None
        assert spec["code"] == "a100-quarter" and spec["price_per_hour"] == "0.9"
        one = client.get("/api/v1/specs/a100-quarter/", {"region": "local-2"}).json()
        assert one["availability"]["status"] == "no_hardware"

    def test_an_unknown_region_is_a_field_error(self, client, catalog):
        response = client.get("/api/v1/specs/", {"region": "mars-1"})
        assert response.status_code == 400
        assert response.json()["errors"] == {"region": ["No region mars-1: see /api/v1/regions/."]}
