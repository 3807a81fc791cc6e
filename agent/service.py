"""The running agent: its API under uvicorn and its background loops in the same event loop.

uvicorn turns SIGTERM and SIGINT into a graceful shutdown, which ends the loops through the
app's lifespan.
"""

import asyncio
import contextlib
import logging

import uvicorn

from agent.control import Reporter
from agent.host import LocalHost
from agent.image_store import IMAGE_REFRESH_SECONDS

log = logging.getLogger(__name__)


async def _repeat(name: str, step, delay) -> None:
    """Run `step()` forever, `delay()` seconds apart; an error is logged, never raised."""
    while True:
        try:
            await step()
        except Exception:
            log.exception("%s failed", name)
        await asyncio.sleep(delay())


def lifespan(host: LocalHost, sample_interval: float, reporter: Reporter | None, gateway=None):
    async def sample() -> None:
        await host.refresh()
        samples = host.poll()
        if reporter:
            reporter.add(samples)

    @contextlib.asynccontextmanager
    async def run(app):
        loops = [
            _repeat("sampling", sample, lambda: sample_interval),
            host.watch_exits(),
            _repeat("images", host.refresh_images, lambda: IMAGE_REFRESH_SECONDS),
        ]
        if reporter:
            loops.append(
                _repeat("heartbeat", reporter.heartbeat, lambda: reporter.heartbeat_interval)
            )
            loops.append(_repeat("sample push", reporter.push_when_read, reporter.push_delay))
            loops.append(_repeat("event push", reporter.push_events, reporter.event_delay))
        tasks = [asyncio.create_task(loop) for loop in loops]
        if gateway is not None:
            await gateway.start()
        try:
            yield
        finally:
            if gateway is not None:
                await gateway.stop()
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            if reporter:
                await reporter.flush()
                await reporter.aclose()
            log.info("agent stopped")

    return run


def serve(app, host: str, port: int, log_level: str) -> None:
    config = uvicorn.Config(
        app,
        host=host,
        port=port,
        log_level=log_level,
        access_log=False,
        log_config=None,  # its lines go through the agent's handler (agent/logs.py)
        lifespan="on",
        timeout_graceful_shutdown=5,
    )
    uvicorn.Server(config).run()
