//! `drover broker` (SPEC section 8): a local MQTT broker for development.
//!
//! drover does not carry a broker of its own: this command writes a minimal mosquitto
//! configuration under `<home>/broker/` — one listener on loopback only, anonymous clients
//! allowed (nothing but this machine can reach it), persistence on so retained state
//! snapshots survive a restart — and replaces itself with `mosquitto -c <that file>` (exec),
//! so signals, logs (stderr) and the exit code are mosquitto's own. Production deployments
//! point `[mqtt] url` at a real broker with TLS and credentials instead.

use std::io::Write;
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};

use clap::Args;

use crate::Exit;

/// `drover broker`.
#[derive(Args, Debug)]
pub struct BrokerArgs {
    /// The loopback port to listen on.
    #[arg(long, default_value_t = 1883)]
    port: u16,
    /// The mosquitto executable (default: `mosquitto` on PATH, else /usr/sbin/mosquitto).
    #[arg(long, value_name = "PATH")]
    mosquitto: Option<PathBuf>,
}

/// Where mosquitto usually is when it is not on `PATH` (Debian puts it in /usr/sbin).
const FALLBACK: &str = "/usr/sbin/mosquitto";

/// Runs `drover broker`: only returns if mosquitto cannot be started.
pub fn run(home: PathBuf, args: BrokerArgs) -> Exit {
    match start(&home, &args) {
        Ok(never) => match never {},
        Err(e) => {
            eprintln!("drover: {e}");
            Exit::Failed
        }
    }
}

enum Never {}

fn start(home: &Path, args: &BrokerArgs) -> Result<Never, String> {
    if args.port == 0 {
        return Err("--port must be from 1 to 65535".into());
    }
    let exe = match &args.mosquitto {
        Some(p) => p.clone(),
        None => find_mosquitto().ok_or_else(|| {
            "drover broker runs mosquitto, which is not installed (on Debian or Ubuntu: \
             apt-get install mosquitto), or name it with --mosquitto PATH"
                .to_string()
        })?,
    };
    let dir = home.join("broker");
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(&dir)
        .map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
    let conf = dir.join("mosquitto.conf");
    let text = config(args.port, &dir, running_as_root());
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(&conf)
        .map_err(|e| format!("cannot write {}: {e}", conf.display()))?;
    f.write_all(text.as_bytes())
        .map_err(|e| format!("cannot write {}: {e}", conf.display()))?;
    drop(f);
    eprintln!(
        "drover: development MQTT broker on mqtt://127.0.0.1:{} (mosquitto, config {}); \
         point [mqtt] url or $DROVER_MQTT_URL at it",
        args.port,
        conf.display()
    );
    let err = std::process::Command::new(&exe).arg("-c").arg(&conf).exec();
    Err(format!("cannot run {}: {err}", exe.display()))
}

/// Whether this process runs as root (the owner of `/proc/self` is the effective uid).
fn running_as_root() -> bool {
    use std::os::unix::fs::MetadataExt;
    std::fs::metadata("/proc/self").is_ok_and(|m| m.uid() == 0)
}

fn find_mosquitto() -> Option<PathBuf> {
    let on_path = std::env::var_os("PATH").and_then(|path| {
        std::env::split_paths(&path)
            .map(|d| d.join("mosquitto"))
            .find(|p| p.is_file())
    });
    on_path.or_else(|| Some(PathBuf::from(FALLBACK)).filter(|p| p.is_file()))
}

/// The mosquitto configuration `drover broker` runs.
fn config(port: u16, dir: &Path, as_root: bool) -> String {
    let mut text = format!(
        "# Written by `drover broker`: a development broker, loopback only.\n\
         listener {port} 127.0.0.1\n\
         allow_anonymous true\n\
         persistence true\n\
         persistence_location {}/\n\
         log_dest stderr\n",
        dir.display()
    );
    if as_root {
        // mosquitto started as root drops to the `mosquitto` user, which cannot write the
        // persistence file in a 0700 home; stay the user who ran drover.
        text.push_str("user root\n");
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_config_listens_on_loopback_only_and_persists_under_the_home() {
        let text = config(18830, Path::new("/h/broker"), false);
        assert!(text.contains("listener 18830 127.0.0.1\n"), "{text}");
        assert!(text.contains("persistence_location /h/broker/\n"), "{text}");
        assert!(!text.contains("user root"));
        assert!(config(1, Path::new("/h"), true).contains("user root\n"));
    }
}
