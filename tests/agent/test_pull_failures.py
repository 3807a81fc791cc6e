"""How the agent words a failed pull (image_store.pull_failure), which digest it reports
(repo_digest), and that a pull's credential is never saved with its allocation."""

import json

import pytest

from agent.allocations import Allocation
from agent.image_store import pull_failure, repo_digest, shorten
from agent.state import StateStore

AUTH = {"registry": "registry.example.com", "username": "ci-bot", "password": "pw-Zq81"}
REF = "registry.example.com/team/app:1"


@pytest.mark.parametrize(
    "error, auth, expected",
    [
        (
            "reading manifest 1 in registry.example.com/team/app: unauthorized: "
            "authentication required",
            AUTH,
            "registry_refused_credentials: registry.example.com refused the credentials "
            "‘ci-bot’: reading manifest 1 in registry.example.com/team/app: unauthorized: "
            "authentication required",
        ),
        (
            "unauthorized: authentication required",
            None,
            f"registry_needs_credentials: registry.example.com asks for credentials to pull {REF}",
        ),
        (
            "reading manifest 1 in registry.example.com/team/app: manifest unknown",
            None,
            f"image_not_found: {REF} is not in registry.example.com: reading manifest 1 in "
            "registry.example.com/team/app: manifest unknown",
        ),
        (
            'Get "https://registry.example.com/v2/": dial tcp 10.0.0.1:443: connect: '
            "connection refused",
            None,
            'registry_unreachable: registry.example.com: Get "https://registry.example.com/v2/": '
            "dial tcp 10.0.0.1:443: connect: connection refused",
        ),
        ("something else", None, f"image_pull_failed: {REF}: something else"),
    ],
)
def test_pull_failure(error, auth, expected):
    assert pull_failure(REF, error, auth) == expected


def test_the_password_never_shows():
    text = pull_failure(REF, "401 unauthorized for user ci-bot with pw-Zq81", AUTH)
    assert "pw-Zq81" not in text and "ci-bot" in text


def test_a_long_engine_error_is_shortened_at_a_words_end():
    text = shorten("dial tcp 127.0.0.1:5999: " + "connection refused " * 20)
    assert len(text) <= 140 and text.endswith("refused…")


def test_repo_digest_prefers_the_references_repository():
    ours = "sha256:" + "a" * 64
    mirror = "sha256:" + "b" * 64
    digests = [f"127.0.0.1:5001/team/app@{mirror}", f"registry.example.com/team/app@{ours}"]
    assert repo_digest(digests, REF) == ours
    assert repo_digest([f"127.0.0.1:5001/team/app@{mirror}"], REF) == mirror
    assert repo_digest([], REF) is None
    assert repo_digest(["docker.io/library/ubuntu@sha256:bad"], "ubuntu") is None


def test_the_pull_credential_is_never_saved(tmp_path):
    store = StateStore(tmp_path / "state")
    alloc = Allocation(
        id="a-1",
        spec={"labels": {}},
        gpu_uuids=[],
        mig_uuid=None,
        env={},
        state="starting",
        created_at="",
        updated_at="",
        pull_auth=AUTH,
    )
    store.save_allocations([alloc])
    for path in (tmp_path / "state").rglob("*"):
        if path.is_file():
            assert "pw-Zq81" not in path.read_text()
    saved = json.loads((tmp_path / "state" / "allocations.json").read_text())
    assert "pull_auth" not in saved[0]
    assert store.load_allocations()[0].pull_auth is None
    assert "pw-Zq81" not in repr(alloc)


def test_an_image_of_the_hosts_own_that_is_not_there_is_not_found_not_a_registry_outage():
    error = 'pinging container registry localhost: Get "https://localhost/v2/": dial tcp'
    assert pull_failure("localhost/gpucloud/no-such:1", error, None) == (
        "image_not_found: localhost/gpucloud/no-such:1 is not on this host (an image of the "
        "host's own is built or loaded there, e.g. by make images)"
    )
