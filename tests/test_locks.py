"""Row locks are taken only by the lock modules (accounts/locks.py states the order they
follow), so a new select_for_update cannot quietly take locks in another order."""

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
LOCK_MODULES = {
    "accounts/locks.py",
    "console/instances/locks.py",
    "console/fleet/locks.py",
    "billing/locks.py",
    "console/volumes/locks.py",
    "console/snapshots/locks.py",
    "console/idle/locks.py",
    "console/notifications/locks.py",
}


def test_only_the_lock_modules_lock_rows():
    lockers = set()
    for folder in ("accounts", "billing", "console"):
        for path in (ROOT / folder).rglob("*.py"):
            tree = ast.parse(path.read_text(), str(path))
            for node in ast.walk(tree):
                if isinstance(node, ast.Attribute) and node.attr == "select_for_update":
                    lockers.add(str(path.relative_to(ROOT)))
    assert lockers == LOCK_MODULES
