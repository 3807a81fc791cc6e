import pytest


@pytest.fixture(autouse=True)
def _both_query_paths(prepared_queries):
    """Every API test runs with prepared queries and with plain querysets (tests/conftest.py)."""
