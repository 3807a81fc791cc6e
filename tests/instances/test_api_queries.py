"""The instances API's SQL queries per request stay fixed: a page of 50 running instances of
several specs, on two hosts, with keys of two members, costs what one instance costs; a detail
costs its few. (bench/api.py measures the time under load; these pin the counts.)"""

import asyncssh
import pytest
from django.db import connection

from accounts.roles import Role
from accounts.ssh_keys import add_ssh_key
from console.catalog.models import Mode
from console.instances import services
from console.instances.models import Instance, State

pytestmark = pytest.mark.usefixtures("no_tasks", "prepared_queries")
URL = "/api/v1/instances/"
# the token (with its tenant, user and membership), the page's rows (with their image, region and
# disk host), the running ones' hosts, keys with their members, the specs' price points (with
# their figures); a page that does not reach the end of the list also counts it
LIST_QUERIES = 5
# the token, then the same for the one row
DETAIL_QUERIES = 5


def key_text(comment: str) -> str:
    key = asyncssh.generate_private_key("ssh-ed25519", comment=comment)
    return key.export_public_key().decode()


@pytest.fixture
def fleet(catalog, tenant, member, make_member):
    """`launch(n)`: n more running instances, alternating between specs, on two hosts, each
    granting a key of its launcher and one of another member; their disks on the hosts."""
    room = {"gpus": 8, "vcpus": 512, "ram_mib": 4_000_000}
    for name in ("host-a", "host-b"):
        catalog.host(name, mode=Mode.SHARED, **room)
    catalog.host("host-m", mode=Mode.MIG, **room)
    tenant.quota.gpu_quota = 100
    tenant.quota.max_instances = 100
    tenant.quota.save()
    colleague = make_member(tenant, Role.MEMBER, username="cole")
    add_ssh_key(member, "laptop", key_text("laptop"))
    add_ssh_key(colleague, "desk", key_text("desk"))
    specs = [catalog.quarter, catalog.half, catalog.mig1g]

    def launch(n: int) -> None:
        start = Instance.objects.count()
        for i in range(start, start + n):
            services.launch_instance(
                tenant, name=f"box-{i}", spec=specs[i % len(specs)], image=catalog.image,
                ssh_keys=["laptop", "cole/desk"], actor=member.user,
            )  # fmt: skip
        assert not Instance.objects.filter(state=State.PENDING).exists()
        for instance in Instance.objects.filter(disk_host__isnull=True):
            instance.disk_host = instance.allocations.get().host
            instance.save(update_fields=["disk_host"])
        Instance.objects.update(state=State.RUNNING)

    return launch


@pytest.fixture
def client(member, token_client):
    client = token_client(member)
    client.get(URL)  # the token's first use writes last_used_at
    return client


@pytest.mark.slow  # fifty instances made first: 5 s on a loaded 2-core machine
def test_a_page_of_fifty_costs_what_one_costs(fleet, client, django_assert_num_queries):
    fleet(1)
    with django_assert_num_queries(LIST_QUERIES):
        one = client.get(URL).json()
    fleet(49)
    with django_assert_num_queries(LIST_QUERIES):
        page = client.get(URL).json()
    assert one["count"] == 1 and page["count"] == 50
    shown = page["results"][-1]
    assert shown["state"] == "running" and sorted(shown["ssh_keys"]) == ["cole/desk", "laptop"]
    assert shown["disk"]["host"] in {"host-a", "host-b", "host-m"}
    assert {i["spec"] for i in page["results"]} == {"a100-quarter", "a100-half", "a100-1g10gb"}
    assert all(i["price_per_hour"] for i in page["results"])


def test_a_filtered_page_costs_the_same(fleet, client, django_assert_num_queries):
    fleet(6)
    with django_assert_num_queries(LIST_QUERIES + 1):
        page = client.get(URL, {"state": "running", "limit": 4}).json()
    assert page["count"] == 6 and len(page["results"]) == 4


def test_a_detail_costs_a_few(fleet, client, django_assert_num_queries):
    fleet(3)
    pk = Instance.objects.order_by("pk").last().pk
    with django_assert_num_queries(DETAIL_QUERIES):
        detail = client.get(f"{URL}{pk}/").json()
    assert detail["id"] == pk and sorted(detail["ssh_keys"]) == ["cole/desk", "laptop"]


def test_postgresql_plans_the_lists_queries_once_per_connection(fleet, client):
    """On PostgreSQL a statement the connection runs often is prepared there, so that the
    server plans it once, not on every request (settings: server-side binding)."""
    if connection.vendor != "postgresql":
        pytest.skip("prepared statements are PostgreSQL's")
    fleet(3)
    for _ in range(6):
        assert client.get(URL).json()["count"] == 3
    with connection.cursor() as cursor:
        cursor.execute("SELECT statement FROM pg_prepared_statements")
        prepared = [row[0] for row in cursor.fetchall()]
    assert any('FROM "instances_instance"' in sql and "LIMIT" in sql for sql in prepared)
    assert any('FROM "accounts_apitoken"' in sql for sql in prepared)
