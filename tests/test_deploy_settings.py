"""Production settings can be turned on from the environment (issue 12, finding 12)."""

import os
import re
import secrets
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def _manage(tmp_path, *args, **env):
    environ = {
        **os.environ,
        "GPUCLOUD_VAR_DIR": str(tmp_path / "var"),
        "SECRET_KEY": secrets.token_urlsafe(50),
        "ALLOWED_HOSTS": "console.example.com",
        **env,
    }
    for name in ("DEBUG", "HTTPS", "DATABASE_URL", "REDIS_URL"):
        if name not in env:
            environ.pop(name, None)
    return subprocess.run(
        [sys.executable, "manage.py", *args], cwd=ROOT, env=environ, capture_output=True, text=True
    )


@pytest.mark.integration
def test_check_deploy_passes_when_served_over_https(tmp_path):
    checked = _manage(tmp_path, "check", "--deploy", "--fail-level", "WARNING", HTTPS="true")
    assert checked.returncode == 0, checked.stderr
    assert "no issues" in checked.stdout


SHOW = (
    "shell",
    "-c",
    "from django.conf import settings as s; print(s.SECURE_SSL_REDIRECT, s.SECURE_HSTS_SECONDS,"
    " s.SESSION_COOKIE_SECURE, s.CSRF_COOKIE_SECURE, getattr(s, 'SECURE_PROXY_SSL_HEADER', None))",
)


@pytest.mark.integration
@pytest.mark.parametrize(
    ("env", "shown"),
    [
        ({}, "False 0 False False None"),  # plain HTTP on a laptop: make run works as before
        ({"HTTPS": "true"}, "True 31536000 True True None"),
        ({"HTTPS": "true", "DEBUG": "true"}, "False 0 True True None"),
        (
            {"HTTPS": "true", "TRUSTED_PROXY_COUNT": "1", "SECURE_HSTS_SECONDS": "60"},
            "True 60 True True ('HTTP_X_FORWARDED_PROTO', 'https')",
        ),
    ],
)
def test_https_settings_follow_the_environment(tmp_path, env, shown):
    result = _manage(tmp_path, *SHOW, **env)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip().splitlines()[-1] == shown


def test_no_inline_script_is_left_in_the_templates():
    """The CSP allows no inline script: no on* handler attributes, no <script> without src."""
    for template in (ROOT / "templates").rglob("*.html"):
        text = template.read_text()
        assert not re.search(r"\son[a-z]+\s*=", text), template
        assert not re.search(r"<script(?![^>]*\bsrc=)[^>]*>", text), template
        assert "javascript:" not in text, template
