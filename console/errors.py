"""The one family of domain errors: a rule said no.

Every error a business function raises on purpose is a ``DomainError`` with a stable
``code`` (what clients switch on), a ``detail`` (a sentence for a person) and the HTTP
``status`` it means. The API answers it as ``{"code", "detail"}`` with that status
(console.api.errors.exception_handler), pages show ``detail`` as an error message; neither
wraps it again. Subclasses only fix a default code and status."""


class DomainError(Exception):
    code = "conflict"
    status = 409

    def __init__(self, detail: str, *, code: str | None = None, status: int | None = None):
        super().__init__(detail)
        self.detail = detail
        if code is not None:
            self.code = code
        if status is not None:
            self.status = status

    def __str__(self) -> str:
        return self.detail
