"""A join token registers one host, even when two agents race with it (real threads, each
with its own database connection: SQLite here, PostgreSQL when DATABASE_URL is set)."""

import threading

import pytest
from django.db import connection

from console.fleet import services
from console.fleet.models import Host, JoinToken
from tests.fleet.conftest import make_inventory


@pytest.mark.django_db(transaction=True)
def test_join_token_single_use_under_race(region, a100):
    for round_ in range(3):
        token, raw = services.create_join_token(region)
        barrier = threading.Barrier(2)
        outcomes: dict[str, str] = {}

        def attempt(hostname: str, raw=raw, barrier=barrier, outcomes=outcomes):
            try:
                barrier.wait(timeout=10)
                services.register_host(
                    join_token=raw,
                    hostname=hostname,
                    address="http://127.0.0.1:9101",
                    remote_addr="127.0.0.1",
                    inventory=make_inventory(hostname, gpus=2),
                )
                outcomes[hostname] = "registered"
            except services.RegistrationRefused as refused:
                outcomes[hostname] = refused.code
            except Exception as exc:  # noqa: BLE001 - reported by the assertion below
                outcomes[hostname] = repr(exc)
            finally:
                connection.close()

        names = [f"racer-{round_}-a", f"racer-{round_}-b"]
        threads = [threading.Thread(target=attempt, args=(name,)) for name in names]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=60)
        assert sorted(outcomes.values()) == ["join_token_used", "registered"], outcomes
        winner = next(name for name, outcome in outcomes.items() if outcome == "registered")
        token.refresh_from_db()
        assert token.host.name == winner
        assert Host.objects.filter(name__in=names).count() == 1
    assert JoinToken.objects.filter(used_at=None).count() == 0
