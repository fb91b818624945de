//! The bootstrap of an execution (SPEC section 4): its head, its body (history and input), and
//! how a body of any length is cut into bounded frames and put together again.

use serde::{Deserialize, Serialize};

use super::{OwnerFrame, Policy, Scope, MAX_FRAME_BYTES};
use crate::chat::ChatMessage;

/// The most JSON text one [`OwnerFrame::BootstrapPart`] carries (1 MiB). JSON text holds no
/// control characters, so escaping it as a string at most doubles it (only `"` and `\` are
/// escaped): a part frame stays under half of [`MAX_FRAME_BYTES`].
pub const BOOTSTRAP_PART_BYTES: usize = 1024 * 1024;

/// The bootstrap frame's head: who the execution is, what it may do, and how many
/// [`OwnerFrame::BootstrapPart`] frames carry the rest (SPEC section 4;
/// docs/decisions/turn-bootstrap-parts.md).
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
