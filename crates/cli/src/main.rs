//! `drover`: the single binary (SPEC section 8). It only wires the crates together:
//! `daemon` runs [`drover_owner`], `worker` runs [`drover_worker`], `run`, `sessions` and
//! `stop` are clients of the home's daemon, and `job`, `runner` and `loop` drive
//! [`drover_jobs`].

mod broker;
mod client;
mod commands;
mod job;
mod protocol_cmd;
mod runner;

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};

/// Every exit code of `drover` (SPEC section 8).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Exit {
    /// The turn completed, or the command did what it was asked.
    Ok = 0,
    /// The turn failed, or the command could not do its job (the reason is on stderr); also
    /// a command line that does not parse. `job submit`: the job ended without `completed`
    /// (`agent_blocked`: no `started` within T; or `error`, `cancelled`). `job publish`:
    /// refused, nothing recorded and no seq used.
    Failed = 1,
    /// `job submit`: the job went quiet for its idle window (`deadline_timeout`) or ran past
    /// `--timeout`. `job publish`: the event was recorded but the broker was unreachable.
    Incomplete = 2,
    /// This home is owned by another running daemon.
    HomeOwned = 3,
    /// The turn's outcome is unknown (its worker or the owner died while it ran).
    Unknown = 4,
    /// A prompt waits for an answer and there is no terminal to ask on.
    PromptWaiting = 5,
    /// Interrupted with Ctrl-C.
    Interrupted = 130,
}

#[derive(Parser)]
#[command(name = "drover", version, about = "A durable runtime for AI agents")]
struct Cli {
    /// The drover home (default: $DROVER_HOME, else ~/.drover).
    #[arg(long, global = true, value_name = "DIR")]
    home: Option<PathBuf>,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run the owner daemon in the foreground.
    Daemon,
    /// Submit a prompt to a session and stream the answer (starts the daemon if needed).
    Run(commands::RunArgs),
    /// Ask the home's daemon to stop (as SIGTERM does) and wait for it to exit.
    Stop,
    /// List sessions.
    Sessions {
        /// Print JSON (the `session.list` result) instead of a table.
        #[arg(long)]
        json: bool,
    },
    /// The stored `always` approval rules.
    Approvals {
        #[command(subcommand)]
        command: commands::ApprovalsCommand,
    },
    /// Delegated jobs: register, submit, publish and inspect (SPEC section 7).
    Job(job::JobArgs),
    /// Run dispatched remote jobs: follow this runner's dispatch topic and run CMD per job.
    Runner(runner::RunnerArgs),
    /// Alternate creator and reviewer jobs until the reviewer says PASS.
    Loop(runner::LoopArgs),
    /// Run a local MQTT broker for development (mosquitto on loopback; docs/jobs.md).
    Broker(broker::BrokerArgs),
    /// The client protocol: `drover protocol schema [--out DIR]` writes its JSON Schema.
    Protocol(protocol_cmd::ProtocolArgs),
    /// Internal: a managed worker, started by the owner only.
    #[command(hide = true)]
    Worker,
}

fn main() -> ExitCode {
    // A command line that does not parse exits 1, not clap's 2: 2 means "recorded but not
    // sent" for `job publish` and "went quiet" for `job submit` (SPEC section 7).
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(e) => {
            let _ = e.print();
            let code = if e.use_stderr() {
                Exit::Failed
            } else {
                Exit::Ok
            };
            return ExitCode::from(code as u8);
        }
    };
    let home = drover_owner::home::resolve_home(cli.home.as_deref());
    let code = match cli.command {
        Command::Daemon => drover_owner::run_daemon(&home) as u8,
        Command::Worker => drover_worker::main_entry().clamp(0, 255) as u8,
        Command::Run(args) => commands::block_on(commands::run(home, args)) as u8,
        Command::Stop => commands::block_on(commands::stop(home)) as u8,
        Command::Sessions { json } => commands::block_on(commands::sessions(home, json)) as u8,
        Command::Approvals { command } => {
            commands::block_on(commands::approvals(home, command)) as u8
        }
        Command::Job(args) => job::run(home, args) as u8,
        Command::Broker(args) => broker::run(home, args) as u8,
        Command::Runner(args) => runner::run_runner(home, args) as u8,
        Command::Loop(args) => runner::run_loop(home, args) as u8,
        Command::Protocol(args) => protocol_cmd::run(args) as u8,
    };
    ExitCode::from(code)
}
