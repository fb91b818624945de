//! The ACP method handlers of one connection: `initialize`, `session/new`, `session/load`,
//! `session/resume`, `session/list`, `session/close`, `session/prompt`, `session/set_mode` and
//! the `session/cancel` notification, each answered through the connection's bridge.

use std::sync::{Arc, OnceLock};

use agent_client_protocol::schema::ProtocolVersion;
use agent_client_protocol::v1::schema::{
    AgentCapabilities, CancelNotification, CloseSessionRequest, CloseSessionResponse,
    Implementation, InitializeRequest, InitializeResponse, ListSessionsRequest,
    ListSessionsResponse, LoadSessionRequest, LoadSessionResponse, McpCapabilities,
    NewSessionRequest, NewSessionResponse, PromptCapabilities, PromptRequest, ResumeSessionRequest,
    ResumeSessionResponse, SessionCapabilities, SessionCloseCapabilities, SessionInfo,
    SessionListCapabilities, SessionResumeCapabilities, SetSessionModeRequest,
    SetSessionModeResponse,
};
use agent_client_protocol::v1::ConnectionTo;
use agent_client_protocol::{
    on_receive_notification, on_receive_request, Agent, Client as AcpClient, Error as AcpRpcError,
};
use drover_client::{Client, ConnectOptions};
use drover_protocol::client::{
    ClientRequest, SessionCreateParams, SessionListParams, SessionMode, SessionPage,
    SessionSetModeParams,
};
use drover_protocol::ApprovalMode;

use crate::bridge::{rpc_error, Attached, Bridge};
use crate::map;

/// The `source` of sessions made over ACP (`session.list`, the dashboard).
pub const SESSION_SOURCE: &str = "acp";

/// Sessions per `session/list` page.
const LIST_PAGE: u64 = 200;

/// Unix seconds as an RFC 3339 time (UTC), as ACP's `updatedAt` is.
fn rfc3339(unix_seconds: f64) -> Option<String> {
    let millis = (unix_seconds * 1000.0) as i64;
    chrono::DateTime::from_timestamp_millis(millis)
        .map(|t| t.to_rfc3339_opts(chrono::SecondsFormat::Millis, true))
}

/// What the sessions one ACP client makes are (`drover acp --agent NAME`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct NewSessions {
    /// The external agent (`[agents.<name>]`) every `session/new` runs, and the only one whose
    /// sessions `session/list` shows; `None`: drover's own agent loop, and every session.
    pub agent: Option<String>,
}

/// The connection's bridge, made at its first request (it needs the connection).
#[derive(Clone)]
pub(crate) struct Shared {
    client: Client,
    options: ConnectOptions,
    new_sessions: Arc<NewSessions>,
    bridge: Arc<OnceLock<Arc<Bridge>>>,
}

impl Shared {
    /// A connection before its first request: the daemon's client, no bridge yet.
    pub(crate) fn new(
        client: Client,
        options: ConnectOptions,
        new_sessions: NewSessions,
    ) -> Shared {
        Shared {
            client,
            options,
            new_sessions: Arc::new(new_sessions),
            bridge: Arc::new(OnceLock::new()),
        }
    }

    fn bridge(&self, cx: &ConnectionTo<AcpClient>) -> Arc<Bridge> {
        self.bridge
            .get_or_init(|| Bridge::new(self.client.clone(), self.options.clone(), cx.clone()))
            .clone()
    }
}

fn initialize(request: &InitializeRequest, new_sessions: &NewSessions) -> InitializeResponse {
    // drover speaks version 1; a client asking for a newer one gets 1 and decides.
    let _ = request;
    // An editor shows the title: which agent its new sessions run is worth seeing there.
    let title = match &new_sessions.agent {
        Some(agent) => format!("drover ({agent})"),
        None => "drover".to_string(),
    };
    InitializeResponse::new(ProtocolVersion::V1)
        .agent_capabilities(
            AgentCapabilities::new()
                .load_session(true)
                .prompt_capabilities(PromptCapabilities::new().embedded_context(true))
                .mcp_capabilities(McpCapabilities::new())
                .session_capabilities(
                    SessionCapabilities::new()
                        .list(SessionListCapabilities::new())
                        .resume(SessionResumeCapabilities::new())
                        .close(SessionCloseCapabilities::new()),
                ),
        )
        .auth_methods(Vec::new())
        .agent_info(Implementation::new("drover", env!("CARGO_PKG_VERSION")).title(title))
}

