//! Owner <-> worker frames (SPEC section 4).
//!
//! One JSON object per line on the worker's stdin/stdout, at most [`MAX_FRAME_BYTES`] per line.
//! Every frame has a `type` tag. The owner speaks first with [`OwnerFrame::Bootstrap`] (the
//! head: scope, policy and a part count), then the [`BootstrapBody`] (history and input): as
//! one [`OwnerFrame::BootstrapBody`] frame when it fits in one, else in that many
//! [`OwnerFrame::BootstrapPart`] frames whose texts, joined, are its JSON, so a history of any
//! length reaches the worker in bounded frames ([`Bootstrap::into_frames`], read back with
//! [`BodyFrame`] and [`Bootstrap::assemble`]).

use std::collections::BTreeMap;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::Value;
use tokio::io::{AsyncBufRead, AsyncBufReadExt};

use crate::chat::{ChatMessage, Usage};
use crate::policy::{ApprovalMode, ContextBudget, ModelSettings};
use crate::secret::Secret;

/// The largest frame either side accepts, newline excluded (SPEC section 4: 4 MiB).
pub const MAX_FRAME_BYTES: usize = 4 * 1024 * 1024;

/// How a spare file in a worker's outbox folder is named: this, then a number. A worker turns
/// an answered frame file into an empty spare file instead of deleting it and reuses it for a
/// later frame; the owner recycles a finished worker's folder that holds only spare files for
/// a later turn (no inode is created or deleted per turn; docs/decisions.md,
/// "Recycled outbox folders").
pub const OUTBOX_SPARE_PREFIX: &str = ".spare-";

/// The most spare files a worker keeps in its outbox folder (more are deleted), and the most
/// files a folder the owner recycles may hold.
pub const OUTBOX_SPARES_MAX: usize = 4;

/// The owner's messages with its worker template ("a lean worker start"): one
/// `SOCK_SEQPACKET` message each way per spare. The owner sends [`template::FORK_REQUEST`] with
/// [`template::REQUEST_FDS`] descriptors (the spare's stdin, stdout and stderr); the template
/// answers with a [`template::ForkReply`], with the spare's pidfd attached when it forked one.
pub mod template {
    /// What the owner sends to ask for a spare.
    pub const FORK_REQUEST: &[u8] = b"fork";
    /// How many descriptors a request carries: stdin, stdout, stderr, in that order.
    pub const REQUEST_FDS: usize = 3;

    /// The template's answer: the spare's pid, or the errno of why there is none.
    #[derive(Debug, Clone, Copy, PartialEq, Eq)]
    pub struct ForkReply {
        /// The forked spare's pid; 0 when none was forked.
        pub pid: i32,
        /// Why none was forked (an errno); 0 when one was.
        pub errno: i32,
    }

    impl ForkReply {
        /// Its length on the wire: two little-endian `i32`s.
        pub const LEN: usize = 8;

        /// The wire form.
        pub fn to_bytes(self) -> [u8; ForkReply::LEN] {
            let mut bytes = [0u8; ForkReply::LEN];
            bytes[..4].copy_from_slice(&self.pid.to_le_bytes());
            bytes[4..].copy_from_slice(&self.errno.to_le_bytes());
            bytes
        }

        /// Reads the wire form; `None` when it is not [`ForkReply::LEN`] bytes.
        pub fn parse(bytes: &[u8]) -> Option<ForkReply> {
            let bytes: [u8; ForkReply::LEN] = bytes.try_into().ok()?;
            let (pid, errno) = bytes.split_at(4);
            Some(ForkReply {
                pid: i32::from_le_bytes(pid.try_into().ok()?),
                errno: i32::from_le_bytes(errno.try_into().ok()?),
            })
        }
    }

    #[cfg(test)]
    mod tests {
        use super::ForkReply;

        #[test]
        fn a_reply_reads_back_and_a_short_one_is_refused() {
            let reply = ForkReply {
                pid: 4242,
                errno: 0,
            };
            assert_eq!(ForkReply::parse(&reply.to_bytes()), Some(reply));
            let failed = ForkReply { pid: 0, errno: 11 };
            assert_eq!(ForkReply::parse(&failed.to_bytes()), Some(failed));
            assert_eq!(ForkReply::parse(&reply.to_bytes()[..7]), None);
        }
    }
}

/// The most JSON text one [`OwnerFrame::BootstrapPart`] carries (1 MiB). JSON text holds no
/// control characters, so escaping it as a string at most doubles it (only `"` and `\` are
/// escaped): a part frame stays under half of [`MAX_FRAME_BYTES`].
pub const BOOTSTRAP_PART_BYTES: usize = 1024 * 1024;

