"""Django's requests in a web process take turns (WEB_REQUEST_CONCURRENCY at a time): the ones
over the limit wait for a turn and are answered, none is refused."""

import asyncio

from console.asgi import at_most


def test_requests_over_the_limit_wait_their_turn_and_all_are_answered():
    running, most, answered = 0, 0, []

    async def app(scope, receive, send):
        nonlocal running, most
        running += 1
        most = max(most, running)
        await asyncio.sleep(0.01)
        running -= 1
        await send({"path": scope["path"]})

    async def send(message):
        answered.append(message["path"])

    async def main():
        limited = at_most(2, app)
        await asyncio.gather(*(limited({"path": f"/{i}"}, None, send) for i in range(7)))

    asyncio.run(main())
    assert most == 2
    assert sorted(answered) == sorted(f"/{i}" for i in range(7))
