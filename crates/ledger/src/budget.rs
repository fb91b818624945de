//! Spend limits (docs/configuration.md, "Budgets"; docs/guarantees.md, "Budgets"): what each
//! execution's model requests cost (`worker_executions.cost_usd`, priced at `usage.add` from
//! `[pricing]`), the `budget.check` a worker sends before each step's model request, the
//! `budget` prompt it opens when the next request would pass a limit, and the answers and raises
//! that let the turn go on or stop it.
//!
//! A session's limits are its root parent's (`sessions.budget_usd`, `budget_tokens`; a child
//! agent's session has none of its own), spent by the whole tree of sessions under that root.
//! The home-wide daily limit is `[budget] home_usd_per_day` plus today's raises
//! (`home_budget_raises`), spent by the executions created today (UTC).

use std::collections::BTreeMap;

use drover_protocol::words::{BudgetChoice, BudgetScope};
use drover_protocol::worker::UsageAdd;
use rusqlite::{params, Connection, OptionalExtension};
use serde_json::{json, Value};

use crate::events::StoredEvent;
use crate::prompts::PromptRow;
use crate::sql::Cached;
use crate::state::PromptStatus;
use crate::{now, Ledger, LedgerError};

/// Sums of USD that differ by less than this are equal (a sum of float prices).
const USD_EPSILON: f64 = 1e-9;

/// The most levels a child's session is looked up through to find its root parent.
const MAX_TREE_DEPTH: usize = 64;

/// A model's price (`[pricing."<model>"]`), USD per million tokens.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct Price {
    /// Input (prompt) tokens.
    pub input_per_mtok: f64,
    /// Cached input tokens; `None`: as `input_per_mtok`.
    pub cached_input_per_mtok: Option<f64>,
    /// Output (completion) tokens.
    pub output_per_mtok: f64,
}

impl Price {
    /// What `usage` costs at this price: its cached input tokens at `cached_input_per_mtok`
    /// (else `input_per_mtok`), the rest of its input at `input_per_mtok`.
    pub fn cost(&self, usage: &UsageAdd) -> f64 {
        let cached = usage.cached_input_tokens.min(usage.input_tokens);
        let fresh = usage.input_tokens - cached;
        let cached_price = self.cached_input_per_mtok.unwrap_or(self.input_per_mtok);
        (fresh as f64 * self.input_per_mtok
            + cached as f64 * cached_price
            + usage.output_tokens as f64 * self.output_per_mtok)
            / 1_000_000.0
    }
}

/// The owner's `[pricing]` and home-wide `[budget]` settings of now, which `usage.add` and
/// `budget.check` are applied with.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct SpendRules {
    /// Prices by model name.
    pub pricing: BTreeMap<String, Price>,
    /// `[budget] home_usd_per_day`.
    pub home_usd_per_day: Option<f64>,
}

/// Adds the cost of one `usage.add` (or a compaction's usage) to its execution: the cost the
/// endpoint reported when it did, else the session's model's price from `[pricing]`. Without
/// either the cost stays as it was (`NULL` when no request of the execution had one).
pub(crate) fn add_cost(
    tx: &Connection,
    execution_id: &str,
    session_id: &str,
    usage: &UsageAdd,
    rules: &SpendRules,
) -> Result<(), LedgerError> {
    let reported = usage.cost_usd.filter(|usd| usd.is_finite() && *usd >= 0.0);
    if reported.is_none() && rules.pricing.is_empty() {
        return Ok(());
    }
    let cost = match reported {
        Some(usd) => usd,
        None => {
            let model: Option<String> = tx
                .query_row_cached(
                    "SELECT model FROM sessions WHERE id = ?1",
                    [session_id],
                    |r| r.get(0),
                )
                .optional()?;
            let Some(price) = model.and_then(|m| rules.pricing.get(&m).copied()) else {
                return Ok(());
            };
            price.cost(usage)
        }
    };
    if !cost.is_finite() {
        return Ok(());
    }
    tx.execute_cached(
        "UPDATE worker_executions SET cost_usd = COALESCE(cost_usd, 0) + ?1 WHERE execution_id = ?2",
        params![cost, execution_id],
    )?;
    Ok(())
}