/// Operation names of `persist` frames (SPEC section 4).
pub mod op {
    /// Append messages to the transcript ([`TranscriptAppend`](super::TranscriptAppend)).
    pub const TRANSCRIPT_APPEND: &str = "transcript.append";
    /// Add one model request's usage ([`UsageAdd`](super::UsageAdd)).
    pub const USAGE_ADD: &str = "usage.add";
    /// Open a prompt and wait for its answer ([`PromptOpen`](super::PromptOpen); the receipt is deferred).
    pub const PROMPT_OPEN: &str = "prompt.open";
    /// Register a background process ([`BackgroundProcess`](super::BackgroundProcess)).
    pub const PROCESS_REGISTER: &str = "process.register";
    /// A background process left `running` ([`ProcessUpdate`](super::ProcessUpdate)).
    pub const PROCESS_UPDATE: &str = "process.update";
    /// Reserve a child agent's session ([`ChildReserve`](super::ChildReserve)).
    pub const CHILD_RESERVE: &str = "child.reserve";
    /// Record a job the `jobs` toolset registered ([`JobRegister`](super::JobRegister)).
    pub const JOB_REGISTER: &str = "job.register";
    /// An MCP server of the turn changed state
    /// ([`McpServerStatus`](crate::mcp::McpServerStatus)); stored as an `mcp.status` event.
    pub const MCP_STATUS: &str = "mcp.status";
    /// Store a summary of older history ([`CompactionRecord`](super::CompactionRecord)) with the
    /// usage of the requests that made it.
    pub const COMPACTION_RECORD: &str = "compaction.record";
    /// Record the context window the endpoint reported for the session's model
    /// ([`ContextWindowFound`](super::ContextWindowFound)).
    pub const CONTEXT_WINDOW: &str = "model.context_window";
    /// Settle the turn ([`ExecutionFinish`](super::ExecutionFinish)); the last persist of an execution.
    pub const EXECUTION_FINISH: &str = "execution.finish";
}

/// Frames from the owner to the worker.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum OwnerFrame {
    /// First frame of every execution: the bootstrap's head. Its `body_parts` part frames
    /// follow at once, before any other frame.
    Bootstrap(Box<BootstrapHead>),
    /// The execution's whole [`BootstrapBody`] as a JSON object, when its frame fits in
    /// [`MAX_FRAME_BYTES`] (the head then announces one part). Lean worker start: a body sent as text
    /// parts is escaped by the owner and unescaped by the worker, a cost that grows with the
    /// session's history on every turn. Read with [`BodyFrame`].
    BootstrapBody {
        /// The JSON of the [`BootstrapBody`], written as it was serialized.
        body: RawBody,
    },
    /// One piece of the JSON text of the execution's [`BootstrapBody`], in order.
    BootstrapPart {
        /// At most [`BOOTSTRAP_PART_BYTES`] of the text, cut at a character boundary.
        text: String,
    },
    /// The persist with this `sequence` was applied (or had been); `result` is its receipt.
    Receipt {
        /// The persist answered.
        sequence: u64,
        /// Its receipt.
        result: Value,
    },
    /// The persist with this `sequence` was refused with a spec reason word; the worker must
    /// not resend it.
    Refused {
        /// The refused persist.
        sequence: u64,
        /// The spec reason word.
        reason: String,
        /// A sentence for humans.
        message: String,
    },
    /// Stop the turn now (interrupt or owner drain); settle with outcome `interrupted`.
    Stop {
        /// Why (`interrupted`, `runtime_draining`, `parent_finished`).
        reason: String,
    },
    /// The session's approval mode changed while the turn runs (`session.set_mode`): the
    /// turn's next approval decision uses `mode` instead of its policy's `approvals`.
    Approvals {
        /// The mode from now on (the home's `deny` floor already applied).
        mode: ApprovalMode,
    },
}

/// Frames from the worker to the owner.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum WorkerFrame {
    /// A sequence-numbered, idempotent write.
    Persist(PersistFrame),
    /// Several persists of consecutive sequences, applied in one ledger transaction: every
    /// one of them or none (docs/decisions.md, "Batched persists"). The owner answers each
    /// sequence with its own `receipt`, or, when one operation is refused, every sequence of
    /// the batch with a `refused` carrying that operation's reason. [`op::PROMPT_OPEN`] and
    /// [`op::CHILD_RESERVE`] (their receipts come later) travel alone, never in a batch.
    PersistBatch {
        /// The persists, in sequence order, each a whole [`PersistFrame`] of the same
        /// execution.
        persists: Vec<PersistFrame>,
    },
    /// The worker has read its whole bootstrap and starts the turn now: its first frame,
    /// written before it does anything of the turn (docs/workers.md, "The bootstrap is
    /// acknowledged"). Until it arrives nothing of the turn has run, so the owner may give the
    /// turn to a fresh worker when this one dies, stops or stays silent.
    Started,
    /// Live assistant text (becomes `message.delta`; never stored).
    Delta {
        /// The piece of text.
        text: String,
    },
}

