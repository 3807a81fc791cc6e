"""Static files as a collected install serves them (settings.STATIC_COLLECTED): fingerprinted
names, brotli and gzip copies, a year's cache; and the Plotly bundles the pages load."""

import os
from pathlib import Path

import pytest
from django.contrib.staticfiles import finders
from django.core.management import call_command
from django.templatetags.static import static
from django.test import Client, override_settings

ROOT = Path(__file__).resolve().parent.parent
COLLECTED = {
    "default": {"BACKEND": "django.core.files.storage.FileSystemStorage"},
    "staticfiles": {"BACKEND": "console.staticfiles.CompressedManifestStorage"},
}


@pytest.fixture
def collected(tmp_path):
    """A collected install of one script (the live metrics charts'), whitenoise serving it from
    STATIC_ROOT as in production."""
    source = tmp_path / "source" / "js"
    source.mkdir(parents=True)
    source.joinpath("metrics.js").write_bytes((ROOT / "static" / "js" / "metrics.js").read_bytes())
    with override_settings(
        STORAGES=COLLECTED,
        STATIC_ROOT=tmp_path / "static",
        STATICFILES_DIRS=[tmp_path / "source"],
        STATICFILES_FINDERS=["django.contrib.staticfiles.finders.FileSystemFinder"],
        WHITENOISE_USE_FINDERS=False,
        WHITENOISE_AUTOREFRESH=False,
    ):
        call_command("collectstatic", "--noinput", verbosity=0)
        yield tmp_path / "static"


def test_a_collected_script_is_fingerprinted_compressed_and_cached_for_a_year(collected, db):
    url = static("js/metrics.js")
    assert url.startswith("/static/js/metrics.") and url != "/static/js/metrics.js"
    hashed = collected / url.removeprefix("/static/")
    assert hashed.with_name(hashed.name + ".br").exists()
    assert hashed.with_name(hashed.name + ".gz").exists()

    client = Client()
    answer = client.get(url, headers={"accept-encoding": "gzip, br"})
    assert answer.status_code == 200
    assert answer["Content-Encoding"] == "br"
    assert "immutable" in answer["Cache-Control"]
    assert "max-age=315360000" in answer["Cache-Control"]
    plain = client.get(url, headers={"accept-encoding": "gzip"})
    assert plain["Content-Encoding"] == "gzip"
    assert int(answer["Content-Length"]) < int(plain["Content-Length"]) < hashed.stat().st_size


def test_collecting_again_keeps_the_compressed_copies(collected):
    """A hashed name's content never changes: `make run` collects at every start without
    compressing again."""
    hashed = collected / static("js/metrics.js").removeprefix("/static/")
    brotli = hashed.with_name(hashed.name + ".br")
    os.utime(brotli, (1, 1))
    call_command("collectstatic", "--noinput", verbosity=0)
    assert brotli.stat().st_mtime == 1


@pytest.mark.parametrize(
    ("bundle", "most_bytes"),
    [("plotly-basic.min.js", 1_300_000), ("plotly-cartesian.min.js", 1_600_000)],
)
def test_the_plotly_bundles_are_the_small_official_ones(bundle, most_bytes):
    path = finders.find(f"vendor/plotly/{bundle}")
    assert path and os.path.getsize(path) < most_bytes  # the full bundle is 4.8 MB
    assert not finders.find("vendor/plotly/plotly.min.js")