/// The root session whose budget `session_id` names (a child spends from its root parent's),
/// `None` for the home's; an unknown session is `NotFound`.
fn budget_root(tx: &Connection, session_id: Option<&str>) -> Result<Option<String>, LedgerError> {
    let Some(id) = session_id else {
        return Ok(None);
    };
    crate::sessions::session_in(tx, id)?
        .ok_or_else(|| LedgerError::NotFound(format!("session {id}")))?;
    Ok(Some(root_of(tx, id)?))
}

/// The session whose limits `session_id` spends from: itself, or its root parent.
pub(crate) fn root_of(tx: &Connection, session_id: &str) -> Result<String, LedgerError> {
    let mut id = session_id.to_string();
    for _ in 0..MAX_TREE_DEPTH {
        let parent: Option<Option<String>> = tx
            .query_row_cached(
                "SELECT parent_session_id FROM sessions WHERE id = ?1",
                [&id],
                |r| r.get(0),
            )
            .optional()?;
        match parent.flatten() {
            Some(parent) => id = parent,
            None => break,
        }
    }
    Ok(id)
}

/// Spend under a limit: USD, tokens (input + output) and model requests.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
struct Spend {
    usd: f64,
    tokens: u64,
    calls: u64,
}

impl Spend {
    /// What the next request would need: the average of a request so far.
    fn next(&self) -> (f64, u64) {
        if self.calls == 0 {
            return (0.0, 0);
        }
        (self.usd / self.calls as f64, self.tokens / self.calls)
    }
}

fn spend_row(r: &rusqlite::Row<'_>) -> rusqlite::Result<Spend> {
    let usd: f64 = r.get(0)?;
    let tokens: i64 = r.get(1)?;
    let calls: i64 = r.get(2)?;
    Ok(Spend {
        usd: if usd.is_finite() { usd.max(0.0) } else { 0.0 },
        tokens: tokens.max(0) as u64,
        calls: calls.max(0) as u64,
    })
}

/// The spend of `root` and every session under it.
fn tree_spend(tx: &Connection, root: &str) -> Result<Spend, LedgerError> {
    Ok(tx.query_row_cached(
        "WITH RECURSIVE tree(id) AS (
             SELECT ?1 UNION SELECT s.id FROM sessions s JOIN tree t ON s.parent_session_id = t.id)
         SELECT COALESCE(SUM(e.cost_usd), 0.0), COALESCE(SUM(e.input_tokens + e.output_tokens), 0),
                COALESCE(SUM(e.api_calls), 0)
         FROM worker_executions e WHERE e.session_id IN (SELECT id FROM tree)",
        [root],
        spend_row,
    )?)
}

/// The start of today (UTC) in Unix seconds, and its `YYYY-MM-DD`.
fn today() -> (f64, String) {
    let days = (now() / 86_400.0).floor() as i64;
    (days as f64 * 86_400.0, civil_day(days))
}

/// `YYYY-MM-DD` of a count of days since 1970-01-01 (H. Hinnant's `civil_from_days`).
fn civil_day(days: i64) -> String {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    format!("{y:04}-{m:02}-{d:02}")
}

/// The home's spend today: the executions created since midnight UTC.
fn home_spend(tx: &Connection) -> Result<Spend, LedgerError> {
    let (start, _) = today();
    Ok(tx.query_row_cached(
        "SELECT COALESCE(SUM(cost_usd), 0.0), COALESCE(SUM(input_tokens + output_tokens), 0),
                COALESCE(SUM(api_calls), 0)
         FROM worker_executions WHERE created_at >= ?1",
        [start],
        spend_row,
    )?)
}

