"""How far make run's background build of the demo images is (console/launcher.py starts it,
agent/images.py writes <var>/image-builds.json as it goes): a banner on every page while an
image is being built or failed, and a line per image on the fleet page.

The console reads the file only: it never builds, and a console that no make run started (a
deployment) has no such file and shows nothing."""

import json
import logging

from django.conf import settings

logger = logging.getLogger(__name__)
FILE = "image-builds.json"
# by hand, as the README says: into make run's engine whether it runs or not
BY_HAND = "sudo make images"


def read() -> list[dict]:
    """Each image's build: reference, state (waiting, building, built, failed), step, steps,
    doing, and the error's last line where it failed; [] without a build."""
    try:
        state = json.loads((settings.VAR_DIR / FILE).read_text())
    except FileNotFoundError:
        return []
    except (OSError, ValueError) as error:  # never a page's 500 for a file that is not ours
        logger.warning("%s is unreadable: %s", FILE, error)
        return []
    builds = []
    for reference, image in state.get("images", {}).items():
        said = (image.get("error") or "").strip().splitlines()
        builds.append(
            {
                "reference": reference,
                "state": image.get("state", "waiting"),
                "step": image.get("step", 0),
                "steps": image.get("steps", 0),
                "doing": image.get("doing", ""),
                "error": said[-1] if said else "",
            }
        )
    return builds


def image_builds(request) -> dict:
    """For every signed-in page (settings.TEMPLATES context_processors): `image_builds` (each
    image's build) and `image_builds_banner` (whether one is still under way or failed)."""
    if not request.user.is_authenticated:
        return {}
    builds = read()
    return {
        "image_builds": builds,
        "image_builds_banner": any(build["state"] != "built" for build in builds),
        "image_builds_by_hand": BY_HAND,
    }