/// The execution's identity and credentials.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Scope {
    /// The session.
    pub session_id: String,
    /// The admission the turn runs.
    pub admission_id: String,
    /// This execution.
    pub execution_id: String,
    /// The turn's generation.
    pub generation: u64,
    /// The owner's runtime epoch; a write from an older epoch is `stale_epoch`.
    pub epoch: u64,
    /// Per-execution secret; the owner keeps only its SHA-256 digest.
    pub secret: Secret,
}

/// The session's frozen policy (SPEC section 4, "Frozen session"), plus runtime limits.
///
/// Read through [`PolicyFields`], its fields as they are on the wire: a `#[serde(flatten)]`
/// field would make serde copy the whole policy into an intermediate tree before reading it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(from = "PolicyFields")]
pub struct Policy {
    /// The model name.
    pub model: String,
    /// The model endpoint.
    pub base_url: String,
    #[serde(default)]
    /// The session's API key, if it has one (else the daemon's environment).
    pub api_key: Option<Secret>,
    /// `stream`, `request_timeout_s`, `max_retries` and `stall_timeout_s`, as top-level fields of
    /// the policy.
    #[serde(flatten)]
    pub model_settings: ModelSettings,
    /// The frozen system prompt.
    pub system_prompt: String,
    /// The session's toolsets.
    pub toolsets: Vec<String>,
    /// Tool schemas as frozen at `session.create`, sent byte for byte.
    pub tools: Vec<Value>,
    /// The tools' working directory.
    pub cwd: String,
    /// Upper bound on model requests in one turn.
    pub max_steps: u32,
    /// `approvals.mode`: `manual`, `auto` or `deny`.
    #[serde(default)]
    pub approvals: ApprovalMode,
    /// The drover home (for outbox and logs).
    pub home: String,
    /// Approval pattern keys already granted: the session's `session` choices and the home's
    /// `always` rules (SPEC section 6).
    #[serde(default)]
    pub approval_grants: Vec<String>,
    /// The session's background processes as the ledger knows them at claim time (SPEC
    /// section 6: the next turn's worker can see them); the `process` tool checks each one's
    /// liveness itself.
    #[serde(default)]
    pub background_processes: Vec<BackgroundProcess>,
    /// The MCP servers of the session's toolsets, by server name, from the owner's config at
    /// claim time (SPEC section 6, MCP). The worker starts the ones its turn calls.
    #[serde(default)]
    pub mcp_servers: BTreeMap<String, McpServerSpec>,
    /// The home's `[mqtt]` settings, from the owner's config at claim time: the `jobs`
    /// toolset's wire (SPEC section 7, "Wire settings"; `$DROVER_MQTT_URL` still wins).
    #[serde(default)]
    pub jobs_wire: JobsWire,
    /// How every tool process of the turn is confined (`docs/sandbox.md`); an owner
    /// that sends none means `off`.
    #[serde(default)]
    pub sandbox: crate::sandbox::SandboxPolicy,
    /// The session's context budget. Its `context_window` is the frozen
    /// `[model] context_window`, else the one an earlier turn found at the endpoint, else 0
    /// (the worker asks the endpoint when the history grows large enough to matter).
    #[serde(default)]
    pub context: ContextBudget,
}

/// [`Policy`] as it is on the wire, read in one pass: [`ModelSettings`]' fields are flat here
/// (each missing one takes its default).
#[derive(Deserialize)]
struct PolicyFields {
    model: String,
    base_url: String,
    #[serde(default)]
    api_key: Option<Secret>,
    #[serde(default)]
    stream: Option<bool>,
    #[serde(default)]
    request_timeout_s: Option<u64>,
    #[serde(default)]
    max_retries: Option<u32>,
    #[serde(default)]
    stall_timeout_s: Option<u64>,
    system_prompt: String,
    toolsets: Vec<String>,
    tools: Vec<Value>,
    cwd: String,
    max_steps: u32,
    #[serde(default)]
    approvals: ApprovalMode,
    home: String,
    #[serde(default)]
    approval_grants: Vec<String>,
    #[serde(default)]
    background_processes: Vec<BackgroundProcess>,
    #[serde(default)]
    mcp_servers: BTreeMap<String, McpServerSpec>,
    #[serde(default)]
    jobs_wire: JobsWire,
    #[serde(default)]
    sandbox: crate::sandbox::SandboxPolicy,
    #[serde(default)]
    context: ContextBudget,
}