/// Today's home-wide limit: `[budget] home_usd_per_day` plus today's raises.
fn home_limit(tx: &Connection, rules: &SpendRules) -> Result<Option<f64>, LedgerError> {
    let Some(base) = rules.home_usd_per_day else {
        return Ok(None);
    };
    let (_, day) = today();
    let raised: Option<f64> = tx
        .query_row_cached(
            "SELECT add_usd FROM home_budget_raises WHERE day = ?1",
            [&day],
            |r| r.get(0),
        )
        .optional()?;
    Ok(Some(base + raised.unwrap_or(0.0)))
}

/// A session's own limits (`sessions.budget_usd`, `budget_tokens`).
fn session_limits(
    tx: &Connection,
    session_id: &str,
) -> Result<(Option<f64>, Option<u64>), LedgerError> {
    let limits: Option<(Option<f64>, Option<i64>)> = tx
        .query_row_cached(
            "SELECT budget_usd, budget_tokens FROM sessions WHERE id = ?1",
            [session_id],
            |r| Ok((r.get(0)?, r.get(1)?)),
        )
        .optional()?;
    let (usd, tokens) = limits.unwrap_or((None, None));
    Ok((usd, tokens.map(|t| t.max(0) as u64)))
}

/// Whether the session (its root parent) has a limit of its own: with the home-wide limit,
/// what the bootstrap's `budget_checked` says.
pub(crate) fn limited(tx: &Connection, session_id: &str) -> Result<bool, LedgerError> {
    let root = root_of(tx, session_id)?;
    let (usd, tokens) = session_limits(tx, &root)?;
    Ok(usd.is_some() || tokens.is_some())
}

/// A limit the next request would pass: the body of a `budget` prompt.
#[derive(Debug, Clone, PartialEq)]
struct Over {
    scope: BudgetScope,
    spent: Spend,
    limit_usd: Option<f64>,
    limit_tokens: Option<u64>,
}

impl Over {
    fn body(&self) -> Value {
        let (next_usd, next_tokens) = self.spent.next();
        json!({
            "scope": self.scope.as_str(),
            "spent_usd": self.spent.usd,
            "spent_tokens": self.spent.tokens,
            "limit_usd": self.limit_usd,
            "limit_tokens": self.limit_tokens,
            "next_usd": next_usd,
            "next_tokens": next_tokens,
        })
    }
}

/// The first limit a next request of `session_id` would pass: the session's (its root's, with
/// its tree's spend), then the home's for today. `None`: the request may start.
fn over(
    tx: &Connection,
    session_id: &str,
    rules: &SpendRules,
) -> Result<Option<Over>, LedgerError> {
    let root = root_of(tx, session_id)?;
    let (limit_usd, limit_tokens) = session_limits(tx, &root)?;
    if limit_usd.is_some() || limit_tokens.is_some() {
        let spent = tree_spend(tx, &root)?;
        let (next_usd, next_tokens) = spent.next();
        let usd_over = limit_usd.is_some_and(|l| spent.usd + next_usd > l + USD_EPSILON);
        let tokens_over =
            limit_tokens.is_some_and(|l| spent.tokens.saturating_add(next_tokens) > l);
        if usd_over || tokens_over {
            return Ok(Some(Over {
                scope: BudgetScope::Session,
                spent,
                limit_usd,
                limit_tokens,
            }));
        }
    }
    if let Some(limit) = home_limit(tx, rules)? {
        let spent = home_spend(tx)?;
        let (next_usd, _) = spent.next();
        if spent.usd + next_usd > limit + USD_EPSILON {
            return Ok(Some(Over {
                scope: BudgetScope::Home,
                spent,
                limit_usd: Some(limit),
                limit_tokens: None,
            }));
        }
    }
    Ok(None)
}

/// The receipt of a `budget.check` that lets the request start.
fn ok_receipt() -> Value {
    json!({"status": "ok"})
}

