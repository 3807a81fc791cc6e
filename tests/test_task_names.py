"""Celery routes, beat and every queueing call find tasks by name, so a task's name is pinned
in its decorator: moving or renaming a module cannot silently reroute or orphan the tasks
already queued under the old name."""

import ast
from pathlib import Path

import pytest
from django.conf import settings

from console.celery import app

ROOT = Path(__file__).resolve().parent.parent
TASK_MODULES = [
    "console.instances.tasks",
    "console.fleet.tasks",
    "console.metrics.tasks",
    "billing.tasks",
    "console.notifications.tasks",
    "console.volumes.tasks",
    "console.idle.tasks",
    "console.snapshots.tasks",
]


def _sources():
    for folder in ("accounts", "billing", "console"):
        for path in (ROOT / folder).rglob("*.py"):
            if "migrations" not in path.parts:
                yield path, ast.parse(path.read_text(), str(path))


def _decorators():
    for path, tree in _sources():
        for node in ast.walk(tree):
            if isinstance(node, ast.FunctionDef):
                for decorator in node.decorator_list:
                    target = decorator.func if isinstance(decorator, ast.Call) else decorator
                    if getattr(target, "id", None) == "shared_task":
                        yield path, node.name, decorator


def _queued_names():
    """The literal task names that enqueue_on_commit and the instances' queue.enqueue are
    given."""
    for path, tree in _sources():
        for node in ast.walk(tree):
            if not (isinstance(node, ast.Call) and node.args):
                continue
            name = getattr(node.func, "id", None) or getattr(node.func, "attr", None)
            first = node.args[0]
            if not isinstance(first, ast.Constant):
                continue
            if name == "enqueue_on_commit":
                yield path, first.value
            elif name == "enqueue":
                yield path, f"console.instances.tasks.{first.value}"


@pytest.fixture(scope="module")
def registered():
    for module in TASK_MODULES:
        __import__(module)
    return set(app.tasks)


def test_every_task_names_itself():
    found = list(_decorators())
    assert len(found) >= 15
    for path, function, decorator in found:
        keywords = {k.arg: k.value for k in getattr(decorator, "keywords", [])}
        assert "name" in keywords, f"{path}: task {function} has no pinned name"
        module = ".".join(path.relative_to(ROOT).with_suffix("").parts)
        assert keywords["name"].value == f"{module}.{function}", f"{path}: {function}"


def test_routes_beat_and_queueing_calls_name_registered_tasks(registered):
    for entry in settings.CELERY_BEAT_SCHEDULE.values():
        assert entry["task"] in registered
    for pattern in settings.CELERY_TASK_ROUTES:
        prefix = pattern.rstrip("*")
        assert any(name.startswith(prefix) for name in registered), pattern
    queued = list(_queued_names())
    assert len(queued) >= 5
    for path, name in queued:
        assert name in registered, f"{path} queues {name}, which no worker knows"
