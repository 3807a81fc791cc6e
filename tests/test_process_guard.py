"""tests/conftest.py fails an unmarked test that starts a process, so that `make test-fast`
(the tests without a process marker) starts none."""

import asyncio
import os
import subprocess

import pytest

REFUSED = r"starts a process .*pytest\.mark\.integration, pytest\.mark\.containers"


def test_an_unmarked_test_that_runs_a_program_fails_naming_the_markers():
    with pytest.raises(pytest.fail.Exception, match=REFUSED + r".*browser") as refused:
        subprocess.run(["true"], check=True)
    assert "test_an_unmarked_test_that_runs_a_program" in str(refused.value)
    assert "['true']" in str(refused.value)


def test_an_asyncio_subprocess_or_a_fork_is_refused_too():
    async def start():
        await asyncio.create_subprocess_exec("true")

    with pytest.raises(pytest.fail.Exception, match=REFUSED):
        asyncio.run(start())
    with pytest.raises(pytest.fail.Exception, match=REFUSED):
        os.fork()
    with pytest.raises(pytest.fail.Exception, match=REFUSED):
        os.system("true")  # noqa: S605 (the very call refused)


@pytest.mark.integration
def test_a_marked_test_runs_programs():
    assert subprocess.run(["true"]).returncode == 0
    assert os.system("true") == 0  # noqa: S605 (a constant command)