/// What a `budget.check` got: its receipt now, or a prompt whose answer gives it later.
pub(crate) enum Checked {
    /// Under every limit: `{"status": "ok"}`.
    Ok(Value),
    /// A limit was reached: the prompt opened and its `budget.request` event.
    Paused(String, Box<StoredEvent>),
}

/// Applies a `budget.check` at `sequence` inside `tx`.
pub(crate) fn check(
    tx: &Connection,
    session_id: &str,
    execution_id: &str,
    generation: i64,
    sequence: u64,
    rules: &SpendRules,
) -> Result<Checked, LedgerError> {
    match over(tx, session_id, rules)? {
        None => Ok(Checked::Ok(ok_receipt())),
        Some(over) => {
            let (prompt_id, event) = crate::prompts::insert_prompt(
                tx,
                session_id,
                execution_id,
                generation,
                sequence,
                "budget",
                &over.body(),
            )?;
            Ok(Checked::Paused(prompt_id, Box::new(event)))
        }
    }
}

/// Adds `add_usd` / `add_tokens` to `root`'s limits, or (`root` `None`) `add_usd` to today's
/// home-wide limit. A session limit that was not set starts from what the session's tree has
/// spent: raising it by $5 allows five more dollars from now (`/budget +5` in a chat that was
/// started without one).
fn raise(
    tx: &Connection,
    root: Option<&str>,
    add_usd: Option<f64>,
    add_tokens: Option<u64>,
) -> Result<(), LedgerError> {
    match root {
        Some(root) => {
            let spent = tree_spend(tx, root)?;
            let cap = |n: u64| n.min(i64::MAX as u64 / 2) as i64;
            tx.execute_cached(
                "UPDATE sessions SET
                     budget_usd = CASE WHEN ?1 IS NULL THEN budget_usd
                                       ELSE COALESCE(budget_usd, ?2) + ?1 END,
                     budget_tokens = CASE WHEN ?3 IS NULL THEN budget_tokens
                                       ELSE MIN(COALESCE(budget_tokens, ?4) + ?3, 9007199254740992) END
                 WHERE id = ?5",
                params![
                    add_usd,
                    spent.usd,
                    add_tokens.map(cap),
                    cap(spent.tokens),
                    root
                ],
            )?;
        }
        None => {
            let (_, day) = today();
            tx.execute_cached(
                "INSERT INTO home_budget_raises (day, add_usd) VALUES (?1, ?2)
                 ON CONFLICT (day) DO UPDATE SET add_usd = add_usd + excluded.add_usd",
                params![day, add_usd.unwrap_or(0.0)],
            )?;
        }
    }
    Ok(())
}

/// Checks an amount of `budget.respond` / `budget.raise`.
fn check_amounts(add_usd: Option<f64>, add_tokens: Option<u64>) -> Result<(), LedgerError> {
    if let Some(usd) = add_usd {
        if !usd.is_finite() || usd <= 0.0 {
            return Err(LedgerError::invalid(
                "add_usd",
                format!("add_usd must be a finite amount over 0, not {usd}"),
            ));
        }
    }
    if add_tokens == Some(0) {
        return Err(LedgerError::invalid(
            "add_tokens",
            "add_tokens must be over 0",
        ));
    }
    if add_usd.is_none() && add_tokens.is_none() {
        return Err(LedgerError::invalid(
            "add_usd",
            "a raise names add_usd, add_tokens or both",
        ));
    }
    Ok(())
}

/// A worker waiting on a `budget.check` that now has its receipt: send it.
#[derive(Debug, Clone, PartialEq)]
pub struct BudgetDelivery {
    /// The execution that waits.
    pub execution_id: String,
    /// Its `budget.check` sequence.
    pub sequence: u64,
    /// The receipt: `{"status": "ok"}` or `{"status": "stopped"}`.
    pub receipt: Value,
}

