"""The agent's command line: what it refuses before it starts."""

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
