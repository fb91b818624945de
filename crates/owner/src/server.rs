//! The HTTP endpoint: `GET /healthz` (no auth) and the WebSocket at `/v1/ws` (SPEC section 1).
//!
//! The upgrade requires `Authorization: Bearer <token>` (401 otherwise, compared in constant
//! time) and refuses any browser `Origin` header (403). Each text frame is one JSON-RPC message.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use axum::extract::ws::{Message, WebSocket, WebSocketUpgrade};
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response as HttpResponse};
use axum::routing::get;
use axum::{Json, Router};
use drover_protocol::rpc::{ErrorReason, Request, Response, RpcError, INVALID_REQUEST};
use futures::{SinkExt, StreamExt};
use serde_json::{json, Value};

use crate::hub::ConnHandle;
use crate::rpc::dispatch;
use crate::runtime::Owner;

#[derive(Clone)]
struct AppState {
    owner: Arc<Owner>,
    token: Arc<String>,
}

static NEXT_CONN: AtomicU64 = AtomicU64::new(1);

/// The router for one owner.
pub fn router(owner: Arc<Owner>, token: String) -> Router {
    Router::new()
        .route("/healthz", get(healthz))
        .route("/v1/ws", get(ws_upgrade))
        .with_state(AppState {
            owner,
            token: Arc::new(token),
        })
}

async fn healthz(State(state): State<AppState>) -> Json<Value> {
    Json(json!({"status": "ok", "draining": state.owner.is_draining()}))
}

fn authorized(headers: &HeaderMap, token: &str) -> bool {
    use subtle::ConstantTimeEq;
    let Some(value) = headers.get(axum::http::header::AUTHORIZATION) else {
        return false;
    };
    let Ok(value) = value.to_str() else {
        return false;
    };
    let Some(given) = value.strip_prefix("Bearer ") else {
        return false;
    };
    given.len() == token.len() && bool::from(given.as_bytes().ct_eq(token.as_bytes()))
}

async fn ws_upgrade(
    State(state): State<AppState>,
    headers: HeaderMap,
    ws: WebSocketUpgrade,
) -> HttpResponse {
    if headers.contains_key(axum::http::header::ORIGIN) {
        return (StatusCode::FORBIDDEN, "browser origins are refused\n").into_response();
    }
    if !authorized(&headers, &state.token) {
        return (StatusCode::UNAUTHORIZED, "missing or bad bearer token\n").into_response();
    }
    ws.on_upgrade(move |socket| serve_connection(state.owner, socket))
}

async fn serve_connection(owner: Arc<Owner>, socket: WebSocket) {
    let id = NEXT_CONN.fetch_add(1, Ordering::Relaxed);
    let (mut sink, mut stream) = socket.split();
    let (conn, mut rx) = ConnHandle::new(id);
    let overflow = conn.overflow.clone();
    let writer_overflow = overflow.clone();
    let writer_conn = conn.clone();
    let writer = tokio::spawn(async move {
        loop {
            tokio::select! {
                msg = rx.recv() => match msg {
                    Some(text) => {
                        let len = text.len();
                        // A socket the client stopped reading blocks here; overflow must still
                        // be able to end the connection.
                        let sent = tokio::select! {
                            r = sink.send(Message::Text(text.into())) => r.is_ok(),
                            _ = writer_overflow.cancelled() => false,
                        };
                        writer_conn.sent(len);
                        if !sent {
                            break;
                        }
                    }
                    None => break,
                },
                _ = writer_overflow.cancelled() => break,
            }
        }
        // Bounded: closing a socket whose peer does not read could wait forever.
        let _ = tokio::time::timeout(std::time::Duration::from_secs(1), sink.close()).await;
    });
    tracing::debug!(conn = id, "client connected");
    loop {
        let msg = tokio::select! {
            m = stream.next() => m,
            _ = overflow.cancelled() => break,
        };
        let Some(Ok(msg)) = msg else { break };
        let reply = match msg {
            Message::Text(text) => handle_text(&owner, &conn, text.as_str()).await,
            Message::Binary(_) => Some(error_response(
                Value::Null,
                RpcError {
                    code: INVALID_REQUEST,
                    message: "invalid_request".into(),
                    data: json!({"reason": "invalid_request", "detail": "send JSON-RPC as text frames"}),
                },
            )),
            Message::Close(_) => break,
            _ => None,
        };
        if let Some(reply) = reply {
            if !conn.send(reply).await {
                break;
            }
        }
    }
    // Detach is not cancel (G3): only the connection's attachments go.
    owner.hub.detach_all(id);
    drop(conn);
    let _ = tokio::time::timeout(std::time::Duration::from_secs(5), writer).await;
    tracing::debug!(conn = id, "client disconnected");
}

fn error_response(id: Value, e: RpcError) -> String {
    serde_json::to_string(&Response::err(id, e)).unwrap_or_default()
}

/// Parses and answers one text frame; `None` for notifications.
async fn handle_text(owner: &Arc<Owner>, conn: &ConnHandle, text: &str) -> Option<String> {
    let value: Value = match serde_json::from_str(text) {
        Ok(v) => v,
        Err(e) => {
            return Some(error_response(
                Value::Null,
                RpcError::new(ErrorReason::ParseError, format!("malformed JSON: {e}")),
            ))
        }
    };
    let id = value.get("id").cloned();
    let request: Request = match serde_json::from_value(value) {
        Ok(r) => r,
        Err(e) => {
            return Some(error_response(
                id.unwrap_or(Value::Null),
                RpcError {
                    code: INVALID_REQUEST,
                    message: "invalid_request".into(),
                    data: json!({"reason": "invalid_request", "detail": format!("not a JSON-RPC request: {e}")}),
                },
            ))
        }
    };
    let result = dispatch(owner, conn, &request.method, &request.params).await;
    let id = request.id?;
    let response = match result {
        Ok(v) => Response::ok(id, v),
        Err(e) => Response::err(id, e),
    };
    Some(serde_json::to_string(&response).unwrap_or_default())
}
