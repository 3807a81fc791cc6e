"""The API's JSON is written by orjson (console/api/renderers.py); clients get the same bytes
DRF's own JSONRenderer writes, whatever the answer holds."""

from datetime import UTC, date, datetime, time, timedelta
from decimal import Decimal
from uuid import UUID

import pytest
from django.utils.translation import gettext_lazy
from rest_framework.renderers import JSONRenderer

from console.api.renderers import FastJSONRenderer

ANSWERS = {
    "a page": {
        "count": 2,
        "next": None,
        "results": [
            {"id": 1, "name": "trainer", "state": "running", "ssh_keys": ["laptop", "cole/desk"]},
            {"id": 2, "name": "ünïcödé ✓ 訓練", "env": {"A": "1"}, "exit_code": None},
        ],
    },
    "money and figures": {"price_per_hour": Decimal("0.900000"), "share": 0.25, "big": 2**62},
    "times": {
        "at": datetime(2026, 12, 1, 20, 0, 0, 123456, tzinfo=UTC),
        "whole": datetime(2026, 12, 1, 20, 0, tzinfo=UTC),
        "naive": datetime(2026, 12, 1, 20, 0, 0, 5),
        "day": date(2026, 12, 1),
        "clock": time(9, 30, 0, 250000),
        "took": timedelta(seconds=90),
    },
    "a field error": {"name": [gettext_lazy("This field is required.")]},
    "JavaScript's line separators": {"text": "one\u2028two\u2029three"},
    "identifiers and tuples": {"id": UUID("12345678-1234-5678-1234-567812345678"), "t": (1, 2)},
    "past 64 bits": {"offset": 10**23},
    "keys that are not strings": {1: "one", 2: "two"},
    "a list": [1, "two", None, True],
}


@pytest.mark.parametrize("answer", ANSWERS.values(), ids=ANSWERS.keys())
def test_the_bytes_are_drfs(answer):
    assert FastJSONRenderer().render(answer) == JSONRenderer().render(answer)


@pytest.mark.parametrize("accept", ["application/json; indent=4", "application/json; indent=2"])
def test_indented_output_is_drfs(accept):
    answer = ANSWERS["a page"]
    assert FastJSONRenderer().render(answer, accept) == JSONRenderer().render(answer, accept)


def test_nothing_renders_as_an_empty_body():
    assert FastJSONRenderer().render(None) == b""


def test_the_api_answers_through_it(token_client, tenant, make_member):
    client = token_client(make_member(tenant))
    answer = client.get("/api/v1/instances/", HTTP_ACCEPT="application/json")
    assert answer.status_code == 200
    assert answer.accepted_renderer.__class__ is FastJSONRenderer
    assert answer.content == JSONRenderer().render(answer.data)
