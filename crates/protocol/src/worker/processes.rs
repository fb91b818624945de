//! Background processes as the worker reports them and the bootstrap lists them (SPEC
//! sections 3 and 6).

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// `background_processes.status` (SPEC section 3): `running`, then one of `exited` (its exit
/// code is known), `killed` (by the `process` tool) or `lost` (gone, exit status unknown).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum ProcessStatus {
    /// Still running.
    Running,
    /// Exited with a known code.
    Exited,
    /// Killed by the `process` tool.
    Killed,
    /// Gone, exit status unknown.
    Lost,
}

impl ProcessStatus {
    /// The spec's word.
    pub fn as_str(self) -> &'static str {
        match self {
            ProcessStatus::Running => "running",
            ProcessStatus::Exited => "exited",
            ProcessStatus::Killed => "killed",
            ProcessStatus::Lost => "lost",
        }
    }

    /// Parses the spec's word; `None` for anything else.
    pub fn parse(word: &str) -> Option<ProcessStatus> {
        match word {
            "running" => Some(ProcessStatus::Running),
            "exited" => Some(ProcessStatus::Exited),
            "killed" => Some(ProcessStatus::Killed),
            "lost" => Some(ProcessStatus::Lost),
            _ => None,
        }
    }
}

impl std::fmt::Display for ProcessStatus {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// One `background_processes` row without its `session_id` (the execution's session is
/// implied): the payload of `process.register` (with `status: running`) and an entry of
/// [`Policy::background_processes`]. Field names are the spec's column names.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct BackgroundProcess {
    /// The `process_id` the `terminal` and `process` tools show.
    pub id: String,
    /// The launcher's pid, which is also its process group id and session id.
    pub pid: i32,
    /// Field 22 of `/proc/<pid>/stat` (clock ticks after boot): with `pid`, names the process
    /// even after the pid is recycled.
    #[serde(default)]
    pub start_time: Option<u64>,
    /// The command line.
    pub command: String,
    /// Its working directory.
    pub cwd: String,
    /// Where its output goes.
    pub log_path: String,
    /// Where it stands.
    pub status: ProcessStatus,
    #[serde(default)]
    /// Its exit code, once `exited`.
    pub exit_code: Option<i32>,
    /// Unix seconds.
    pub started_at: f64,
}

/// Payload of `process.update`: a background process left `running`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ProcessUpdate {
    /// `background_processes.id`.
    pub id: String,
    /// `exited`, `killed` or `lost`.
    pub status: ProcessStatus,
    #[serde(default)]
    /// Its exit code, for `exited`.
    pub exit_code: Option<i32>,
}
