//! [`Client`]: the handle a program holds. Typed requests, the named helpers of the methods a
//! client uses, session ids by prefix, and [`Client::attach`].

use std::path::Path;

use drover_protocol::client::{
    AdmissionReceipt, AdmissionRef, ApprovalChoice, ApprovalRespondParams, ApprovalScope,
    ClarifyAnswer, ClarifyRespondParams, CompactionResult, EventsPage, EventsSinceParams,
    InterruptAccepted, InterruptParams, PromptReceiptParams, PromptResponse, PromptSubmitParams,
    SessionCompactParams, SessionCreateParams, SessionListParams, SessionPage, SessionRef,
    SessionRenameParams, SessionRenamed, SessionSnapshot, SessionSummary,
};
use drover_protocol::daemon_file::DaemonInfo;
use drover_protocol::ClientRequest;
use serde::de::DeserializeOwned;
use serde_json::Value;

use crate::connection::Link;
use crate::daemon::{api_key_mismatch, ApiKeyMismatch, ConnectOptions};
use crate::error::ClientError;
use crate::stream::SessionStream;

/// A connection to the home's daemon: a cheap-to-clone handle to a background task that owns
/// the WebSocket, so one part of a program can read a [`SessionStream`] while another sends
/// requests. The task ends when the last handle and stream are dropped.
///
/// A dropped connection is made again on its own (see the crate doc); a request in flight
/// then fails with [`ClientError::ConnectionLost`], and requests sent meanwhile wait for the
/// new connection. The helpers whose method is idempotent (reads, `prompt.submit` with its
/// `input_id`, `session.create` with its `request_id`, prompt answers) retry across a lost
/// connection.
#[derive(Clone)]
pub struct Client {
    link: Link,
}

/// How many times an idempotent helper resends across lost connections.
const RETRIES: u32 = 3;

/// How long [`Client::compact`] waits for its answer: the compaction waits its turn in the
/// session's FIFO (behind a turn that may wait for a person), then runs model requests.
pub const COMPACT_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(3600);

impl Client {
    /// Connects to the home's daemon, starting it when `options.start` allows and none runs.
    /// Must be called inside a tokio runtime (the connection task is spawned on it).
    pub async fn connect(options: ConnectOptions) -> Result<Client, ClientError> {
        Ok(Client {
            link: Link::open(options).await?,
        })
    }

    /// The home.
    pub fn home(&self) -> &Path {
        &self.link.shared.options.home
    }

    /// The `daemon.json` of the daemon connected now (after a reconnect, the new one).
    pub fn daemon(&self) -> DaemonInfo {
        self.link.info()
    }

    /// `Some` when the daemon holds another API key than this process's `$OPENAI_API_KEY`
    /// (or `[model] api_key_env`): its `Display` is one line saying so and how to fix it.
    pub fn api_key_mismatch(&self) -> Option<ApiKeyMismatch> {
        api_key_mismatch(self.home(), &self.link.shared.settings, &self.link.info())
    }

    /// Calls `request` and reads its result as `R`, the method's result type (see
    /// [`drover_protocol::MethodResult`]). An error answer is [`ClientError::Rpc`].
    pub async fn request<R: DeserializeOwned>(
        &self,
        request: ClientRequest,
    ) -> Result<R, ClientError> {
        self.link.typed(request).await
    }

    /// Calls `request` and returns its result as the daemon sent it (unknown fields kept),
    /// for a caller that prints it whole.
    pub async fn request_value(&self, request: ClientRequest) -> Result<Value, ClientError> {
        let method = request.method();
        self.link
            .call(request)
            .await?
            .map_err(|error| ClientError::Rpc { method, error })
    }

    /// [`Client::request`], resent when the connection was lost before the answer: only for
    /// methods whose retry is harmless.
    async fn idempotent<R: DeserializeOwned>(
        &self,
        request: ClientRequest,
    ) -> Result<R, ClientError> {
        let mut tries = 0;
        loop {
            match self.link.typed(request.clone()).await {
                Err(ClientError::ConnectionLost { .. }) if tries < RETRIES => tries += 1,
                other => return other,
            }
        }
    }

    /// `session.create` (idempotent on `request_id`); attaches.
    pub async fn create_session(
        &self,
        params: SessionCreateParams,
    ) -> Result<SessionSnapshot, ClientError> {
        self.idempotent(ClientRequest::SessionCreate(params)).await
    }

