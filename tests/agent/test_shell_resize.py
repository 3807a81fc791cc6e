"""A terminal's size reaches its shell even when the engine refuses it at first (Podman's conmon
on a busy host refuses a resize while it still starts the exec session): the shell's first
`stty size` must say what the tab asked for."""

import asyncio

from agent import shell


class Engine:
    """Refuses the first `refusals` resizes, then applies them."""

    def __init__(self, refusals: int):
        self.refusals = refusals
        self.sizes: list[tuple[int, int]] = []

    def exec_resize(self, exec_id: str, cols: int, rows: int) -> bool:
        self.sizes.append((cols, rows))
        return len(self.sizes) > self.refusals


REAL_SLEEP = asyncio.sleep


def no_wait(seconds: float):
    return REAL_SLEEP(0)


def resized(engine: Engine) -> None:
    asyncio.run(shell.Shell(engine, "exec-1", True, None, None).resize(100, 30))


def test_a_refused_resize_is_asked_again_until_the_engine_applies_it(monkeypatch):
    monkeypatch.setattr(asyncio, "sleep", no_wait)
    engine = Engine(refusals=3)
    resized(engine)
    assert engine.sizes == [(100, 30)] * 4


def test_an_engine_that_keeps_refusing_is_left_after_its_tries(monkeypatch):
    monkeypatch.setattr(asyncio, "sleep", no_wait)
    engine = Engine(refusals=1000)
    resized(engine)
    assert len(engine.sizes) == shell.RESIZE_TRIES
