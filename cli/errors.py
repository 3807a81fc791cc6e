"""What a command refuses or cannot do: one line (and field errors) on stderr, exit status 1."""


class CliError(Exception):
    def __init__(self, message: str, fields: dict | None = None, code: str | None = None):
        super().__init__(message)
        self.fields = fields or {}
        self.code = code  # the API's error code, when the API refused
