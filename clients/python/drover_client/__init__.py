"""drover-client: an asyncio client for the drover daemon (docs/protocol.md).

Owns the client side of the WebSocket JSON-RPC protocol: reading `<home>/daemon.json`,
authenticating, the methods, typed errors, and an event stream that survives dropped
connections, owner restarts and handoffs (`drover restart`, reported to `on_restart`) without
yielding an event twice or skipping one.

Layers: `types` (wire shapes, generated from `schema/` by `scripts/gen_types.py`), `errors`
(typed exceptions), `_rpc` (one connection: requests and routed events), `client` (`Client`,
`Session`).

    import asyncio
    from drover_client import Client

    async def main() -> None:
        async with await Client.connect("~/.drover") as client:
            session = await client.create_session(cwd="/tmp")
            receipt = await session.submit("What kernel is this?")
            async for event in session.events():
                print(event["seq"], event["type"])
                if event["type"] == "turn.settled" and event["payload"]["admission_id"] == receipt["admission_id"]:
                    break

    asyncio.run(main())
"""

from ._rpc import DaemonRestarted
from .client import Client, Session, default_home, read_daemon_info
from .errors import (
    AdmissionConflict,
    AuthenticationFailed,
    ConnectionLost,
    DaemonNotRunning,
    DroverError,
    InvalidParams,
    InvalidRequest,
    ModelUnavailable,
    NotFound,
    ParseError,
    PermissionDenied,
    ProtocolViolation,
    RpcError,
    RuntimeDraining,
    StaleEpoch,
    StaleGeneration,
    StorageUnavailable,
    UnknownExecution,
    UnknownMethod,
)
from .types import Event, Receipt, SessionSnapshot

__all__ = [
    "AdmissionConflict",
    "AuthenticationFailed",
    "Client",
    "ConnectionLost",
    "DaemonNotRunning",
    "DaemonRestarted",
    "DroverError",
    "Event",
    "InvalidParams",
    "InvalidRequest",
    "ModelUnavailable",
    "NotFound",
    "ParseError",
    "PermissionDenied",
    "ProtocolViolation",
    "Receipt",
    "RpcError",
    "RuntimeDraining",
    "Session",
    "SessionSnapshot",
    "StaleEpoch",
    "StaleGeneration",
    "StorageUnavailable",
    "UnknownExecution",
    "UnknownMethod",
    "default_home",
    "read_daemon_info",
]
