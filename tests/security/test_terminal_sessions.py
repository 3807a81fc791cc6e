"""A browser terminal's session id (kept by the panel, sent in the query) takes back a shell the
agent kept after its console went: only for the member and the instance it was made for. The
agent's key is derived from all three; an id of the wrong shape names no shell. The real path
(a web process restarted under an open terminal; another member sending the same id gets a
shell of their own) is tests/instances/test_e2e_access.py's."""

import pytest

from agent.terminals import SESSION_KEY
from console.instances.relay import terminal_key

SESSION = "0123456789abcdef0123456789abcdef"


def test_the_agents_key_is_bound_to_the_member_and_the_instance():
    mine = terminal_key(7, 42, SESSION)
    assert SESSION_KEY.fullmatch(mine)
    assert mine != terminal_key(8, 42, SESSION)  # another member of the tenant
    assert mine != terminal_key(7, 43, SESSION)  # another instance
    assert mine == terminal_key(7, 42, SESSION)


@pytest.mark.parametrize(
    "session",
    ["", "short", "../../etc", SESSION + "&cols=1", "x" * 65, "é" * 20, "a b" * 8, "%2e" * 8],
)
def test_a_session_id_of_any_other_shape_keeps_nothing(session):
    assert terminal_key(7, 42, session) is None
