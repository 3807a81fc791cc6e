"""agent/terminals.py on its own (the real path, a web process restarted under an open
terminal, is tests/instances/test_e2e_access.py's): a kept shell drains what it prints into a
bounded backlog, is given back once, and when no one takes it back in time it ends and the
console hears so; a push of the instance's access that no longer names a terminal's member ends
that member's terminals, open or kept."""

import asyncio

import pytest

from agent import terminals
from agent.errors import ApiError


class FakeShell:
    def __init__(self, output: list[bytes]):
        self.output = list(output)
        self.closed = False
        self.withdrawn = False

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
        kept.keep("7", "k" * 32, shell, "3")
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
        kept.keep("7", "k" * 32, shell, "3")
        await asyncio.sleep(0.05)
        first = await kept.take("7", "k" * 32)
        again = await kept.take("7", "k" * 32)
        other = await kept.take("8", "k" * 32)
        return shell, first, again, other

    shell, first, again, other = asyncio.run(scenario())
    assert first == (shell, b"89abcdef") and not shell.closed
    assert again is None and other is None


def test_a_push_without_its_member_ends_their_terminals_open_or_kept():
    heard = []

    async def scenario():
        kept = terminals.Terminals(
            ended=lambda instance, message: heard.append((instance, message))
        )
        shells = {name: FakeShell([]) for name in ("open", "kept", "others", "unnamed", "theirs")}
        kept.open[shells["open"]] = ("7", "3")
        kept.open[shells["others"]] = ("8", "3")  # another instance's
        kept.open[shells["unnamed"]] = ("7", None)  # opened by a console that names no one
        kept.open[shells["theirs"]] = ("7", "4")
        kept.keep("7", "k" * 32, shells["kept"], "3")
        kept.withdraw("7", [], None)  # a console that does not say: nothing ends
        assert not any(shell.closed for shell in shells.values())
        kept.withdraw("7", [], {"4"})
        await asyncio.sleep(0)
        return shells, kept

    shells, kept = asyncio.run(scenario())
    assert shells["open"].closed and shells["open"].withdrawn  # its relay closes with 4403
    assert shells["kept"].closed and not kept.kept
    assert not any(shells[name].closed for name in ("others", "unnamed", "theirs"))
    assert heard == [("7", "terminal session ended: its member's access was withdrawn")]


@pytest.mark.parametrize("members", ["3", [3], ["3", ""], ["x" * 65], ["../3"], [None]])
def test_a_push_with_members_of_another_shape_is_refused(members):
    with pytest.raises(ApiError) as refused:
        terminals.parse_members({"members": members})
    assert refused.value.status == 400


def test_a_push_names_its_members_or_says_nothing():
    assert terminals.parse_members({"members": ["3", "4"]}) == {"3", "4"}
    assert terminals.parse_members({"members": []}) == set()
    assert terminals.parse_members({"keys": []}) is None
