"""What a failed pull says (agent/image_store.pull_failure's codes, console/instances/reasons
sentences): the registry, the engine's error and the right next step, in full words; a long
reason is shortened at a word's end, the advice never cut."""

import pytest

from console.instances import reasons
from console.instances.reasons import Code, Reason


def said(text: str) -> str:
    return reasons.explain(reasons.from_agent(text).fitted())


def test_refused_credentials_name_the_registry_and_the_user():
    text = said(
        "registry_refused_credentials: registry.example.com refused the credentials ‘ci-bot’: "
        "401 unauthorized"
    )
    assert text == (
        "registry.example.com refused the credentials ‘ci-bot’: 401 unauthorized — check the "
        "username and token under Registry credentials, then start it again."
    )


def test_each_failure_says_its_next_step():
    needs = said("registry_needs_credentials: ghcr.io asks for credentials to pull ghcr.io/x:1")
    assert needs.startswith("ghcr.io asks for credentials") and "Registry credentials" in needs
    missing = said("image_not_found: ghcr.io/x:1 is not in ghcr.io: manifest unknown")
    assert "check the reference for a typo" in missing
    away = said("registry_unreachable: ghcr.io: dial tcp 140.82.1.1:443: connection refused")
    assert "dial tcp 140.82.1.1:443: connection refused" in away
    assert "registry mirror" in away and "start it again in a moment" not in away
    other = said("image_pull_failed: ghcr.io/x:1: something odd")
    assert "in a moment" not in other and "check the reference" in other


def test_a_long_reason_is_shortened_at_a_words_end():
    raw = "Get https://127.0.0.1:5999/v2/: dial tcp 127.0.0.1:5999: connect: " + "word " * 60
    reason = reasons.from_agent(f"registry_unreachable: 127.0.0.1:5999: {raw}").fitted()
    assert len(reason.text) <= reasons.MAX_TEXT
    assert reason.detail.endswith("word…")
    sentence = reasons.explain(reason)
    assert sentence.endswith("push the image to a registry the region allows.")


@pytest.mark.parametrize(
    "text, limit, shortened",
    [
        ("short", 10, "short"),
        ("dial tcp 127.0.0.1:5999: connection refused", 30, "dial tcp 127.0.0.1:5999…"),
        ("x" * 20, 10, "x" * 9 + "…"),
        ("one two three", 13, "one two three"),
        ("one two three", 12, "one two…"),
    ],
)
def test_shorten(text, limit, shortened):
    assert reasons.shorten(text, limit) == shortened
    assert len(reasons.shorten(text, limit)) <= limit


def test_pull_failures_never_ran():
    from console.instances import outcomes

    for code in (
        Code.REGISTRY_UNREACHABLE,
        Code.REGISTRY_NEEDS_CREDENTIALS,
        Code.REGISTRY_REFUSED_CREDENTIALS,
    ):
        assert code in outcomes.NEVER_RAN
        assert reasons.explain(Reason(code)).endswith(".")
