"""The instance list reads its JSON columns (command, env, ports) with orjson
(console/speedups/prepared.py). A tenant's own values come back exactly as launched, whatever
they spell: digits orjson would read as a float, escapes, JSON in a string, a lone
surrogate's escape; and the list of another tenant's member holds none of them."""

import pytest

from console.catalog.models import Mode
from tests.instances.fakes import FakeAgents

pytestmark = pytest.mark.django_db

HOSTILE = {
    "DIGITS": "1" * 40,
    "NEGATIVE": "-99999999999999999999",
    "JSON": '{"a": 123456789012345678901234567890, "b": [NaN, Infinity]}',
    "ESCAPES": '\\u0000 \\ud800 "quoted" \u2028\u2029 é 字',
}
COMMAND = ["sh", "-c", "echo 18446744073709551616 -9223372036854775809 1e400"]


@pytest.fixture
def agents(monkeypatch):
    return FakeAgents().install(monkeypatch)


def test_hostile_json_values_come_back_as_launched_and_only_to_their_tenant(
    catalog, member, tenant, other_tenant, make_member, token_client, agents
):
    catalog.host(gpus=1, mode=Mode.SHARED)
    body = {"name": "odd", "spec": "a100-quarter", "image": "pytorch-2.5-cuda12.4",
            "env": HOSTILE, "command": COMMAND}  # fmt: skip
    launched = token_client(member).post("/api/v1/instances/", body, format="json")
    assert launched.status_code == 202, launched.json()
    mine = token_client(member)
    (row,) = mine.get("/api/v1/instances/").json()["results"]
    detail = mine.get(f"/api/v1/instances/{row['id']}/").json()
    assert row["env"] == detail["env"] == HOSTILE
    assert row["command"] == detail["command"] == COMMAND

    stranger = token_client(make_member(other_tenant, "owner", username="eve"))
    assert stranger.get("/api/v1/instances/").json()["results"] == []
    assert stranger.get(f"/api/v1/instances/{row['id']}/").status_code == 404
