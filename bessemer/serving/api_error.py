"""ApiError: a request the server refuses, in OpenAI's error shape
`{"error": {message, type, param, code}}` with its HTTP status."""

from __future__ import annotations


class ApiError(Exception):
    def __init__(self, status: int, message: str, type: str = "invalid_request_error",
                 param: str | None = None, code: str | None = None):
        super().__init__(message)
        self.status, self.message, self.type, self.param, self.code = status, message, type, param, code

    def body(self) -> dict:
        return error_body(self.message, self.type, self.param, self.code)


def error_body(message: str, type: str = "invalid_request_error", param: str | None = None,
               code: str | None = None) -> dict:
    return {"error": {"message": message, "type": type, "param": param, "code": code}}
