"""The one family of domain errors: a rule said no.

Every error a business function raises on purpose is a ``DomainError`` with a stable
``code`` (what clients switch on), a ``detail`` (a sentence for a person) and the HTTP
``status`` it means. The API answers it as ``{"code", "detail"}`` with that status
(console.api.errors.exception_handler), pages show ``detail`` as an error message; neither
wraps it again. Subclasses only fix a default code and status.

``ErrorCode`` is every code the console answers with, its own errors' and the ones DRF and
the port origin answer; the OpenAPI document publishes it (console.api.schema)."""

# ruff: noqa: S105 - codes that name tokens and secrets, none of them a secret
from enum import StrEnum


class ErrorCode(StrEnum):
    """What clients switch on: a value is never renamed. A StrEnum, so a member is the very
    string that JSON carries and compares equal to it."""

    # the request itself
    INVALID = "invalid"
    PARSE_ERROR = "parse_error"
    BAD_REQUEST = "bad_request"
    TOO_LARGE = "too_large"
    INVALID_RANGE = "invalid_range"
    METHOD_NOT_ALLOWED = "method_not_allowed"
    NOT_ACCEPTABLE = "not_acceptable"
    UNSUPPORTED_MEDIA_TYPE = "unsupported_media_type"
    THROTTLED = "throttled"
    TOO_MANY_ATTEMPTS = "too_many_attempts"
    NOT_FOUND = "not_found"
    ERROR = "error"
    SERVER_ERROR = "server_error"
    # who asks, and what they may do
    NOT_AUTHENTICATED = "not_authenticated"
    AUTHENTICATION_FAILED = "authentication_failed"
    INVALID_TOKEN = "invalid_token"
    TOKEN_REVOKED = "token_revoked"
    TOKEN_EXPIRED = "token_expired"
    TENANT_SUSPENDED = "tenant_suspended"
    NO_TENANT = "no_tenant"
    PERMISSION_DENIED = "permission_denied"
    SCOPE_MISSING = "scope_missing"
    PREFIX_CONFINED = "prefix_confined"
    # instances
    CONFLICT = "conflict"
    INVALID_STATE = "invalid_state"
    QUOTA_EXCEEDED = "quota_exceeded"
    BUDGET_EXCEEDED = "budget_exceeded"
    BUSY = "busy"
    HOST_UNAVAILABLE = "host_unavailable"
    NOT_RUNNING = "not_running"
    KEEP_RUNNING_REFUSED = "keep_running_refused"
    KEEP_RUNNING_FORBIDDEN = "keep_running_forbidden"
    KEPT_RUNNING_ALREADY = "kept_running_already"
    # volumes and snapshots
    INSTANCE_SHELVED = "instance_shelved"
    SHELVED = "shelved"
    SNAPSHOT_SHELVED = "snapshot_shelved"
    SNAPSHOT_RUNNING = "snapshot_running"
    SNAPSHOT_RESTORING = "snapshot_restoring"
    # notifications and the catalog
    NOT_A_WEBHOOK = "not_a_webhook"
    INVALID_CATALOG = "invalid_catalog"
    # the port origin (console.instances.ports)
    INVALID_GRANT = "invalid_grant"
    CROSS_ORIGIN = "cross_origin"
    INVALID_PATH = "invalid_path"
    AGENT_UNAVAILABLE = "agent_unavailable"
    PORT_UNREACHABLE = "port_unreachable"
    # host agents: joining, and what they send
    INVALID_SECRET = "invalid_secret"
    WRONG_HOST = "wrong_host"
    INVALID_JOIN_TOKEN = "invalid_join_token"
    JOIN_TOKEN_USED = "join_token_used"
    JOIN_TOKEN_EXPIRED = "join_token_expired"
    INVALID_ADDRESS = "invalid_address"
    INVALID_HOSTNAME = "invalid_hostname"
    REGION_MISMATCH = "region_mismatch"
    UNKNOWN_GPU_MODEL = "unknown_gpu_model"
    GPU_ALREADY_REGISTERED = "gpu_already_registered"
    HOSTNAME_TAKEN = "hostname_taken"


class DomainError(Exception):
    code = ErrorCode.CONFLICT
    status = 409

    def __init__(
        self, detail: str, *, code: ErrorCode | None = None, status: int | None = None
    ) -> None:
        super().__init__(detail)
        self.detail = detail
        if code is not None:
            # a string that is no ErrorCode fails here, where it is raised, not in a client
            self.code = ErrorCode(code)
        if status is not None:
            self.status = status

    def __str__(self) -> str:
        return self.detail
