//! The home's systemd user unit: its name, where it is written and its text. Pure: no process
//! is started and nothing is written here.

use std::path::{Path, PathBuf};

use anyhow::{bail, Result};
use sha2::{Digest, Sha256};

use crate::Exit;

/// The unit of one home: its name and the file it lives in.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UnitFile {
    /// `drover.service` for the default home, `drover-<12 hex>.service` for any other.
    pub name: String,
    /// `<config dir>/systemd/user/<name>`.
    pub path: PathBuf,
}

/// The directory the user manager reads units from: `$XDG_CONFIG_HOME/systemd/user`, else
/// `$HOME/.config/systemd/user` (systemd.unit(5), "User Unit Search Path").
pub fn unit_dir() -> Result<PathBuf> {
    let config = match std::env::var_os("XDG_CONFIG_HOME").filter(|v| !v.is_empty()) {
        Some(dir) => PathBuf::from(dir),
        None => match std::env::var_os("HOME").filter(|v| !v.is_empty()) {
            Some(home) => PathBuf::from(home).join(".config"),
            None => bail!("neither $XDG_CONFIG_HOME nor $HOME is set: no place for a user unit"),
        },
    };
    if !config.is_absolute() {
        bail!(
            "$XDG_CONFIG_HOME is {}, not an absolute path: systemd ignores it",
            config.display()
        );
    }
    Ok(config.join("systemd").join("user"))
}

/// The home as the unit names it: its canonical path when it exists, so a symlink to a home
/// and the home itself share one unit.
pub fn canonical_home(home: &Path) -> PathBuf {
    std::fs::canonicalize(home).unwrap_or_else(|_| home.to_path_buf())
}

/// The default home, `$HOME/.drover`, canonical, if `$HOME` is set.
fn default_home() -> Option<PathBuf> {
    let home = std::env::var_os("HOME").filter(|v| !v.is_empty())?;
    Some(canonical_home(&PathBuf::from(home).join(".drover")))
}

/// The unit of `home` (canonical) in `dir`. Each home gets its own unit, so two homes can both
/// run as services; the default home's is plain `drover.service`, the name a user guesses.
pub fn unit_for(home: &Path, dir: &Path) -> UnitFile {
    let name = if default_home().as_deref() == Some(home) {
        "drover.service".to_owned()
    } else {
        use std::os::unix::ffi::OsStrExt;
        let digest = Sha256::digest(home.as_os_str().as_bytes());
        format!("drover-{}.service", &hex::encode(digest)[..12])
    };
    UnitFile {
        path: dir.join(&name),
        name,
    }
}

/// The text of the unit that runs `exe daemon` for `home` (both absolute). Every setting is
/// explained in docs/service.md.
pub fn unit_text(exe: &Path, home: &Path) -> Result<String> {
    let exe_arg = exec_arg(exe, "the drover binary")?;
    let home_arg = exec_arg(home, "the home")?;
    let home_text = plain_value(home, "the home")?;
    // Comments are not expanded: they show the path as it is (checked by plain_value).
    let home_shown = home.display();
    let env_file = plain_value(&home.join("service.env"), "the home")?;
    let drover = format!("{exe_arg} --home {home_arg}");
    let home_owned = Exit::HomeOwned.code();
    Ok(format!(
        "# Written by `drover service install` for the drover home {home_shown}.\n\
         # `drover --home {home_shown} service uninstall` removes it; docs/service.md explains it.\n\
         [Unit]\n\
         Description=drover daemon for {home_text}\n\
         # A daemon that cannot start (a bad config.toml) is not retried forever.\n\
         StartLimitIntervalSec=60\n\
         StartLimitBurst=5\n\
         \n\
         [Service]\n\
         Type=exec\n\
         ExecStart={drover} daemon\n\
         # A reload is a handoff: the binary on disk becomes the next owner and adopts the\n\
         # running turns; the old main process then exits 0.\n\
         ExecReload={drover} restart\n\
         # Stops whichever process owns the home now (after a reload it is not the one systemd\n\
         # started), gracefully, as SIGTERM does.\n\
         ExecStop={drover} stop\n\
         # The service lives as long as its processes do, not its first main process: the next\n\
         # owner started by a reload carries it on.\n\
         ExitType=cgroup\n\
         KillMode=control-group\n\
         # After a handoff systemd cannot tell the next owner's crash from a clean exit, so the\n\
         # daemon is brought back either way (`systemctl --user stop` stops it for good).\n\
         Restart=always\n\
         RestartSec=2s\n\
         # {home_owned}: another daemon owns the home; retrying would not change that.\n\
         RestartPreventExitStatus={home_owned}\n\
         # The user manager does not pass a login shell's environment: variables the daemon\n\
         # needs (the model API key, a proxy, PATH for tools) go in this file, if wanted.\n\
         EnvironmentFile=-{env_file}\n\
         \n\
         [Install]\n\
         WantedBy=default.target\n"
    ))
}

/// `path` as one word of an `Exec*=` line: specifiers (`%`) and variables (`$`) doubled, and
/// quoted when it holds a space or a quote (systemd.service(5), "Command lines").
fn exec_arg(path: &Path, what: &str) -> Result<String> {
    let text = plain_value(path, what)?;
    let text = text.replace('$', "$$");
    if text.contains([' ', '"', '\'']) {
        Ok(format!("\"{}\"", text.replace('"', "\\\"")))
    } else {
        Ok(text)
    }
}

/// `path` as a unit file value: UTF-8 with `%` doubled. Control characters and backslashes are
/// refused: systemd would read them as line ends, continuations or escapes.
fn plain_value(path: &Path, what: &str) -> Result<String> {
    let Some(text) = path.to_str() else {
        bail!(
            "{what} {} is not UTF-8: a systemd unit cannot name it",
            path.display()
        );
    };
    if text.chars().any(|c| c.is_control() || c == '\\') {
        bail!(
            "{what} {} holds a control character or a backslash: a systemd unit cannot name it",
            text.escape_debug()
        );
    }
    Ok(text.replace('%', "%%"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exec_words_are_escaped_for_systemd() {
        assert_eq!(
            exec_arg(Path::new("/a/b"), "x").unwrap(),
            "/a/b",
            "a plain path stays as it is"
        );
        assert_eq!(
            exec_arg(Path::new("/my home/100%/$x"), "x").unwrap(),
            "\"/my home/100%%/$$x\""
        );
        assert!(exec_arg(Path::new("/a\nb"), "x").is_err());
        assert!(exec_arg(Path::new("/a\\b"), "x").is_err());
    }

    #[test]
    fn other_homes_get_a_name_from_their_path() {
        let dir = Path::new("/cfg/systemd/user");
        let a = unit_for(Path::new("/srv/drover-a"), dir);
        let b = unit_for(Path::new("/srv/drover-b"), dir);
        assert_ne!(a.name, b.name);
        assert!(a.name.starts_with("drover-") && a.name.ends_with(".service"));
        assert_eq!(a.path, dir.join(&a.name));
        assert_eq!(a, unit_for(Path::new("/srv/drover-a"), dir), "stable");
    }
}