impl From<PolicyFields> for Policy {
    fn from(f: PolicyFields) -> Policy {
        let defaults = ModelSettings::default();
        Policy {
            model: f.model,
            base_url: f.base_url,
            api_key: f.api_key,
            model_settings: ModelSettings {
                stream: f.stream.unwrap_or(defaults.stream),
                request_timeout_s: f.request_timeout_s.unwrap_or(defaults.request_timeout_s),
                max_retries: f.max_retries.unwrap_or(defaults.max_retries),
                stall_timeout_s: f.stall_timeout_s.unwrap_or(defaults.stall_timeout_s),
            },
            system_prompt: f.system_prompt,
            toolsets: f.toolsets,
            tools: f.tools,
            cwd: f.cwd,
            max_steps: f.max_steps,
            approvals: f.approvals,
            home: f.home,
            approval_grants: f.approval_grants,
            background_processes: f.background_processes,
            mcp_servers: f.mcp_servers,
            jobs_wire: f.jobs_wire,
            sandbox: f.sandbox,
            context: f.context,
        }
    }
}

/// `[mqtt]` as the owner's config gives it, for the `jobs` toolset (all optional; no `url`
/// means local-only).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct JobsWire {
    #[serde(default)]
    /// The broker URL.
    pub url: Option<String>,
    #[serde(default)]
    /// The environment variable holding the user name.
    pub username_env: Option<String>,
    #[serde(default)]
    /// The environment variable holding the password.
    pub password_env: Option<String>,
    #[serde(default)]
    /// The topic prefix.
    pub topic_base: Option<String>,
}

/// Payload of `job.register` (SPEC sections 3 and 4): a job the `jobs` toolset registered,
/// recorded in `session_jobs` for the execution's session before it is delivered.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct JobRegister {
    /// The job.
    pub job_id: String,
    /// The registry folder that holds the job (absolute).
    pub registry_dir: String,
}

/// How to start one stdio MCP server (`[mcp_servers.<name>]` minus `enabled`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct McpServerSpec {
    /// The program.
    pub command: String,
    #[serde(default)]
    /// Its arguments.
    pub args: Vec<String>,
    #[serde(default)]
    /// Extra environment variables (values may be credentials, so they print redacted).
    pub env: BTreeMap<String, Secret>,
    /// Seconds one `tools/call` may take before the model gets a tool error (SPEC section 1:
    /// `[mcp_servers.<name>] tool_timeout_s`).
    #[serde(default = "McpServerSpec::default_tool_timeout_s")]
    pub tool_timeout_s: u64,
}

impl McpServerSpec {
    /// The default `tool_timeout_s` (SPEC section 1: 600 s).
    pub const DEFAULT_TOOL_TIMEOUT_S: u64 = 600;

    /// [`McpServerSpec::DEFAULT_TOOL_TIMEOUT_S`], for serde.
    pub fn default_tool_timeout_s() -> u64 {
        Self::DEFAULT_TOOL_TIMEOUT_S
    }

    /// The bound on one `tools/call`; 0 means the default.
    pub fn tool_timeout(&self) -> std::time::Duration {
        match self.tool_timeout_s {
            0 => std::time::Duration::from_secs(Self::DEFAULT_TOOL_TIMEOUT_S),
            s => std::time::Duration::from_secs(s),
        }
    }
}

/// The bootstrap frame's head: who the execution is, what it may do, and how many
/// [`OwnerFrame::BootstrapPart`] frames carry the rest (SPEC section 4; docs/decisions.md,
/// "The bootstrap in parts").
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct BootstrapHead {
    /// Who the execution is.
    pub scope: Scope,
    /// What it may do.
    pub policy: Policy,
    /// The number of part frames that follow (at least 1).
    pub body_parts: u64,
    /// The owner's turn span, when it exports telemetry.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub trace: Option<TraceContext>,
}

/// Trace context handed from the owner to its worker (docs/telemetry.md): the worker
/// parents its spans on the owner's turn span, so a turn is one trace across both processes.
/// Read from the bootstrap, never from the environment: a worker may be started before it
/// knows its turn.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TraceContext {
    /// The W3C `traceparent` of the owner's turn span
    /// (`00-<trace id>-<span id>-<flags>`).
    pub traceparent: String,
    /// `[telemetry] include_content`: whether the worker's spans may carry content (the input
    /// text, tool arguments and results).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub include_content: bool,
}

/// What the part frames carry, as one JSON text: the history and the input.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct BootstrapBody {
    /// Earlier messages of the session, oldest first, without the system prompt and without
    /// what `compaction` covers.
    pub history: Vec<ChatMessage>,
    /// The ledger id of each `history` message, in the same order.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub history_ids: Vec<i64>,
    /// The session's latest compaction, which stands for the history before `history`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub compaction: Option<CompactionSummary>,
    /// This turn's user text (empty for a compaction-only turn).
    pub input: String,
    /// A compaction-only turn (`session.compact`): summarise the history before the
    /// last `keep_recent_turns` turns, whatever the budget; no input, no tools.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub compact_only: bool,
}

