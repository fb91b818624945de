//! A temporary drover home with its config, a working directory beside it, and a path outside
//! every sandbox root.

use std::path::{Path, PathBuf};

use anyhow::Result;

/// A temporary drover home, with a working directory for its sessions beside it, both
/// removed on drop.
pub struct TestHome {
    _dir: tempfile::TempDir,
    home: PathBuf,
    work: PathBuf,
}

impl TestHome {
    /// A fresh, empty home (`<tmp>/drover-test-*/home`) and an empty working directory beside
    /// it (`…/work`).
    pub fn new() -> Result<TestHome> {
        let dir = tempfile::Builder::new().prefix("drover-test-").tempdir()?;
        let home = dir.path().join("home");
        let work = dir.path().join("work");
        std::fs::create_dir(&home)?;
        std::fs::create_dir(&work)?;
        Ok(TestHome {
            _dir: dir,
            home,
            work,
        })
    }

    /// The home folder.
    pub fn path(&self) -> &Path {
        &self.home
    }

    /// A working directory for sessions, outside the home: tools cannot see the home (issue
    /// 13), so a session whose cwd is inside it could run no tool.
    pub fn work(&self) -> &Path {
        &self.work
    }

    /// Writes `<home>/config.toml`.
    pub fn write_config(&self, toml: &str) -> Result<()> {
        std::fs::write(self.path().join("config.toml"), toml)?;
        Ok(())
    }

    /// A config pointing at `base_url` with model `mock`, no retries and a 1 s drain grace,
    /// plus `extra` TOML appended verbatim (may add keys to `[model]` by repeating nothing).
    pub fn write_model_config(&self, base_url: &str, stream: bool, extra: &str) -> Result<()> {
        self.write_model_config_with_grace(base_url, stream, 1.0, extra)
    }

    /// Like [`TestHome::write_model_config`], with `drain_grace_s` for the daemon.
    pub fn write_model_config_with_grace(
        &self,
        base_url: &str,
        stream: bool,
        drain_grace_s: f64,
        extra: &str,
    ) -> Result<()> {
        self.write_model_config_with_keys(base_url, stream, drain_grace_s, "", extra)
    }

    /// Like [`TestHome::write_model_config_with_grace`], with `model_keys` TOML lines added to
    /// `[model]`.
    pub fn write_model_config_with_keys(
        &self,
        base_url: &str,
        stream: bool,
        drain_grace_s: f64,
        model_keys: &str,
        extra: &str,
    ) -> Result<()> {
        self.write_config(&format!(
            "[model]\nbase_url = \"{base_url}\"\nname = \"mock\"\nstream = {stream}\nmax_retries = 0\nrequest_timeout_s = 30\n{model_keys}\n\n[daemon]\ndrain_grace_s = {drain_grace_s:?}\n\n{extra}"
        ))
    }

    /// The ledger path.
    pub fn db(&self) -> PathBuf {
        self.path().join("state.db")
    }
}

/// A fresh path under `/var/tmp`, not made: outside every sandbox root and not the temp dir
/// (`/tmp`, which the sandbox leaves writable). `name` goes into it, for a reader of a leftover.
pub fn outside_path(name: &str) -> std::path::PathBuf {
    let mut bytes = [0u8; 8];
    std::io::Read::read_exact(
        &mut std::fs::File::open("/dev/urandom").expect("urandom"),
        &mut bytes,
    )
    .expect("random");
    let hex: String = bytes.iter().map(|b| format!("{b:02x}")).collect();
    std::path::PathBuf::from(format!("/var/tmp/drover-sandbox-{name}-{hex}"))
}
