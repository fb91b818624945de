//! Adoption (SPEC section 9, daemon handoff): the next owner takes over the previous owner's
//! running worker executions instead of losing them. Only a handoff both owners took part in
//! adopts: the previous owner hands over each execution's secret, and an execution is adopted
//! only when that secret matches its stored digest, it is still live, of the epoch handed
//! from and of the generation handed. Everything else of an older epoch is still lost by
//! [`Ledger::recover`] (G2 unchanged).
//!
//! The order at the next owner's start: [`Ledger::check_adoption`] (no write: a handoff that
//! would fail is refused before the previous owner lets go), then [`Ledger::bump_epoch`],
//! [`Ledger::adopt_executions`], [`Ledger::recover`].

use rusqlite::{params, Connection, OptionalExtension};

use crate::admissions::load_admission;
use crate::digests::digests_equal;
use crate::state::ExecutionStatus;
use crate::turns::Claim;
use crate::{digest, Ledger, LedgerError};

/// One running worker execution the previous owner hands over, with the proof it may be
/// adopted: the secret its worker was given (the ledger keeps only its digest).
#[derive(Clone, PartialEq)]
pub struct Handover {
    /// The execution.
    pub execution_id: String,
    /// Its generation, as the previous owner ran it.
    pub generation: u64,
    /// The execution's secret.
    pub secret: drover_protocol::Secret,
}

impl std::fmt::Debug for Handover {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Handover")
            .field("execution_id", &self.execution_id)
            .field("generation", &self.generation)
            .finish_non_exhaustive()
    }
}

impl Ledger {
    /// Checks, writing nothing, that every execution of `handed` can be adopted from
    /// `from_epoch`; the error names the first that cannot, and why.
    pub fn check_adoption(&self, from_epoch: u64, handed: &[Handover]) -> Result<(), LedgerError> {
        for handover in handed {
            check_one(&self.conn, from_epoch, handover)?;
        }
        Ok(())
    }

    /// Adopts every execution of `handed` into this owner's epoch (call after
    /// [`Ledger::bump_epoch`], before [`Ledger::recover`]): the execution, its admission and its
    /// session's turn lease move to the current epoch, its generation and sequence numbers go
    /// on. Children reserved under `from_epoch` whose turn was not claimed yet move too, so
    /// this owner claims them. One transaction: all of them or none. Returns each adopted turn
    /// as a [`Claim`] without history (its worker has had its bootstrap).
    pub fn adopt_executions(
        &mut self,
        from_epoch: u64,
        handed: &[Handover],
    ) -> Result<Vec<Claim>, LedgerError> {
        let epoch = self.epoch;
        if epoch <= from_epoch {
            return Err(LedgerError::invalid(
                "epoch",
                format!("adopting from epoch {from_epoch} needs a later epoch; this is {epoch}"),
            ));
        }
        let tx = self.conn.transaction()?;
        let mut adopted = Vec::with_capacity(handed.len());
        for handover in handed {
            let (session_id, admission_id) = check_one(&tx, from_epoch, handover)?;
            tx.execute(
                "UPDATE worker_executions SET owner_epoch = ?1 WHERE execution_id = ?2",
                params![epoch as i64, handover.execution_id],
            )?;
            tx.execute(
                "UPDATE session_admissions SET owner_epoch = ?1 WHERE admission_id = ?2",
                params![epoch as i64, admission_id],
            )?;
            tx.execute(
                "UPDATE session_turn_leases SET owner_epoch = ?1 WHERE execution_id = ?2",
                params![epoch as i64, handover.execution_id],
            )?;
            adopted.push(claim_of(&tx, epoch, &session_id, &admission_id, handover)?);
        }
        // A child reserved by an adopted parent and not claimed yet: its own turn starts under
        // this owner (recovery would retire it, and the parent would lose its child).
        tx.execute(
            "UPDATE worker_executions SET owner_epoch = ?1
             WHERE kind = 'child' AND status = 'registered' AND owner_epoch = ?2
               AND admission_id IN (SELECT admission_id FROM session_admissions
                                    WHERE status = 'queued')",
            params![epoch as i64, from_epoch as i64],
        )?;
        tx.commit()?;
        Ok(adopted)
    }
}