/// A stored compaction as a turn's history uses it (`compactions` rows).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CompactionSummary {
    /// The summary text: it stands for every message up to `through_message_id`.
    pub summary: String,
    /// The ledger id of the last message it covers.
    pub through_message_id: i64,
    /// How many messages it covers in all (earlier compactions' included).
    pub covered: u64,
}

/// Payload of `compaction.record`: a summary of the history messages `first_message_id` to
/// `last_message_id` (and of the compaction before them, if any), and the usage of the
/// requests that made it. The range may end inside the running turn, after the last tool
/// result of one of its steps (the ids come from `transcript.append` receipts:
/// `{message_ids, input_message_id}`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CompactionRecord {
    /// The ledger id of the first message summarised now.
    pub first_message_id: i64,
    /// The ledger id of the last message summarised now.
    pub last_message_id: i64,
    /// The summary.
    pub summary: String,
    /// The usage of the summarisation requests (added to the turn's counts).
    pub usage: UsageAdd,
}

/// Payload of `model.context_window`: the window the endpoint's `GET /models` reported for
/// the session's model, or the default when it reported none.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct ContextWindowFound {
    /// Tokens.
    pub context_window: u64,
    /// Whether the endpoint reported it (else it is the default).
    pub reported: bool,
}

/// Why a bootstrap could not be cut into frames or put together from them.
#[derive(Debug, thiserror::Error)]
pub enum BootstrapFrameError {
    /// The head alone (scope and policy) is over [`MAX_FRAME_BYTES`].
    #[error("the bootstrap head (scope and policy) is {0} bytes, over the {MAX_FRAME_BYTES}-byte frame limit")]
    HeadTooLong(usize),
    /// The head announced another number of parts than arrived.
    #[error("the bootstrap head announced {expected} parts, {got} arrived")]
    PartCount {
        /// `body_parts` of the head.
        expected: u64,
        /// Parts read.
        got: u64,
    },
    /// A frame or the joined body is not valid JSON of its type.
    #[error("the bootstrap is not valid JSON: {0}")]
    Json(#[from] serde_json::Error),
}

/// The whole bootstrap `{scope, policy, history, input}` (SPEC section 4) as the worker uses
/// it; on the wire it is a head and parts ([`Bootstrap::into_frames`]).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Bootstrap {
    /// Who the execution is.
    pub scope: Scope,
    /// What it may do.
    pub policy: Policy,
    /// Earlier messages of the session, oldest first, without the system prompt and without
    /// what `compaction` covers.
    pub history: Vec<ChatMessage>,
    /// The ledger id of each `history` message, in the same order.
    pub history_ids: Vec<i64>,
    /// The session's latest compaction, which stands for the history before `history`.
    pub compaction: Option<CompactionSummary>,
    /// This turn's user text. The owner has already stored it as a `user` message.
    pub input: String,
    /// A compaction-only turn ([`BootstrapBody::compact_only`]).
    pub compact_only: bool,
    /// The owner's turn span ([`BootstrapHead::trace`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub trace: Option<TraceContext>,
}

impl Bootstrap {
    /// The frames that carry this bootstrap: the head, then the body's JSON text in parts of
    /// at most [`BOOTSTRAP_PART_BYTES`] (at least one part, so an empty text is sent too).
    /// Every frame is under [`MAX_FRAME_BYTES`], or this is [`BootstrapFrameError::HeadTooLong`].
    pub fn into_frames(self) -> Result<Vec<OwnerFrame>, BootstrapFrameError> {
        let frames = self.frames_unchecked()?;
        if let Some(head) = frames.first() {
            let head_bytes = serde_json::to_vec(head)?.len();
            if head_bytes > MAX_FRAME_BYTES {
                return Err(BootstrapFrameError::HeadTooLong(head_bytes));
            }
        }
        Ok(frames)
    }

    /// The head and the body's frames; only the head can be over [`MAX_FRAME_BYTES`].
    fn frames_unchecked(self) -> Result<Vec<OwnerFrame>, BootstrapFrameError> {
        let body = serde_json::value::to_raw_value(&BootstrapBody {
            history: self.history,
            history_ids: self.history_ids,
            compaction: self.compaction,
            input: self.input,
            compact_only: self.compact_only,
        })?;
        let body = if body.get().len() + BODY_FRAME_OVERHEAD <= MAX_FRAME_BYTES {
            vec![OwnerFrame::BootstrapBody {
                body: RawBody(body),
            }]
        } else {
            split_at_chars(body.get(), BOOTSTRAP_PART_BYTES)
                .into_iter()
                .map(|text| OwnerFrame::BootstrapPart {
                    text: text.to_string(),
                })
                .collect()
        };
        let head = OwnerFrame::Bootstrap(Box::new(BootstrapHead {
            scope: self.scope,
            policy: self.policy,
            body_parts: body.len() as u64,
            trace: self.trace,
        }));
        let mut frames = Vec::with_capacity(body.len() + 1);
        frames.push(head);
        frames.extend(body);
        Ok(frames)
    }

