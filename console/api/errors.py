"""One error shape for the whole API: {"code", "detail", "errors"?}, with an exception's
`extra` fields beside them (a scoped token's `required_scope`). A DomainError is answered with
its own code and status."""

from django.conf import settings
from django.core.exceptions import PermissionDenied as DjangoPermissionDenied
from django.core.exceptions import RequestDataTooBig
from django.core.exceptions import ValidationError as DjangoValidationError
from django.http import Http404, JsonResponse
from rest_framework import exceptions, status
from rest_framework.response import Response
from rest_framework.serializers import as_serializer_error
from rest_framework.views import exception_handler as drf_exception_handler

from console.audit import refusals
from console.errors import DomainError, ErrorCode


def _first_code(detail) -> str | None:
    if isinstance(detail, list) and detail:
        return _first_code(detail[0])
    if isinstance(detail, dict) and detail:
        return _first_code(next(iter(detail.values())))
    return getattr(detail, "code", None)


def exception_handler(exc, context):
    """The error shape; a refusal of a person's write is recorded in the audit log."""
    response = _answer(exc, context)
    if response is not None:
        refusals.record(
            context["request"],
            context.get("view"),
            response.status_code,
            response.data["code"],
            response.data["detail"],
        )
    return response


def _answer(exc, context):
    if isinstance(exc, DomainError):
        return Response({"code": exc.code, "detail": exc.detail}, status=exc.status)
    if isinstance(exc, DjangoValidationError):
        exc = exceptions.ValidationError(as_serializer_error(exc))
    elif isinstance(exc, Http404):
        exc = exceptions.NotFound()
    elif isinstance(exc, DjangoPermissionDenied):
        exc = exceptions.PermissionDenied()
    response = drf_exception_handler(exc, context)
    if response is None:
        return None
    if isinstance(exc, exceptions.ValidationError):
        errors = exc.detail if isinstance(exc.detail, dict) else {"non_field_errors": exc.detail}
        non_field = errors.get("non_field_errors")
        detail = str(non_field[0]) if non_field else "Some fields are not valid."
        response.data = {"code": ErrorCode.INVALID, "detail": detail, "errors": errors}
        return response
    code = _first_code(exc.detail) or exc.default_code
    if isinstance(exc, exceptions.NotAuthenticated | exceptions.AuthenticationFailed):
        response.status_code = status.HTTP_401_UNAUTHORIZED
    response.data = {"code": code, "detail": str(exc.detail), **getattr(exc, "extra", {})}
    return response


def _speaks_json(request) -> bool:
    """The REST API and the agents' protocol answer errors as JSON; pages answer HTML."""
    return request.path.startswith(("/api/", "/agent/"))


def api_bad_request(request, exception=None):
    """What Django refuses before a view runs: a body over DATA_UPLOAD_MAX_MEMORY_SIZE (413),
    too many form fields, a malformed multipart body (400)."""
    if not _speaks_json(request):
        from django.views.defaults import bad_request

        return bad_request(request, exception)
    if isinstance(exception, RequestDataTooBig):
        limit = settings.DATA_UPLOAD_MAX_MEMORY_SIZE
        detail = f"The request body is larger than the {limit} bytes this endpoint takes."
        return JsonResponse({"code": ErrorCode.TOO_LARGE, "detail": detail}, status=413)
    detail = "The request is malformed."
    return JsonResponse({"code": ErrorCode.BAD_REQUEST, "detail": detail}, status=400)


def api_not_found(request, exception=None):
    if _speaks_json(request):
        return JsonResponse({"code": ErrorCode.NOT_FOUND, "detail": "Not found."}, status=404)
    from django.views.defaults import page_not_found

    return page_not_found(request, exception)


def api_server_error(request):
    if _speaks_json(request):
        return JsonResponse(
            {"code": ErrorCode.SERVER_ERROR, "detail": "Something went wrong on our side."},
            status=500,
        )
    from django.views.defaults import server_error

    return server_error(request)


__all__ = [
    "Response",
    "exception_handler",
    "api_bad_request",
    "api_not_found",
    "api_server_error",
]
