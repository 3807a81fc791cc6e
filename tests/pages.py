"""What the browser tests share: signing in, and where screenshots go (to be looked at)."""

from pathlib import Path

SHOTS = Path(__file__).resolve().parents[1] / "var" / "screenshots"
PASSWORD = "correct-horse-battery"  # tests.factories.UserFactory's


def sign_in(page, base_url: str, username: str) -> None:
    page.goto(f"{base_url}/login/")
    page.fill("#id_username", username)
    page.fill("#id_password", PASSWORD)
    page.click("button[type=submit]")
    page.wait_for_load_state()


def screenshot(page, name: str) -> None:
    SHOTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(SHOTS / f"{name}.png"), full_page=True)
