//! `drover usage [--since DATE] [--by model|session|day|turn] [--session ID] [--json]`: what
//! the home's model requests spent, from the ledger (the daemon's `usage.report`): tokens in
//! and out, requests, and the cost in USD where a price or the endpoint's own figure is known,
//! one line per group and a total line.

use std::path::Path;

use anyhow::{bail, Context, Result};
use chrono::{DateTime, NaiveDate};
use clap::{Args, ValueEnum};
use drover_protocol::client::{
    UsageGroup, UsageGrouping, UsageReport, UsageReportParams, UsageSpend,
};
use drover_protocol::ClientRequest;

use crate::display::dollars;
use crate::display::printable;
use crate::session_cmd::{head, one_line, require_home, short_len};
use crate::Exit;

/// How `drover usage` groups (`--by`).
#[derive(ValueEnum, Clone, Copy, Debug, Default)]
pub enum By {
    /// The session's model.
    #[default]
    Model,
    /// The session (a delegated child session has its own line).
    Session,
    /// The UTC day the turn started (the day a home-wide daily budget counts it in).
    Day,
    /// Each turn, oldest first.
    Turn,
}

impl From<By> for UsageGrouping {
    fn from(by: By) -> Self {
        match by {
            By::Model => UsageGrouping::Model,
            By::Session => UsageGrouping::Session,
            By::Day => UsageGrouping::Day,
            By::Turn => UsageGrouping::Turn,
        }
    }
}

/// `drover usage` arguments.
#[derive(Args, Debug)]
pub struct UsageArgs {
    /// Only turns started on or after DATE: `YYYY-MM-DD` (from 00:00 UTC) or an RFC 3339
    /// time (`2026-12-06T09:30:00+01:00`).
    #[arg(long, value_name = "DATE")]
    since: Option<String>,
    /// Group by model, session, UTC day or turn.
    #[arg(long, value_enum, default_value_t = By::Model)]
    by: By,
    /// Only this session (its id or a unique prefix) and the sessions it delegated to.
    #[arg(long, value_name = "ID")]
    session: Option<String>,
    /// Print the `usage.report` result as JSON.
    #[arg(long)]
    json: bool,
}

/// `--since`'s DATE as Unix seconds.
fn since_seconds(date: &str) -> Result<f64> {
    if let Ok(day) = NaiveDate::parse_from_str(date, "%Y-%m-%d") {
        if let Some(midnight) = day.and_hms_opt(0, 0, 0) {
            return Ok(midnight.and_utc().timestamp() as f64);
        }
    }
    match DateTime::parse_from_rfc3339(date) {
        Ok(at) => Ok(at.timestamp_millis() as f64 / 1000.0),
        Err(_) => bail!(
            "--since {date:?}: not a date; give YYYY-MM-DD (from 00:00 UTC) or an RFC 3339 time \
             such as 2026-12-06T09:30:00Z"
        ),
    }
}

/// `drover usage`.
pub async fn usage(home: &Path, args: UsageArgs) -> Result<Exit> {
    require_home(home)?;
    let since = args.since.as_deref().map(since_seconds).transpose()?;
    let c = crate::commands::connect(home).await?;
    let session_id = match &args.session {
        Some(prefix) => Some(c.resolve_session(prefix).await?.session_id),
        None => None,
    };
    let request = ClientRequest::UsageReport(UsageReportParams {
        by: Some(args.by.into()),
        since,
        session_id,
    });
    if args.json {
        // As the daemon sent it (fields this build does not know included), once it parses.
        let raw = c.request_value(request).await?;
        drover_client::parse_result::<UsageReport>("usage.report", raw.clone())?;
        println!("{}", serde_json::to_string_pretty(&raw)?);
        return Ok(Exit::Ok);
    }
    let report: UsageReport = c
        .request(request)
        .await
        .context("usage.report (a daemon older than this drover does not have it)")?;
    for line in usage_table(&report) {
        println!("{line}");
    }
    Ok(Exit::Ok)
}

/// A spend's cost cell: `-` when none is known, `*` after one that leaves out turns with no
/// price.
fn cost_cell(spend: &UsageSpend) -> String {
    match spend.cost_usd {
        None => "-".to_string(),
        Some(usd) if spend.unpriced_executions > 0 => format!("{}*", dollars(usd)),
        Some(usd) => dollars(usd),
    }
}

/// A group's cell in the first column; ids by their shortest telling prefix, `id_len`.
fn key_cell(by: UsageGrouping, g: &UsageGroup, id_len: usize) -> String {
    match by {
        UsageGrouping::Model => printable(&g.key).into_owned(),
        UsageGrouping::Day => g.key.clone(),
        UsageGrouping::Session | UsageGrouping::Turn => head(&g.key, id_len).to_string(),
    }
}

