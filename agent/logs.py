"""The agent's log lines: text, or one JSON object a line (`--log-format json`, or
LOG_FORMAT=json as the console's processes read it), its HTTP server's lines included. The
agent is its own program, so this is its own copy of the console's format (console/logs.py):
ts (UTC), level, logger, message, and exc when there is one."""

import json
import logging
import re
from datetime import UTC, datetime

TEXT = "%(asctime)s %(levelname)s %(name)s: %(message)s"
# A terminal's session key (`?session=`, which reattaches to its shell) in a logged URL.
SESSION_KEY = re.compile(r"(session=)[^&\s\"']+")


class RedactSessionKeys(logging.Filter):
    """uvicorn logs each websocket's path with its query (`"WebSocket /v1/…/terminal?…"
    [accepted]`): a terminal's session key there is a secret, and becomes `session=…`."""

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        if "session=" in message:
            record.msg, record.args = SESSION_KEY.sub(r"\1…", message), None
        return True


class JsonFormatter(logging.Formatter):
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


def configure(level: str, form: str) -> None:
    """One handler on the root logger (unless the process has one already, as under a test
    runner); uvicorn's loggers send their lines to it too (the server
    is started with log_config=None). httpx logs each request at INFO (every sample push and
    heartbeat): routine, so only at DEBUG."""
    handler = logging.StreamHandler()
    handler.setFormatter(JsonFormatter() if form == "json" else logging.Formatter(TEXT))
    handler.addFilter(RedactSessionKeys())
    logging.basicConfig(level=level.upper(), handlers=[handler])  # a no-op where one is set
    if level.upper() != "DEBUG":
        logging.getLogger("httpx").setLevel(logging.WARNING)