/// Whether `handover` may be adopted from `from_epoch`: its session and admission when it may.
fn check_one(
    conn: &Connection,
    from_epoch: u64,
    handover: &Handover,
) -> Result<(String, String), LedgerError> {
    let id = &handover.execution_id;
    let row: Option<(String, Option<String>, String, i64, i64, String)> = conn
        .query_row(
            "SELECT session_id, admission_id, status, owner_epoch, generation, secret_digest
             FROM worker_executions WHERE execution_id = ?1",
            [id],
            |r| {
                Ok((
                    r.get(0)?,
                    r.get(1)?,
                    r.get(2)?,
                    r.get(3)?,
                    r.get(4)?,
                    r.get(5)?,
                ))
            },
        )
        .optional()?;
    let Some((session_id, admission_id, status, owner_epoch, generation, secret_digest)) = row
    else {
        return Err(LedgerError::NotFound(format!("execution {id}")));
    };
    let status = ExecutionStatus::parse(&status)
        .ok_or_else(|| LedgerError::Corrupt(format!("worker_executions.status {status:?}")))?;
    if !status.is_live() {
        return Err(LedgerError::StaleGeneration(format!(
            "execution {id} is {status}, not running: it cannot be adopted"
        )));
    }
    if owner_epoch as u64 != from_epoch {
        return Err(LedgerError::StaleGeneration(format!(
            "execution {id} belongs to epoch {owner_epoch}, not to the epoch {from_epoch} handed from"
        )));
    }
    if generation as u64 != handover.generation {
        return Err(LedgerError::StaleGeneration(format!(
            "execution {id} runs generation {generation}, not {}",
            handover.generation
        )));
    }
    if !digests_equal(&digest(handover.secret.expose().as_bytes()), &secret_digest) {
        return Err(LedgerError::PermissionDenied(format!(
            "the secret handed over for execution {id} does not match"
        )));
    }
    let admission_id = admission_id
        .ok_or_else(|| LedgerError::Corrupt(format!("execution {id} has no admission")))?;
    Ok((session_id, admission_id))
}

/// The adopted turn as a [`Claim`] without history or events.
fn claim_of(
    tx: &Connection,
    epoch: u64,
    session_id: &str,
    admission_id: &str,
    handover: &Handover,
) -> Result<Claim, LedgerError> {
    let admission = load_admission(tx, session_id, admission_id)?
        .ok_or_else(|| LedgerError::NotFound(format!("admission {admission_id}")))?;
    let session = crate::sessions::session_in(tx, session_id)?
        .ok_or_else(|| LedgerError::NotFound(format!("session {session_id}")))?;
    Ok(Claim {
        admission,
        session,
        execution_id: handover.execution_id.clone(),
        generation: handover.generation,
        epoch,
        history: Default::default(),
        context_window_found: None,
        approval_grants: Vec::new(),
        scoped_rules: Vec::new(),
        background_processes: Vec::new(),
        events: Vec::new(),
        budget_limited: crate::budget::limited(tx, session_id)?,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::{claim, open, session};

    fn handover(claim: &Claim, secret: &str) -> Handover {
        Handover {
            execution_id: claim.execution_id.clone(),
            generation: claim.generation,
            secret: drover_protocol::Secret::new(secret.to_string()),
        }
    }

    fn count(ledger: &Ledger, sql: &str) -> i64 {
        ledger.conn.query_row(sql, [], |r| r.get(0)).unwrap()
    }

    #[test]
    fn an_adopted_turn_survives_recovery_and_a_wrong_secret_adopts_nothing() {
        let (_dir, mut ledger) = open();
        let s1 = session(&mut ledger, &[], Vec::new());
        let s2 = session(&mut ledger, &[], Vec::new());
        let handed = claim(&mut ledger, &s1, "handed over", "secret-1");
        let left = claim(&mut ledger, &s2, "not handed over", "secret-2");
        let from = ledger.epoch();

        // A wrong secret, or another generation, is refused before anything is written.
        let wrong = handover(&handed, "not-the-secret");
        assert!(matches!(
            ledger.check_adoption(from, std::slice::from_ref(&wrong)),
            Err(LedgerError::PermissionDenied(_))
        ));
        let mut stale = handover(&handed, "secret-1");
        stale.generation += 1;
        assert!(ledger.check_adoption(from, &[stale]).is_err());
        assert!(ledger
            .check_adoption(from + 1, &[handover(&handed, "secret-1")])
            .is_err());
        let good = handover(&handed, "secret-1");
        ledger
            .check_adoption(from, std::slice::from_ref(&good))
            .unwrap();

        ledger.bump_epoch().unwrap();
        // All or nothing: one wrong secret adopts none.
        assert!(ledger
            .adopt_executions(from, &[good.clone(), wrong])
            .is_err());
        let adopted = ledger.adopt_executions(from, &[good]).unwrap();
        assert_eq!(adopted.len(), 1);
        assert_eq!(adopted[0].execution_id, handed.execution_id);
        assert_eq!(adopted[0].epoch, from + 1);
        let recovery = ledger.recover().unwrap();
        // Only the turn that was not handed over is lost.
        assert_eq!(
            recovery.unknown_admissions,
            vec![left.admission.admission_id.clone()]
        );
        assert_eq!(
            count(
                &ledger,
                "SELECT count(*) FROM session_admissions WHERE status = 'started'"
            ),
            1
        );
        assert_eq!(
            count(&ledger, "SELECT count(*) FROM session_turn_leases"),
            1,
            "the adopted turn keeps its lease"
        );
    }
}