/// `drover usage`'s table: a heading, one line per group, the total line, and a note when a
/// cost leaves turns out.
fn usage_table(report: &UsageReport) -> Vec<String> {
    let by = report.by;
    let heading = by.as_str().to_uppercase();
    let ids: Vec<&str> = report.groups.iter().map(|g| g.key.as_str()).collect();
    let id_len = short_len(&ids);
    let keys: Vec<String> = report
        .groups
        .iter()
        .map(|g| key_cell(by, g, id_len))
        .collect();
    let width = keys
        .iter()
        .map(|k| k.chars().count())
        .chain([heading.len(), "total".len()])
        .max()
        .unwrap_or(5)
        .min(40);
    let detail = matches!(by, UsageGrouping::Session | UsageGrouping::Turn);
    let row = |key: &str, s: &UsageSpend, tail: &str| {
        let line = format!(
            "{:<width$}  {:>6}  {:>6}  {:>12}  {:>12}  {:>12}  {:>10}  {tail}",
            one_line(key, width),
            s.executions,
            s.api_calls,
            s.input_tokens,
            s.output_tokens,
            s.total_tokens,
            cost_cell(s),
        );
        line.trim_end().to_string()
    };
    let mut lines = vec![format!(
        "{:<width$}  {:>6}  {:>6}  {:>12}  {:>12}  {:>12}  {:>10}{}",
        heading,
        "TURNS",
        "CALLS",
        "INPUT",
        "OUTPUT",
        "TOTAL",
        "COST",
        if detail { "  MODEL / TITLE" } else { "" }
    )];
    for (g, key) in report.groups.iter().zip(&keys) {
        let tail = if detail {
            let mut tail = printable(g.model.as_deref().unwrap_or_default()).into_owned();
            if let Some(title) = &g.title {
                tail.push_str(&format!("  {}", one_line(&printable(title), 50)));
            }
            if by == UsageGrouping::Turn {
                tail = format!(
                    "session {}  {tail}",
                    head(g.session_id.as_deref().unwrap_or_default(), 8)
                );
            }
            if let Some(parent) = &g.parent_session_id {
                tail.push_str(&format!("  (delegated by {})", head(parent, 8)));
            }
            tail
        } else {
            String::new()
        };
        lines.push(row(key, &g.spend, &tail));
    }
    lines.push(row("total", &report.total, ""));
    let t = &report.total;
    if t.unpriced_executions > 0 {
        lines.push(format!(
            "{}{} turn{} made requests with no price known: not in the cost (set \
             [pricing.\"<model>\"] in config.toml)",
            if t.cost_usd.is_some() { "* " } else { "" },
            t.unpriced_executions,
            if t.unpriced_executions == 1 { "" } else { "s" },
        ));
    }
    lines
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn since_reads_a_day_from_utc_midnight_or_an_rfc3339_time() {
        assert_eq!(since_seconds("2026-12-06").unwrap(), 1_796_515_200.0);
        assert_eq!(
            since_seconds("2026-12-06T01:00:00+01:00").unwrap(),
            1_796_515_200.0
        );
        let refused = since_seconds("yesterday").unwrap_err().to_string();
        assert!(refused.contains("--since"), "{refused}");
    }

    #[test]
    fn the_table_has_a_total_line_and_says_when_a_cost_leaves_turns_out() {
        let spend = |tokens: u64, cost: Option<f64>, unpriced: u64| UsageSpend {
            input_tokens: tokens,
            output_tokens: 1,
            total_tokens: tokens + 1,
            api_calls: 1,
            executions: 1,
            cost_usd: cost,
            unpriced_executions: unpriced,
            ..UsageSpend::default()
        };
        let group = |key: &str, s: UsageSpend| UsageGroup {
            key: key.into(),
            session_id: None,
            title: None,
            model: None,
            parent_session_id: None,
            first_at: 0.0,
            spend: s,
        };
        let report = UsageReport {
            by: UsageGrouping::Model,
            since: None,
            groups: vec![
                group("gpt-x", spend(10, Some(0.25), 0)),
                group("local", spend(20, None, 1)),
            ],
            total: UsageSpend {
                executions: 2,
                ..spend(30, Some(0.25), 1)
            },
        };
        let lines = usage_table(&report);
        assert!(lines[0].starts_with("MODEL"), "{lines:?}");
        assert!(
            lines[1].contains("gpt-x") && lines[1].ends_with("$0.2500"),
            "{lines:?}"
        );
        assert!(lines[2].ends_with('-'), "{lines:?}");
        assert!(
            lines[3].starts_with("total") && lines[3].ends_with("$0.2500*"),
            "{lines:?}"
        );
        assert!(lines[4].contains("1 turn made requests"), "{lines:?}");
    }
}