/// What a `budget.respond` did.
#[derive(Debug, Clone, PartialEq)]
pub enum BudgetResponse {
    /// This answer was recorded. `delivery` is the receipt to send (none when the raise was
    /// not enough: a new prompt is open, its event in `events`).
    Resolved {
        /// The receipt for the waiting worker, if the turn may go on or must stop now.
        delivery: Option<BudgetDelivery>,
        /// The `budget.settled` (and a new prompt's `budget.request`) events, to publish.
        events: Vec<StoredEvent>,
    },
    /// Another answer was recorded first.
    AlreadyResolved,
    /// The prompt was closed unanswered; why (`interrupted`, `lost`, `stopped`).
    Cancelled(&'static str),
}

/// A spend and its limits (`budget.status`, `budget.raise`).
#[derive(Debug, Clone, PartialEq, Default)]
pub struct BudgetStanding {
    /// The root session; `None` for the home.
    pub session_id: Option<String>,
    /// USD spent under it.
    pub spent_usd: f64,
    /// Tokens spent under it.
    pub spent_tokens: u64,
    /// The USD limit.
    pub limit_usd: Option<f64>,
    /// The token limit.
    pub limit_tokens: Option<u64>,
    /// Turns that went on (`budget.raise`).
    pub resumed: Vec<BudgetDelivery>,
    /// Budget prompts still open under it.
    pub paused: u64,
    /// Events to publish.
    pub events: Vec<StoredEvent>,
}

/// Resolves an open budget prompt inside `tx` with `answer`, and, for a raise, checks again:
/// under every limit now, the worker's receipt is `ok`; still over, a new prompt is opened for
/// the same `budget.check`. `stop` gives the receipt `stopped`.
fn settle(
    tx: &Connection,
    prompt: &PromptRow,
    choice: BudgetChoice,
    answer: Value,
    rules: &SpendRules,
    events: &mut Vec<StoredEvent>,
) -> Result<Option<BudgetDelivery>, LedgerError> {
    tx.execute_cached(
        "UPDATE prompts SET status = 'resolved', answer = ?1 WHERE prompt_id = ?2 AND status = 'open'",
        params![answer.to_string(), prompt.prompt_id],
    )?;
    let receipt = match choice {
        BudgetChoice::Stop => Some(json!({"status": "stopped"})),
        BudgetChoice::Raise => match over(tx, &prompt.session_id, rules)? {
            None => Some(ok_receipt()),
            Some(_) => None,
        },
    };
    events.push(crate::prompts::budget_settled(
        tx,
        prompt,
        receipt.as_ref(),
        Some(choice),
    )?);
    match receipt {
        Some(receipt) => Ok(Some(BudgetDelivery {
            execution_id: prompt.execution_id.clone(),
            sequence: prompt.sequence,
            receipt,
        })),
        None => {
            if let Some(over) = over(tx, &prompt.session_id, rules)? {
                let (_, event) = crate::prompts::insert_prompt(
                    tx,
                    &prompt.session_id,
                    &prompt.execution_id,
                    prompt.generation as i64,
                    prompt.sequence,
                    "budget",
                    &over.body(),
                )?;
                events.push(event);
            }
            Ok(None)
        }
    }
}

/// The open budget prompts of the sessions under `root`, or of every session (`None`).
fn open_budget_prompts(tx: &Connection, root: Option<&str>) -> Result<Vec<String>, LedgerError> {
    let ids: Vec<String> = match root {
        Some(root) => {
            let mut stmt = tx.prepare_cached(
                "WITH RECURSIVE tree(id) AS (
                     SELECT ?1 UNION SELECT s.id FROM sessions s
                     JOIN tree t ON s.parent_session_id = t.id)
                 SELECT prompt_id FROM prompts
                 WHERE kind = 'budget' AND status = 'open' AND session_id IN (SELECT id FROM tree)
                 ORDER BY created_at, rowid",
            )?;
            let rows = stmt.query_map([root], |r| r.get(0))?;
            rows.collect::<Result<_, _>>()?
        }
        None => {
            let mut stmt = tx.prepare_cached(
                "SELECT prompt_id FROM prompts WHERE kind = 'budget' AND status = 'open'
                 ORDER BY created_at, rowid",
            )?;
            let rows = stmt.query_map([], |r| r.get(0))?;
            rows.collect::<Result<_, _>>()?
        }
    };
    Ok(ids)
}