    /// The frames of [`Bootstrap::into_frames`], each serialized once as a line (newline
    /// included), as the owner writes them to a worker's stdin.
    pub fn into_lines(self) -> Result<Vec<Vec<u8>>, BootstrapFrameError> {
        self.frames_unchecked()?
            .iter()
            .map(|frame| {
                let mut line = serde_json::to_vec(frame)?;
                if line.len() > MAX_FRAME_BYTES {
                    return Err(BootstrapFrameError::HeadTooLong(line.len()));
                }
                line.push(b'\n');
                Ok(line)
            })
            .collect()
    }

    /// The bootstrap the head and its parts' texts (in order) carry.
    pub fn assemble(
        head: BootstrapHead,
        parts: &[String],
    ) -> Result<Bootstrap, BootstrapFrameError> {
        if parts.len() as u64 != head.body_parts {
            return Err(BootstrapFrameError::PartCount {
                expected: head.body_parts,
                got: parts.len() as u64,
            });
        }
        let body: BootstrapBody = serde_json::from_str(&parts.concat())?;
        Ok(Bootstrap::from_head_and_body(head, body))
    }

    /// The bootstrap of a head and its body.
    pub fn from_head_and_body(head: BootstrapHead, body: BootstrapBody) -> Bootstrap {
        Bootstrap {
            scope: head.scope,
            policy: head.policy,
            history: body.history,
            history_ids: body.history_ids,
            compaction: body.compaction,
            input: body.input,
            compact_only: body.compact_only,
            trace: head.trace,
        }
    }
}

/// What an [`OwnerFrame::BootstrapBody`] frame adds to its body: `{"type":"bootstrap_body",
/// "body":` and `}`.
const BODY_FRAME_OVERHEAD: usize = r#"{"type":"bootstrap_body","body":}"#.len();

/// A [`BootstrapBody`]'s JSON as serialized once by the owner and written into its frame as
/// it is (`serde_json`'s `RawValue`): no second serialization, no escaping.
#[derive(Debug, Clone)]
pub struct RawBody(pub Box<serde_json::value::RawValue>);

impl PartialEq for RawBody {
    fn eq(&self, other: &RawBody) -> bool {
        self.0.get() == other.0.get()
    }
}

impl Serialize for RawBody {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        self.0.serialize(serializer)
    }
}

/// Only a frame read on its own keeps a raw value: as a field of the tagged [`OwnerFrame`] it
/// is read as a [`BootstrapBody`] and written back to text (the worker reads the body with
/// [`BodyFrame`] instead).
impl<'de> Deserialize<'de> for RawBody {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<RawBody, D::Error> {
        let body = BootstrapBody::deserialize(deserializer)?;
        serde_json::value::to_raw_value(&body)
            .map(RawBody)
            .map_err(serde::de::Error::custom)
    }
}

/// The bootstrap head as the worker reads it: the first frame's `type` is checked on its own,
/// then the frame is parsed straight into a [`BootstrapHead`] (the `type` key is ignored
/// there). Read as an internally tagged [`OwnerFrame`], the whole head (the tools' schemas
/// above all) would first be copied into an intermediate tree.
pub fn read_head(line: &[u8]) -> Result<BootstrapHead, String> {
    /// Only the `type` of a frame; every other key is skipped.
    #[derive(Deserialize)]
    struct FrameType<'a> {
        #[serde(rename = "type", borrow)]
        frame_type: std::borrow::Cow<'a, str>,
    }
    let tag = serde_json::from_slice::<FrameType>(line).map_err(|e| e.to_string())?;
    if tag.frame_type != "bootstrap" {
        return Err(format!(
            "expected type \"bootstrap\", got {:?}",
            tag.frame_type
        ));
    }
    serde_json::from_slice::<BootstrapHead>(line).map_err(|e| e.to_string())
}

/// A frame after the bootstrap head as the worker reads it: a whole body or a part's text,
/// parsed in one pass into its type (an internally tagged [`OwnerFrame`] would first copy
/// every string of the history into an intermediate tree).
#[derive(Debug, Deserialize)]
pub struct BodyFrame {
    /// `bootstrap_body` or `bootstrap_part`.
    #[serde(rename = "type")]
    pub frame_type: String,
    /// The body of a `bootstrap_body` frame.
    #[serde(default)]
    pub body: Option<BootstrapBody>,
    /// The text of a `bootstrap_part` frame.
    #[serde(default)]
    pub text: Option<String>,
}

/// One piece of a bootstrap's body, as read ([`BodyFrame::piece`]).
#[derive(Debug)]
pub enum BodyPiece {
    /// The whole body.
    Whole(BootstrapBody),
    /// A piece of its JSON text.
    Text(String),
}