    /// `session.create`, and the new session's stream: one round trip (the create's answer is
    /// the snapshot an attach would read with `session.resume`).
    pub async fn create_and_attach(
        &self,
        params: SessionCreateParams,
    ) -> Result<SessionStream, ClientError> {
        let snapshot = self.create_session(params).await?;
        Ok(SessionStream::created(self.link.clone(), snapshot))
    }

    /// `session.resume`: the session's snapshot; attaches (and stays attached across
    /// reconnects).
    pub async fn resume(&self, session_id: &str) -> Result<SessionSnapshot, ClientError> {
        self.idempotent(ClientRequest::SessionResume(SessionRef {
            session_id: session_id.to_string(),
        }))
        .await
    }

    /// `session.detach`.
    pub async fn detach(&self, session_id: &str) -> Result<(), ClientError> {
        self.request_value(ClientRequest::SessionDetach(SessionRef {
            session_id: session_id.to_string(),
        }))
        .await
        .map(drop)
    }

    /// One page of `session.list`.
    pub async fn list_sessions(
        &self,
        limit: Option<u64>,
        cursor: Option<String>,
    ) -> Result<SessionPage, ClientError> {
        self.idempotent(ClientRequest::SessionList(SessionListParams {
            limit,
            cursor,
            cwd: None,
        }))
        .await
    }

    /// Every session of the home (all pages of `session.list`).
    pub async fn all_sessions(&self) -> Result<Vec<SessionSummary>, ClientError> {
        let mut all = Vec::new();
        let mut cursor = None;
        loop {
            let page = self.list_sessions(Some(1000), cursor).await?;
            all.extend(page.sessions);
            match page.next_cursor {
                Some(next) => cursor = Some(next),
                None => return Ok(all),
            }
        }
    }

    /// The session whose id is `prefix` or, failing that, the one whose id starts with it.
    /// None is [`ClientError::NoSuchSession`]; several is [`ClientError::AmbiguousSession`]
    /// listing them.
    pub async fn resolve_session(&self, prefix: &str) -> Result<SessionSummary, ClientError> {
        let sessions = self.all_sessions().await?;
        pick_by_prefix(sessions, prefix, self.home())
    }

    /// The home's most recently started session that a person started (not a child agent's),
    /// for `--continue`. None is [`ClientError::NoSessions`].
    pub async fn most_recent_session(&self) -> Result<SessionSummary, ClientError> {
        let sessions = self.all_sessions().await?;
        most_recent(sessions).ok_or_else(|| ClientError::NoSessions {
            home: self.home().display().to_string(),
        })
    }

    /// `prompt.submit` of `text` with a new `input_id`; resent with the same `input_id`
    /// across a lost connection, so it is admitted once (SPEC G1).
    pub async fn submit(
        &self,
        session_id: &str,
        text: &str,
    ) -> Result<AdmissionReceipt, ClientError> {
        self.submit_input(PromptSubmitParams {
            session_id: session_id.to_string(),
            input_id: uuid::Uuid::new_v4().to_string(),
            text: text.to_string(),
        })
        .await
    }

    /// `prompt.submit` with the caller's `input_id`.
    pub async fn submit_input(
        &self,
        params: PromptSubmitParams,
    ) -> Result<AdmissionReceipt, ClientError> {
        self.idempotent(ClientRequest::PromptSubmit(params)).await
    }

    /// `session.compact` (SPEC section 2): compacts the session's history as a turn in its
    /// FIFO and answers once that turn settled: `compacted` (with how many messages the summary
    /// now stands for) or `nothing_to_compact`. A compaction turn that fails, is cancelled or
    /// interrupted, or is lost is a [`ClientError::Rpc`] naming the admission. The call is
    /// sent with a new `input_id` and resent with the same id across a lost connection, so
    /// the compaction is admitted once; the wait is bounded by [`COMPACT_TIMEOUT`].
    pub async fn compact(&self, session_id: &str) -> Result<CompactionResult, ClientError> {
        self.compact_with(SessionCompactParams {
            session_id: session_id.to_string(),
            input_id: Some(uuid::Uuid::new_v4().to_string()),
        })
        .await
    }

