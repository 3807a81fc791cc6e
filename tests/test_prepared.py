"""Prepared queries answer exactly what the ORM answers for the same filters (rows, order,
converted values, windows, counts), compile once per shape, and refuse what they cannot run;
with PREPARED_QUERIES off they are the ORM's own querysets."""

import threading

import pytest
from django.db import connection, transaction
from django.db.models import QuerySet
from django.test.utils import CaptureQueriesContext
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from accounts.models import Membership, Tenant
from console.catalog.models import Image
from console.speedups.prepared import Prepared, columns, instances
from tests.factories import ImageFactory, MembershipFactory, TenantFactory

pytestmark = pytest.mark.django_db


@pytest.fixture(autouse=True)
def _prepared(settings):
    """These tests are of the prepared path, whatever the environment says."""
    settings.PREPARED_QUERIES = True


TENANTS = Tenant.objects.order_by("name", "id").values(
    "id", "slug", "status", "created_at", "suspended_at"
)
MEMBERS = Membership.objects.order_by("role", "id").values_list(
    "id", "role", "tenant__slug", "user__username"
)


@pytest.fixture
def tenants():
    made = [TenantFactory(slug=f"t{i}", name=f"Tenant {i % 4}") for i in range(9)]
    for tenant in made[:3]:
        tenant.status = Tenant.Status.SUSPENDED
        tenant.save()
    return made


