//! `drover service install | uninstall | status`: the home's daemon as a systemd user unit
//! (SPEC section 9; docs/service.md). [`unit`] names and writes the unit's text, [`systemctl`]
//! runs the user manager's commands within a bound. Where no user manager can be reached (a
//! container, a session without a user bus), the unit is still written or removed and the
//! commands that would finish the job are printed.

mod systemctl;
mod unit;

use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{bail, Context, Result};
use clap::{Args, Subcommand};
use serde_json::json;

use crate::Exit;
use systemctl::systemctl;
use unit::{canonical_home, unit_dir, unit_for, unit_text, UnitFile};

/// A question to the user manager.
const QUERY: Duration = Duration::from_secs(15);
/// `daemon-reload`, `enable`, `start`: the daemon's start is quick (`Type=exec`).
const CHANGE: Duration = Duration::from_secs(120);
/// `disable --now` waits for the stop: `drover stop` (up to 60 s) inside systemd's own
/// 90 s stop timeout.
const STOP: Duration = Duration::from_secs(150);

/// `drover service`.
#[derive(Args, Debug)]
pub struct ServiceArgs {
    #[command(subcommand)]
    pub command: ServiceCommand,
}

/// What to do with the home's user unit.
#[derive(Subcommand, Debug)]
pub enum ServiceCommand {
    /// Write and enable a systemd user unit that runs `drover daemon` for the home, and start it.
    Install {
        /// Print the unit and where it would go; write nothing, start nothing.
        #[arg(long)]
        dry_run: bool,
    },
    /// Stop, disable and remove the home's unit.
    Uninstall,
    /// Whether the home's unit is installed, enabled and running, and the daemon's pid.
    Status {
        /// Print JSON (`{unit, path, installed, up_to_date, manager, daemon_pid}`).
        #[arg(long)]
        json: bool,
    },
}

/// `drover service`.
pub fn run(home: PathBuf, args: ServiceArgs) -> Result<Exit> {
    if !cfg!(target_os = "linux") {
        bail!(
            "drover service writes a systemd user unit, which only Linux has; elsewhere run \
             `drover daemon` under the system's own service manager"
        );
    }
    match args.command {
        ServiceCommand::Install { dry_run } => install(&home, dry_run),
        ServiceCommand::Uninstall => uninstall(&home),
        ServiceCommand::Status { json } => status(&home, json),
    }
}

fn install(home: &Path, dry_run: bool) -> Result<Exit> {
    let exe = std::env::current_exe().context("cannot find the drover executable")?;
    // A daemon that cannot read its config would only fail at each start, in the journal:
    // say it now, in the config's own words, before anything is written.
    if let Err(e) = drover_owner::config::Config::load(home) {
        bail!("{e}; the service's daemon could not start: fix it, then install again");
    }
    if !dry_run {
        // The unit names the canonical home, which must exist to be known.
        drover_owner::home::prepare_home(home)
            .with_context(|| format!("cannot create the home {}", home.display()))?;
    }
    let home = canonical_home(home);
    let unit = unit_for(&home, &unit_dir()?);
    let text = unit_text(&exe, &home)?;
    if dry_run {
        println!("# {}", unit.path.display());
        print!("{text}");
        return Ok(Exit::Ok);
    }
    if std::fs::read_to_string(&unit.path).ok().as_deref() == Some(text.as_str()) {
        println!("{} is up to date", unit.path.display());
    } else {
        write_unit(&unit.path, &text)?;
        println!("wrote {}", unit.path.display());
    }
    let name = unit.name.as_str();
    match manager() {
        Err(reason) => {
            println!(
                "the user manager is not reachable ({reason}): the unit is written but not \
                 enabled or started. Where `systemctl --user` works, run:\n  \
                 systemctl --user daemon-reload\n  systemctl --user enable --now {name}"
            );
        }
        Ok(()) => {
            must(&["daemon-reload"], CHANGE)?;
            must(&["enable", name], CHANGE)?;
            if unit_running(name)? {
                println!(
                    "{name} is enabled and already running; `systemctl --user reload {name}` \
                     hands the home over to the drover binary now on disk (running turns carry \
                     on)"
                );
            } else if let Some(pid) = drover_client::owner_pid(&home) {
                let h = home.display();
                println!(
                    "{name} is enabled but not started: a daemon (pid {pid}) already runs for {h} \
                     outside the service and is left running. The service replaces it only once \
                     it has stopped:\n  drover --home {h} stop\n  systemctl --user start {name}"
                );
            } else {
                // A unit that failed before (its start limit hit, say) would refuse to start.
                let _ = systemctl(&["reset-failed", name], QUERY);
                let started = systemctl(&["start", name], CHANGE)?;
                if !started.ok() {
                    bail!(
                        "{name} is enabled but did not start: {}; `journalctl --user -u {name}` \
                         and {} say why",
                        started.reason("systemctl"),
                        home.join("logs").join("daemon.log").display()
                    );
                }
                println!("{name} is enabled and started");
            }
        }
    }
    print_linger();
    let env_file = home.join("service.env");
    if !env_file.exists() {
        println!(
            "The service does not see this shell's environment: put what the daemon needs (the \
             model API key named by [model] api_key_env, a proxy, PATH for tools) in {} as \
             NAME=value lines (mode 0600), then `systemctl --user restart {name}`.",
            env_file.display()
        );
    }
    Ok(Exit::Ok)
}

