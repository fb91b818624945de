//! `systemctl --user` (and `loginctl`), run to their end within a bound.

use std::io::Read;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};

/// How one run of a tool ended.
#[derive(Debug)]
pub enum Ran {
    /// The tool is not installed (not on `PATH`).
    Missing,
    /// It ran to its end.
    Done {
        status: ExitStatus,
        stdout: String,
        stderr: String,
    },
}

impl Ran {
    /// Exited 0.
    pub fn ok(&self) -> bool {
        matches!(self, Ran::Done { status, .. } if status.success())
    }

    /// Its stdout, trimmed (empty when it did not run).
    pub fn stdout(&self) -> &str {
        match self {
            Ran::Done { stdout, .. } => stdout.trim(),
            Ran::Missing => "",
        }
    }

    /// Why it failed, in one line: its stderr's first line, else its status.
    pub fn reason(&self, program: &str) -> String {
        match self {
            Ran::Missing => format!("{program} is not installed"),
            Ran::Done { status, stderr, .. } => match stderr.lines().find(|l| !l.trim().is_empty())
            {
                Some(line) => line.trim().to_owned(),
                None => format!("{program} {status}"),
            },
        }
    }
}

/// `systemctl --user <args>`, waited for up to `bound`.
pub fn systemctl(args: &[&str], bound: Duration) -> Result<Ran> {
    let mut all = vec!["--user", "--no-pager"];
    all.extend_from_slice(args);
    run("systemctl", &all, bound)
}

/// `program args`, its output collected, waited for up to `bound` (then killed, reaped, and an
/// error naming the command).
pub fn run(program: &str, args: &[&str], bound: Duration) -> Result<Ran> {
    let child = Command::new(program)
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn();
    let mut child = match child {
        Ok(child) => child,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Ran::Missing),
        Err(e) => return Err(e).with_context(|| format!("cannot run {program}")),
    };
    // Read both pipes beside the wait, so a chatty tool never blocks on a full pipe.
    let stdout = drain(child.stdout.take());
    let stderr = drain(child.stderr.take());
    let status =
        wait_within(&mut child, bound).with_context(|| format!("{program} {}", args.join(" ")))?;
    Ok(Ran::Done {
        status,
        stdout: stdout.join().unwrap_or_default(),
        stderr: stderr.join().unwrap_or_default(),
    })
}

fn drain(pipe: Option<impl Read + Send + 'static>) -> std::thread::JoinHandle<String> {
    std::thread::spawn(move || {
        let mut bytes = Vec::new();
        if let Some(mut pipe) = pipe {
            let _ = pipe.read_to_end(&mut bytes);
        }
        String::from_utf8_lossy(&bytes).into_owned()
    })
}

/// `child`'s exit, checked every few milliseconds until `bound` has passed (std has no wait
/// with a timeout); past it the child is killed and reaped.
fn wait_within(child: &mut Child, bound: Duration) -> Result<ExitStatus> {
    let deadline = Instant::now() + bound;
    loop {
        if let Some(status) = child.try_wait()? {
            return Ok(status);
        }
        if Instant::now() >= deadline {
            let _ = child.kill();
            let _ = child.wait();
            bail!("did not finish within {} s", bound.as_secs());
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}
