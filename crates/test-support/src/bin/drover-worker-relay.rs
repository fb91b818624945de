//! `drover-worker-relay`: a wrapper for `$DROVER_WORKER_EXE` that plays a worker which knows
//! more than it should, for tests of the owner's worker checks.
//!
//! Started by the owner as `drover-worker-relay worker`, it reads the bootstrap head line and
//! the part lines it announces, writes the head to `$DROVER_RELAY_DIR/boot-<execution_id>.json`
//! (so a test learns the execution's secret, as a hostile worker might), then starts the real worker `$DROVER_RELAY_REAL worker` and
//! relays the owner's stdin to it (the worker's stdout and stderr are the relay's own).
//!
//! Attack mode: when `$DROVER_RELAY_DIR/attack.json` exists at start, the first relay to rename
//! it to `attack-<execution_id>.json` sends its content (one JSON line, say a persist frame
//! naming another execution) on its own stdout before the real worker starts, and stores the
//! owner's answer to it in `answer-<execution_id>.json`. The real worker never sees that
//! answer, so its own turn runs as usual.

use std::io::{self, BufRead, BufReader, Write};
use std::path::PathBuf;
use std::process::{Command, ExitCode, Stdio};

fn main() -> ExitCode {
    match relay() {
        Ok(code) => ExitCode::from(code),
        Err(e) => {
            eprintln!("drover-worker-relay: {e}");
            ExitCode::from(1)
        }
    }
}

fn env_path(name: &str) -> io::Result<PathBuf> {
    std::env::var_os(name)
        .map(PathBuf::from)
        .ok_or_else(|| io::Error::other(format!("${name} is not set")))
}

fn read_line(reader: &mut impl BufRead) -> io::Result<String> {
    let mut line = String::new();
    if reader.read_line(&mut line)? == 0 {
        return Err(io::Error::other("the owner closed stdin"));
    }
    Ok(line)
}

fn relay() -> io::Result<u8> {
    let dir = env_path("DROVER_RELAY_DIR")?;
    let real = env_path("DROVER_RELAY_REAL")?;
    let mut stdin = BufReader::new(io::stdin());
    let bootstrap = read_line(&mut stdin)?;
    let parsed: serde_json::Value = serde_json::from_str(&bootstrap)?;
    let execution_id = parsed["scope"]["execution_id"]
        .as_str()
        .filter(|id| !id.is_empty() && !id.contains(['/', '.']))
        .ok_or_else(|| io::Error::other("bootstrap without a usable scope.execution_id"))?
        .to_string();
    std::fs::write(dir.join(format!("boot-{execution_id}.json")), &bootstrap)?;
    // The parts follow the head at once; the real worker gets them all before anything else.
    let parts = parsed["body_parts"].as_u64().unwrap_or(0);
    let mut bootstrap = bootstrap;
    for _ in 0..parts {
        bootstrap.push_str(&read_line(&mut stdin)?);
    }

    let claimed = dir.join(format!("attack-{execution_id}.json"));
    if std::fs::rename(dir.join("attack.json"), &claimed).is_ok() {
        let forged = std::fs::read_to_string(&claimed)?;
        let mut out = io::stdout().lock();
        out.write_all(forged.trim_end().as_bytes())?;
        out.write_all(b"\n")?;
        out.flush()?;
        drop(out);
        let answer = read_line(&mut stdin)?;
        std::fs::write(dir.join(format!("answer-{execution_id}.json")), &answer)?;
    }

    let mut child = Command::new(&real)
        .arg("worker")
        // The real worker checks that its parent is the owner it was told of.
        .env("DROVER_OWNER_PID", std::process::id().to_string())
        .stdin(Stdio::piped())
        .stdout(Stdio::inherit())
        .stderr(Stdio::inherit())
        .spawn()?;
    let mut to_child = child
        .stdin
        .take()
        .ok_or_else(|| io::Error::other("no stdin pipe to the worker"))?;
    // Relays until the owner closes stdin, then closes the worker's, as the owner would.
    let copier = std::thread::spawn(move || {
        let _ = to_child.write_all(bootstrap.as_bytes());
        let _ = io::copy(&mut stdin, &mut to_child);
    });
    let status = child.wait()?;
    drop(copier);
    Ok(status
        .code()
        .and_then(|c| u8::try_from(c).ok())
        .unwrap_or(1))
}
