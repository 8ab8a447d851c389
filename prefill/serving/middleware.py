"""ASGI middleware: request bodies decoded (zstd, gzip, deflate) within a size limit, and every request given an id
(`x-typesafe-request-id` on every response, answers and errors alike; the server's log line names it)."""

from __future__ import annotations

import contextvars
import json
import logging
import time
import uuid
import zlib

log = logging.getLogger("prefill.serving")
REQUEST_ID_HEADER = "x-typesafe-request-id"
_REQUEST_ID: contextvars.ContextVar[str] = contextvars.ContextVar("prefill_request_id", default="-")


def new_request_id() -> str:
    return f"req_{uuid.uuid4().hex}"


def request_id() -> str:
    """The id of the request being served (the header every response carries), "-" outside a request."""
    return _REQUEST_ID.get()


class RequestIds:
    """Every HTTP response gets `x-typesafe-request-id` (the official SDK puts it in its errors), and the server
    logs one line per request with it: id, method, path, status, seconds."""

    def __init__(self, app):
        self.app = app

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        rid = new_request_id()
        token = _REQUEST_ID.set(rid)
        start, status = time.perf_counter(), [500]

        async def send_with_id(message):
            if message["type"] == "http.response.start":
                status[0] = message["status"]
                message = {
                    **message,
                    "headers": [*message.get("headers", []), (REQUEST_ID_HEADER.encode(), rid.encode())],
                }
            await send(message)

        try:
            await self.app(scope, receive, send_with_id)
        finally:
            log.info(
                "%s %s %s %d %.3f s",
                rid,
                scope.get("method", ""),
                scope["path"],
                status[0],
                time.perf_counter() - start,
            )
            _REQUEST_ID.reset(token)


class DecodeBody:
    """Request bodies sent with Content-Encoding zstd (the official SDK's default when zstd is
    available), gzip or deflate are decompressed; an unknown encoding is a 415, an oversized body a 413."""

    def __init__(self, app, max_bytes: int):
        self.app = app
        self.max_bytes = max_bytes

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        headers = dict(scope.get("headers") or [])
        encoding = headers.get(b"content-encoding", b"identity").decode("latin-1").strip().lower()
        if encoding in ("", "identity") and not _too_long(headers, self.max_bytes):
            return await self.app(scope, receive, send)
        body, more = b"", True
        while more:
            message = await receive()
            body += message.get("body", b"")
            more = message.get("more_body", False)
            if len(body) > self.max_bytes:
                return await _respond(send, 413, "request_too_large", f"the body is over {self.max_bytes} bytes")
        try:
            body = _decompress(encoding, body, self.max_bytes)
        except LookupError:
            return await _respond(
                send,
                415,
                "unsupported_media_type",
                f"Content-Encoding {encoding!r} is not supported (zstd, gzip, deflate are)",
            )
        except OverflowError:
            return await _respond(send, 413, "request_too_large", f"the decoded body is over {self.max_bytes} bytes")
        except Exception:  # noqa: BLE001 — a corrupt stream is the client's error
            return await _respond(send, 400, "invalid_request_error", f"the body is not valid {encoding} data")
        new_headers = [(k, v) for k, v in scope["headers"] if k not in (b"content-encoding", b"content-length")]
        new_headers.append((b"content-length", str(len(body)).encode()))
        sent = False

        async def replay():
            nonlocal sent
            if sent:
                return await receive()
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}

        return await self.app({**scope, "headers": new_headers}, replay, send)


def _too_long(headers: dict, max_bytes: int) -> bool:
    try:
        return int(headers.get(b"content-length", b"0")) > max_bytes
    except ValueError:
        return True


def _decompress(encoding: str, body: bytes, limit: int) -> bytes:
    if encoding in ("", "identity"):
        return body
    if encoding == "zstd":
        try:
            from compression import zstd  # Python 3.14+
        except ImportError:
            from backports import zstd
        out = zstd.ZstdDecompressor().decompress(body, max_length=limit + 1)
    elif encoding in ("gzip", "x-gzip"):
        out = zlib.decompressobj(wbits=16 + zlib.MAX_WBITS).decompress(body, limit + 1)
    elif encoding == "deflate":
        out = zlib.decompressobj().decompress(body, limit + 1)
    else:
        raise LookupError(encoding)
    if len(out) > limit:
        raise OverflowError
    return out


async def _respond(send, status: int, error_type: str, message: str) -> None:
    raw = json.dumps({"detail": {"error_type": error_type, "message": message}}).encode()
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(raw)).encode())],
        }
    )
    await send({"type": "http.response.body", "body": raw})
