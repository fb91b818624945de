//! The brief (`<registry>/<job_id>/brief.md`) and the one-line start instruction
//! (SPEC section 7).
//!
//! The brief states the task, the contract in plain words ("heartbeat every N s", "after K
//! missed heartbeats", "within T s"), and the exact commands the agent runs: start, finish,
//! give up, and report being blocked. Every command names the `drover` executable, the home,
//! the registry and the attempt's `dispatch_token` explicitly, so it works from any shell and
//! a publisher of an older attempt is refused.
//!
//! The commands are the indented lines after the `## Commands` heading, in that order (start,
//! finish, give up, blocked), so a script can pick them out.

use std::fs::OpenOptions;
use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::path::PathBuf;

use crate::registry::{Job, Registry};
use crate::JobError;

/// The placeholder in the finish command for the agent's one-line summary.
pub const SUMMARY_PLACEHOLDER: &str = "SUMMARY";
/// The placeholder in the give-up command for the reason.
pub const REASON_PLACEHOLDER: &str = "REASON";
/// The placeholder in the blocked command for what the agent waits on.
pub const WAITING_PLACEHOLDER: &str = "WHAT YOU WAIT FOR";
/// The variable the `exec` transport sets to the agent's pid (see [`WatchPid::AgentPidEnv`]).
pub const AGENT_PID_ENV: &str = "DROVER_AGENT_PID";

/// Which process the start command's heartbeat timer watches.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum WatchPid {
    /// None known (`herdr`, `manual`): the timer stops only at the terminal event or an
    /// attempt change.
    None,
    /// A literal pid (`tmux`: the pane's process).
    Pid(i32),
    /// `"$DROVER_AGENT_PID"`, which the `exec` transport sets in the agent's environment.
    AgentPidEnv,
}

/// Where the commands point.
#[derive(Debug, Clone)]
pub struct BriefContext {
    /// The `drover` executable.
    pub exe: PathBuf,
    /// `--home`.
    pub home: PathBuf,
    /// `--registry-dir`.
    pub registry_dir: PathBuf,
    /// `--watch-pid` of the start command.
    pub watch: WatchPid,
}

/// The commands an agent runs for one attempt.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Commands {
    /// `--event started --heartbeat N [--watch-pid P]`: the start command, which the start
    /// instruction carries.
    pub start: String,
    /// `--event completed --detail SUMMARY`.
    pub finish: String,
    /// `--event error --detail REASON`.
    pub give_up: String,
    /// `--event blocked --detail 'WHAT YOU WAIT FOR'` (optional for the agent).
    pub blocked: String,
}

/// The commands for `job`'s current attempt.
pub fn commands(ctx: &BriefContext, job: &Job) -> Commands {
    let base = |event: &str| -> String {
        let words = [
            ctx.exe.display().to_string(),
            "--home".into(),
            ctx.home.display().to_string(),
            "job".into(),
            "publish".into(),
            "--registry-dir".into(),
            ctx.registry_dir.display().to_string(),
            "--job".into(),
            job.job_id.clone(),
            "--event".into(),
            event.into(),
        ];
        words.iter().map(|w| quote(w)).collect::<Vec<_>>().join(" ")
    };
    let token = format!("--expect-dispatch-token {}", quote(&job.dispatch_token));
    let watch = match &ctx.watch {
        WatchPid::None => String::new(),
        WatchPid::Pid(pid) => format!(" --watch-pid {pid}"),
        WatchPid::AgentPidEnv => format!(" --watch-pid \"${AGENT_PID_ENV}\""),
    };
    Commands {
        start: format!(
            "{} --heartbeat {}{watch} {token}",
            base("started"),
            job.contract.heartbeat_sec
        ),
        finish: format!(
            "{} --detail {} {token}",
            base("completed"),
            quote(SUMMARY_PLACEHOLDER)
        ),
        give_up: format!(
            "{} --detail {} {token}",
            base("error"),
            quote(REASON_PLACEHOLDER)
        ),
        blocked: format!(
            "{} --detail {} {token}",
            base("blocked"),
            quote(WAITING_PLACEHOLDER)
        ),
    }
}