fn uninstall(home: &Path) -> Result<Exit> {
    let home = canonical_home(home);
    let dir = unit_dir()?;
    let unit = unit_for(&home, &dir);
    let name = unit.name.as_str();
    if std::fs::symlink_metadata(&unit.path).is_err() {
        println!(
            "no service is installed for {} ({} does not exist)",
            home.display(),
            unit.path.display()
        );
        return Ok(Exit::Ok);
    }
    match manager() {
        Ok(()) => {
            let disabled = systemctl(&["disable", "--now", name], STOP)?;
            if !disabled.ok() {
                bail!(
                    "systemctl --user disable --now {name}: {}; {} is kept",
                    disabled.reason("systemctl"),
                    unit.path.display()
                );
            }
            println!("stopped and disabled {name}");
            // A unit that had failed would stay listed as failed, and not-found, once removed.
            let _ = systemctl(&["reset-failed", name], QUERY);
            remove_unit(&unit, &dir)?;
            let reloaded = systemctl(&["daemon-reload"], CHANGE)?;
            if !reloaded.ok() {
                println!(
                    "systemctl --user daemon-reload: {}; the manager forgets {name} at its next \
                     reload",
                    reloaded.reason("systemctl")
                );
            }
        }
        Err(reason) => {
            remove_unit(&unit, &dir)?;
            println!(
                "the user manager is not reachable ({reason}): nothing was stopped or disabled"
            );
            if let Some(pid) = drover_client::owner_pid(&home) {
                println!(
                    "a daemon (pid {pid}) still runs for {h}: `drover --home {h} stop` stops it",
                    h = home.display()
                );
            }
        }
    }
    Ok(Exit::Ok)
}

fn status(home: &Path, as_json: bool) -> Result<Exit> {
    let exe = std::env::current_exe().context("cannot find the drover executable")?;
    let home = canonical_home(home);
    let unit = unit_for(&home, &unit_dir()?);
    let written = std::fs::read_to_string(&unit.path).ok();
    let up_to_date = written
        .as_deref()
        .map(|text| unit_text(&exe, &home).is_ok_and(|now| now == text));
    let daemon_pid = drover_client::owner_pid(&home);
    let manager = match manager() {
        Ok(()) => Ok(unit_properties(&unit.name)?),
        Err(reason) => Err(reason),
    };
    if as_json {
        let manager = match &manager {
            Ok(p) => json!({
                "reachable": true,
                "unit_file_state": p.unit_file_state,
                "active_state": p.active_state,
                "sub_state": p.sub_state,
                "main_pid": p.main_pid,
            }),
            Err(reason) => json!({"reachable": false, "reason": reason}),
        };
        let out = json!({
            "unit": unit.name,
            "path": unit.path,
            "installed": written.is_some(),
            "up_to_date": up_to_date,
            "manager": manager,
            "daemon_pid": daemon_pid,
        });
        println!("{out}");
        return Ok(Exit::Ok);
    }
    println!("home:    {}", home.display());
    println!("unit:    {}", unit.name);
    match up_to_date {
        None => println!("file:    {} (not installed)", unit.path.display()),
        Some(true) => println!("file:    {} (installed)", unit.path.display()),
        Some(false) => println!(
            "file:    {} (installed; it differs from what this drover writes, as after the \
             binary moved: `drover service install` rewrites it)",
            unit.path.display()
        ),
    }
    match &manager {
        Ok(p) => {
            let main = p
                .main_pid
                .map(|pid| format!(", main pid {pid}"))
                .unwrap_or_default();
            println!(
                "systemd: {}, {} ({}){main}",
                p.unit_file_state, p.active_state, p.sub_state
            );
        }
        Err(reason) => println!("systemd: user manager not reachable ({reason})"),
    }
    match daemon_pid {
        Some(pid) => println!("daemon:  pid {pid}"),
        None => println!("daemon:  not running"),
    }
    Ok(Exit::Ok)
}