fn standing(
    tx: &Connection,
    root: Option<&str>,
    rules: &SpendRules,
) -> Result<BudgetStanding, LedgerError> {
    let paused = open_budget_prompts(tx, root)?.len() as u64;
    Ok(match root {
        Some(root) => {
            let spent = tree_spend(tx, root)?;
            let (limit_usd, limit_tokens) = session_limits(tx, root)?;
            BudgetStanding {
                session_id: Some(root.to_string()),
                spent_usd: spent.usd,
                spent_tokens: spent.tokens,
                limit_usd,
                limit_tokens,
                paused,
                ..BudgetStanding::default()
            }
        }
        None => {
            let spent = home_spend(tx)?;
            BudgetStanding {
                session_id: None,
                spent_usd: spent.usd,
                spent_tokens: spent.tokens,
                limit_usd: home_limit(tx, rules)?,
                limit_tokens: None,
                paused,
                ..BudgetStanding::default()
            }
        }
    })
}

impl Ledger {
    /// `budget.respond`: the first answer to a budget prompt of `session_id`'s turn of
    /// `generation`. `raise` adds `add_usd` / `add_tokens` to the limit the prompt is about
    /// (the session's root's, or today's home-wide one) and checks again; `stop` ends the wait
    /// with the receipt `stopped`.
    #[allow(clippy::too_many_arguments)]
    pub fn respond_budget(
        &mut self,
        session_id: &str,
        generation: u64,
        prompt_id: &str,
        choice: BudgetChoice,
        add_usd: Option<f64>,
        add_tokens: Option<u64>,
        rules: &SpendRules,
    ) -> Result<BudgetResponse, LedgerError> {
        if choice == BudgetChoice::Raise {
            check_amounts(add_usd, add_tokens)?;
        }
        let tx = self.conn.transaction()?;
        let prompt = crate::prompts::load_prompt(&tx, prompt_id)?
            .filter(|p| p.session_id == session_id && p.kind == "budget")
            .ok_or_else(|| LedgerError::NotFound(format!("budget prompt {prompt_id}")))?;
        if prompt.generation != generation {
            return Err(LedgerError::StaleGeneration(format!(
                "prompt {prompt_id} belongs to generation {}, not {generation}",
                prompt.generation
            )));
        }
        if prompt.status == PromptStatus::Cancelled {
            let reason = crate::prompts::cancel_reason(&tx, &prompt)?;
            return Ok(BudgetResponse::Cancelled(reason));
        }
        if prompt.status != PromptStatus::Open {
            return Ok(BudgetResponse::AlreadyResolved);
        }
        if choice == BudgetChoice::Raise {
            let home = prompt.body.get("scope").and_then(Value::as_str) == Some("home");
            let root = root_of(&tx, session_id)?;
            raise(&tx, (!home).then_some(root.as_str()), add_usd, add_tokens)?;
        }
        let answer = json!({"choice": choice, "add_usd": add_usd, "add_tokens": add_tokens});
        let mut events = Vec::new();
        let delivery = settle(&tx, &prompt, choice, answer, rules, &mut events)?;
        tx.commit()?;
        Ok(BudgetResponse::Resolved { delivery, events })
    }

