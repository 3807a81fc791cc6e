"""The worker's and beat's start and shutdown lines in the log's format. Celery prints its
banner (~20 lines) to stdout and writes the worker's shutdown lines ("worker: Warm shutdown")
straight to the terminal from its signal handlers; with LOG_FORMAT=json each becomes one JSON
line instead, as every other line is. With text logs they stay as Celery prints them."""

import contextlib
import logging
import os
import sys

from celery import __version__ as celery_version
from celery.apps import beat, worker
from django.conf import settings

from console import logs


def _json_lines() -> bool:
    return settings.LOG_FORMAT == "json"


def _say_as_json(msg: str, f=sys.__stderr__) -> None:
    """Celery's `safe_say`, as one JSON line. It runs in signal handlers, where logging could
    wait forever on a lock the interrupted code holds: so it formats the line itself and
    writes it to the file descriptor, as Celery does."""
    record = logging.makeLogRecord(
        {"name": "celery.apps.worker", "levelno": logging.INFO, "levelname": "INFO"}
    )
    record.msg = msg.strip()
    # a closed stream: losing the line must not stop the worker
    with contextlib.suppress(OSError, ValueError):
        os.write(f.fileno(), (logs.JsonFormatter().format(record) + "\n").encode())


class Worker(worker.Worker):
    def on_before_init(self, **kwargs):
        if _json_lines():
            # Celery sets up logging later, after its checks have warned (as root, say)
            logs.configure()
            # the module's own function, which its shutdown handlers call
            worker.safe_say = _say_as_json
        super().on_before_init(**kwargs)

    def emit_banner(self):
        if not _json_lines():
            super().emit_banner()
            return
        logging.getLogger("celery.apps.worker").info(
            "%s%s", self.startup_info(artlines=False), self.extra_info() or ""
        )


class Beat(beat.Beat):
    def __init__(self, *args, quiet: bool = False, **kwargs):
        super().__init__(*args, quiet=quiet or _json_lines(), **kwargs)

    def install_sync_handler(self, service: beat.beat.Service) -> None:
        # Where beat has both its logging set up and its service in hand: say the banner that
        # `quiet` kept from being printed.
        if _json_lines():
            logging.getLogger("celery.beat").info(
                "celery beat v%s is starting.\n%s", celery_version, self.startup_info(service)
            )
        super().install_sync_handler(service)
