"""Error codes are data (console.errors.ErrorCode): every code a client can be answered is one
of its members, the OpenAPI document publishes exactly those, and a member goes over the wire
as the plain string clients switch on."""

import importlib
import json
import pkgutil

import pytest
from rest_framework.exceptions import APIException
from rest_framework.renderers import JSONRenderer
from rest_framework.test import APIClient

import accounts
import billing
import console
from console.api.renderers import FastJSONRenderer
from console.errors import DomainError, ErrorCode


def _every_subclass(cls):
    for sub in cls.__subclasses__():
        yield sub
        yield from _every_subclass(sub)


@pytest.fixture(scope="module")
def every_module():
    """Every module of the console, accounts and billing imported, so that every error class
    they define is there to be found."""
    for package in (console, accounts, billing):
        for found in pkgutil.walk_packages(package.__path__, f"{package.__name__}."):
            if ".migrations" not in found.name:
                importlib.import_module(found.name)


def test_every_domain_error_carries_an_error_code_by_default(every_module):
    classes = list(_every_subclass(DomainError))
    names = {cls.__name__ for cls in classes}
    assert {"QuotaExceeded", "TokenRejected", "ConnectRefused", "BatchRefused"} <= names
    assert len(names) == len(classes), "two error classes share a name"
    for cls in [DomainError, *classes]:
        assert isinstance(cls.code, ErrorCode), cls


def test_a_code_that_is_not_an_error_code_is_refused_where_it_is_raised():
    with pytest.raises(ValueError, match="quota_exeeded"):
        DomainError("No room.", code="quota_exeeded")
    error = DomainError("No room.", code="quota_exceeded", status=409)
    assert error.code is ErrorCode.QUOTA_EXCEEDED


def test_each_constructor_takes_the_detail_first_and_the_rest_by_keyword(every_module):
    for cls in [DomainError, *_every_subclass(DomainError)]:
        with pytest.raises(TypeError):
            cls("A sentence.", ErrorCode.CONFLICT)


def test_every_code_drf_answers_is_an_error_code(every_module):
    """The API answers DRF's exceptions (and the project's own) with their default code."""
    for cls in [APIException, *_every_subclass(APIException)]:
        assert cls.default_code in {code.value for code in ErrorCode}, cls


@pytest.mark.django_db
def test_the_openapi_error_code_is_the_enum_of_every_error_code():
    schema = APIClient().get("/api/v1/schema/", HTTP_ACCEPT="application/json").json()
    components = schema["components"]["schemas"]
    code = components["Error"]["properties"]["code"]
    assert code["allOf"] == [{"$ref": "#/components/schemas/ErrorCode"}]
    assert components["ErrorCode"] == {"enum": [c.value for c in ErrorCode], "type": "string"}


def test_a_code_goes_over_the_wire_as_the_plain_string():
    answer = {"code": ErrorCode.QUOTA_EXCEEDED, "detail": "No room."}
    expected = b'{"code":"quota_exceeded","detail":"No room."}'
    assert FastJSONRenderer().render(answer) == expected
    assert JSONRenderer().render(answer) == expected
    assert json.dumps(answer) == '{"code": "quota_exceeded", "detail": "No room."}'
    assert ErrorCode.QUOTA_EXCEEDED == "quota_exceeded"
    assert f"{ErrorCode.QUOTA_EXCEEDED}" == "quota_exceeded"
