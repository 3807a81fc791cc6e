"""The agent's log lines: text, or one JSON object a line (`--log-format json`, or
LOG_FORMAT=json as the console's processes read it), its HTTP server's lines included. The
agent is its own program, so this is its own copy of the console's format (console/logs.py):
ts (UTC), level, logger, message, and exc when there is one."""

import json
import logging
from datetime import UTC, datetime

TEXT = "%(asctime)s %(levelname)s %(name)s: %(message)s"


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
    logging.basicConfig(level=level.upper(), handlers=[handler])  # a no-op where one is set
    if level.upper() != "DEBUG":
        logging.getLogger("httpx").setLevel(logging.WARNING)
