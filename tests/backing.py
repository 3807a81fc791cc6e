"""A PostgreSQL database and a Redis database number of a test module's own, for the tests
that run the console as an operator does (tests/test_distributed.py, tests/test_deploy.py).

They run on DATABASE_URL and REDIS_URL when set (CI), else on a PostgreSQL and a Redis on
127.0.0.1 when they answer; otherwise the test is skipped."""

import os
import secrets
import socket
from contextlib import contextmanager
from urllib.parse import urlsplit, urlunsplit

import pytest


def _answers(url: str, default_port: int) -> bool:
    parts = urlsplit(url)
    try:
        socket.create_connection((parts.hostname, parts.port or default_port), timeout=1).close()
        return True
    except OSError:
        return False


@contextmanager
def own_postgres_and_redis(redis_db: int):
    """(database URL, Redis URL): a database created for the caller and dropped after it, and
    Redis database `redis_db` (not the 0 that the other tests and `make run` use), emptied
    before and after."""
    import psycopg
    import redis

    server = os.environ.get("DATABASE_URL") or "postgres://postgres@127.0.0.1:5432/test"
    broker = os.environ.get("REDIS_URL") or "redis://127.0.0.1:6379/0"
    if not server.startswith("postgres") or not _answers(server, 5432):
        pytest.skip("no PostgreSQL: set DATABASE_URL (or run one on 127.0.0.1:5432)")
    if not _answers(broker, 6379):
        pytest.skip("no Redis: set REDIS_URL (or run one on 127.0.0.1:6379)")
    name = f"gpucloud_{secrets.token_hex(6)}"
    with psycopg.connect(server, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    database = urlunsplit(urlsplit(server)._replace(path=f"/{name}"))
    broker = urlunsplit(urlsplit(broker)._replace(path=f"/{redis_db}"))
    redis.Redis.from_url(broker).flushdb()
    try:
        yield database, broker
    finally:
        redis.Redis.from_url(broker).flushdb()
        with psycopg.connect(server, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
