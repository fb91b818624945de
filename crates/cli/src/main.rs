//! `drover`: the single binary (SPEC section 8). It only wires the crates together:
//! `daemon` runs [`drover_owner`], `worker` runs [`drover_worker`], `run`, `approvals` and
//! `stop` are clients of the home's daemon, the session commands (`sessions`, `show`,
//! `resolve`, `cancel`, `interrupt`, `answer`, `rename`) are too, through [`drover_client`];
//! `chat` and `attach` (and `drover` alone on a terminal) run [`drover_tui`] on it; `job`,
//! `runner` and `loop` drive [`drover_jobs`]. `completions` and `man` are generated from
//! [`Cli`] itself.

mod acp_cmd;
mod broker;
mod budget_cmd;
mod chat;
mod commands;
mod completions;
mod display;
mod interrupt_cmd;
mod job_cmd;
mod protocol_cmd;
mod restart_cmd;
mod run_cmd;
mod runner_cmd;
mod service_cmd;
mod session_cmd;
mod spinner;
mod ui_cmd;
mod usage_cmd;

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{CommandFactory, Parser, Subcommand};

/// Every exit code of `drover`, for every command, is one [`drover_protocol::Exit`].
pub use drover_protocol::Exit;

#[derive(Parser)]
#[command(name = "drover", version, about = "A durable runtime for AI agents")]
struct Cli {
    /// The drover home (default: $DROVER_HOME, else ~/.drover).
    #[arg(long, global = true, value_name = "DIR")]
    home: Option<PathBuf>,
    /// Without a command: the model of the chat's new sessions, as `drover chat --model`.
    #[arg(long, value_name = "NAME")]
    model: Option<String>,
    /// Without a command: the endpoint of the chat's new sessions, as `drover chat
    /// --base-url`.
    #[arg(long, value_name = "URL")]
    base_url: Option<String>,
    /// Without a command, on a terminal: `drover chat`.
    #[command(subcommand)]
    command: Option<Command>,
}

#[derive(Subcommand)]
enum Command {
    /// Run the owner daemon in the foreground.
    Daemon {
        /// Internal: a client started this daemon in the background, so it exits after
        /// `[daemon] idle_exit_s` with nothing to do.
        #[arg(long, hide = true)]
        started_by_client: bool,
        /// Internal: a pipe inherited from the client that started this daemon; the line
        /// `ready` is written to it once daemon.json is written and the daemon listens.
        #[arg(long, hide = true, value_name = "FD")]
        ready_fd: Option<i32>,
        /// Internal: be the next owner of a handoff (`drover restart`), reading the old
        /// owner's hand-over from the socket at this descriptor.
        #[arg(long, hide = true, value_name = "FD")]
        handoff_fd: Option<i32>,
        /// Internal: print this binary's version and worker protocol as JSON (what a
        /// daemon checks before it hands the home to this binary), and exit.
        #[arg(long, hide = true)]
        handoff_info: bool,
    },
    /// Submit a prompt to a session and stream the answer (starts the daemon if needed).
    Run(run_cmd::RunArgs),
    /// The interactive client: chat with a session (a new one, `-c` the most recent, or
    /// `--session ID`).
    Chat(chat::ChatArgs),
    /// Reopen a session in the interactive client, with its running turn.
    Attach(chat::AttachArgs),
    /// Serve drover as an Agent Client Protocol (ACP) agent on stdio, for editors (Zed,
    /// JetBrains, Neovim, Emacs) and ACP clients such as acpx (docs/acp.md).
    Acp(acp_cmd::AcpArgs),
    /// Ask the home's daemon to stop (as SIGTERM does) and wait for it to exit.
    Stop,
    /// Hand the home over to the drover binary now on disk: it becomes the next owner and
    /// adopts the running turns (as SIGHUP to the daemon does).
    Restart(restart_cmd::RestartArgs),
    /// The home's daemon as a systemd user service: install, uninstall, status.
    Service(service_cmd::ServiceArgs),
    /// List sessions: started, last active, state, queue length and title.
    Sessions {
        /// Print JSON (the `session.list` result) instead of a table.
        #[arg(long)]
        json: bool,
    },
    /// Show a session: its transcript, tool calls and results, usage and each turn's outcome.
    Show(session_cmd::ShowArgs),
    /// Resolve a session's turn whose outcome is unknown, so its queue goes on.
    Resolve(session_cmd::ResolveArgs),
    /// Cancel a session's queued input (all of it, or the admission named).
    Cancel(session_cmd::CancelArgs),
    /// Stop a session's running turn (its generation is read for you); waits until it settles.
    Interrupt(interrupt_cmd::InterruptArgs),
    /// Answer the open approval prompt or clarify question of a session.
    Answer(session_cmd::AnswerArgs),
    /// Set a session's title.
    Rename(session_cmd::RenameArgs),
    /// A session's spend against its limits; raise a limit (resuming the turns paused under
    /// it) or stop a paused turn. `--home-wide`: the home's daily limit.
    Budget(budget_cmd::BudgetArgs),
    /// What the model requests spent: tokens, requests and cost, by model, session, day or
    /// turn, with a total line.
    Usage(usage_cmd::UsageArgs),
    /// The stored `always` approval rules.
    Approvals {
        #[command(subcommand)]
        command: commands::ApprovalsCommand,
    },
    /// Delegated jobs: register, submit, publish and inspect (docs/jobs.md).
    Job(job_cmd::JobArgs),
    /// Run dispatched remote jobs: follow this runner's dispatch topic and run CMD per job.
    Runner(runner_cmd::RunnerArgs),
    /// Alternate creator and reviewer jobs until the reviewer says PASS.
    Loop(runner_cmd::LoopArgs),
    /// Run a local MQTT broker for development (mosquitto on loopback; docs/jobs.md).
    Broker(broker::BrokerArgs),
    /// Print (and open, when a browser is there) a one-time login link to the daemon's web
    /// dashboard at /ui.
    Ui(ui_cmd::UiArgs),
    /// The client protocol: `drover protocol schema [--out DIR]` writes its JSON Schema.
    Protocol(protocol_cmd::ProtocolArgs),
    /// Print a shell completion script (bash, zsh, fish, elvish, powershell).
    Completions {
        /// The shell to complete for.
        #[arg(value_enum)]
        shell: clap_complete::Shell,
    },
    /// Print the manual page drover.1, or write it and one page per subcommand to DIR.
    Man {
        /// The directory to write the pages to (created if missing); without it, print
        /// drover.1 to stdout.
        #[arg(long, value_name = "DIR")]
        out: Option<PathBuf>,
    },
    /// Internal: a managed worker, started by the owner only.
    #[command(hide = true)]
    Worker {
        /// Be the owner's worker template: fork a spare worker per request on stdin.
        #[arg(long)]
        template: bool,
    },
}

