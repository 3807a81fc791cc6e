"""When open sockets look again at what they were granted (accounts/websocket.py): each
within RECHECK_SECONDS of its last look, and sockets opened together not all at once."""

import asyncio
from types import SimpleNamespace

from accounts import websocket


class Counted(websocket._Standing):
    def __init__(self, looks: list):
        super().__init__()
        self.looks = looks

    async def stands(self) -> bool:
        self.looks.append(websocket.time.monotonic())
        return True


def test_sockets_opened_together_look_again_spread_over_the_last_quarter(monkeypatch):
    clock = SimpleNamespace(now=1000.0)
    monkeypatch.setattr(websocket, "time", SimpleNamespace(monotonic=lambda: clock.now))
    looks: list[float] = []
    sockets = [Counted(looks) for _ in range(200)]

    async def every_half_second():
        while clock.now < 1000.0 + websocket.RECHECK_SECONDS:
            clock.now += 0.5
            assert all([await s.holds() for s in sockets])

    asyncio.run(every_half_second())
    assert len(looks) == len(sockets)  # each looked once, within RECHECK_SECONDS
    first, last = min(looks) - 1000.0, max(looks) - 1000.0
    assert first >= 0.75 * websocket.RECHECK_SECONDS
    assert last - first > websocket.RECHECK_SECONDS / 8  # not in the same second
