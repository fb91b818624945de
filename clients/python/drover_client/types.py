"""Wire types of drover's client protocol (docs/protocol.md), as TypedDicts.

This module is the only place that spells the shapes of params, results and events. It is
written by hand from docs/protocol.md and the owner's code (crates/owner/src/rpc.rs) for now,
and is meant to be replaced by a module generated from the checked-in JSON Schema (`schema/`,
written by `drover protocol schema --out schema`), for example with

    datamodel-codegen --input schema/ --input-file-type jsonschema \
        --output-model-type typing.TypedDict --target-python-version 3.11 \
        --use-standard-collections --use-union-operator \
        --output drover_client/types.py

What that step needs from the schema: one definition per result and event payload named as
below (`SessionSnapshot`, `Receipt`, `EventsSince`, ...), string enums for `status`, `outcome`,
`role` and `kind`, `required` lists that match which keys are always present (a key that is
always present but may be `null` is required and nullable), and no `additionalProperties: false`
on results (the daemon may add keys; a client must ignore what it does not know). The client
(`client.py`) only reads the keys named here, by these names.
"""

from __future__ import annotations

from typing import Any, Literal, NotRequired, TypedDict

AdmissionStatus = Literal["queued", "started", "unknown", "terminal"]
"""Where an admission stands: `queued` -> `started` -> `terminal`, or via `unknown`."""

Outcome = Literal["completed", "interrupted", "failed", "rejected", "cancelled"]
"""The outcome of a terminal admission."""

TurnOutcome = Literal["completed", "interrupted", "failed", "unknown"]
"""The outcome in `turn.settled`: a turn lost to a crash is `unknown`."""

ApprovalChoice = Literal["once", "session", "always", "deny"]

EventType = Literal[
    "turn.started",
    "message.delta",
    "tool.start",
    "tool.complete",
    "approval.request",
    "clarify.request",
    "approval.settled",
    "clarify.settled",
    "message.complete",
    "turn.settled",
    "admission.updated",
    "turn.progress",
]


class DaemonInfo(TypedDict):
    """`<home>/daemon.json`, written by the daemon once it is ready."""

    pid: int
    epoch: int
    instance_id: str
    url: str
    token: str
    started_at: float


# ---- results ---------------------------------------------------------------------------------


class Pong(TypedDict):
    pong: bool


class Message(TypedDict):
    """One transcript entry of `session.resume`."""

    id: int
    role: Literal["system", "user", "assistant", "tool"]
    content: str | None
    tool_calls: list[dict[str, Any]] | None
    tool_call_id: str | None
    tool_name: str | None
    created_at: float


class PendingAdmission(TypedDict):
    admission_id: str
    input_id: str
    text: str
    sequence: int
    status: AdmissionStatus
    execution_generation: int | None


class ApprovalPrompt(TypedDict):
    kind: Literal["approval"]
    prompt_id: str
    execution_generation: int
    command: str
    description: str
    pattern_key: str
    choices: list[ApprovalChoice]


class ClarifyPrompt(TypedDict):
    kind: Literal["clarify"]
    prompt_id: str
    execution_generation: int
    question: str
    choices: list[str]
    multi_select: bool


Prompt = ApprovalPrompt | ClarifyPrompt


class BackgroundProcess(TypedDict):
    id: str
    pid: int
    start_time: int
    command: str
    cwd: str
    log_path: str
    status: Literal["running", "exited", "killed", "lost"]
    exit_code: int | None
    started_at: float


class SessionInfo(TypedDict):
    model: str
    cwd: str
    source: str
    toolsets: list[str]
    title: str | None


class SessionSnapshot(TypedDict):
    """The result of `session.create` and `session.resume`."""

    session_id: str
    messages: list[Message]
    pending: list[PendingAdmission]
    prompts: list[Prompt]
    running: bool
    processes: list[BackgroundProcess]
    jobs: list[dict[str, Any]]
    execution_generation: int
    replay_epoch: str
    last_sequence: int
    info: SessionInfo


class SessionRow(TypedDict):
    session_id: str
    title: str | None
    source: str
    parent_session_id: str | None
    model: str
    started_at: float
    ended_at: float | None
    running: bool
    pending_count: int
    error: NotRequired[str]


class SessionList(TypedDict):
    sessions: list[SessionRow]
    next_cursor: str | None


class Usage(TypedDict):
    input_tokens: int
    output_tokens: int
    total_tokens: int


class Receipt(TypedDict):
    """The admission receipt of `prompt.submit`, `prompt.receipt`, `prompt.cancel` and
    `prompt.resolve_unknown`. `usage` and `result` only with `include_result` on a terminal
    admission that has a stored result."""

    admission_id: str
    session_id: str
    sequence: int
    status: AdmissionStatus
    outcome: Outcome | None
    execution_generation: int | None
    usage: NotRequired[Usage | None]
    result: NotRequired[dict[str, Any] | None]


class InterruptResult(TypedDict):
    execution_state: Literal["interrupting"]


class RespondResult(TypedDict):
    status: Literal["resolved", "already_resolved"]
    prompt_id: str


class Event(TypedDict):
    """The params of an `event` notification, and one entry of `session.events.since`.

    `seq` is `None` only for `message.delta` (live only, never stored or replayed).
    """

    session_id: str
    seq: int | None
    replay_epoch: str
    type: str
    payload: dict[str, Any]


class EventsSince(TypedDict):
    events: list[Event]
    last_sequence: int
    replay_epoch: str
    snapshot_required: bool
    has_more: NotRequired[bool]


class ErrorData(TypedDict):
    reason: str
    detail: NotRequired[str]
    field: NotRequired[str]


class ErrorObject(TypedDict):
    code: int
    message: str
    data: NotRequired[ErrorData]
