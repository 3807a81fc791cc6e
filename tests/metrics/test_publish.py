"""Samples go out in the same Redis pipeline as the window writes, as PUBLISHes that channels_redis'
RedisPubSubChannelLayer delivers to the group's consumers as if group_send had sent them."""

import asyncio
import time

import pytest
import redis
from asgiref.sync import sync_to_async
from channels.layers import channel_layers, get_channel_layer

from console import broadcast
from console.metrics import ingest, live
from tests.metrics.communicator import run
from tests.metrics.conftest import alloc_sample


def use_redis(settings, url):
    settings.REDIS_URL = url
    settings.CHANNEL_LAYERS = {
        "default": {
            "BACKEND": "channels_redis.pubsub.RedisPubSubChannelLayer",
            "CONFIG": {"hosts": [url]},
        }
    }
    channel_layers.backends.clear()
    live.reset_store()


async def receive_while(layer, channel, send, timeout: float = 5.0):
    """Receive on `channel`, calling `send()` until something arrives: a Redis SUBSCRIBE that
    group_add issued may still be on its way when the first PUBLISH goes out."""
    received = asyncio.ensure_future(layer.receive(channel))
    deadline = time.monotonic() + timeout
    while not received.done():
        assert time.monotonic() < deadline, "nothing arrived"
        await send()
        await asyncio.wait({received}, timeout=0.2)
    return received.result()


def test_the_wire_format_is_the_layers(settings, redis_url):
    use_redis(settings, redis_url)
    message = {"type": "metrics.frames", "frames": [[1.5, '{"type":"sample"}']]}

    async def scenario():
        layer = get_channel_layer()
        channel = await layer.new_channel()
        await layer.group_add("metrics.instance.77", channel)
        [(name, payload)] = broadcast.pubsub_wire([("metrics.instance.77", message)])

        async def publish():
            redis.Redis.from_url(redis_url).publish(name, payload)

        assert await receive_while(layer, channel, publish) == message
        await layer.group_discard("metrics.instance.77", channel)
        await layer.flush()

    run(scenario)


def test_without_the_pubsub_layer_group_send_is_used(settings):
    settings.CHANNEL_LAYERS = {"default": {"BACKEND": "channels.layers.InMemoryChannelLayer"}}
    channel_layers.backends.clear()
    assert broadcast.pubsub_wire([("metrics.instance.1", {"type": "x"})]) is None


@pytest.mark.django_db(transaction=True)
def test_a_batch_reaches_a_consumer_of_the_redis_layer(world, settings, redis_url):
    use_redis(settings, redis_url)
    live.store().clear()

    async def scenario():
        layer = get_channel_layer()
        channel = await layer.new_channel()
        await layer.group_add(ingest.instance_group(world.train.pk), channel)
        now = time.time()

        async def push():
            result = await sync_to_async(ingest.ingest_samples)(
                world.host, [alloc_sample(now, "alloc-train", util=42.0)]
            )
            assert ingest.instance_group(world.train.pk) in result.groups

        got = await receive_while(layer, channel, push)
        assert got["type"] == "metrics.frames"
        [[ts, frame]] = got["frames"]
        assert ts == now and '"gpu_util":42.0' in frame
        await layer.flush()

    run(scenario)
    live.store().clear()
