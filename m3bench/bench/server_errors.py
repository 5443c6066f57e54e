"""The server's error contract: every error is OpenAI's `{"error": {"message", "type", "param", "code"}}`.

    install_error_handlers(app)      # 404 / 405 / 422 / 500 in that shape; a 500 never carries the exception text
    body = parse_json_body(raw)      # 400 for non-JSON, over-deep nesting (the parser's recursion is not the client's 500)

Internal errors log their traceback (logger `m3bench.serve`) and answer a fixed message.
"""

from __future__ import annotations

import json
import logging
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

MAX_JSON_DEPTH = 32  # deepest nesting a request body may have (a chat message's content parts are depth 4)
INTERNAL_MESSAGE = "internal server error (the traceback is in the server's log)"
LOG = logging.getLogger("m3bench.serve")

KIND_OF_STATUS = {400: "BadRequestError", 401: "AuthenticationError", 404: "NotFoundError",
                  405: "MethodNotAllowedError", 413: "RequestTooLarge", 422: "UnprocessableEntityError",
                  500: "InternalServerError", 503: "ServiceUnavailableError"}


class ApiError(Exception):
    """An HTTP error answered in OpenAI's shape (`param`: the request field at fault, when known)."""

    def __init__(self, status: int, message: str, kind: str = "BadRequestError", param: str | None = None) -> None:
        super().__init__(message)
        self.status, self.message, self.kind, self.param = status, message, kind, param


def error_body(status: int, message: str, kind: str | None = None, param: str | None = None) -> dict:
    return {"error": {"message": message, "type": kind or KIND_OF_STATUS.get(status, "Error"), "param": param,
                      "code": status}}


def error_response(e: ApiError) -> JSONResponse:
    return JSONResponse(error_body(e.status, e.message, e.kind, e.param), status_code=e.status)


def internal_error_body(e: BaseException) -> dict:
    """Log `e` with its traceback; the body a client gets instead (no exception text)."""
    LOG.error("internal error while answering a request", exc_info=e)
    return error_body(500, INTERNAL_MESSAGE, "InternalServerError")


def install_error_handlers(app: FastAPI) -> None:
    """ApiError, routing errors (404 / 405), FastAPI's validation (422) and anything else (500), one shape."""

    @app.exception_handler(ApiError)
    async def api_error(_: Request, e: ApiError):
        return error_response(e)

    @app.exception_handler(StarletteHTTPException)
    async def http_error(_: Request, e: StarletteHTTPException):
        message = {404: "no such route", 405: "method not allowed on this route"}.get(e.status_code, str(e.detail))
        return JSONResponse(error_body(e.status_code, message), status_code=e.status_code, headers=e.headers)

    @app.exception_handler(RequestValidationError)
    async def validation_error(_: Request, e: RequestValidationError):
        return JSONResponse(error_body(422, "invalid request parameters"), status_code=422)

    @app.exception_handler(Exception)
    async def internal_error(_: Request, e: Exception):
        return JSONResponse(internal_error_body(e), status_code=500)


def json_depth(value: Any, limit: int) -> int:
    """Nesting depth of a parsed JSON value (a scalar is 0), counted without recursion; stops past `limit`."""
    deepest, stack = 0, [(value, 0)]
    while stack:
        node, depth = stack.pop()
        deepest = max(deepest, depth)
        if deepest > limit:
            return deepest
        children = node.values() if isinstance(node, dict) else node if isinstance(node, list) else ()
        stack.extend((child, depth + 1) for child in children)
    return deepest


def parse_json_body(raw: bytes) -> Any:
    """The body as JSON, or a 400: not JSON, not UTF-8, or nested deeper than MAX_JSON_DEPTH."""
    try:
        body = json.loads(raw)
    except (ValueError, UnicodeDecodeError) as e:  # not JSON, or an integer of more than 4,300 digits
        raise ApiError(400, f"body is not JSON: {str(e)[:200]}") from None
    except RecursionError:
        raise ApiError(400, f"body nested deeper than {MAX_JSON_DEPTH} levels") from None
    if json_depth(body, MAX_JSON_DEPTH) > MAX_JSON_DEPTH:
        raise ApiError(400, f"body nested deeper than {MAX_JSON_DEPTH} levels")
    return body
