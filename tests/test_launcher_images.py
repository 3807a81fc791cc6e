"""make run's background build of the demo images can be skipped (GPUCLOUD_BUILD_IMAGES=0, what
the tests that start make run set), and an earlier run's progress never shows as this one's."""

from console import launcher


def test_no_build_and_no_earlier_progress_with_the_switch_off(tmp_path, monkeypatch):
    monkeypatch.setenv("GPUCLOUD_BUILD_IMAGES", "0")
    (tmp_path / launcher.IMAGE_BUILDS).write_text('{"images": {}}')
    assert launcher.start_image_build(tmp_path, {}) is None
    assert list(tmp_path.iterdir()) == []
