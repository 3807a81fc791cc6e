"""The OpenAPI document's error responses: every operation lists the errors it can answer,
each in the API's one error shape (console.api.errors), so generated clients know them, and
the codes it can carry (console.errors.ErrorCode)."""

from drf_spectacular.plumbing import build_object_type

from accounts import scopes
from console.errors import ErrorCode

ERROR = "Error"
ERROR_CODE = "ErrorCode"
ERROR_CODE_SCHEMA = {"enum": [code.value for code in ErrorCode], "type": "string"}
ERROR_SCHEMA = build_object_type(
    properties={
        "code": {
            "allOf": [{"$ref": f"#/components/schemas/{ERROR_CODE}"}],
            "description": "stable: invalid, not_found, quota_exceeded …",
        },
        "detail": {"type": "string", "description": "for a person to read"},
        "errors": {
            "type": "object",
            "description": "only with code invalid: the messages of each field (a list of "
            "messages, or for a list or object field the same, keyed by index or name)",
            "additionalProperties": {"oneOf": [{"type": "array", "items": {}}, {"type": "object"}]},
        },
        "required_scope": {
            "type": "string",
            "nullable": True,
            "description": "only with code scope_missing: the scope the API token lacks",
        },
    },
    required=["code", "detail"],
)
DESCRIPTIONS = {
    "400": "The request is not valid: `errors` names the fields.",
    "401": "No credentials, or a token that is unknown, revoked or expired.",
    "403": "Signed in, but the role, the tenant or the API token's scopes do not allow it.",
    "404": "No such object, or not one of this tenant's.",
    "409": "Not possible in the current state (e.g. quota_exceeded, invalid_state).",
    "415": "The body's Content-Type is not one the operation accepts (send application/json).",
    "429": "Too many requests (unknown tokens from this address): wait `Retry-After` seconds.",
}


def _errors_of(path: str, method: str, operation: dict) -> list[str]:
    codes = ["401", "403", "429"]
    if operation.get("requestBody"):
        codes.append("415")
    if operation.get("requestBody") or any(
        p.get("in") == "query" for p in operation.get("parameters", [])
    ):
        codes.append("400")
    if "{" in path:
        codes.append("404")
    if method in ("post", "put", "patch", "delete"):
        codes.append("409")
    return codes


def add_error_responses(result, generator, request, public):
    """drf-spectacular postprocessing hook: add the Error and ErrorCode components and the
    error responses an operation does not document already."""
    components = result.setdefault("components", {}).setdefault("schemas", {})
    components[ERROR] = ERROR_SCHEMA
    components[ERROR_CODE] = ERROR_CODE_SCHEMA
    reference = {"$ref": f"#/components/schemas/{ERROR}"}
    for path, operations in result.get("paths", {}).items():
        for method, operation in operations.items():
            responses = operation.setdefault("responses", {})
            for code in _errors_of(path, method, operation):
                responses.setdefault(
                    code,
                    {
                        "description": DESCRIPTIONS[code],
                        "content": {"application/json": {"schema": reference}},
                    },
                )
    return result


def add_token_scopes(result, generator, request, public):
    """drf-spectacular postprocessing hook: each operation names the API token scope it needs
    (`x-token-scope`, accounts.scopes), also at the end of its description."""
    for path, _, method, callback in generator.endpoints:
        view = generator.create_view(callback, method)
        operation = result["paths"].get(generator.coerce_path(path, method, view), {})
        operation = operation.get(method.lower())
        needed = scopes.required(view, method)
        if operation is None or needed is None:
            continue
        operation["x-token-scope"] = needed
        text = f"API token scope: `{needed}`."
        description = operation.get("description")
        operation["description"] = f"{description}\n\n{text}" if description else text
    return result
