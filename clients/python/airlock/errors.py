"""The API's errors as exceptions: one class per error code.

Every failed call raises an AirlockError subclass named for the code the
server answered (docs/api.md, "Errors"), carrying the HTTP status, the code,
the server's message and its details. Match on the class, as one matches on
the code: never on the message.
"""

from __future__ import annotations

from typing import Any


# _CLASS_STATUS, as an error's status, keeps the status of its class: that
# of its code.
_CLASS_STATUS: Any = object()


class AirlockError(Exception):
    """A call that the server refused or could not carry out.

    status is the HTTP status (None when no answer came), code the API's
    error code ("not_found"), message what was wrong and what to do, details
    the server's structured details, if any. operation is set when the error
    is that of a failed asynchronous operation, and retry_after (seconds)
    when the server said when to try again.
    """

    code = "unknown"
    status: int | None = None

    def __init__(self, message: str, *, status: Any = _CLASS_STATUS, code: str | None = None,
                 details: dict[str, Any] | None = None, retry_after: float | None = None,
                 operation: Any = None) -> None:
        super().__init__(message)
        self.message = message
        if status is not _CLASS_STATUS:
            self.status = status
        if code is not None:
            self.code = code
        self.details = details or {}
        self.retry_after = retry_after
        self.operation = operation

    def __str__(self) -> str:
        return self.message


class InvalidArgument(AirlockError):
    """400: the request is wrong in itself (a bad field, a relative path)."""
    code, status = "invalid_argument", 400


class Unauthenticated(AirlockError):
    """401: no key, an unknown or revoked key, or a spent attach token."""
    code, status = "unauthenticated", 401


class PermissionDenied(AirlockError):
    """403: the call needs an admin key, or the policy refuses an address."""
    code, status = "permission_denied", 403


class NotFound(AirlockError):
    """404: no such sandbox, command, checkpoint, path…, or one the key may not see."""
    code, status = "not_found", 404


class Conflict(AirlockError):
    """409: the current state does not allow the request; the message names it."""
    code, status = "conflict", 409


class PayloadTooLarge(AirlockError):
    """413: a body over the server's limit."""
    code, status = "payload_too_large", 413


class ResourceExhausted(AirlockError):
    """429: a limit or a host-wide cap is reached; retry_after says when to retry."""
    code, status = "resource_exhausted", 429


class InternalError(AirlockError):
    """500: a failure inside airlock; the server log has more."""
    code, status = "internal", 500


class Unavailable(AirlockError):
    """503, or no answer at all: a failure that may pass. Retry."""
    code, status = "unavailable", 503


class ProtocolError(AirlockError):
    """An answer that does not follow the API's contract."""
    code = "protocol"


_BY_CODE: dict[str, type[AirlockError]] = {
    cls.code: cls for cls in (InvalidArgument, Unauthenticated, PermissionDenied, NotFound,
                              Conflict, PayloadTooLarge, ResourceExhausted, InternalError, Unavailable)
}
_BY_STATUS: dict[int, type[AirlockError]] = {cls.status: cls for cls in _BY_CODE.values()
                                             if cls.status is not None}


def error_for(code: str | None, message: str, *, status: int | None = None, **kw: Any) -> AirlockError:
    """Returns the exception for an error code, or for the HTTP status when
    the code is unknown (an answer from a proxy in between, say). Without a
    status (the error of an operation), it is the code's."""
    cls = _BY_CODE.get(code or "") or _BY_STATUS.get(status or 0) or AirlockError
    return cls(message, status=_CLASS_STATUS if status is None else status, code=code or None, **kw)
