"""make images reads the machine's own Debian release and mirror from apt's sources, installs
PyTorch's wheel from this machine's disk where it lies there, and says how far it is."""

import json

import pytest

from agent import images
from agent.images import (
    JUPYTER,
    PYTORCH,
    RECIPES,
    TORCH_INDEX,
    TRAIN_SCRIPT,
    Progress,
    debian_source,
    local_wheels,
    pip_sources,
)
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


def test_a_pinned_wheel_on_this_machines_disk_is_installed_offline(tmp_path):
    wheel = tmp_path / "torch-2.13.0+cpu-cp311-cp311-manylinux_2_28_x86_64.whl"
    wheel.touch()
    (tmp_path / "torch-2.12.0+cpu-cp311-cp311-manylinux_2_28_x86_64.whl").touch()
    assert local_wheels(PYTORCH.requirements, tmp_path) == [wheel]
    assert pip_sources(PYTORCH.requirements, tmp_path) == ["--find-links=/tmp/wheels"]


def test_without_the_wheel_the_cpu_build_comes_from_pytorchs_index(tmp_path):
    assert local_wheels(PYTORCH.requirements, tmp_path) == []
    assert pip_sources(PYTORCH.requirements, tmp_path) == [f"--extra-index-url={TORCH_INDEX}"]
    assert pip_sources(JUPYTER.requirements, tmp_path) == []  # PyPI's alone


def test_each_recipe_has_a_version_of_its_own_per_release():
    versions = {recipe.version(release) for recipe in RECIPES for release in ("bookworm", "trixie")}
    assert len(versions) == 4
    assert JUPYTER.version("bookworm") == "beb832fea4e9"  # the caches' tars made before stay good


def test_progress_is_written_whole_for_the_console(tmp_path):
    path = tmp_path / "image-builds.json"
    progress = Progress(path, RECIPES)
    progress(PYTORCH.reference, state="building", step=2)
    images = json.loads(path.read_text())["images"]
    assert images[JUPYTER.reference] == {"state": "waiting", "step": 0, "steps": 4}
    assert images[PYTORCH.reference]["doing"] == "Python packages (pip)"
    assert [p.name for p in tmp_path.iterdir()] == ["image-builds.json"]
    assert path.stat().st_mode & 0o077 == 0  # make run's state directory's


def test_a_failed_image_does_not_stop_the_next(tmp_path, monkeypatch):
    built = []

    def build(recipe, storage, cache, progress):
        if recipe is JUPYTER:
            raise EngineError("pip install failed:\nNo matching distribution")
        built.append(recipe.name)
        return True

    monkeypatch.setattr(images, "build_image", build)
    assert images.build_all(tmp_path / "storage", tmp_path, tmp_path / "p.json") == 1
    assert built == ["pytorch"]
    state = json.loads((tmp_path / "p.json").read_text())["images"][JUPYTER.reference]
    assert state["state"] == "failed" and "No matching distribution" in state["error"]


def test_the_training_script_is_python():
    compile(TRAIN_SCRIPT, "train.py", "exec")
    assert "manual_seed" in TRAIN_SCRIPT
