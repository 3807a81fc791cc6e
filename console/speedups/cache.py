"""The Redis cache with one connection pool per process.

Django keeps its cache objects per context (asgiref's Local), and a web process runs each
request in one of its fixed threads (console/asgi.py) but in a context of its own, which
a2wsgi copies for it: with Django's RedisCache every request made a new connection pool, so
every request that touched the cache (every API call: the bad-token throttle) opened a Redis
connection and went through its handshake. Here the pools are kept per process, keyed by
server URL."""

import threading

from django.core.cache.backends import redis

_pools: dict[str, object] = {}
_lock = threading.Lock()


class _Client(redis.RedisCacheClient):
    def _get_connection_pool(self, write):
        url = self._servers[self._get_connection_pool_index(write)]
        pool = _pools.get(url)
        if pool is None:
            with _lock:
                pool = _pools.get(url)
                if pool is None:
                    pool = _pools[url] = self._pool_class.from_url(url, **self._pool_options)
        return pool


class RedisCache(redis.RedisCache):
    def __init__(self, server, params):
        super().__init__(server, params)
        self._class = _Client
