"""What the browser tests share: signing in, and where screenshots go (to be looked at)."""

import warnings
from pathlib import Path

from playwright.sync_api import TimeoutError as PlaywrightTimeout

SHOTS = Path(__file__).resolve().parents[1] / "var" / "screenshots"
PASSWORD = "correct-horse-battery"  # tests.factories.UserFactory's


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