impl BodyFrame {
    /// What the frame carries, or why it is not a body frame: the reason names the type found.
    pub fn piece(self) -> Result<BodyPiece, String> {
        match (self.frame_type.as_str(), self.body, self.text) {
            ("bootstrap_body", Some(body), None) => Ok(BodyPiece::Whole(body)),
            ("bootstrap_part", None, Some(text)) => Ok(BodyPiece::Text(text)),
            ("bootstrap_body", _, _) => Err("a bootstrap_body frame needs `body` only".into()),
            ("bootstrap_part", _, _) => Err("a bootstrap_part frame needs `text` only".into()),
            (other, _, _) => Err(format!("type {other:?}")),
        }
    }
}

/// `text` cut into pieces of at most `max` bytes (at least one, possibly empty), each ending at
/// a character boundary. `max` must be at least 4 (one UTF-8 character).
fn split_at_chars(text: &str, max: usize) -> Vec<&str> {
    let mut pieces = Vec::new();
    let mut rest = text;
    loop {
        if rest.len() <= max {
            pieces.push(rest);
            return pieces;
        }
        let mut cut = max;
        while !rest.is_char_boundary(cut) {
            cut -= 1;
        }
        let (piece, tail) = rest.split_at(cut);
        pieces.push(piece);
        rest = tail;
    }
}

/// A worker write: `{epoch, execution_id, generation, sequence, operation, payload, secret}`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PersistFrame {
    /// The owner epoch of [`Scope::epoch`].
    pub epoch: u64,
    /// The execution.
    pub execution_id: String,
    /// The turn's generation.
    pub generation: u64,
    /// Starts at 1 and goes up by one per execution.
    pub sequence: u64,
    /// One of [`op`].
    pub operation: String,
    /// The operation's payload.
    pub payload: Value,
    /// The execution's [`Scope::secret`].
    pub secret: Secret,
}

impl PersistFrame {
    /// Whether this persist may travel in a [`WorkerFrame::PersistBatch`]: not
    /// [`op::PROMPT_OPEN`] or [`op::CHILD_RESERVE`], whose receipts the owner sends only when a
    /// human answers or a child's turn ends.
    pub fn batchable(&self) -> bool {
        batchable(&self.operation)
    }
}

/// Whether persists of `operation` may travel in a [`WorkerFrame::PersistBatch`] (see
/// [`PersistFrame::batchable`]).
pub fn batchable(operation: &str) -> bool {
    operation != op::PROMPT_OPEN && operation != op::CHILD_RESERVE
}

/// Payload of `transcript.append`.
///
/// `tool_contexts` maps a tool call id to its one-line preview (`tool.start` `context`), for
/// the tool calls of assistant messages in `messages`. `tool_errors` lists the tool call ids
/// whose result messages in `messages` are errors (`tool.complete` `is_error`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TranscriptAppend {
    /// The messages, in order.
    pub messages: Vec<ChatMessage>,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    /// Tool call id -> one-line preview.
    pub tool_contexts: BTreeMap<String, String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    /// Tool call ids whose results are errors.
    pub tool_errors: Vec<String>,
}

/// Payload of `usage.add`: one model request's usage.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct UsageAdd {
    /// Prompt tokens.
    pub input_tokens: u64,
    /// Completion tokens.
    pub output_tokens: u64,
    /// As the model reported it.
    pub total_tokens: u64,
    /// Model responses (1 per request).
    pub api_calls: u64,
}

/// How a turn ended, as the worker reports it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum TurnOutcome {
    /// The turn finished.
    Completed,
    /// The turn failed (see `error`).
    Failed,
    /// The turn was stopped.
    Interrupted,
}

impl TurnOutcome {
    /// The spec's word.
    pub fn as_str(self) -> &'static str {
        match self {
            TurnOutcome::Completed => "completed",
            TurnOutcome::Failed => "failed",
            TurnOutcome::Interrupted => "interrupted",
        }
    }
}

/// Payload of `execution.finish`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ExecutionFinish {
    /// How it ended.
    pub outcome: TurnOutcome,
    /// What it gave.
    pub result: TurnResult,
    /// The model's or the tool's error message for `failed` turns.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// Usage summed over the turn (as also sent through `usage.add`).
    #[serde(default)]
    pub usage: Usage,
}

/// `result:{final_response, model, api_calls}` of `prompt.receipt` (SPEC section 2).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TurnResult {
    /// The final text.
    pub final_response: String,
    /// The model that answered.
    pub model: String,
    /// The number of model responses.
    pub api_calls: u64,
}