    /// `session.compact` with the caller's params (an `input_id` of `None` is not resent:
    /// a resend would be a second compaction).
    pub async fn compact_with(
        &self,
        params: SessionCompactParams,
    ) -> Result<CompactionResult, ClientError> {
        let resend = params.input_id.is_some();
        let request = ClientRequest::SessionCompact(params);
        let mut tries = 0;
        loop {
            match self
                .link
                .typed_within(request.clone(), COMPACT_TIMEOUT)
                .await
            {
                Err(ClientError::ConnectionLost { .. }) if resend && tries < RETRIES => tries += 1,
                other => return other,
            }
        }
    }

    /// `prompt.receipt`; `include_result` adds `usage` and `result` once terminal.
    pub async fn receipt(
        &self,
        session_id: &str,
        admission_id: &str,
        include_result: bool,
    ) -> Result<AdmissionReceipt, ClientError> {
        self.idempotent(ClientRequest::PromptReceipt(PromptReceiptParams {
            session_id: session_id.to_string(),
            admission_id: admission_id.to_string(),
            include_result: Some(include_result),
        }))
        .await
    }

    /// `session.interrupt` of the running turn of `execution_generation`.
    pub async fn interrupt(
        &self,
        session_id: &str,
        execution_generation: u64,
    ) -> Result<InterruptAccepted, ClientError> {
        self.request(ClientRequest::SessionInterrupt(InterruptParams {
            session_id: session_id.to_string(),
            execution_generation,
        }))
        .await
    }

    /// `approval.respond` (an `always` answer takes the default scope: see
    /// [`Client::respond_approval_scoped`]).
    pub async fn respond_approval(
        &self,
        session_id: &str,
        execution_generation: u64,
        prompt_id: &str,
        choice: ApprovalChoice,
    ) -> Result<PromptResponse, ClientError> {
        self.respond_approval_scoped(session_id, execution_generation, prompt_id, choice, None)
            .await
    }

    /// `approval.respond` with the `scope` of an `always` answer (one of the prompt's
    /// `scopes`; `None`: `workspace` when offered, else the prompt's narrowest offer).
    pub async fn respond_approval_scoped(
        &self,
        session_id: &str,
        execution_generation: u64,
        prompt_id: &str,
        choice: ApprovalChoice,
        scope: Option<ApprovalScope>,
    ) -> Result<PromptResponse, ClientError> {
        self.idempotent(ClientRequest::ApprovalRespond(ApprovalRespondParams {
            session_id: session_id.to_string(),
            execution_generation,
            prompt_id: prompt_id.to_string(),
            choice,
            scope,
        }))
        .await
    }

    /// `clarify.respond`.
    pub async fn respond_clarify(
        &self,
        session_id: &str,
        execution_generation: u64,
        prompt_id: &str,
        answer: ClarifyAnswer,
    ) -> Result<PromptResponse, ClientError> {
        self.idempotent(ClientRequest::ClarifyRespond(ClarifyRespondParams {
            session_id: session_id.to_string(),
            execution_generation,
            prompt_id: prompt_id.to_string(),
            answer,
        }))
        .await
    }

    /// `prompt.resolve_unknown`: closes an `unknown` admission as `interrupted`; the queue
    /// resumes.
    pub async fn resolve_unknown(
        &self,
        session_id: &str,
        admission_id: &str,
    ) -> Result<AdmissionReceipt, ClientError> {
        self.idempotent(ClientRequest::PromptResolveUnknown(AdmissionRef {
            session_id: session_id.to_string(),
            admission_id: admission_id.to_string(),
        }))
        .await
    }

    /// `prompt.cancel` of a queued admission.
    pub async fn cancel(
        &self,
        session_id: &str,
        admission_id: &str,
    ) -> Result<AdmissionReceipt, ClientError> {
        self.request(ClientRequest::PromptCancel(AdmissionRef {
            session_id: session_id.to_string(),
            admission_id: admission_id.to_string(),
        }))
        .await
    }

    /// `session.rename`: sets the session's title (no attachment needed). Safe to repeat.
    pub async fn rename(
        &self,
        session_id: &str,
        title: &str,
    ) -> Result<SessionRenamed, ClientError> {
        self.idempotent(ClientRequest::SessionRename(SessionRenameParams {
            session_id: session_id.to_string(),
            title: title.to_string(),
        }))
        .await
    }

