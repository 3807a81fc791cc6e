"""make run's background build of the demo images, as the console's pages tell it (from the
file agent/images.py writes): a banner on every page while an image is built or failed, with
the reason and the command that builds it by hand; a line per image on the fleet page once all
are built; nothing where no make run built anything."""

import json

import pytest

from console.web import image_builds
from tests.factories import UserFactory

JUPYTER = "localhost/gpucloud/jupyter:latest"
PYTORCH = "localhost/gpucloud/pytorch:latest"


@pytest.fixture
def var_dir(settings, tmp_path):
    settings.VAR_DIR = tmp_path
    return tmp_path


def write(var_dir, **images):
    (var_dir / image_builds.FILE).write_text(json.dumps({"images": images}))


def test_the_banner_says_how_far_the_build_is(client, member, var_dir):
    write(
        var_dir,
        **{
            JUPYTER: {"state": "built", "step": 4, "steps": 4, "doing": "built"},
            PYTORCH: {"state": "building", "step": 2, "steps": 4, "doing": "Python packages (pip)"},
        },
    )
    client.force_login(member.user)
    page = client.get("/").content.decode()
    assert 'data-testid="image-builds"' in page
    assert "step 2 of 4: Python packages (pip)" in page
    assert f'data-reference="{JUPYTER}" data-state="built"' in page


def test_a_failed_build_says_why_and_how_to_build_it_by_hand(client, member, var_dir):
    error = "chroot /var/cache pip failed:\nERROR: No matching distribution found for torch"
    write(var_dir, **{PYTORCH: {"state": "failed", "step": 2, "steps": 4, "error": error}})
    client.force_login(member.user)
    page = client.get("/").content.decode()
    assert "could not be built (ERROR: No matching distribution found for torch)" in page
    assert "<code>sudo make images</code>" in page


def test_once_built_only_the_fleet_page_says_so(client, member, var_dir):
    done = {"state": "built", "step": 4, "steps": 4, "doing": "built"}
    write(var_dir, **{JUPYTER: done, PYTORCH: done})
    client.force_login(member.user)
    assert 'data-testid="image-builds"' not in client.get("/").content.decode()
    client.force_login(UserFactory(username="ops", is_staff=True, is_superuser=True))
    fleet = client.get("/fleet/").content.decode()
    assert fleet.count('data-state="built"') == 2


@pytest.mark.parametrize("text", [None, "{not json", '{"images": {"x": {}}}'])
def test_no_build_or_an_odd_file_is_no_error(client, member, var_dir, text):
    if text is not None:
        (var_dir / image_builds.FILE).write_text(text)
    client.force_login(member.user)
    assert client.get("/").status_code == 200
