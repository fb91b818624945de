//! Asking before a dangerous action: the [`approval`](crate::approval) policy's decision for a
//! tool call, and when it says "ask", an `approval` prompt through the call's
//! [`ToolContext`], raced against the turn's cancel token. The prompt names the key's command
//! class and the scopes an `always` answer may choose ([`crate::approval::scope`]). A `session`
//! or `always` answer grants the pattern key for the rest of the context, an `always` one only
//! within its scope's tree (the owner stores it for later turns).

use serde_json::Value;

use crate::approval::scope::{self, Subject};
use crate::approval::{decide_dangerous, ApprovalChoice, ApprovalMode, Danger, Decision, Refusal};
use crate::prompt::PromptAnswer;
use crate::tool_context::ToolContext;

/// Applies the approval policy to one dangerous action (SPEC section 6): runs it when the mode
/// is `auto` or a `session`/`always` grant covers `danger.key`, refuses it in `deny` mode, and
/// otherwise opens an `approval` prompt showing `shown` (the command, or `write_file <path>`)
/// and waits for the answer, racing the turn's cancel token. A `session` or `always` answer
/// also grants the key for the rest of this context (the owner stores it for later turns).
pub async fn authorize(ctx: &ToolContext, danger: &Danger, shown: &str) -> Result<(), Refusal> {
    authorize_key(ctx, danger.key, &danger.description, shown).await
}

/// [`authorize`] for an action whose place is known (`subject`: a command and its working
/// directory, or a file): an `always` rule bound to a directory tree that covers it lets it
/// run, and the prompt offers the trees that cover it as scopes.
pub async fn authorize_in(
    ctx: &ToolContext,
    danger: &Danger,
    shown: &str,
    subject: Subject<'_>,
) -> Result<(), Refusal> {
    let ungranted = first_ungranted(ctx, danger, subject);
    let decision = decide_dangerous(ctx.approvals.get(), ungranted.is_none());
    let danger = ungranted.as_ref().unwrap_or(danger);
    authorize_as(
        ctx,
        decision,
        danger.key,
        &danger.description,
        shown,
        Some(subject),
    )
    .await
}

/// The first danger of the action that no grant covers, starting with `danger`; `None` when
/// grants cover them all. A grant covers its class only: a rule for recursive deletes does not
/// let `rm -rf x; kill -9 -1` through, and the prompt then names the class still unapproved.
fn first_ungranted(ctx: &ToolContext, danger: &Danger, subject: Subject<'_>) -> Option<Danger> {
    let mut next = Some(danger.clone());
    let mut passed = Vec::new();
    while let Some(found) = next {
        if !ctx.grants.covers(found.key, Some(subject)) || passed.contains(&found.key) {
            return Some(found);
        }
        let Subject::Command { command, .. } = subject else {
            return None;
        };
        passed.push(found.key);
        next = crate::approval::classify_except(command, &passed);
    }
    None
}

/// [`authorize`] for an action whose grant key is not one of [`PATTERNS`](crate::approval::PATTERNS) (a `terminal`
/// call's `sandbox: false` escalation, keyed by its exact command).
pub async fn authorize_key(
    ctx: &ToolContext,
    key: &str,
    description: &str,
    shown: &str,
) -> Result<(), Refusal> {
    let decision = decide_dangerous(ctx.approvals.get(), ctx.grants.contains(key));
    authorize_as(ctx, decision, key, description, shown, None).await
}

/// [`authorize_key`] for an action that runs with none of the sandbox's protection (an `exec`
/// job's command): it asks in `auto` mode too, since `auto` trusts the sandbox to hold what a
/// command might do. Only a `session` or `always` grant of `key` skips the prompt; `deny`
/// refuses.
pub async fn authorize_unconfined(
    ctx: &ToolContext,
    key: &str,
    description: &str,
    shown: &str,
) -> Result<(), Refusal> {
    let mode = ctx.approvals.get();
    let decision = match decide_dangerous(mode, ctx.grants.contains(key)) {
        Decision::Run if mode == ApprovalMode::Auto && !ctx.grants.contains(key) => Decision::Ask,
        decision => decision,
    };
    authorize_as(ctx, decision, key, description, shown, None).await
}

async fn authorize_as(
    ctx: &ToolContext,
    decision: Decision,
    key: &str,
    description: &str,
    shown: &str,
    subject: Option<Subject<'_>>,
) -> Result<(), Refusal> {
    match decision {
        Decision::Run => Ok(()),
        Decision::Refuse => Err(Refusal::ModeDeny),
        Decision::Ask => {
            let class = scope::class_of(key);
            let body = serde_json::json!({
                "command": shown,
                "description": description,
                "pattern_key": key,
                "choices": ApprovalChoice::ALL.map(ApprovalChoice::as_str),
                "scopes": scope::offers(
                    &class,
                    &ctx.cwd,
                    subject.filter(|_| scope::tree_bound(key))
                ),
                "class": class,
            });
            let answer = tokio::select! {
                biased;
                () = ctx.cancel.cancelled() => return Err(Refusal::Interrupted),
                answer = ctx.prompts.open("approval", body) => answer,
            };
            // The owner may close the prompt because of the interrupt itself.
            if ctx.cancel.is_cancelled() {
                return Err(Refusal::Interrupted);
            }
            // An `always` answer whose rule is bound to a tree comes as `{choice, path}`.
            let (choice, tree) = match &answer {
                PromptAnswer::Answered(Value::String(s)) => {
                    (s.parse::<ApprovalChoice>().ok(), None)
                }
                PromptAnswer::Answered(Value::Object(o)) => {
                    match (o.get("choice").and_then(Value::as_str), o.get("path")) {
                        (Some("always"), Some(Value::String(path))) => (
                            Some(ApprovalChoice::Always),
                            Some(std::path::PathBuf::from(path)),
                        ),
                        _ => (None, None),
                    }
                }
                PromptAnswer::Answered(_) => (None, None),
                PromptAnswer::Cancelled => (Some(ApprovalChoice::Deny), None),
            };
            match choice {
                Some(choice) if choice.allows() => {
                    tracing::info!(session_id = %ctx.session_id, pattern_key = key, choice = %choice, "dangerous action approved");
                    match (choice, tree) {
                        (ApprovalChoice::Always, Some(tree)) => ctx.grants.insert_tree(key, tree),
                        (ApprovalChoice::Session | ApprovalChoice::Always, _) => {
                            ctx.grants.insert(key)
                        }
                        _ => {}
                    }
                    Ok(())
                }
                Some(_) => Err(Refusal::Denied),
                None => {
                    // Only once/session/always allow it; anything else is a no.
                    tracing::warn!(session_id = %ctx.session_id, ?answer, "unreadable approval answer, treated as deny");
                    Err(Refusal::Denied)
                }
            }
        }
    }
}