/// The brief's text.
pub fn render(job: &Job, ctx: &BriefContext) -> String {
    let contract = &job.contract;
    let cmds = commands(ctx, job);
    let watched = match &ctx.watch {
        WatchPid::None => "until the job ends".to_string(),
        WatchPid::Pid(pid) => format!("for as long as process {pid} (your pane) lives"),
        WatchPid::AgentPidEnv => "for as long as your process lives".to_string(),
    };
    let prompt = if job.prompt.trim().is_empty() {
        "(no task text was given)"
    } else {
        job.prompt.trim_end()
    };
    format!(
        "# Job {id}\n\
         \n\
         {prompt}\n\
         \n\
         ## The contract\n\
         \n\
         drover decides whether you are alive from what you publish, never from your screen.\n\
         \n\
         - Publish `started` within {t} s of receiving this job, with the start command below. \
         Run it once.\n\
         - The start command also starts a timer that reports for you: a heartbeat every {n} s, \
         {watched}.\n\
         - After {k} missed heartbeats ({idle} s with no report at all) drover gives the job \
         up as `error` (`deadline_timeout`).\n\
         - When the job is done, publish `completed` with a one-line summary. If you cannot do \
         it, publish `error` with the reason. Either one is final: nothing published after it \
         counts.\n\
         \n\
         ## Commands\n\
         \n\
         Start (run first, once, within {t} s):\n\
         \n\
         \x20   {start}\n\
         \n\
         Done (replace {summary} with a one-line summary):\n\
         \n\
         \x20   {finish}\n\
         \n\
         Cannot finish (replace {reason} with the reason):\n\
         \n\
         \x20   {give_up}\n\
         \n\
         Waiting on someone or something, still working (optional):\n\
         \n\
         \x20   {blocked}\n",
        id = job.job_id,
        t = contract.ack_timeout_sec,
        n = contract.heartbeat_sec,
        k = contract.heartbeat_misses,
        idle = contract.idle_timeout_sec,
        start = cmds.start,
        finish = cmds.finish,
        give_up = cmds.give_up,
        blocked = cmds.blocked,
        summary = SUMMARY_PLACEHOLDER,
        reason = REASON_PLACEHOLDER,
    )
}

/// The one line delivered to the agent (also what `submit --dry-run` prints), which an agent
/// or a plain shell can act on:
///
/// `<start command>; : '<the contract in words, and where the brief is>'`
///
/// A shell runs the start command as it stands (every word quoted) and takes the words as the
/// argument of `:`, the do-nothing command, so they are never executed (`#` would do the same
/// in bash, but zsh's interactive shells do not take comments by default). An agent reads the
/// words: run the line, the contract ("heartbeat every N s", "after K missed heartbeats",
/// "started within T s"), and the brief's path for the rest of the task. The prompt is not
/// in the line: it is data, in the brief only.
pub fn start_instruction(job: &Job, ctx: &BriefContext) -> String {
    let contract = &job.contract;
    let start = commands(ctx, job).start;
    let watched = match &ctx.watch {
        WatchPid::None => "until the job ends".to_string(),
        WatchPid::Pid(pid) => {
            format!("while process {pid} (this pane, --watch-pid) lives")
        }
        WatchPid::AgentPidEnv => {
            format!("while your process (--watch-pid ${AGENT_PID_ENV}) lives")
        }
    };
    let words = format!(
        "drover job {id}: run this line in a shell, as it stands, once: it is the start \
         command, and the job must have started within {t} s. It keeps a heartbeat every {n} s \
         {watched}; after {k} missed heartbeats ({idle} s with no report) the job fails as \
         deadline_timeout. For the rest of the task read the brief at {brief} and follow it \
         exactly.",
        id = job.job_id,
        t = contract.ack_timeout_sec,
        n = contract.heartbeat_sec,
        k = contract.heartbeat_misses,
        idle = contract.idle_timeout_sec,
        brief = job.brief_path.display(),
    );
    format!("{start}; : {}", quote(&words))
}

