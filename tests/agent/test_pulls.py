"""An image pull's progress read from the engine's stream (agent/pulls.py): layers and bytes
done of total, in units a person reads, at most one report a second."""

import pytest

from agent.pulls import PullProgress, eta, human_size

REF = "registry.example/team/pytorch:2.4"


@pytest.mark.parametrize(
    ("size", "text"),
    [
        (0, "0 B"),
        (999, "999 B"),
        (1000, "1.0 kB"),
        (1_234_567, "1.2 MB"),
        (3_400_000_000, "3.4 GB"),
        (999_949_999, "999.9 MB"),
        (12_500_000_000_000, "12.5 TB"),
        (5e15, "5000.0 TB"),
    ],
)
def test_sizes_read_in_decimal_units(size, text):
    assert human_size(size) == text


class Clock:
    def __init__(self):
        self.now = 100.0

    def __call__(self):
        return self.now


def _line(status, layer, current=None, total=None):
    detail = {"current": current, "total": total} if total else {}
    return {"status": status, "id": layer, "progressDetail": detail}


# Docker's stream: every layer announced first, bytes as they come, extraction after the fetch
DOCKER = [
    {"status": "Pulling from team/pytorch", "id": "2.4"},
    _line("Already exists", "base"),
    _line("Pulling fs layer", "big"),
    _line("Pulling fs layer", "small"),
    _line("Waiting", "small"),
    _line("Downloading", "big", 1_000_000_000, 3_000_000_000),
    _line("Downloading", "small", 200_000_000, 400_000_000),
]
DOCKER_END = [
    _line("Download complete", "small"),
    _line("Extracting", "small", 50_000_000, 400_000_000),  # the extraction's bytes
    _line("Pull complete", "small"),
    _line("Downloading", "big", 3_000_000_000, 3_000_000_000),
    _line("Verifying Checksum", "big"),
    _line("Download complete", "big"),
    _line("Extracting", "big", 3_000_000_000, 3_000_000_000),
    _line("Pull complete", "big"),
    {"status": "Digest: sha256:0123"},
    {"status": "Status: Downloaded newer image for registry.example/team/pytorch:2.4"},
]


def test_a_docker_pull_reads_layers_and_bytes_done_of_total():
    clock = Clock()
    pull = PullProgress(REF, clock=clock)
    assert pull.start() == f"pulling {REF}"
    for line in DOCKER:
        pull.feed(line)
    clock.now += 1
    assert pull.due() == f"pulling {REF}: 1 of 3 layers · 1.2 GB of 3.4 GB"
    for line in DOCKER_END:
        pull.feed(line)
    clock.now += 41.6
    assert pull.finished() == f"pulled {REF} in 43 s: 3 of 3 layers · 3.4 GB of 3.4 GB"


def test_a_podman_pull_counts_its_layers_done_at_download_complete():
    """Podman's compatible stream reports bytes once a second per layer, so a quick layer
    may end with its size never told: it counts as done, outside the bytes."""
    pull = PullProgress(REF, clock=Clock())
    for line in [
        _line("Pulling fs layer", "quick"),
        _line("Pulling fs layer", "slow"),
        _line("Download complete", "quick"),
        _line("Downloading", "slow", 2_500_000, 10_000_000),
    ]:
        pull.feed(line)
    assert pull.summary() == "1 of 2 layers · 2.5 MB of 10.0 MB"
    pull.feed(_line("Download complete", "slow"))
    assert pull.summary() == "2 of 2 layers · 10.0 MB of 10.0 MB"


def test_reports_come_at_most_once_a_second_and_only_when_something_moved():
    clock = Clock()
    pull = PullProgress(REF, clock=clock)
    pull.start()
    pull.feed(_line("Downloading", "big", 1_000_000, 9_000_000))
    assert pull.due() is None  # the start was reported less than a second ago
    clock.now += 1
    assert pull.due() == f"pulling {REF}: 0 of 1 layers · 1.0 MB of 9.0 MB"
    for current in range(2_000_000, 9_000_000, 1_000_000):  # many lines within the second
        pull.feed(_line("Downloading", "big", current, 9_000_000))
        clock.now += 0.1
        assert pull.due() is None
    clock.now += 0.5
    assert pull.due() == f"pulling {REF}: 0 of 1 layers · 8.0 MB of 9.0 MB"
    clock.now += 5
    assert pull.due() is None  # nothing new to say
    pull.feed(_line("Download complete", "big"))
    assert pull.finished().endswith(": 1 of 1 layers · 9.0 MB of 9.0 MB")  # the end: at once


def test_a_stream_of_no_layers_reports_nothing_until_the_end():
    clock = Clock()
    pull = PullProgress(REF, clock=clock)
    pull.feed({"status": "Trying to pull registry.example/team/pytorch:2.4..."})
    pull.feed({"status": "Pulling from team/pytorch", "id": "2.4"})
    clock.now += 2
    assert pull.due() is None
    assert pull.finished() == f"pulled {REF} in 2 s"


def test_podmans_config_blob_is_no_layer():
    """What Podman 4.3 streams for an image of three layers, one of them on the host."""
    image_id = "sha256:257fe8a3d8dd" + "0" * 52
    pull = PullProgress(REF, clock=Clock())
    for line in [
        _line("Already exists", "73f26e731392"),
        _line("Pulling fs layer", "1a14f52bc89c"),
        _line("Pulling fs layer", "c71d1d2abe0a"),
        _line("Download complete", "1a14f52bc89c"),
        _line("Download complete", "c71d1d2abe0a"),
        _line("Pulling fs layer", "257fe8a3d8dd"),
        _line("Download complete", "257fe8a3d8dd"),
    ]:
        pull.feed(line)
    assert pull.finished(image_id) == f"pulled {REF} in 0 s: 3 of 3 layers"


@pytest.mark.parametrize(
    ("done", "total", "elapsed", "left"),
    [
        (1_000_000_000, 3_000_000_000, 10.0, 20),  # 100 MB/s, 2 GB to go
        (1, 3, 1.0, 2),
        (2_000_000, 3_000_000, 7.0, 4),  # 3.5 s rounded up
        (3_000_000, 3_000_000, 5.0, 0),
        (0, 3_000_000, 5.0, None),  # no rate yet
        (1_000, 0, 5.0, None),  # no size known
        (1_000, 2_000, 0.0, None),
    ],
)
def test_the_eta_is_what_is_left_at_the_rate_so_far(done, total, elapsed, left):
    assert eta(done, total, elapsed) == left


def test_each_report_has_its_figures_as_numbers_with_an_eta():
    clock = Clock()
    pull = PullProgress(REF, clock=clock)
    assert pull.snapshot() == {
        "reference": REF, "layers_done": 0, "layers_total": 0, "bytes_done": 0,
        "bytes_total": 0, "eta_seconds": None, "done": False,
    }  # fmt: skip
    for line in DOCKER:
        pull.feed(line)
    clock.now += 12  # 1.2 GB in 12 s: 100 MB/s, 2.2 GB to go
    figures = pull.snapshot()
    assert (figures["layers_done"], figures["layers_total"]) == (1, 3)
    assert (figures["bytes_done"], figures["bytes_total"]) == (1_200_000_000, 3_400_000_000)
    assert figures["eta_seconds"] == 22
    for line in DOCKER_END:
        pull.feed(line)
    pull.finished()
    assert pull.snapshot(done=True) | {"reference": REF} == {
        "reference": REF, "layers_done": 3, "layers_total": 3, "bytes_done": 3_400_000_000,
        "bytes_total": 3_400_000_000, "eta_seconds": 0, "done": True,
    }  # fmt: skip
