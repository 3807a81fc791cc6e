"""A terminal's session key reattaches to its shell: it is a secret, and uvicorn's line for
each websocket (`"WebSocket <path with query>" [accepted]`, logged at INFO by the console's
web processes and by the agent) must not carry it (issue 50 item 8)."""

import logging

import pytest

from agent import logs as agent_logs
from console import logs as console_logs

KEY = "s3cr3t-SESSION-key_0123456789"
PATH = f"/v1/instances/7/terminal?cols=80&rows=24&session={KEY}&member=3"


@pytest.fixture
def uvicorn_error(caplog):
    console_logs.adopt_uvicorn_loggers(json_lines=False)
    with caplog.at_level(logging.INFO, logger="uvicorn.error"):
        yield logging.getLogger("uvicorn.error")


def test_the_web_processes_websocket_lines_keep_the_path_but_not_the_key(uvicorn_error, caplog):
    uvicorn_error.info('%s - "WebSocket %s" [accepted]', "127.0.0.1:5123", PATH)
    [line] = caplog.messages
    assert KEY not in line
    assert "/v1/instances/7/terminal?cols=80&rows=24&session=…&member=3" in line


def test_the_agents_handler_drops_the_key_from_every_record_it_writes():
    record = logging.LogRecord(
        "uvicorn.error", logging.INFO, __file__, 1, '%s - "WebSocket %s" [accepted]',
        ("127.0.0.1:5123", f'{PATH}"&session={KEY}2'), None,
    )  # fmt: skip
    for formatter in (agent_logs.JsonFormatter(), logging.Formatter(agent_logs.TEXT)):
        handler = logging.StreamHandler()
        handler.setFormatter(formatter)
        handler.addFilter(agent_logs.RedactSessionKeys())
        assert handler.filter(record)
        assert KEY not in handler.format(record)