fn main() -> ExitCode {
    // The owner starts `drover worker` for every turn: it skips building the whole command
    // line's parser (clap's subcommand tree was about 4% of a worker's start).
    match worker_command_line(std::env::args_os().skip(1)) {
        Some(WorkerLine::Worker) => return drover_worker::main_entry().into(),
        Some(WorkerLine::Template) => return drover_worker::template_entry().into(),
        Some(WorkerLine::FileTools) => return ExitCode::from(drover_worker::file_tools_entry()),
        None => {}
    }
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
    if cli.command.is_some() && (cli.model.is_some() || cli.base_url.is_some()) {
        eprintln!(
            "drover: --model and --base-url before the command are the chat's (`drover --model M`); \
             put them after the command (`drover run --model M ...`)"
        );
        return Exit::Failed.into();
    }
    let Some(command) = cli.command else {
        if chat::on_a_terminal() {
            let args = chat::ChatArgs::new_session_on(cli.model, cli.base_url);
            return commands::block_on(chat::chat(home, args)).into();
        }
        let _ = <Cli as clap::CommandFactory>::command().print_help();
        return Exit::Failed.into();
    };
    // A reader that goes away (`| head`) ends a printing command quietly, as Unix commands do.
    // The daemon, its workers and the chat client keep writes failing instead.
    if matches!(
        command,
        Command::Run(_)
            | Command::Sessions { .. }
            | Command::Show(_)
            | Command::Resolve(_)
            | Command::Cancel(_)
            | Command::Interrupt(_)
            | Command::Answer(_)
            | Command::Rename(_)
            | Command::Budget(_)
            | Command::Usage(_)
            | Command::Approvals { .. }
            | Command::Protocol(_)
            | Command::Ui(_)
            | Command::Completions { .. }
            | Command::Man { .. }
    ) {
        let _ = drover_platform::default_pipe_signal();
    }
    let exit = match command {
        Command::Chat(args) => commands::block_on(chat::chat(home, args)),
        Command::Attach(args) => commands::block_on(chat::attach(home, args)),
        Command::Acp(args) => commands::block_on(acp_cmd::acp(home, args)),
        Command::Daemon { handoff_info, .. } if handoff_info => {
            match serde_json::to_string(&drover_owner::handoff::own_info()) {
                Ok(line) => {
                    println!("{line}");
                    Exit::Ok
                }
                Err(e) => {
                    eprintln!("drover daemon: {e}");
                    Exit::Failed
                }
            }
        }
        Command::Daemon {
            started_by_client,
            ready_fd,
            handoff_fd,
            ..
        } => {
            let lifetime = if started_by_client {
                drover_owner::daemon::Lifetime::StartedByClient
            } else {
                drover_owner::daemon::Lifetime::Foreground
            };
            let ready = ready_fd.and_then(|fd| match drover_platform::take_inherited_fd(fd) {
                Ok(file) => Some(file),
                Err(e) => {
                    eprintln!("drover daemon: --ready-fd {fd}: {e}; not signalling readiness");
                    None
                }
            });
            let handoff = match handoff_fd.map(drover_platform::take_inherited_fd) {
                Some(Ok(file)) => Some(file),
                Some(Err(e)) => {
                    eprintln!("drover daemon: --handoff-fd: {e}");
                    return Exit::Failed.into();
                }
                None => None,
            };
            let acp = acp_endpoint(home.clone());
            drover_owner::run_daemon(
                &home,
                drover_owner::DaemonStart {
                    lifetime,
                    ready,
                    acp: Some(acp),
                    handoff,
                },
            )
        }
        Command::Worker { template: false } => drover_worker::main_entry(),
        Command::Worker { template: true } => drover_worker::template_entry(),
        Command::Run(args) => commands::block_on(run_cmd::run(home, args)),
        Command::Stop => commands::block_on(commands::stop(home)),
        Command::Restart(args) => commands::block_on(restart_cmd::restart(home, args)),
        Command::Service(args) => commands::block_on(async { service_cmd::run(home, args) }),
        Command::Sessions { json } => commands::block_on(session_cmd::sessions(&home, json)),
        Command::Show(args) => commands::block_on(session_cmd::show(&home, args)),
        Command::Resolve(args) => commands::block_on(session_cmd::resolve(&home, args)),
        Command::Cancel(args) => commands::block_on(session_cmd::cancel(&home, args)),
        Command::Interrupt(args) => commands::block_on(interrupt_cmd::interrupt(&home, args)),
        Command::Answer(args) => commands::block_on(session_cmd::answer(&home, args)),
        Command::Rename(args) => commands::block_on(session_cmd::rename(&home, args)),
        Command::Budget(args) => commands::block_on(budget_cmd::budget(&home, args)),
        Command::Usage(args) => commands::block_on(usage_cmd::usage(&home, args)),
        Command::Approvals { command } => commands::block_on(async {
            // A home that does not exist has no rules to list or remove: said so, never created.
            session_cmd::require_home(&home)?;
            commands::approvals(home, command).await
        }),
        Command::Job(args) => job_cmd::run(home, args),
        Command::Broker(args) => broker::run(home, args),
        Command::Runner(args) => runner_cmd::run_runner(home, args),
        Command::Loop(args) => runner_cmd::run_loop(home, args),
        Command::Protocol(args) => protocol_cmd::run(args),
        Command::Ui(args) => commands::block_on(ui_cmd::ui(home, args)),
        Command::Completions { shell } => completions::completions(Cli::command(), shell),
        Command::Man { out } => completions::man(Cli::command(), out.as_deref()),
    };
    exit.into()
}

