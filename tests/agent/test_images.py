"""make images reads the machine's own Debian release and mirror from apt's sources."""

import pytest

from agent.images import debian_source
from agent.podman import EngineError


def test_deb822_sources(tmp_path):
    (tmp_path / "sources.list.d").mkdir()
    (tmp_path / "sources.list.d" / "debian.sources").write_text(
        "Types: deb\n# a comment\nURIs: http://deb.debian.org/debian-security\n"
        "Suites: bookworm-security\nComponents: main\n\n"
        "Types: deb deb-src\nURIs: http://mirror.example/debian\n"
        "Suites: bookworm bookworm-updates\n"
        "Components: main\nSigned-By: /usr/share/keyrings/debian-archive-keyring.gpg\n"
    )
    assert debian_source(tmp_path) == ("http://mirror.example/debian", "bookworm")


def test_one_line_sources_come_first(tmp_path):
    (tmp_path / "sources.list.d").mkdir()
    (tmp_path / "sources.list").write_text(
        "# deb http://old.example/debian buster main\n"
        "deb-src http://src.example/debian trixie main\n"
        "deb [arch=amd64 signed-by=/k.gpg] http://deb.example/debian trixie main contrib\n"
    )
    assert debian_source(tmp_path) == ("http://deb.example/debian", "trixie")


def test_no_debian_source(tmp_path):
    with pytest.raises(EngineError, match="no Debian source"):
        debian_source(tmp_path)
