"""The history API (tenant-scoped), the charts pages, and who may see them."""

import time

import pytest
from django.test import Client

from console.metrics import ingest
from tests.factories import UserFactory
from tests.metrics.conftest import alloc_sample


def signed_in(user) -> Client:
    client = Client()
    client.force_login(user)
    return client


def test_history_of_your_instance(world, token_client):
    now = time.time()
    ingest.ingest_samples(
        world.host, [alloc_sample(now - 2 + n, "alloc-train", util=n) for n in range(3)]
    )
    response = token_client(world.alice).get(
        f"/api/v1/instances/{world.train.pk}/metrics/?range=10m"
    )
    assert response.status_code == 200
    body = response.json()
    assert (body["instance"], body["range"], body["resolution_seconds"]) == (
        world.train.pk,
        "10m",
        0,
    )
    assert body["gpu_util"] == [0, 1, 2]
    for name in ("1h", "24h", "7d"):
        data = (
            token_client(world.alice)
            .get(f"/api/v1/instances/{world.train.pk}/metrics/?range={name}")
            .json()
        )
        assert data["gpu_util"] == [0, 1, 2]  # nothing folded yet: the window's tail


def test_history_of_another_tenants_instance_is_404(world, token_client):
    response = token_client(world.bob).get(f"/api/v1/instances/{world.train.pk}/metrics/")
    assert response.status_code == 404


def test_history_needs_a_member(world):
    assert Client().get(f"/api/v1/instances/{world.train.pk}/metrics/").status_code in (401, 403)


def test_an_unknown_range_is_a_400(world, token_client):
    response = token_client(world.alice).get(
        f"/api/v1/instances/{world.train.pk}/metrics/?range=5y"
    )
    assert response.status_code == 400
    assert "range" in response.json()["errors"]


def test_the_charts_page_of_an_instance(world):
    client = signed_in(world.alice.user)
    page = client.get(f"/metrics/instances/{world.train.pk}/").content.decode()
    assert f'data-ws-path="/ws/instances/{world.train.pk}/metrics/"' in page
    assert f'data-history-url="/api/v1/instances/{world.train.pk}/metrics/"' in page
    assert "vendor/plotly/plotly-basic.min.js" in page and "js/metrics.js" in page
    assert "cdn" not in page.lower()
    assert client.get(f"/metrics/instances/{world.infer.pk}/").status_code == 404


@pytest.mark.parametrize(
    "path", ["/metrics/fleet/", "/metrics/hosts/{host}/", "/metrics/hosts/{host}/history/"]
)
def test_operator_pages_are_404_to_tenants(world, path):
    url = path.format(host=world.host.pk)
    assert signed_in(world.alice.user).get(url).status_code == 404
    assert Client().get(url).status_code == 302  # to the login page
    assert signed_in(UserFactory(username="op", is_staff=True)).get(url).status_code == 200


def test_host_history_has_every_gpu(world):
    from tests.metrics.conftest import gpu_sample

    now = time.time()
    ingest.ingest_samples(world.host, [gpu_sample(now, 0, util=5.0), gpu_sample(now, 1, util=6.0)])
    operator = signed_in(UserFactory(username="op", is_staff=True))
    body = operator.get(f"/metrics/hosts/{world.host.pk}/history/?range=10m").json()
    assert {k: v["gpu_util"] for k, v in body["gpus"].items()} == {"0": [5.0], "1": [6.0]}
    assert operator.get(f"/metrics/hosts/{world.host.pk}/history/?range=2d").status_code == 400
