"""What the browser tests share: signing in, and where screenshots go (to be looked at)."""

import warnings
from pathlib import Path

from playwright.sync_api import Error as PlaywrightError
from playwright.sync_api import TimeoutError as PlaywrightTimeout

SHOTS = Path(__file__).resolve().parents[1] / "var" / "screenshots"
PASSWORD = "correct-horse-battery"  # tests.factories.UserFactory's


NETWORK_CHANGED = "net::ERR_NETWORK_CHANGED"


def steady(page):
    """The page, loading again what Chromium dropped for a network change. Chromium cancels its
    requests in flight when any interface of the machine gains or loses an address, and the
    suite's containers add and remove interfaces (a veth's IPv6 link-local address appears a
    moment after the container starts), so a script of the page can fail to load for no fault of
    the console. goto and reload try again, up to three times, when that happened while they
    loaded; any other failure stands."""
    dropped = []
    page.on(
        "requestfailed",
        lambda request: NETWORK_CHANGED in (request.failure or "") and dropped.append(request.url),
    )

    def again(load):
        def load_steadily(*args, **kwargs):
            for attempt in range(3):
                dropped.clear()
                try:
                    response = load(*args, **kwargs)
                except PlaywrightError as error:
                    if NETWORK_CHANGED not in str(error) or attempt == 2:
                        raise
                    continue
                if not dropped:
                    return response
            return response

        return load_steadily

    page.goto = again(page.goto)
    page.reload = again(page.reload)
    return page


def sign_in(page, base_url: str, username: str) -> None:
    page.goto(f"{base_url}/login/")
    page.fill("#id_username", username)
    page.fill("#id_password", PASSWORD)
    page.click("button[type=submit]")
    page.wait_for_load_state()


def screenshot(page, name: str) -> None:
    """Save the page for a person to look at. Not an assertion: a page whose live charts keep
    redrawing on a busy machine may not settle for a full-page capture in time, and that is
    worth a warning, not a failed test."""
    SHOTS.mkdir(parents=True, exist_ok=True)
    try:
        page.screenshot(path=str(SHOTS / f"{name}.png"), full_page=True, timeout=30_000)
    except PlaywrightTimeout:
        warnings.warn(f"screenshot {name!r} timed out", stacklevel=2)
