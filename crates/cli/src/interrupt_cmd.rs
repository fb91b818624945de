//! `drover interrupt ID`: stop a session's running turn from any terminal (SPEC section 9,
//! "Interrupt from the command line"). `session.interrupt` is fenced by the turn's generation so
//! a stop never lands on a later turn; this command reads the running turn and its generation
//! from the session's snapshot itself, so a person never has to. It then follows the session
//! until the turn settles and says how it ended: a stop is only asked for, and a worker that does
//! not stop within `[daemon] interrupt_grace_s` is killed, which leaves the turn `unknown`.

use std::path::Path;
use std::time::Duration;

use anyhow::{anyhow, bail, Result};
use clap::Args;
use drover_client::{SessionStream, Update};
use drover_protocol::client::{AdmissionStatus, SessionSnapshot};
use drover_protocol::event::{EventPayload, TurnEnd};
use serde_json::json;

use crate::Exit;

/// `drover interrupt <id> [--json]` arguments.
#[derive(Args, Debug)]
pub struct InterruptArgs {
    /// The session: its id, or any unique prefix of it.
    session: String,
    /// Print `{session_id, admission_id, execution_generation, outcome}`.
    #[arg(long)]
    json: bool,
}

/// How long past the interrupt grace a turn may take to settle before this command stops
/// waiting: the daemon kills a worker at the end of the grace, so only a daemon that has
/// stopped answering gets here.
const SETTLE_MARGIN: Duration = Duration::from_secs(30);

/// The first 8 characters of a session id, as the hints name it.
fn short(sid: &str) -> &str {
    sid.get(..8).unwrap_or(sid)
}

/// The running turn of `snapshot`: its admission and generation.
fn running_turn(snapshot: &SessionSnapshot) -> Option<(String, u64)> {
    snapshot
        .pending
        .iter()
        .filter(|p| p.status == AdmissionStatus::Started)
        .find_map(|p| Some((p.admission_id.clone(), p.execution_generation?)))
}

/// Why nothing can be interrupted in `snapshot`'s session, with what can be done instead.
fn nothing_running(snapshot: &SessionSnapshot) -> String {
    let sid = &snapshot.session_id;
    let mut why = format!("no turn is running in session {sid}: nothing to interrupt");
    if let Some(p) = snapshot
        .pending
        .iter()
        .find(|p| p.status == AdmissionStatus::Unknown)
    {
        why.push_str(&format!(
            "; turn {} has an unknown outcome (`drover resolve {}` closes it)",
            p.admission_id,
            short(sid)
        ));
    }
    let queued = snapshot
        .pending
        .iter()
        .filter(|p| p.status == AdmissionStatus::Queued)
        .count();
    if queued > 0 {
        why.push_str(&format!(
            "; {queued} queued input{} (`drover cancel {}` takes them off)",
            if queued == 1 { "" } else { "s" },
            short(sid)
        ));
    }
    why
}

/// `drover interrupt`.
pub async fn interrupt(home: &Path, args: InterruptArgs) -> Result<Exit> {
    crate::session_cmd::require_home(home)?;
    let c = crate::commands::connect(home).await?;
    let sid = c.resolve_session(&args.session).await?.session_id;
    // Attached before the interrupt, so the turn's settling cannot slip between the two.
    let mut stream = c.attach(&sid).await?;
    let Some((admission, generation)) = running_turn(stream.snapshot()) else {
        bail!("{}", nothing_running(stream.snapshot()));
    };
    if let Err(e) = c.interrupt(&sid, generation).await {
        if e.reason() != Some("stale_generation") {
            return Err(e.into());
        }
        // It ended between the snapshot and the interrupt; the stream says how.
    }
    let grace = drover_owner::config::Config::load(home)
        .map(|config| config.daemon.interrupt_grace_s.max(0.0))
        .unwrap_or(5.0);
    let bound = Duration::from_secs_f64(grace) + SETTLE_MARGIN;
    let outcome = match tokio::time::timeout(bound, settled(&c, &mut stream, &admission)).await {
        Ok(outcome) => outcome?,
        Err(_) => bail!(
            "asked turn {admission} (generation {generation}) of session {sid} to stop, but it \
             has not settled after {} s (`drover show {}` shows it)",
            bound.as_secs(),
            short(&sid)
        ),
    };
    if args.json {
        println!(
            "{}",
            serde_json::to_string_pretty(&json!({
                "session_id": sid,
                "admission_id": admission,
                "execution_generation": generation,
                "outcome": outcome,
            }))?
        );
    }
    Ok(match outcome {
        TurnEnd::Interrupted => {
            if !args.json {
                println!("interrupted turn {admission} (generation {generation}) of session {sid}");
            }
            Exit::Ok
        }
        TurnEnd::Unknown => {
            eprintln!(
                "drover: turn {admission} (generation {generation}) of session {sid} did not stop \
                 within the interrupt grace and was killed: its outcome is unknown; `drover \
                 resolve {}` closes it",
                short(&sid)
            );
            Exit::Unknown
        }
        other => {
            let word = serde_json::to_value(other)?;
            eprintln!(
                "drover: turn {admission} (generation {generation}) of session {sid} ended {} \
                 before the interrupt reached it",
                word.as_str().unwrap_or_default()
            );
            Exit::Failed
        }
    })
}

/// How turn `admission` ended, from the session's events after the attach.
async fn settled(
    c: &drover_client::Client,
    stream: &mut SessionStream,
    admission: &str,
) -> Result<TurnEnd> {
    loop {
        let update = stream
            .next()
            .await
            .ok_or_else(|| anyhow!("the connection to the daemon closed"))?;
        match update {
            Ok(Update::Event(event)) => match event.event {
                EventPayload::TurnSettled(s) if s.admission_id == admission => return Ok(s.outcome),
                EventPayload::AdmissionUpdated(u)
                    if u.admission_id == admission && u.status == AdmissionStatus::Unknown =>
                {
                    return Ok(TurnEnd::Unknown)
                }
                _ => {}
            },
            // The stored stream could not be followed: the turn's receipt says where it is.
            Ok(Update::Snapshot(snapshot)) => {
                if running_turn(&snapshot).is_some_and(|(a, _)| a == admission) {
                    continue;
                }
                let sid = stream.session_id().to_string();
                let r = c.receipt(&sid, admission, false).await?;
                match (r.status, r.outcome) {
                    (AdmissionStatus::Unknown, _) => return Ok(TurnEnd::Unknown),
                    (AdmissionStatus::Terminal, Some(o)) => return Ok(TurnEnd::from(o)),
                    _ => {}
                }
            }
            Ok(Update::Connection(_)) => {}
            // One event that does not parse: the rest still tell.
            Err(e @ drover_client::ClientError::GaveUp { .. }) => return Err(e.into()),
            Err(_) => {}
        }
    }
}
