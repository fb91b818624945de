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

/// Every exit code of `drover`, for every command, is one [`drover_protocol::Exit`].
pub use drover_protocol::Exit;

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
    Daemon {
        /// Internal: a client started this daemon in the background.
        #[arg(long, hide = true)]
        started_by_client: bool,
    },
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
            let exit = if e.use_stderr() {
                Exit::Failed
            } else {
                Exit::Ok
            };
            return exit.into();
        }
    };
    let home = drover_owner::home::resolve_home(cli.home.as_deref());
    let exit = match cli.command {
        Command::Daemon { .. } => drover_owner::run_daemon(&home),
        Command::Worker => drover_worker::main_entry(),
        Command::Run(args) => commands::block_on(commands::run(home, args)),
        Command::Stop => commands::block_on(commands::stop(home)),
        Command::Sessions { json } => commands::block_on(commands::sessions(home, json)),
        Command::Approvals { command } => commands::block_on(commands::approvals(home, command)),
        Command::Job(args) => job::run(home, args),
        Command::Broker(args) => broker::run(home, args),
        Command::Runner(args) => runner::run_runner(home, args),
        Command::Loop(args) => runner::run_loop(home, args),
        Command::Protocol(args) => protocol_cmd::run(args),
    };
    exit.into()
}
