"""The state directory (GPUCLOUD_VAR_DIR, `var/` by default): the SQLite database, the
generated secrets, beat's schedule, the collected static files, `make run`'s logs. It is the
console's user's alone: the directory 0700, its files 0600.

Reading the settings makes nothing on disk: they compute these paths and read the secrets
already there. What a process needs is made by `prepare()`, which every entry point calls
before Django reads the settings: manage.py, the ASGI app (console/asgi.py), Celery's worker
and beat (console/celery.py), `make run` (console/launcher.py)."""

import os
import secrets
from pathlib import Path

from console.env import env_str

ROOT = Path(__file__).resolve().parent.parent


def var_dir() -> Path:
    return Path(env_str("GPUCLOUD_VAR_DIR", str(ROOT / "var")))


def sqlite_path() -> str:
    """The embedded database's file (without DATABASE_URL)."""
    return env_str("GPUCLOUD_SQLITE_PATH", str(var_dir() / "gpucloud.sqlite3"))


def stored_secret(name: str) -> str:
    """The secret in var/`name`, "" where none was made."""
    try:
        return (var_dir() / name).read_text().strip()
    except FileNotFoundError:
        return ""


def prepare() -> None:
    """Make the state directory private (0700), with what the settings read from it: the
    SQLite database's file 0600 before SQLite opens it, the secrets the environment does not
    set, the static files' folder; and make 0600 again what an older install left readable.
    Called as a process starts, before it opens the database: opening and closing a file of
    it would drop the SQLite locks the process holds."""
    var = var_dir()
    var.mkdir(mode=0o700, parents=True, exist_ok=True)
    var.chmod(0o700)
    (var / "static").mkdir(exist_ok=True)
    if not env_str("DATABASE_URL"):
        _private_file(sqlite_path())
    if not env_str("SECRET_KEY"):
        _generate_secret(var / "secret-key", 50)
    if not env_str("SNAPSHOT_MASTER_SECRET") and not env_str("SNAPSHOT_PASSWORD"):
        _generate_secret(var / "snapshot-master-secret", 32)
    legacy = var / "snapshot-password"
    if legacy.exists():
        legacy.chmod(0o600)


def _private_file(path: str) -> None:
    """Create `path` readable by its owner only (0600) before SQLite opens it: SQLite gives
    its WAL and shared-memory files the database file's mode."""
    os.close(os.open(path, os.O_CREAT | os.O_WRONLY, 0o600))
    for suffix in ("", "-wal", "-shm"):
        if os.path.exists(path + suffix):
            os.chmod(path + suffix, 0o600)


def _generate_secret(path: Path, nbytes: int) -> None:
    """Make the secret at `path` unless it is there, whichever process starting alongside
    others comes first: written 0600 aside (never readable by others, not even for a moment),
    then linked into place, so that none reads it half-written; made 0600 again if an older
    install left it readable."""
    if path.exists():
        path.chmod(0o600)
        return
    aside = path.with_name(f".{path.name}.{os.getpid()}")
    with os.fdopen(os.open(aside, os.O_CREAT | os.O_TRUNC | os.O_WRONLY, 0o600), "w") as f:
        f.write(secrets.token_urlsafe(nbytes))
    try:
        os.link(aside, path)
    except FileExistsError:
        pass  # another process made it first: its secret is the one
    finally:
        os.unlink(aside)