    /// `budget.raise`: adds to `session_id`'s limits (its root parent's) or, with no session,
    /// to today's home-wide limit, then checks every turn paused under it again: each one now
    /// under every limit gets its receipt `ok` (in `resumed`).
    pub fn raise_budget(
        &mut self,
        session_id: Option<&str>,
        add_usd: Option<f64>,
        add_tokens: Option<u64>,
        rules: &SpendRules,
    ) -> Result<BudgetStanding, LedgerError> {
        check_amounts(add_usd, add_tokens)?;
        if session_id.is_none() && add_tokens.is_some() {
            return Err(LedgerError::invalid(
                "add_tokens",
                "the home-wide limit is in USD only",
            ));
        }
        if session_id.is_none() && rules.home_usd_per_day.is_none() {
            return Err(LedgerError::invalid(
                "session_id",
                "no home-wide limit is set ([budget] home_usd_per_day); name a session",
            ));
        }
        let tx = self.conn.transaction()?;
        let root = budget_root(&tx, session_id)?;
        raise(&tx, root.as_deref(), add_usd, add_tokens)?;
        let mut events = Vec::new();
        let mut resumed = Vec::new();
        let answer = json!({"choice": "raise", "add_usd": add_usd, "add_tokens": add_tokens});
        for id in open_budget_prompts(&tx, root.as_deref())? {
            let Some(prompt) = crate::prompts::load_prompt(&tx, &id)? else {
                continue;
            };
            if over(&tx, &prompt.session_id, rules)?.is_some() {
                continue;
            }
            if let Some(delivery) = settle(
                &tx,
                &prompt,
                BudgetChoice::Raise,
                answer.clone(),
                rules,
                &mut events,
            )? {
                resumed.push(delivery);
            }
        }
        let mut out = standing(&tx, root.as_deref(), rules)?;
        tx.commit()?;
        out.resumed = resumed;
        out.events = events;
        Ok(out)
    }

    /// `budget.status`: `session_id`'s (its root parent's) spend and limits, or the home's
    /// for today.
    pub fn budget_standing(
        &mut self,
        session_id: Option<&str>,
        rules: &SpendRules,
    ) -> Result<BudgetStanding, LedgerError> {
        let tx = self.conn.transaction()?;
        let root = budget_root(&tx, session_id)?;
        let out = standing(&tx, root.as_deref(), rules)?;
        tx.commit()?;
        Ok(out)
    }

    /// What an execution's model requests cost so far (USD); `None` while no price was known.
    pub fn execution_cost(&self, execution_id: &str) -> Result<Option<f64>, LedgerError> {
        execution_cost(&self.conn, execution_id)
    }
}

/// `worker_executions.cost_usd` of an execution.
pub(crate) fn execution_cost(
    tx: &Connection,
    execution_id: &str,
) -> Result<Option<f64>, LedgerError> {
    let cost: Option<Option<f64>> = tx
        .query_row_cached(
            "SELECT cost_usd FROM worker_executions WHERE execution_id = ?1",
            [execution_id],
            |r| r.get(0),
        )
        .optional()?;
    Ok(cost.flatten())
}

#[cfg(test)]
mod tests {
    use super::{civil_day, Price};
    use drover_protocol::worker::UsageAdd;

    #[test]
    fn cached_input_is_priced_apart_when_it_has_a_price() {
        let usage = UsageAdd {
            input_tokens: 1_000_000,
            output_tokens: 500_000,
            cached_input_tokens: 400_000,
            ..UsageAdd::default()
        };
        let price = Price {
            input_per_mtok: 1.0,
            cached_input_per_mtok: Some(0.25),
            output_per_mtok: 4.0,
        };
        assert!((price.cost(&usage) - (0.6 + 0.1 + 2.0)).abs() < 1e-9);
        let flat = Price {
            cached_input_per_mtok: None,
            ..price
        };
        assert!((flat.cost(&usage) - (1.0 + 2.0)).abs() < 1e-9);
    }

    #[test]
    fn days_since_the_epoch_read_as_their_dates() {
        assert_eq!(civil_day(0), "1970-01-01");
        assert_eq!(civil_day(19_723), "2024-01-01");
        assert_eq!(civil_day(20_793), "2026-12-06");
        assert_eq!(civil_day(-1), "1969-12-31");
    }
}
