"""The console's state for a benchmark's own processes: a fresh folder, out of the way."""

import os
import tempfile
from pathlib import Path


def scratch_var_dir(prefix: str) -> Path:
    """A new GPUCLOUD_VAR_DIR (with its SQLite database) for the console processes this
    process starts and for its own Django, logging at WARNING; answers the folder."""
    folder = Path(tempfile.mkdtemp(prefix=prefix))
    os.environ.update(
        {
            "DJANGO_SETTINGS_MODULE": "console.settings",
            "GPUCLOUD_VAR_DIR": str(folder),
            "GPUCLOUD_SQLITE_PATH": str(folder / "bench.sqlite3"),
            "LOG_LEVEL": "WARNING",
        }
    )
    return folder