/// The two command lines the owner starts a worker with, read without the parser.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum WorkerLine {
    /// `drover worker`
    Worker,
    /// `drover worker --template`
    Template,
    /// `drover worker --file-tools`: a worker's confined helper for the file tools.
    FileTools,
}

/// Which worker command line the arguments after the program's name are, exactly as the owner
/// starts one. Any other form (`drover --home H worker`) goes through the parser.
fn worker_command_line(mut args: impl Iterator<Item = std::ffi::OsString>) -> Option<WorkerLine> {
    if args.next()? != "worker" {
        return None;
    }
    match (args.next(), args.next()) {
        (None, _) => Some(WorkerLine::Worker),
        (Some(flag), None) if flag == "--template" => Some(WorkerLine::Template),
        (Some(flag), None) if flag == "--file-tools" => Some(WorkerLine::FileTools),
        _ => None,
    }
}

/// The daemon's `/v1/acp`: for each connection, `drover acp`'s agent over the WebSocket's
/// messages, a client of this same daemon's `/v1/ws` (it reads the home's `daemon.json`; it
/// never starts a daemon, being in one).
fn acp_endpoint(home: std::path::PathBuf) -> drover_owner::AcpEndpoint {
    std::sync::Arc::new(move |lines: drover_owner::AcpLines| {
        let options =
            drover_client::ConnectOptions::new(home.clone(), drover_client::StartDaemon::Never);
        Box::pin(async move {
            let transport = drover_acp::Transport::Lines {
                incoming: lines.incoming,
                outgoing: lines.outgoing,
            };
            let new_sessions = drover_acp::NewSessions::default();
            if let Err(e) = drover_acp::serve(transport, options, new_sessions).await {
                tracing::debug!(error = %e, "an ACP client over /v1/acp ended with an error");
            }
        })
    })
}

#[cfg(test)]
mod tests {
    use super::{worker_command_line, WorkerLine};

    #[test]
    fn only_the_owners_worker_command_lines_skip_the_parser() {
        let line = |args: &[&str]| worker_command_line(args.iter().map(Into::into));
        assert_eq!(line(&["worker"]), Some(WorkerLine::Worker));
        assert_eq!(line(&["worker", "--template"]), Some(WorkerLine::Template));
        assert_eq!(
            line(&["worker", "--file-tools"]),
            Some(WorkerLine::FileTools)
        );
        assert_eq!(line(&[]), None);
        assert_eq!(line(&["worker", "--help"]), None);
        assert_eq!(line(&["worker", "--template", "x"]), None);
        assert_eq!(line(&["--home", "/h", "worker"]), None);
        assert_eq!(line(&["workers"]), None);
        assert_eq!(line(&["run", "worker"]), None);
    }
}