    /// One page of `session.events.since` (`has_more`: ask again from `last_sequence`).
    pub async fn events_since(
        &self,
        session_id: &str,
        replay_epoch: Option<&str>,
        last_sequence: u64,
        limit: Option<u64>,
    ) -> Result<EventsPage, ClientError> {
        self.idempotent(ClientRequest::SessionEventsSince(EventsSinceParams {
            session_id: session_id.to_string(),
            replay_epoch: replay_epoch.map(str::to_string),
            last_sequence,
            limit,
        }))
        .await
    }

    /// Attaches to `session_id` (`session.resume`) and follows its events from the snapshot
    /// on: [`SessionStream::snapshot`] is the state, [`SessionStream::next`] what follows.
    pub async fn attach(&self, session_id: &str) -> Result<SessionStream, ClientError> {
        SessionStream::attach(self.link.clone(), session_id).await
    }
}

/// The session named by `prefix` (an exact id wins over longer ones it prefixes).
fn pick_by_prefix(
    sessions: Vec<SessionSummary>,
    prefix: &str,
    home: &Path,
) -> Result<SessionSummary, ClientError> {
    let mut matching: Vec<SessionSummary> = sessions
        .into_iter()
        .filter(|s| !prefix.is_empty() && s.session_id.starts_with(prefix))
        .collect();
    if let Some(i) = matching.iter().position(|s| s.session_id == prefix) {
        return Ok(matching.swap_remove(i));
    }
    match matching.len() {
        0 => Err(ClientError::NoSuchSession {
            prefix: prefix.to_string(),
            home: home.display().to_string(),
        }),
        1 => Ok(matching.remove(0)),
        _ => {
            let mut candidates: Vec<String> = matching.into_iter().map(|s| s.session_id).collect();
            candidates.sort();
            Err(ClientError::AmbiguousSession {
                prefix: prefix.to_string(),
                candidates,
            })
        }
    }
}

/// The most recently started session that is not a child agent's.
fn most_recent(sessions: Vec<SessionSummary>) -> Option<SessionSummary> {
    sessions
        .into_iter()
        .filter(|s| s.source != "subagent" && s.parent_session_id.is_none())
        .max_by(|a, b| a.started_at.total_cmp(&b.started_at))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn summary(id: &str, started_at: f64, source: &str) -> SessionSummary {
        SessionSummary {
            session_id: id.into(),
            title: None,
            source: source.into(),
            parent_session_id: None,
            model: "m".into(),
            started_at,
            ended_at: None,
            running: false,
            pending_count: 0,
            state: drover_protocol::client::SessionState::Idle,
            last_activity_at: started_at,
            input_tokens: None,
            output_tokens: None,
            approval_mode: None,
            cwd: None,
            agent: None,
            error: None,
        }
    }

    #[test]
    fn a_unique_prefix_names_its_session_and_an_ambiguous_one_lists_the_candidates() {
        let all = || {
            vec![
                summary("abc1", 1.0, "cli"),
                summary("abd2", 2.0, "cli"),
                summary("ab", 3.0, "cli"),
            ]
        };
        let home = Path::new("/h");
        assert_eq!(
            pick_by_prefix(all(), "abc", home).unwrap().session_id,
            "abc1"
        );
        // An exact id wins over the longer ids it prefixes.
        assert_eq!(pick_by_prefix(all(), "ab", home).unwrap().session_id, "ab");
        match pick_by_prefix(all(), "a", home) {
            Err(ClientError::AmbiguousSession { candidates, .. }) => {
                assert_eq!(candidates, ["ab", "abc1", "abd2"])
            }
            other => panic!("{:?}", other.map(|s| s.session_id)),
        }
        assert!(matches!(
            pick_by_prefix(all(), "z", home),
            Err(ClientError::NoSuchSession { .. })
        ));
        assert!(matches!(
            pick_by_prefix(all(), "", home),
            Err(ClientError::NoSuchSession { .. })
        ));
    }

    #[test]
    fn continue_takes_the_newest_session_a_person_started() {
        let all = vec![
            summary("old", 1.0, "cli"),
            summary("new", 5.0, "cli"),
            summary("child", 9.0, "subagent"),
        ];
        assert_eq!(most_recent(all).unwrap().session_id, "new");
        assert!(most_recent(vec![]).is_none());
    }
}
