"""The one error type the agent's API answers with: `{"error": code, "detail": text}`."""


class ApiError(Exception):
    def __init__(self, status: int, code: str, detail: str):
        super().__init__(detail)
        self.status = status
        self.code = code
        self.detail = detail


def invalid(detail: str, code: str = "invalid_body") -> ApiError:
    return ApiError(400, code, detail)


def conflict(code: str, detail: str) -> ApiError:
    return ApiError(409, code, detail)
