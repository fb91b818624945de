//! The methods about the whole home rather than one session: `approvals.list` and
//! `approvals.remove` (the home's stored `always` rules), `mcp.status`, `job.list` and
//! `job.events` (the home's job registry), and `ui.login_code` for the dashboard.

use std::sync::Arc;

use drover_protocol::client as wire;

use crate::error::OwnerError;
use crate::hub::{ConnHandle, Credential};
use crate::owner::Owner;

use super::session_row;

/// `approvals.list` (drover extension, SPEC section 6 `always`): the home's stored rules.
pub(super) async fn approvals_list(owner: &Arc<Owner>) -> Result<wire::ApprovalRules, OwnerError> {
    let rules = owner.ledger(|ledger, _| ledger.approval_rules()).await?;
    Ok(wire::ApprovalRules {
        rules: rules.into_iter().map(wire_rule).collect(),
    })
}

/// A stored rule as the wire shows it; a rule stored before rules had scopes has no words of
/// its own, so its class and scope are named here, in the words a prompt would offer.
pub(super) fn wire_rule(r: drover_ledger::ApprovalRule) -> wire::ApprovalRule {
    use drover_tools::approval::scope::{class_of, scope_text};
    let class = r.class.unwrap_or_else(|| class_of(&r.pattern_key));
    let text = r
        .text
        .unwrap_or_else(|| scope_text(&class, r.scope, r.path.as_deref()));
    wire::ApprovalRule {
        rule_id: r.rule_id,
        pattern_key: r.pattern_key,
        class,
        scope: r.scope,
        path: r.path,
        text,
        origin: wire::ApprovalRuleOrigin {
            session_id: r.session_id,
            prompt_id: r.prompt_id,
            command: r.command,
        },
        created_at: r.created_at,
    }
}

/// `approvals.remove` `{rule_id}` or `{pattern_key}` (drover extension): one rule, or every
/// rule of a command class. `{removed: bool}`.
pub(super) async fn approvals_remove(
    owner: &Arc<Owner>,
    p: wire::ApprovalRuleRef,
) -> Result<wire::ApprovalRuleRemoved, OwnerError> {
    let removed = match (p.rule_id, p.pattern_key) {
        (Some(rule_id), None) => {
            owner
                .ledger(move |ledger, _| ledger.remove_approval_rule_id(&rule_id))
                .await?
        }
        (None, Some(key)) => {
            owner
                .ledger(move |ledger, _| ledger.remove_approval_rule(&key))
                .await?
        }
        (Some(_), Some(_)) | (None, None) => {
            return Err(drover_ledger::LedgerError::invalid(
                "rule_id",
                "name one rule (rule_id) or one command class (pattern_key)",
            )
            .into())
        }
    };
    Ok(wire::ApprovalRuleRemoved { removed })
}

/// `mcp.status` (SPEC section 2): reading status needs no attachment. With `session_id`, the
/// session's MCP toolsets that the config still enables; without, every enabled
/// `[mcp_servers.<name>]` of the home. In name order.
pub(super) async fn mcp_status(
    owner: &Arc<Owner>,
    p: wire::McpStatusParams,
) -> Result<wire::McpStatusResult, OwnerError> {
    let servers = match p.session_id {
        Some(session_id) => {
            let session = owner
                .ledger(move |ledger, _| session_row(ledger, &session_id))
                .await?;
            let mut names = mcp_toolsets(owner, &session.toolsets);
            names.extend(session.mcp_servers.keys().cloned());
            names.sort();
            names.dedup();
            owner.mcp.of_session(&session.id, &names)
        }
        None => {
            let configured: Vec<String> = owner.config().mcp_servers.keys().cloned().collect();
            owner.mcp.of_home(&mcp_toolsets(owner, &configured))
        }
    };
    Ok(wire::McpStatusResult { servers })
}

/// The names of `toolsets` that are enabled MCP servers (a built-in toolset name wins), in
/// name order.
fn mcp_toolsets(owner: &Owner, toolsets: &[String]) -> Vec<String> {
    owner
        .config()
        .mcp_servers_of(toolsets)
        .into_keys()
        .filter(|name| !drover_tools::KNOWN_TOOLSETS.contains(&name.as_str()))
        .collect()
}

/// `ui.login_code`: a one-time code for `/ui/login`. Only a bearer-token client
/// (`drover ui`) may ask: a browser logged in by cookie cannot mint logins for others.
pub(super) fn ui_login_code(
    owner: &Owner,
    conn: &ConnHandle,
) -> Result<wire::UiLoginCode, OwnerError> {
    if conn.credential != Credential::Bearer {
        return Err(OwnerError::BearerOnly(
            "ui.login_code needs the bearer token: run `drover ui`".into(),
        ));
    }
    let code = owner
        .browser
        .issue_code()
        .map_err(|e| OwnerError::Registry(format!("cannot draw a login code: {e}")))?;
    Ok(wire::UiLoginCode {
        url: owner.browser.login_url(&code),
        code,
        expires_in_s: owner.browser.code_ttl().as_secs().max(1),
    })
}

/// The home registry (SPEC section 7: `<home>/jobs`, as the `jobs` toolset and `drover job`
/// use by default).
fn home_registry(owner: &Owner) -> std::path::PathBuf {
    owner.home.join("jobs")
}

/// A registry failure on the wire: an unknown job is `not_found`, anything else
/// `storage_unavailable`.
fn registry_error(e: drover_jobs::JobError) -> OwnerError {
    match e {
        drover_jobs::JobError::UnknownJob { job_id, .. } => {
            OwnerError::NotFound(format!("job {job_id}"))
        }
        e => OwnerError::Registry(e.to_string()),
    }
}

/// `job.list`: read off the runtime's threads, never written.
pub(super) async fn job_list(owner: &Arc<Owner>) -> Result<wire::JobList, OwnerError> {
    let dir = home_registry(owner);
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64());
    tokio::task::spawn_blocking(move || crate::jobs::list(&dir, now))
        .await
        .map_err(|e| OwnerError::Registry(format!("the registry read failed: {e}")))?
        .map_err(registry_error)
}

/// `job.events`.
pub(super) async fn job_events(
    owner: &Arc<Owner>,
    p: wire::JobEventsParams,
) -> Result<wire::JobEvents, OwnerError> {
    let dir = home_registry(owner);
    let after = p.after.unwrap_or(0);
    tokio::task::spawn_blocking(move || crate::jobs::events(&dir, &p.job_id, after))
        .await
        .map_err(|e| OwnerError::Registry(format!("the registry read failed: {e}")))?
        .map_err(registry_error)
}
