"""The cache objects Django makes (one per request) share their process's Redis connection
pool, one per server: a request opens no Redis connection of its own."""

from console.speedups.cache import RedisCache

SERVER = "redis://127.0.0.1:6399/3"  # never connected to: a pool connects on first use


def test_every_cache_object_of_a_process_uses_its_servers_one_pool():
    first, second = RedisCache(SERVER, {}), RedisCache(SERVER, {})
    pool = first._cache.get_client(write=True).connection_pool
    assert second._cache.get_client(write=False).connection_pool is pool
    elsewhere = RedisCache("redis://127.0.0.1:6399/4", {})
    assert elsewhere._cache.get_client().connection_pool is not pool
