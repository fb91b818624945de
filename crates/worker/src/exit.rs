//! How the worker process ends: [`WorkerExit`] and its exit code.

use drover_protocol::Exit;

/// How the worker process ends; [`WorkerExit::exit`] gives its code from the binary's one
/// [`Exit`] enum.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WorkerExit {
    /// 0: `execution.finish` was persisted and acknowledged, and the outbox ended.
    Finished,
    /// 1: the turn could not be settled: the owner is gone (end of stdin, broken stdout,
    /// SIGTERM, a changed parent, a handoff not adopted within its grace period), or the
    /// bootstrap or outbox was unusable. No
    /// `execution.finish` was sent; the owner marks the execution `unknown`.
    Aborted,
    /// 2: the owner refused a persist (`stale_epoch`, `stale_generation`, `permission_denied`,
    /// `admission_conflict`, ...). The turn stopped; no `execution.finish` was sent.
    Refused,
}

impl WorkerExit {
    /// The process exit status, as the binary's [`Exit`] names it.
    pub fn exit(self) -> Exit {
        match self {
            WorkerExit::Finished => Exit::Ok,
            WorkerExit::Aborted => Exit::Failed,
            WorkerExit::Refused => Exit::Incomplete,
        }
    }

    /// The process exit code: 0, 1 or 2.
    pub fn code(self) -> u8 {
        self.exit().code()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exit_codes_are_zero_one_two() {
        assert_eq!(WorkerExit::Finished.code(), 0);
        assert_eq!(WorkerExit::Aborted.code(), 1);
        assert_eq!(WorkerExit::Refused.code(), 2);
    }
}