@settings(
    max_examples=40,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(
    slugs=st.none() | st.lists(st.sampled_from([f"t{i}" for i in range(12)]), max_size=9),
    status=st.none() | st.sampled_from(["active", "suspended", "gone"]),
    start=st.integers(0, 10),
    size=st.integers(0, 10),
)
def test_the_same_rows_windows_and_counts_as_the_orm(tenants, slugs, status, start, size):
    filters = {}
    if slugs is not None:
        filters["slug__in"] = slugs
    if status is not None:
        filters["status"] = status
    prepared = Prepared(TENANTS).filter(**filters)
    orm = TENANTS.filter(**filters)
    assert list(prepared) == list(orm)
    assert prepared[start : start + size] == list(orm[start : start + size])
    assert prepared.count() == orm.count()


def test_values_list_rows_are_tuples_across_joins(tenants):
    MembershipFactory(tenant=tenants[4], role="admin")
    MembershipFactory(tenant=tenants[4], role="viewer")
    MembershipFactory(tenant=tenants[5], role="member")
    rows = Prepared(MEMBERS).filter(tenant_id__in=[tenants[4].pk, tenants[5].pk])
    assert list(rows) == list(MEMBERS.filter(tenant_id__in=[tenants[4].pk, tenants[5].pk]))
    assert [row[1] for row in rows] == ["admin", "member", "viewer"]


def test_each_shape_compiles_once_and_runs_one_query(tenants, django_assert_num_queries):
    prepared = Prepared(TENANTS)
    ids = [t.pk for t in tenants]
    prepared.filter(id__in=ids[:5])[0:5]
    with django_assert_num_queries(1) as captured:
        # 5 and 7 ids both pad to 8: the same SQL, other values
        rows = prepared.filter(id__in=ids[2:9])[0:5]
    assert len(rows) == 5 and {row["id"] for row in rows} <= set(ids[2:9])
    assert len(prepared._local.__dict__[connection.alias]) == 1
    assert {row["id"] for row in prepared.filter(id__in=ids[2:9])} == set(ids[2:9])
    assert "LIMIT" in captured.captured_queries[0]["sql"]


def test_filters_that_match_nothing_ask_nothing(tenants, django_assert_num_queries):
    prepared = Prepared(TENANTS)
    with django_assert_num_queries(0):
        assert list(prepared.filter(id__in=[])) == []
        assert list(prepared.filter(id=2**64)) == []  # no 64-bit column holds it
        assert list(prepared.filter(id__in=[2**63, -(2**70)])) == []
        assert prepared.filter(id=2**63).count() == 0
    assert [row["id"] for row in prepared.filter(id__in=[2**64, tenants[0].pk])] == [tenants[0].pk]


def test_a_filter_value_is_sent_as_a_parameter_never_as_sql(tenants):
    hostile = "t1' OR '1'='1"
    assert list(Prepared(TENANTS).filter(slug=hostile)) == []
    assert [row["slug"] for row in Prepared(TENANTS).filter(slug="t1")] == ["t1"]


def test_refuses_what_it_cannot_run(tenants):
    with pytest.raises(TypeError, match="values"):
        Prepared(Tenant.objects.all())
    prepared = Prepared(TENANTS)
    with pytest.raises(TypeError, match="ints and strings"):
        list(prepared.filter(created_at=tenants[0].created_at))
    with pytest.raises(TypeError, match="slice"):
        prepared.filter(slug="t1")[3]
    with pytest.raises(TypeError, match="slice"):
        prepared.filter(slug="t1")[3:]


def test_models_built_from_joined_columns_are_saved_instances(tenants):
    member = MembershipFactory(tenant=tenants[6], role="admin")
    query = Membership.objects.order_by().values_list(
        *columns(Membership), *columns(Tenant, "tenant__")
    )
    (row,) = Prepared(query).filter(id=member.pk)
    membership, tenant = instances(row, Membership, Tenant)
    assert (membership.pk, membership.role, tenant.slug) == (member.pk, "admin", "t6")
    assert not membership._state.adding and tenant.created_at == tenants[6].created_at
    tenant.name = "renamed"
    tenant.save(update_fields=["name"])
    assert Tenant.objects.get(pk=tenant.pk).name == "renamed"


@pytest.mark.django_db(transaction=True)
def test_every_thread_compiles_its_own(tenants):
    prepared = Prepared(TENANTS)
    seen = []

    def read():
        try:
            with CaptureQueriesContext(connection):
                seen.append([row["slug"] for row in prepared.filter(status="suspended")])
        finally:
            connection.close()

    threads = [threading.Thread(target=read) for _ in range(3)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert seen == [["t0", "t1", "t2"]] * 3
    with transaction.atomic():
        assert [row["slug"] for row in prepared.filter(status="suspended")] == ["t0", "t1", "t2"]


def test_switched_off_it_answers_what_it_answers_on_through_plain_querysets(tenants, settings):
    MembershipFactory(tenant=tenants[4], role="admin")
    MembershipFactory(tenant=tenants[4], role="viewer")
    MembershipFactory(tenant=tenants[5], role="member")
    ids = [t.pk for t in tenants]
    cases = [
        (TENANTS, {"id__in": ids[1:8], "status": "active"}),
        (TENANTS, {"slug": "t3"}),
        (TENANTS, {"id": 2**64}),
        (TENANTS, {"slug__in": []}),
        (MEMBERS, {"tenant_id__in": ids[4:6]}),
    ]

    def answers():
        found = [Prepared(query).filter(**filters) for query, filters in cases]
        return [(list(rows), list(rows[1:3]), rows.count()) for rows in found]

    prepared = answers()
    settings.PREPARED_QUERIES = False
    assert answers() == prepared
    assert isinstance(Prepared(TENANTS).filter(slug="t3"), QuerySet)
    assert [row["slug"] for row in prepared[0][0]] == ["t4", "t5", "t6", "t3", "t7"]  # by name
    assert [role for _, role, *_ in prepared[4][0]] == ["admin", "member", "viewer"]


TEXT = st.characters(exclude_characters="\x00")  # PostgreSQL's jsonb refuses \u0000
JSON = st.recursive(
    st.none()
    | st.booleans()
    | st.text(TEXT, max_size=8)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.integers(-(2**70), 2**70),
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(TEXT, max_size=4), inner, max_size=3)
    ),
    max_leaves=8,
).filter(lambda value: value is not None)  # a column's SQL NULL is not JSON's null


@settings(
    max_examples=40,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(command=JSON, env=JSON)
def test_json_values_are_what_the_orm_reads(tenants, command, env):
    """orjson reads a JSON column first: integers past 64 bits (which it would read as floats),
    floats, texts and keys within a value come back as the ORM gives them (NaN and infinities
    are not JSON: the databases refuse them)."""
    image = ImageFactory(name="json", command=command, env=env)
    query = Image.objects.filter(pk=image.pk).values("id", "command", "env", "command__0")
    assert repr(list(Prepared(query).filter(id=image.pk))) == repr(list(query))
    image.delete()


def test_timestamps_are_aware_as_the_orm_gives_them(tenants):
    rows = list(Prepared(TENANTS).filter(slug="t1"))
    assert rows == list(TENANTS.filter(slug="t1"))
    assert rows[0]["created_at"].tzinfo is not None
    assert rows[0]["created_at"].utcoffset() == TENANTS.get(slug="t1")["created_at"].utcoffset()