/// Whether `systemctl --user` reaches a user manager; why not, in one line, when it does not.
fn manager() -> Result<(), String> {
    match systemctl(&["show", "--property=Version", "--value"], QUERY) {
        Ok(ran) if ran.ok() => Ok(()),
        Ok(ran) => Err(ran.reason("systemctl")),
        Err(e) => Err(format!("{e:#}")),
    }
}

/// `systemctl --user <args>`, which must succeed.
fn must(args: &[&str], bound: Duration) -> Result<()> {
    let ran = systemctl(args, bound)?;
    if !ran.ok() {
        bail!(
            "systemctl --user {}: {}",
            args.join(" "),
            ran.reason("systemctl")
        );
    }
    Ok(())
}

/// What the user manager says of a unit.
struct UnitProperties {
    unit_file_state: String,
    active_state: String,
    sub_state: String,
    /// None when systemd knows no main process (none runs, or after a handoff).
    main_pid: Option<u32>,
}

fn unit_properties(name: &str) -> Result<UnitProperties> {
    let ran = systemctl(
        &[
            "show",
            "--property=LoadState,UnitFileState,ActiveState,SubState,MainPID",
            name,
        ],
        QUERY,
    )?;
    if !ran.ok() {
        bail!("systemctl --user show {name}: {}", ran.reason("systemctl"));
    }
    let value = |key: &str| {
        ran.stdout()
            .lines()
            .find_map(|line| line.strip_prefix(key)?.strip_prefix('='))
            .unwrap_or("")
            .to_owned()
    };
    let unit_file_state = match value("UnitFileState") {
        // A unit file the manager has not loaded, or none: say what LoadState says.
        state if state.is_empty() => value("LoadState"),
        state => state,
    };
    Ok(UnitProperties {
        unit_file_state,
        active_state: value("ActiveState"),
        sub_state: value("SubState"),
        main_pid: value("MainPID").parse().ok().filter(|&pid| pid != 0),
    })
}

/// Whether the unit runs (or is starting, reloading or stopping).
fn unit_running(name: &str) -> Result<bool> {
    let state = unit_properties(name)?.active_state;
    Ok(matches!(
        state.as_str(),
        "active" | "reloading" | "activating" | "deactivating"
    ))
}

/// Says whether the user manager outlives logout (and starts at boot), or how to make it.
fn print_linger() {
    let user = std::env::var("USER").unwrap_or_default();
    let lingers = !user.is_empty()
        && systemctl::run(
            "loginctl",
            &["show-user", &user, "--property=Linger", "--value"],
            QUERY,
        )
        .is_ok_and(|ran| ran.ok() && ran.stdout() == "yes");
    if lingers {
        println!("lingering is on for {user}: the service starts at boot and survives logout");
    } else {
        println!(
            "The user manager stops at your last logout, and the service with it. To keep it \
             running and start it at boot: loginctl enable-linger \"$USER\""
        );
    }
}

/// Writes the unit whole (a manager reading it never sees half), mode 0644 like the units
/// `systemctl edit` writes.
fn write_unit(path: &Path, text: &str) -> Result<()> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let dir = path.parent().context("a unit path has a directory")?;
    std::fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;
    let tmp = path.with_extension("service.tmp");
    let written = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o644)
        .open(&tmp)
        .and_then(|mut f| f.write_all(text.as_bytes()))
        .and_then(|()| std::fs::rename(&tmp, path));
    if let Err(e) = written {
        let _ = std::fs::remove_file(&tmp);
        return Err(e).with_context(|| format!("cannot write {}", path.display()));
    }
    Ok(())
}

/// Removes the unit file and, when no manager could disable it, its `default.target.wants`
/// link (what `systemctl enable` made), so it cannot start at the next login.
fn remove_unit(unit: &UnitFile, dir: &Path) -> Result<()> {
    let wants = dir.join("default.target.wants").join(&unit.name);
    if std::fs::read_link(&wants).is_ok() {
        std::fs::remove_file(&wants)
            .with_context(|| format!("cannot remove {}", wants.display()))?;
        println!("removed {}", wants.display());
    }
    std::fs::remove_file(&unit.path)
        .with_context(|| format!("cannot remove {}", unit.path.display()))?;
    println!("removed {}", unit.path.display());
    Ok(())
}