/// The session's approval mode as ACP modes.
fn modes_of(mode: Option<ApprovalMode>) -> agent_client_protocol::v1::schema::SessionModeState {
    map::modes(mode.unwrap_or_default())
}

/// The attached session `session_id`, attaching it (without replay) when this connection has
/// not yet.
async fn attached(bridge: &Arc<Bridge>, session_id: &str) -> Result<Arc<Attached>, AcpRpcError> {
    if let Some(a) = bridge.attached(session_id) {
        return Ok(a);
    }
    bridge.wake_daemon().await;
    let stream = bridge.client.attach(session_id).await.map_err(rpc_error)?;
    Ok(bridge.follow(stream, None))
}

macro_rules! spawn_answer {
    ($cx:expr, $responder:expr, $work:expr) => {{
        let responder = $responder;
        $cx.spawn(async move { responder.respond_with_result($work.await) })
    }};
}

pub(crate) fn handlers(
    shared: Shared,
) -> agent_client_protocol::v1::Builder<
    Agent,
    impl agent_client_protocol::HandleDispatchFrom<AcpClient>,
> {
    let (s0, s1, s2, s3, s4, s5, s6, s7, s8) = (
        shared.clone(),
        shared.clone(),
        shared.clone(),
        shared.clone(),
        shared.clone(),
        shared.clone(),
        shared.clone(),
        shared.clone(),
        shared,
    );
    Agent
        .v1()
        .name("drover")
        .on_receive_request(
            async move |request: InitializeRequest, responder, cx| {
                let forms = request
                    .client_capabilities
                    .elicitation
                    .as_ref()
                    .is_some_and(|e| e.form.is_some());
                s0.bridge(&cx)
                    .forms
                    .store(forms, std::sync::atomic::Ordering::Relaxed);
                responder.respond(initialize(&request, &s0.new_sessions))
            },
            on_receive_request!(),
        )
        .on_receive_request(
            async move |request: NewSessionRequest, responder, cx| {
                let bridge = s1.bridge(&cx);
                let agent = s1.new_sessions.agent.clone();
                spawn_answer!(cx, responder, async move {
                    let cwd = request.cwd.to_string_lossy().into_owned();
                    let mut params =
                        SessionCreateParams::in_cwd(uuid::Uuid::new_v4().to_string(), cwd);
                    params.source = Some(SESSION_SOURCE.to_string());
                    params.mcp_servers =
                        map::mcp_servers(&request.mcp_servers).map_err(|reason| {
                            AcpRpcError::invalid_params()
                                .data(serde_json::json!({"field": "mcpServers", "reason": reason}))
                        })?;
                    if let Some(agent) = agent {
                        // An external agent uses its own tools (the daemon refuses a session
                        // of one with MCP servers); an editor sends the servers it has
                        // configured with every `session/new`, so they are left out rather
                        // than failing the session.
                        if let Some(servers) = params.mcp_servers.take() {
                            tracing::info!(
                                %agent,
                                servers = ?servers.keys().collect::<Vec<_>>(),
                                "the editor's MCP servers are not given to an external agent's session"
                            );
                        }
                        params.agent = Some(agent);
                    }
                    bridge.wake_daemon().await;
                    let stream = bridge
                        .client
                        .create_and_attach(params)
                        .await
                        .map_err(rpc_error)?;
                    let attached = bridge.follow(stream, None);
                    Ok(NewSessionResponse::new(attached.session_id.clone())
                        .modes(modes_of(attached.approval_mode)))
                })
            },
            on_receive_request!(),
        )
        .on_receive_request(
            async move |request: LoadSessionRequest, responder, cx| {
                // Replayed updates must reach the client before the answer: done here, in
                // the dispatch loop, in order.
                let bridge = s2.bridge(&cx);
                let id = request.session_id.0.to_string();
                bridge.forget(&id);
                bridge.wake_daemon().await;
                let loaded = match bridge.client.attach(&id).await {
                    Ok(stream) => match bridge.failed_calls(stream.snapshot()).await {
                        Ok(failed) => Ok((stream, failed)),
                        Err(e) => Err(e),
                    },
                    Err(e) => Err(e),
                };
                match loaded {
                    Ok((stream, failed)) => {
                        let attached = bridge.follow(stream, Some(failed));
                        responder.respond(
                            LoadSessionResponse::new().modes(modes_of(attached.approval_mode)),
                        )
                    }
                    Err(e) => responder.respond_with_error(rpc_error(e)),
                }
            },
            on_receive_request!(),
        )
        .on_receive_request(
            async move |request: ResumeSessionRequest, responder, cx| {
                let bridge = s3.bridge(&cx);
                spawn_answer!(cx, responder, async move {
                    let id = request.session_id.0.to_string();
                    bridge.forget(&id);
                    let attached = attached(&bridge, &id).await?;
                    Ok(ResumeSessionResponse::new().modes(modes_of(attached.approval_mode)))
                })
            },
            on_receive_request!(),
        )
        .on_receive_request(
            async move |request: ListSessionsRequest, responder, cx| {
                let bridge = s4.bridge(&cx);
                let agent = s4.new_sessions.agent.clone();
                spawn_answer!(cx, responder, async move {
                    bridge.wake_daemon().await;
                    let page: SessionPage = bridge
                        .client
                        .request(ClientRequest::SessionList(SessionListParams {
                            limit: Some(LIST_PAGE),
                            cursor: request.cursor,
                            cwd: request.cwd.map(|c| c.to_string_lossy().into_owned()),
                        }))
                        .await
                        .map_err(rpc_error)?;
                    // Child agents' sessions belong to their parent's turn, not to an editor.
                    let rows: Vec<SessionInfo> = page
                        .sessions
                        .into_iter()
                        .filter(|s| s.parent_session_id.is_none())
                        .filter(|s| agent.is_none() || s.agent == agent)
                        .map(|s| {
                            let cwd = s.cwd.unwrap_or_else(|| "/".to_string());
                            SessionInfo::new(s.session_id, cwd)
                                .title(s.title)
                                .updated_at(rfc3339(s.last_activity_at))
                        })
                        .collect();
                    Ok(ListSessionsResponse::new(rows).next_cursor(page.next_cursor))
                })
            },
            on_receive_request!(),
        )
        .on_receive_request(
            async move |request: CloseSessionRequest, responder, cx| {
                let bridge = s5.bridge(&cx);
                spawn_answer!(cx, responder, async move {
                    let id = request.session_id.0.to_string();
                    // Closing is detaching: the session and any running turn stay with the
                    // daemon (SPEC G3).
                    bridge.forget(&id);
                    bridge.client.detach(&id).await.map_err(rpc_error)?;
                    Ok(CloseSessionResponse::new())
                })
            },
            on_receive_request!(),
        )
        .on_receive_request(
            async move |request: PromptRequest, responder, cx| {
                let bridge = s6.bridge(&cx);
                spawn_answer!(cx, responder, async move {
                    let id = request.session_id.0.to_string();
                    let attached = attached(&bridge, &id).await?;
                    bridge.prompt(attached, request).await
                })
            },
            on_receive_request!(),
        )
        .on_receive_request(
            async move |request: SetSessionModeRequest, responder, cx| {
                let bridge = s7.bridge(&cx);
                spawn_answer!(cx, responder, async move {
                    let mode: ApprovalMode = request.mode_id.0.parse().map_err(|_| {
                        AcpRpcError::invalid_params().data(serde_json::json!(
                            {"field": "modeId", "reason": "expected manual, auto or deny"}
                        ))
                    })?;
                    let id = request.session_id.0.to_string();
                    // The daemon takes a mode only from a client attached to the session.
                    attached(&bridge, &id).await?;
                    let _: SessionMode = bridge
                        .client
                        .request(ClientRequest::SessionSetMode(SessionSetModeParams {
                            session_id: id,
                            mode,
                        }))
                        .await
                        .map_err(rpc_error)?;
                    Ok(SetSessionModeResponse::new())
                })
            },
            on_receive_request!(),
        )
        .on_receive_notification(
            async move |notification: CancelNotification, cx| {
                let bridge = s8.bridge(&cx);
                let id = notification.session_id.0.to_string();
                cx.spawn(async move {
                    if let Some(attached) = bridge.attached(&id) {
                        bridge.cancel(&attached).await;
                    }
                    Ok(())
                })
            },
            on_receive_notification!(),
        )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn initialize_offers_load_list_resume_close_and_embedded_context() {
        let response = serde_json::to_value(initialize(
            &InitializeRequest::new(ProtocolVersion::V1),
            &NewSessions::default(),
        ))
        .unwrap();
        assert_eq!(response["protocolVersion"], 1);
        let caps = &response["agentCapabilities"];
        assert_eq!(caps["loadSession"], true);
        assert_eq!(caps["promptCapabilities"]["embeddedContext"], true);
        for key in ["list", "resume", "close"] {
            assert!(
                caps["sessionCapabilities"][key].is_object(),
                "{key}: {caps}"
            );
        }
        assert_eq!(response["authMethods"], serde_json::json!([]));
    }
}
