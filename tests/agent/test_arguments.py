"""The agent's command line: what it refuses before it starts."""

import re

import pytest

from agent import __main__ as agent_main


def test_the_sim_backend_needs_a_gpu_count_instead_of_silently_one(capsys):
    with pytest.raises(SystemExit) as leaving:
        agent_main._parse(["--secret", "s3cret", "--backend", "sim"])
    assert leaving.value.code == 2
    assert "the sim backend needs --gpus N" in capsys.readouterr().err
    assert agent_main._parse(["--secret", "s3cret", "--gpus", "2"]).modes == ["whole", "whole"]


def test_the_nvml_backend_needs_no_gpu_count():
    assert agent_main._parse(["--secret", "s3cret", "--backend", "nvml"]).gpus is None


def test_help_lists_the_probe_command(capsys):
    with pytest.raises(SystemExit) as leaving:
        agent_main.main(["--help"])
    assert leaving.value.code == 0
    assert re.search(r"^commands:\n  probe \[--json\]", capsys.readouterr().out, re.MULTILINE)