/// Payload of `child.reserve` (SPEC section 6, `delegate_task`): the child's goal, optional
/// context, and the toolsets it asks for (a subset of the caller's; `None` = the caller's).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ChildReserve {
    /// What the child must do.
    pub goal: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    /// Facts the child needs.
    pub context: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    /// The child's toolsets.
    pub toolsets: Option<Vec<String>>,
}

/// Payload of `prompt.open`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PromptOpen {
    /// `approval` or `clarify`.
    pub kind: String,
    /// The prompt's fields (for `approval`: command, description, pattern_key, choices; for `clarify`: question, choices, multi_select).
    pub body: Value,
}

/// `background_processes.status` (SPEC section 3): `running`, then one of `exited` (its exit
/// code is known), `killed` (by the `process` tool) or `lost` (gone, exit status unknown).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum ProcessStatus {
    /// Still running.
    Running,
    /// Exited with a known code.
    Exited,
    /// Killed by the `process` tool.
    Killed,
    /// Gone, exit status unknown.
    Lost,
}

impl ProcessStatus {
    /// The spec's word.
    pub fn as_str(self) -> &'static str {
        match self {
            ProcessStatus::Running => "running",
            ProcessStatus::Exited => "exited",
            ProcessStatus::Killed => "killed",
            ProcessStatus::Lost => "lost",
        }
    }

    /// Parses the spec's word; `None` for anything else.
    pub fn parse(word: &str) -> Option<ProcessStatus> {
        match word {
            "running" => Some(ProcessStatus::Running),
            "exited" => Some(ProcessStatus::Exited),
            "killed" => Some(ProcessStatus::Killed),
            "lost" => Some(ProcessStatus::Lost),
            _ => None,
        }
    }
}

impl std::fmt::Display for ProcessStatus {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// One `background_processes` row without its `session_id` (the execution's session is
/// implied): the payload of `process.register` (with `status: running`) and an entry of
/// [`Policy::background_processes`]. Field names are the spec's column names.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct BackgroundProcess {
    /// The `process_id` the `terminal` and `process` tools show.
    pub id: String,
    /// The launcher's pid, which is also its process group id and session id.
    pub pid: i32,
    /// Field 22 of `/proc/<pid>/stat` (clock ticks after boot): with `pid`, names the process
    /// even after the pid is recycled.
    #[serde(default)]
    pub start_time: Option<u64>,
    /// The command line.
    pub command: String,
    /// Its working directory.
    pub cwd: String,
    /// Where its output goes.
    pub log_path: String,
    /// Where it stands.
    pub status: ProcessStatus,
    #[serde(default)]
    /// Its exit code, once `exited`.
    pub exit_code: Option<i32>,
    /// Unix seconds.
    pub started_at: f64,
}

/// Payload of `process.update`: a background process left `running`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ProcessUpdate {
    /// `background_processes.id`.
    pub id: String,
    /// `exited`, `killed` or `lost`.
    pub status: ProcessStatus,
    #[serde(default)]
    /// Its exit code, for `exited`.
    pub exit_code: Option<i32>,
}

/// Line framing shared by both ends of the stdio pipe (SPEC section 4: at most 4 MiB a line).
/// A decoder that stops at the first oversize line would let one bad line end the whole
/// conversation, so an oversize line is skipped and reported instead.
pub mod framing {
    use std::io;

    use super::{AsyncBufRead, AsyncBufReadExt};

    /// What [`read_frame_line`] found.
    #[derive(Debug, Clone, Copy, PartialEq, Eq)]
    pub enum FrameLine {
        /// A whole line (without its newline) is in the buffer.
        Line,
        /// A line of this many bytes (newline excluded) was over the limit and was skipped.
        TooLong(usize),
        /// End of input; a last line without a newline is dropped (its writer died mid-line).
        Eof,
    }

    /// Reads one `\n`-terminated line into `buf` (cleared first) without ever holding more than
    /// `max` bytes of it: a longer line is consumed and skipped.
    pub async fn read_frame_line<R>(
        reader: &mut R,
        buf: &mut Vec<u8>,
        max: usize,
    ) -> io::Result<FrameLine>
    where
        R: AsyncBufRead + Unpin,
    {
        buf.clear();
        let mut total = 0usize;
        let mut too_long = false;
        loop {
            let available = reader.fill_buf().await?;
            if available.is_empty() {
                return Ok(FrameLine::Eof);
            }
            let (chunk, used, done) = match available.iter().position(|&b| b == b'\n') {
                Some(i) => (&available[..i], i + 1, true),
                None => (available, available.len(), false),
            };
            total += chunk.len();
            if !too_long {
                if total > max {
                    too_long = true;
                    buf.clear();
                } else {
                    buf.extend_from_slice(chunk);
                }
            }
            reader.consume(used);
            if done {
                return Ok(if too_long {
                    FrameLine::TooLong(total)
                } else {
                    FrameLine::Line
                });
            }
        }
    }
}
