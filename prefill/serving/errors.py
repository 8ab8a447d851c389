"""Errors in TypeSafe's shapes: a validation error (422) `{"detail": [{loc, msg, type}]}`, anything else
`{"detail": {error_type, message}}`. A bad request is never a 5xx; what prefill cannot read (image assets, a
multipart body, a box question) is a 400 that says so, never an answer that ignores part of the request."""

from __future__ import annotations

import logging

from fastapi import Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from ..schema import NEEDS_IMAGES, UNSUPPORTED
from .middleware import request_id

log = logging.getLogger("prefill.serving")


class ApiError(Exception):
    def __init__(self, status: int, error_type: str, message: str, headers: dict[str, str] | None = None):
        super().__init__(message)
        self.status, self.error_type, self.message, self.headers = status, error_type, message, headers


def _error(status: int, error_type: str, message: str, headers: dict[str, str] | None = None) -> JSONResponse:
    return JSONResponse({"detail": {"error_type": error_type, "message": message}}, status, headers=headers)


async def _api_error(_: Request, exc: ApiError):
    return _error(exc.status, exc.error_type, exc.message, exc.headers)


async def _http_error(_: Request, exc: StarletteHTTPException):
    kinds = {404: "not_found_error", 405: "method_not_allowed", 413: "request_too_large", 415: "unsupported_media_type"}
    message = exc.detail if isinstance(exc.detail, str) else str(exc.detail)
    return _error(exc.status_code, kinds.get(exc.status_code, "invalid_request_error"), message, exc.headers)


async def _validation_error(request: Request, exc: RequestValidationError):
    """422 with the detail list; but what the API has and a text model cannot read (an image asset, a box question,
    a multipart body: the official SDK sends images as multipart parts) is a 400 that says so."""
    refused = [err["msg"] for err in exc.errors() if err.get("type") == UNSUPPORTED]
    if request.headers.get("content-type", "").lower().startswith("multipart/"):
        refused.append(NEEDS_IMAGES.format(what="multipart requests (the API's way of sending images)"))
    if refused:
        return _error(400, "invalid_request_error", refused[0])
    detail = [
        {"loc": list(err.get("loc", ())), "msg": err.get("msg", ""), "type": err.get("type", "")}
        for err in exc.errors()
    ]
    return JSONResponse({"detail": detail}, 422)


async def _internal_error(_: Request, exc: Exception):
    log.exception("internal error in request %s", request_id(), exc_info=exc)
    return _error(500, "internal_error", "internal error; the server log has the details")


ERROR_HANDLERS = {
    ApiError: _api_error,
    StarletteHTTPException: _http_error,
    RequestValidationError: _validation_error,
    Exception: _internal_error,
}
