//! Where the `jobs` toolset records what it submits ([`JobLedger`], `job.register`) and what
//! it needs beyond the rest of a tool call's context ([`JobsAccess`]), apart from the toolset
//! so the context can hold it without depending on the tools.

use std::sync::{Arc, Mutex};

use async_trait::async_trait;
use drover_protocol::worker::{JobRegister, JobsWire};

/// Where the toolset records the jobs it submits (SPEC section 4, `job.register`). The worker
/// implements it by persisting through the owner.
#[async_trait]
pub trait JobLedger: Send + Sync {
    /// Records `job` for the session; `Err` says why it could not be.
    async fn register(&self, job: JobRegister) -> Result<(), String>;
}

/// A [`JobLedger`] kept in memory (tests, contexts without an owner). Clones share the list.
#[derive(Clone, Debug, Default)]
pub struct InMemoryJobs(Arc<Mutex<Vec<JobRegister>>>);

impl InMemoryJobs {
    /// What was recorded, oldest first.
    pub fn list(&self) -> Vec<JobRegister> {
        self.0.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }
}

#[async_trait]
impl JobLedger for InMemoryJobs {
    async fn register(&self, job: JobRegister) -> Result<(), String> {
        let mut list = self.0.lock().unwrap_or_else(|p| p.into_inner());
        if !list.contains(&job) {
            list.push(job);
        }
        Ok(())
    }
}

/// What the `jobs` toolset needs beyond the rest of a `ToolContext`. Cheap to clone.
#[derive(Clone)]
pub struct JobsAccess {
    /// Where submitted jobs are recorded for the session (`job.register`).
    pub ledger: Arc<dyn JobLedger>,
    /// The home's `[mqtt]` (from the bootstrap).
    pub wire: JobsWire,
}

impl Default for JobsAccess {
    fn default() -> JobsAccess {
        JobsAccess {
            ledger: Arc::new(InMemoryJobs::default()),
            wire: JobsWire::default(),
        }
    }
}
