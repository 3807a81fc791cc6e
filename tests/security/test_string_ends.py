"""`$` is not the end of a string (issue 41, "Smaller holes"): in Python's re it also matches
before a trailing newline, so a validator written `^…$` and used with re.match, re.search or
Django's and DRF's RegexValidator takes "FOO\\n" as FOO. Validators end at the end: fullmatch,
or `\\Z`. What a client reaches refuses "VALID\\n" wherever it takes VALID, and the source
holds no validating pattern that ends in `$`."""

import ast
import re
import sys
from pathlib import Path

import pytest
from django.core.exceptions import ValidationError as DjangoValidationError
from rest_framework.exceptions import ValidationError as DrfValidationError

from accounts.roles import Role
from agent.allocations import parse_spec
from agent.errors import ApiError
from console.catalog.models import Image, Region, Spec, cuda_tuple, env_errors
from console.fleet import forms as fleet_forms
from console.fleet.agent_api import GatewayCertificateSerializer
from console.instances import services as instances
from console.instances.reasons import from_agent

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("console", "accounts", "billing", "agent", "cli")


@pytest.fixture
def owner(tenant, make_member):
    return make_member(tenant, Role.OWNER, username="olga")


@pytest.mark.parametrize("field", ["env", "secret_env"])
def test_an_env_name_with_a_newline_is_a_400(token_client, owner, catalog, field):
    """The issue's own finding: env names are a JSON object's keys, which nothing trims."""
    client = token_client(owner)
    body = {"name": "tpl", "spec": catalog.quarter.code, "image": catalog.image.name}
    assert (
        client.post("/api/v1/templates/", {**body, field: {"SEED": "7"}}, format="json").status_code
        == 201
    )
    for name in ("SEED\n", "SEED\r\n", "SEED\x00", "\nSEED"):
        answer = client.post(
            "/api/v1/templates/", {**body, "name": "tpl2", field: {name: "7"}}, format="json"
        )
        assert answer.status_code == 400, (name, answer.content)
        assert field in answer.json()["errors"], answer.json()


def _django_refuses(validators, value) -> bool:
    try:
        for validator in validators:
            validator(value)
    except DjangoValidationError:
        return True
    return False


def _drf_refuses(field, value) -> bool:
    try:
        field.run_validators(value)
    except DrfValidationError:
        return True
    return False


def _refused(check, value) -> bool:
    try:
        return bool(check(value))
    except (DjangoValidationError, ApiError):
        return True


def _image_refused(reference: str) -> bool:
    try:
        Image(name="x", reference=reference).clean()
    except DjangoValidationError as error:
        return "reference" in error.message_dict
    return False


def _launch_name_refused(name: str) -> bool:
    try:
        instances.validate_launch(None, name, Spec(active=True), Image())
    except DjangoValidationError as error:
        return "name" in error.message_dict
    return False


def _join_form(field: str):
    validators = fleet_forms.JoinTokenForm.base_fields[field].validators
    return lambda value: _django_refuses(validators, value)


GPUS = [{"index": 0, "model": "a100-80gb"}]
CHECKS = {
    # name: (what answers True when `value` is refused, a value it takes)
    "env name": (env_errors, lambda value: {value: "1"}, "SEED"),
    "an image's env name (the agent's)": (
        lambda body: parse_spec(body, GPUS) and False,
        lambda value: {"mode": "whole", "gpus": [0], "env": {value: "1"}},
        "SEED",
    ),
    "instance name": (_launch_name_refused, None, "train-1"),
    "image reference": (_image_refused, None, "docker.io/library/python:3.12-slim"),
    "CUDA version": (lambda value: cuda_tuple(value) is None, None, "12.4"),
    "region's registry mirror": (
        lambda value: _django_refuses(Region._meta.get_field("registry_mirror").validators, value),
        None,
        "mirror.internal:5000",
    ),
    "spec code": (
        lambda value: _django_refuses(Spec._meta.get_field("code").validators, value),
        None,
        "a100-quarter",
    ),
    "join form's address": (
        _join_form("address"),
        None,
        "gpu-host-1",
    ),
    "join form's state directory": (
        _join_form("state_dir"),
        None,
        "/var/lib/gpucloud-agent",
    ),
    "gateway certificate's authority": (
        lambda value: _drf_refuses(GatewayCertificateSerializer().fields["authority"], value),
        None,
        "SHA256:abcd",
    ),
    "agent's state reason code": (lambda value: not from_agent(value).code, None, "oom_killed"),
}  # fmt: skip


@pytest.mark.django_db
@pytest.mark.parametrize("name", CHECKS)
def test_a_validator_takes_the_value_and_refuses_it_with_a_newline(name):
    refused, shape, valid = CHECKS[name]
    shape = shape or (lambda value: value)
    assert not _refused(refused, shape(valid)), f"{name} refuses its valid {valid!r}"
    for value in (f"{valid}\n", f"{valid}\r\n", f"{valid}\n\n"):
        assert _refused(refused, shape(value)), f"{name} takes {value!r}"


# The guard: a pattern that validates ends with \Z (or is used with fullmatch), never with `$`.
_DOLLAR_ANCHOR = re.compile(r"(?<!\\)\$(?:\Z|[)|])")
_REGEX_CALLS = {
    "compile", "match", "search", "fullmatch", "sub", "subn", "split", "findall", "finditer",
    "RegexValidator", "RegexField", "re_path",
}  # fmt: skip
_REGEX_SIGNS = re.compile(r"[\^\[\](){}\\*+?]")
# An OpenAPI (ECMAScript) pattern for the API document, where `$` is the end.
ALLOWED = {("billing/usage.py", "^[0-9]{4}-[0-9]{2}$")}


def _patterns_ending_in_dollar() -> list[str]:
    found = []
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            if "migrations" in path.parts:  # history: what earlier code wrote
                continue
            where = str(path.relative_to(ROOT))
            tree = ast.parse(path.read_text(), where)
            in_calls = {
                id(arg)
                for node in ast.walk(tree)
                if isinstance(node, ast.Call)
                and getattr(node.func, "attr", getattr(node.func, "id", None)) in _REGEX_CALLS
                for arg in node.args[:1]
            }
            for node in ast.walk(tree):
                if not isinstance(node, ast.Constant) or not isinstance(node.value, str | bytes):
                    continue
                text = node.value if isinstance(node.value, str) else node.value.decode("latin-1")
                looks = id(node) in in_calls or _REGEX_SIGNS.search(text)
                if looks and _DOLLAR_ANCHOR.search(text) and (where, text) not in ALLOWED:
                    found.append(f"{where}:{node.lineno} {text!r}")
    return found


@pytest.mark.slow  # a parse of every source file: a lint of the whole tree, not a unit's check
def test_no_validating_pattern_ends_in_a_dollar():
    assert _patterns_ending_in_dollar() == []


def test_the_guard_finds_what_it_looks_for(tmp_path, monkeypatch):
    """The scan is not blind: the patterns the issue found are what it reports."""
    old = 'import re\nNAME = re.compile(r"^[A-Z_][A-Z0-9_]*$")\nre.search(r"KEY$", "x")\n'
    (tmp_path / "console").mkdir()
    (tmp_path / "console" / "old.py").write_text(old)
    monkeypatch.setattr(sys.modules[__name__], "ROOT", tmp_path)
    monkeypatch.setattr(sys.modules[__name__], "PACKAGES", ("console",))
    assert len(_patterns_ending_in_dollar()) == 2
