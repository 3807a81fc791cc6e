"""The console's settings, for the suite: its state directory made first, as every entry point
does (console/state_dir.py), since pytest-django reads the settings before any conftest. The
processes a test starts run the console's own settings."""

import os

from console import state_dir

state_dir.prepare()

from console.settings import *  # noqa: E402, F403

os.environ["DJANGO_SETTINGS_MODULE"] = "console.settings"
