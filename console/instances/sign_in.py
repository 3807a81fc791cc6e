"""Apps that sign in with a token (a port declared with "app": "jupyter"): each instance has one
(Instance.app_token), its workload is given it in the environment, and its port links carry it
for members, so that the link opens the app signed in."""

from urllib.parse import urlencode

JUPYTER = "jupyter"
JUPYTER_VARIABLE = "JUPYTER_TOKEN"  # where Jupyter Server reads its token


def token_env(image_ports: list | None, token: str) -> dict[str, str]:
    """What the workload's environment gets: the token, when its image serves Jupyter."""
    if any(entry.get("app") == JUPYTER for entry in image_ports or []):
        return {JUPYTER_VARIABLE: token}
    return {}


def app_query(entry: dict, token: str) -> str:
    """The query string that opens a port's app signed in ("token=…" for Jupyter, "" for a
    port without an app). For members with role member or above only: it is the key."""
    return urlencode({"token": token}) if entry.get("app") == JUPYTER else ""
