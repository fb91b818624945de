//! Every exit code of the `drover` binary, for every command (SPEC section 8; the table is
//! in README, "Commands"). Scripts and the owner read these numbers, so they never change.

/// Every exit code of `drover`, whatever the command (SPEC section 8).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Exit {
    /// The turn completed, or the command did what it was asked. `drover worker`:
    /// `execution.finish` was persisted and acknowledged.
    Ok = 0,
    /// The turn failed, or the command could not do its job (the reason is on stderr); also
    /// a command line that does not parse. `job submit`: the job ended without `completed`
    /// (`agent_blocked`: no `started` within T; or `error`, `cancelled`). `job publish`:
    /// refused, nothing recorded and no seq used. `drover daemon`: could not start (bad
    /// config, foreign ledger, bind failure). `drover worker`: the turn could not be settled
    /// (the owner is gone, or the bootstrap or outbox was unusable).
    Failed = 1,
    /// `job submit`: the job went quiet for its idle window (`deadline_timeout`) or ran past
    /// `--timeout`. `job publish`: the event was recorded but the broker was unreachable.
    /// `drover worker`: the owner refused a persist, so the turn stopped unsettled.
    Incomplete = 2,
    /// `drover daemon`: this home is owned by another running daemon (SPEC section 1). No
    /// command uses 3 for anything else.
    HomeOwned = 3,
    /// The turn's outcome is unknown (its worker or the owner died while it ran).
    Unknown = 4,
    /// A prompt waits for an answer and there is no terminal to ask on.
    PromptWaiting = 5,
    /// Interrupted with Ctrl-C.
    Interrupted = 130,
}

impl Exit {
    /// The process exit status.
    pub fn code(self) -> u8 {
        self as u8
    }
}

impl From<Exit> for std::process::ExitCode {
    fn from(exit: Exit) -> Self {
        std::process::ExitCode::from(exit.code())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exit_codes_keep_their_numbers() {
        let table = [
            (Exit::Ok, 0),
            (Exit::Failed, 1),
            (Exit::Incomplete, 2),
            (Exit::HomeOwned, 3),
            (Exit::Unknown, 4),
            (Exit::PromptWaiting, 5),
            (Exit::Interrupted, 130),
        ];
        for (exit, code) in table {
            assert_eq!(exit.code(), code, "{exit:?}");
        }
    }
}
