"""agent/terminals.py on its own (the real path, a web process restarted under an open
terminal, is tests/instances/test_e2e_access.py's): a kept shell drains what it prints into a
bounded backlog, is given back once, and when no one takes it back in time it ends and the
console hears so."""

import asyncio

from agent import terminals


class FakeShell:
    def __init__(self, output: list[bytes]):
        self.output = list(output)
        self.closed = False

    async def read(self):
        if self.output:
            return (1, self.output.pop(0))
        await asyncio.sleep(3600)

    def close(self):
        self.closed = True


def test_a_kept_shell_not_taken_back_ends_and_says_so(monkeypatch):
    monkeypatch.setattr(terminals, "REATTACH_GRACE_SECONDS", 0.05)
    heard = []

    async def scenario():
        kept = terminals.Terminals(
            ended=lambda instance, message: heard.append((instance, message))
        )
        shell = FakeShell([b"late"])
        kept.keep("7", "k" * 32, shell)
        await asyncio.sleep(0.2)
        return shell, await kept.take("7", "k" * 32)

    shell, taken = asyncio.run(scenario())
    assert taken is None and shell.closed
    assert heard == [("7", "terminal session ended: not taken back in time")]


def test_a_kept_shell_is_given_back_once_with_the_tail_of_what_it_printed(monkeypatch):
    monkeypatch.setattr(terminals, "BACKLOG_BYTES", 8)

    async def scenario():
        kept = terminals.Terminals()
        shell = FakeShell([b"0123456789", b"abcdef"])
        kept.keep("7", "k" * 32, shell)
        await asyncio.sleep(0.05)
        first = await kept.take("7", "k" * 32)
        again = await kept.take("7", "k" * 32)
        other = await kept.take("8", "k" * 32)
        return shell, first, again, other

    shell, first, again, other = asyncio.run(scenario())
    assert first == (shell, b"89abcdef") and not shell.closed
    assert again is None and other is None