/// Writes the brief to `<registry>/<job_id>/brief.md` (0600, replacing any old one) and gives
/// its path.
pub fn write(registry: &Registry, job: &Job, text: &str) -> Result<PathBuf, JobError> {
    write_beside(registry, job, job.brief_path.clone(), text)
}

/// Writes `run.md` beside the brief (0600, replacing any old one): what a runner adds for
/// its command, kept out of the brief so the brief stays the task as given.
pub fn write_run_notes(registry: &Registry, job: &Job, text: &str) -> Result<PathBuf, JobError> {
    let path = job.brief_path.with_file_name("run.md");
    write_beside(registry, job, path, text)
}

fn write_beside(
    registry: &Registry,
    job: &Job,
    path: PathBuf,
    text: &str,
) -> Result<PathBuf, JobError> {
    registry.ensure_job_dir(&job.job_id)?;
    let io = |source| JobError::Io {
        what: format!("cannot write {}", path.display()),
        source,
    };
    let mut f = OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(&path)
        .map_err(io)?;
    f.write_all(text.as_bytes()).map_err(io)?;
    Ok(path)
}

/// `word` quoted for a POSIX shell (as it stands when it needs no quotes).
pub(crate) fn quote(word: &str) -> String {
    shlex::try_quote(word)
        .map(|q| q.into_owned())
        .unwrap_or_else(|_| format!("'{}'", word.replace('\0', "").replace('\'', "'\\''")))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::registry::NewJob;
    use crate::Contract;
    use std::path::Path;

    fn job(dir: &Path) -> (Registry, Job) {
        let mut reg = Registry::open(dir).unwrap();
        let job = reg
            .register(NewJob {
                job_id: Some("fix-7".into()),
                agent_session: Some(crate::delivery::AgentSession::Tmux("agents:0".into())),
                prompt: "Fix the flaky test in crates/x.".into(),
                contract: Contract {
                    heartbeat_sec: 5,
                    heartbeat_misses: 3,
                    ack_timeout_sec: 60,
                    idle_timeout_sec: 15,
                },
                topic_base: "drover/v1".into(),
            })
            .unwrap();
        (reg, job)
    }

    fn ctx(dir: &Path, watch: WatchPid) -> BriefContext {
        BriefContext {
            exe: PathBuf::from("/opt/my tools/drover"),
            home: PathBuf::from("/home/u/.drover"),
            registry_dir: dir.to_path_buf(),
            watch,
        }
    }

    #[test]
    fn the_brief_states_the_contract_in_plain_words() {
        let dir = tempfile::tempdir().unwrap();
        let (_reg, job) = job(dir.path());
        let text = render(&job, &ctx(dir.path(), WatchPid::Pid(321)));
        for phrase in [
            "heartbeat every 5 s",
            "After 3 missed heartbeats",
            "within 60 s",
            "15 s with no report",
            "Fix the flaky test in crates/x.",
            "process 321",
        ] {
            assert!(text.contains(phrase), "missing {phrase:?} in:\n{text}");
        }
    }

    #[test]
    fn the_commands_are_exact_quoted_and_carry_the_dispatch_token() {
        let dir = tempfile::tempdir().unwrap();
        let (_reg, job) = job(dir.path());
        let c = commands(&ctx(dir.path(), WatchPid::Pid(321)), &job);
        assert!(c
            .start
            .starts_with("'/opt/my tools/drover' --home /home/u/.drover job publish"));
        assert!(c
            .start
            .contains("--event started --heartbeat 5 --watch-pid 321"));
        for cmd in [&c.start, &c.finish, &c.give_up, &c.blocked] {
            assert!(cmd.contains(&format!("--expect-dispatch-token {}", job.dispatch_token)));
            assert!(cmd.contains("--job fix-7"));
            let words = shlex::split(cmd).expect("valid shell words");
            assert_eq!(words[0], "/opt/my tools/drover");
        }
        assert!(c.finish.contains("--event completed --detail SUMMARY"));
        assert!(c.give_up.contains("--event error --detail REASON"));
        assert!(c
            .blocked
            .contains("--event blocked --detail 'WHAT YOU WAIT FOR'"));
        let exec = commands(&ctx(dir.path(), WatchPid::AgentPidEnv), &job);
        assert!(exec.start.contains("--watch-pid \"$DROVER_AGENT_PID\""));
        let none = commands(&ctx(dir.path(), WatchPid::None), &job);
        assert!(!none.start.contains("--watch-pid"));
    }

    #[test]
    fn the_commands_are_the_indented_lines_after_the_commands_heading() {
        let dir = tempfile::tempdir().unwrap();
        let (_reg, job) = job(dir.path());
        let context = ctx(dir.path(), WatchPid::None);
        let text = render(&job, &context);
        let after = text.split("## Commands").nth(1).unwrap();
        let lines: Vec<&str> = after
            .lines()
            .filter_map(|l| l.strip_prefix("    "))
            .collect();
        let c = commands(&context, &job);
        assert_eq!(lines, [&c.start, &c.finish, &c.give_up, &c.blocked]);
    }

    #[test]
    fn the_brief_is_written_beside_the_registry_and_the_instruction_names_it() {
        let dir = tempfile::tempdir().unwrap();
        let (reg, job) = job(dir.path());
        let path = write(&reg, &job, "hello").unwrap();
        assert_eq!(path, dir.path().join("fix-7").join("brief.md"));
        assert_eq!(std::fs::read_to_string(&path).unwrap(), "hello");
        let line = start_instruction(&job, &ctx(dir.path(), WatchPid::Pid(321)));
        assert!(!line.contains('\n'));
        assert!(line.contains(&path.display().to_string()));
    }

    #[test]
    fn the_start_instruction_is_the_start_command_and_the_contract_in_words() {
        let dir = tempfile::tempdir().unwrap();
        let (_reg, job) = job(dir.path());
        let context = ctx(dir.path(), WatchPid::Pid(321));
        let line = start_instruction(&job, &context);
        let start = commands(&context, &job).start;
        let words = format!(
            "drover job fix-7: run this line in a shell, as it stands, once: it is the start \
             command, and the job must have started within 60 s. It keeps a heartbeat every 5 s \
             while process 321 (this pane, --watch-pid) lives; after 3 missed heartbeats (15 s \
             with no report) the job fails as deadline_timeout. For the rest of the task read \
             the brief at {} and follow it exactly.",
            job.brief_path.display()
        );
        assert_eq!(line, format!("{start}; : '{words}'"));
        // As a shell splits it: the start command's words, `;`, then `:` and one argument.
        let mut shell_words = shlex::split(&line).expect("valid shell words");
        assert_eq!(shell_words.pop().as_deref(), Some(words.as_str()));
        assert_eq!(shell_words.pop().as_deref(), Some(":"));
        let last = shell_words.pop().unwrap();
        assert_eq!(last, format!("{};", job.dispatch_token));
        assert_eq!(shell_words[0], "/opt/my tools/drover");
        assert!(shell_words.ends_with(&[
            "--event".into(),
            "started".into(),
            "--heartbeat".into(),
            "5".into(),
            "--watch-pid".into(),
            "321".into(),
            "--expect-dispatch-token".into(),
        ]));
        let none = start_instruction(&job, &ctx(dir.path(), WatchPid::None));
        assert!(none.contains("every 5 s until the job ends;"), "{none}");
        let exec = start_instruction(&job, &ctx(dir.path(), WatchPid::AgentPidEnv));
        assert!(exec.contains("--watch-pid \"$DROVER_AGENT_PID\""), "{exec}");
    }
}
