"""Production logging: Celery's line per task received and per outcome at INFO, no access
line for the agents' periodic calls (every sample push and heartbeat of every host), JSON
lines on request (``LOG_FORMAT=json``). The settings' LOGGING uses these; so do the worker,
the beat and uvicorn's own loggers."""

import json
import logging
import logging.config
import re
import sys
import threading
from datetime import UTC, datetime

# What every agent calls every second (samples) or every few seconds (heartbeat): an access
# line for each would drown everything else in the web process's log.
AGENT_PERIODIC_PATHS = ("/agent/v1/samples", "/agent/v1/heartbeat")


class JsonFormatter(logging.Formatter):
    """One JSON object per line: ts (UTC), level, logger, message, and exc when there is one."""

    def format(self, record: logging.LogRecord) -> str:
        entry = {
            "ts": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        if record.exc_info:
            entry["exc"] = self.formatException(record.exc_info)
        return json.dumps(entry, ensure_ascii=False)


# The beat's periodic tasks, run every few seconds (every host's reconcile among them): a
# line for each one received and succeeded is routine, at DEBUG. What they mend they log
# themselves; a failure or retry keeps its level.
ROUTINE_TASKS = frozenset(
    {
        "console.fleet.tasks.watchdog",
        "console.instances.tasks.schedule_pending",
        "console.instances.tasks.reconcile",
        "console.instances.tasks.reconcile_host",
        "console.metrics.tasks.downsample",
        "billing.tasks.meter",
        "console.idle.tasks.evaluate",
    }
)


class RoutineTasksAtDebug(logging.Filter):
    """On Celery's "received" and "succeeded" lines (their arguments a dict with the task's
    name): those of ROUTINE_TASKS become DEBUG lines, logged only when the root logs DEBUG."""

    def filter(self, record: logging.LogRecord) -> bool:
        args = record.args if isinstance(record.args, dict) else {}
        if args.get("name") not in ROUTINE_TASKS or record.levelno != logging.INFO:
            return True
        if "received" not in str(record.msg) and "succeeded" not in str(record.msg):
            return True
        record.levelno, record.levelname = logging.DEBUG, "DEBUG"
        return logging.getLogger().isEnabledFor(logging.DEBUG)


class SkipAgentPeriodicCalls(logging.Filter):
    """Drops uvicorn's access line of an agent's sample push or heartbeat whatever it
    answered; every other request keeps its line. (uvicorn logs `client - "METHOD path
    HTTP/v" status`: the path is its third argument.)"""

    def filter(self, record: logging.LogRecord) -> bool:
        args = record.args if isinstance(record.args, tuple) else ()
        path = str(args[2]).split("?")[0] if len(args) >= 3 else ""
        return path not in AGENT_PERIODIC_PATHS


# A terminal's session key (`?session=`, which reattaches to its shell) in a logged URL; the
# agent, its own program, keeps its own copy of this filter (agent/logs.py).
SESSION_KEY = re.compile(r"(session=)[^&\s\"']+")


class RedactSessionKeys(logging.Filter):
    """uvicorn logs each websocket's path with its query (`"WebSocket /ws/…/terminal/?…"
    [accepted]`): a terminal's session key there is a secret, and becomes `session=…`."""

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        if "session=" in message:
            record.msg, record.args = SESSION_KEY.sub(r"\1…", message), None
        return True


def adopt_uvicorn_loggers(json_lines: bool) -> None:
    """uvicorn configures its loggers before it loads the app: filter its access log, keep
    session keys out of its lines, and with JSON logs give its handlers (none with
    --no-access-log) the JSON format."""
    access = logging.getLogger("uvicorn.access")
    if not any(isinstance(f, SkipAgentPeriodicCalls) for f in access.filters):
        access.addFilter(SkipAgentPeriodicCalls())
    for name in ("uvicorn.error", "uvicorn.access"):
        logger = logging.getLogger(name)
        if not any(isinstance(f, RedactSessionKeys) for f in logger.filters):
            logger.addFilter(RedactSessionKeys())
    if json_lines:
        for name in ("uvicorn", "uvicorn.error", "uvicorn.access"):
            for handler in logging.getLogger(name).handlers:
                handler.setFormatter(JsonFormatter())


def log_uncaught_exceptions() -> None:
    """An exception nothing caught ends the process through its log, as a CRITICAL line with
    the traceback (one JSON line with LOG_FORMAT=json), not as a plain traceback on stderr;
    one that ends a thread too."""

    def uncaught(kind, value, traceback) -> None:
        if issubclass(kind, KeyboardInterrupt):
            sys.__excepthook__(kind, value, traceback)
            return
        logging.getLogger("uncaught").critical(
            "the process ends: %s", value, exc_info=(kind, value, traceback)
        )

    def uncaught_in_thread(args: threading.ExceptHookArgs) -> None:
        if args.exc_type is SystemExit:
            return
        name = args.thread.name if args.thread else "?"
        logging.getLogger("uncaught").critical(
            "thread %s ends: %s",
            name,
            args.exc_value,
            exc_info=args.exc_value,
        )

    sys.excepthook = uncaught
    threading.excepthook = uncaught_in_thread


def configure() -> None:
    """Log as the settings' LOGGING says, Python's warnings (Celery's among them) and
    uncaught exceptions included."""
    from django.conf import settings

    logging.config.dictConfig(settings.LOGGING)
    logging.captureWarnings(True)
    log_uncaught_exceptions()
