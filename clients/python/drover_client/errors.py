"""Typed exceptions of the drover client.

Every error the daemon answers becomes an :class:`RpcError` subclass chosen by its reason word
(docs/protocol.md, "Errors"), carrying `reason`, `code`, `detail` and, for `invalid_params`,
the offending `field`. Failures of the client itself (no daemon, a refused token, a connection
that could not be re-established in time) have their own classes.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any


class DroverError(Exception):
    """Base class of every exception this package raises."""


class DaemonNotRunning(DroverError):
    """`<home>/daemon.json` is missing, unreadable, or names a process that is not running."""

    def __init__(self, home: Path, detail: str) -> None:
        super().__init__(f"no drover daemon for home {home}: {detail}")
        self.home = home
        self.detail = detail


class AuthenticationFailed(DroverError):
    """The daemon refused the WebSocket upgrade (HTTP 401: token wrong; 403: Origin sent)."""

    def __init__(self, url: str, status: int) -> None:
        super().__init__(f"the daemon at {url} refused the connection with HTTP {status}")
        self.url = url
        self.status = status


class ConnectionLost(DroverError):
    """The connection dropped and could not be re-established within the reconnect timeout."""

    def __init__(self, detail: str, last_error: BaseException | None = None) -> None:
        super().__init__(detail if last_error is None else f"{detail}: {last_error}")
        self.detail = detail
        self.last_error = last_error


class ProtocolViolation(DroverError):
    """The daemon answered something the protocol does not allow (a gap in `seq`, say)."""


class RpcError(DroverError):
    """An error answer of the daemon. Subclasses name the reason."""

    #: The reason word this class stands for (`None` on the base class).
    REASON: str | None = None

    def __init__(
        self,
        method: str,
        code: int,
        reason: str,
        detail: str,
        field: str | None,
        data: dict[str, Any],
    ) -> None:
        where = f" (field {field!r})" if field else ""
        super().__init__(f"{method}: {reason}{where}: {detail}" if detail else f"{method}: {reason}{where}")
        self.method = method
        self.code = code
        self.reason = reason
        self.detail = detail
        self.field = field
        self.data = data


class ParseError(RpcError):
    REASON = "parse_error"


class InvalidRequest(RpcError):
    REASON = "invalid_request"


class UnknownMethod(RpcError):
    REASON = "unknown_method"


class InvalidParams(RpcError):
    """A parameter is missing, has the wrong type or an invalid value; `field` names it."""

    REASON = "invalid_params"


class NotFound(RpcError):
    REASON = "not_found"


class PermissionDenied(RpcError):
    """The connection is not attached to the session (the client attaches on create/resume)."""

    REASON = "permission_denied"


class StaleGeneration(RpcError):
    REASON = "stale_generation"


class UnknownExecution(RpcError):
    REASON = "unknown_execution"


class AdmissionConflict(RpcError):
    """An `input_id` was reused with a different `text`."""

    REASON = "admission_conflict"


class RuntimeDraining(RpcError):
    REASON = "runtime_draining"


class StaleEpoch(RpcError):
    REASON = "stale_epoch"


class StorageUnavailable(RpcError):
    REASON = "storage_unavailable"


class ModelUnavailable(RpcError):
    REASON = "model_unavailable"


_BY_REASON: dict[str, type[RpcError]] = {
    cls.REASON: cls
    for cls in (
        ParseError,
        InvalidRequest,
        UnknownMethod,
        InvalidParams,
        NotFound,
        PermissionDenied,
        StaleGeneration,
        UnknownExecution,
        AdmissionConflict,
        RuntimeDraining,
        StaleEpoch,
        StorageUnavailable,
        ModelUnavailable,
    )
    if cls.REASON is not None
}


def error_from_wire(method: str, error: Any) -> RpcError:
    """Builds the exception for a JSON-RPC `error` object (tolerating a malformed one)."""
    if not isinstance(error, dict):
        return RpcError(method, 0, "invalid_response", f"error is not an object: {error!r}", None, {})
    code = error.get("code")
    data = error.get("data")
    data = data if isinstance(data, dict) else {}
    reason = data.get("reason") or error.get("message") or "unknown"
    detail = data.get("detail") or ""
    field = data.get("field")
    cls = _BY_REASON.get(str(reason), RpcError)
    return cls(
        method,
        code if isinstance(code, int) else 0,
        str(reason),
        str(detail),
        field if isinstance(field, str) else None,
        data,
    )
