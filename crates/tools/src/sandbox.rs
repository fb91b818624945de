//! The sandbox of every process a tool starts (`docs/sandbox.md`), built from the
//! session's [`SandboxPolicy`] (the bootstrap's `policy.sandbox`) and the worker's temp dir.
//!
//! - [`Sandbox::confine`] prepares a command (a `terminal` command, foreground or background):
//!   its environment cut by [`tool_env`] (every mode, `off` included), then, unless the mode
//!   is `off`, the platform's plan ([`drover_platform::confine`]): a user and mount namespace
//!   hiding every drover home and the browsers' profiles (`policy.hidden`), a network
//!   namespace of its own with `network = false`, Landlock's write rules (left out for an
//!   approved `sandbox: false` call), signals and abstract sockets scoped to the call's own
//!   processes, no capabilities. Children inherit all of it.
//! - The file tools run in a helper process confined by that same plan (the file module's
//!   `confined`, which also gives `Sandbox::with_file_helper`); [`Sandbox::check_write`],
//!   [`Sandbox::check_read`] and [`Sandbox::check_opened`] are the same rules by name, applied
//!   there too.
//! - With `[sandbox] required = true`, a layer the kernel cannot give refuses the call (a tool
//!   error naming what is missing) instead of running it with less.
//!
//! Not confined: MCP servers (long-lived helpers the user configured, started by the worker,
//! not by the model), and the worker itself.

use std::ffi::OsString;
use std::path::{Path, PathBuf};

pub use drover_protocol::sandbox::{SandboxMode, SandboxPolicy, ToolEnv};

use drover_platform::confine::{Enforced, LandlockSpec, Plan, Spec};

/// The words a variable name must not contain (any case) to reach a tool, unless kept.
pub const SECRET_WORDS: &[&str] = &["KEY", "SECRET", "TOKEN", "PASSWORD", "CREDENTIAL"];

/// The sandbox of a turn's tools. Cheap to clone.
#[derive(Debug, Clone)]
pub struct Sandbox {
    policy: SandboxPolicy,
    temp_dir: PathBuf,
    /// The file tools' confined helper of the turn, when the worker named its program. Held
    /// opaque: its type is the file module's, which builds on this one.
    files: Option<std::sync::Arc<dyn std::any::Any + Send + Sync>>,
}

impl Default for Sandbox {
    fn default() -> Self {
        Sandbox::off()
    }
}

impl Sandbox {
    /// The sandbox of `policy`, with `temp_dir` writable besides its roots.
    pub fn new(policy: SandboxPolicy, temp_dir: PathBuf) -> Sandbox {
        Sandbox {
            policy,
            temp_dir,
            files: None,
        }
    }

    /// This sandbox holding `files`, the file tools' helper (the file module's `confined`
    /// makes it and reads it back).
    pub(crate) fn with_files(
        self,
        files: std::sync::Arc<dyn std::any::Any + Send + Sync>,
    ) -> Sandbox {
        Sandbox {
            files: Some(files),
            ..self
        }
    }

    /// What [`Sandbox::with_files`] set, unless the mode is `off` (the file tools then run in
    /// the calling process).
    pub(crate) fn files(&self) -> Option<&(dyn std::any::Any + Send + Sync)> {
        match self.policy.mode {
            SandboxMode::Off => None,
            _ => self.files.as_deref(),
        }
    }

    /// The frozen policy.
    pub fn policy(&self) -> &SandboxPolicy {
        &self.policy
    }

    /// The temp dir writable besides the roots.
    pub fn temp_dir(&self) -> &Path {
        &self.temp_dir
    }

    /// No confinement ([`SandboxPolicy::default`], mode `off`); the environment is still cut.
    pub fn off() -> Sandbox {
        Sandbox::new(SandboxPolicy::default(), std::env::temp_dir())
    }

    /// The frozen mode.
    pub fn mode(&self) -> SandboxMode {
        self.policy.mode
    }

    /// Where writes may go: the policy's roots (the session cwd first) and the temp dir under
    /// `workspace-write`, nowhere under `read-only`; `None` in `off` (anywhere).
    pub fn writable_roots(&self) -> Option<Vec<PathBuf>> {
        match self.policy.mode {
            SandboxMode::Off => None,
            SandboxMode::ReadOnly => Some(Vec::new()),
            SandboxMode::WorkspaceWrite => Some(
                self.policy
                    .writable_roots
                    .iter()
                    .map(PathBuf::from)
                    .chain(std::iter::once(self.temp_dir.clone()))
                    .collect(),
            ),
        }
    }

    /// The platform spec of one process. `escalated` (an approved `sandbox: false` call)
    /// leaves the Landlock layer out; the home stays hidden. `writable_files` are single files
    /// the process may write besides its roots (a background process's log). `Err` says which
    /// required layer is missing.
    pub fn spec(&self, escalated: bool, writable_files: &[PathBuf]) -> Result<Spec, String> {
        let policy = &self.policy;
        if policy.mode == SandboxMode::Off {
            return Ok(Spec::default());
        }
        let missing = |what: &str| {
            let problems = if policy.support.problems.is_empty() {
                String::new()
            } else {
                format!(" ({})", policy.support.problems.join("; "))
            };
            format!(
                "refused: the sandbox is required ([sandbox] required = true) and {what}{problems}; \
                 the command did not run"
            )
        };
        if !policy.support.namespaces && policy.required {
            return Err(missing(
                "this kernel gives no user namespace, so the drover home cannot be hidden",
            ));
        }
        let landlock = match (escalated, policy.support.landlock_abi) {
            (true, _) => None,
            (false, None) if policy.required => {
                return Err(missing("this kernel has no Landlock"));
            }
            (false, None) => None,
            (false, Some(abi)) => {
                // A network namespace refuses more than Landlock's TCP rules (and lets the
                // tool's own loopback work); the rules are only the fallback without one.
                let mut network = policy.network || policy.support.namespaces;
                if !network && abi < 4 {
                    if policy.required {
                        return Err(missing(&format!(
                            "Landlock ABI {abi} cannot refuse TCP (network = false needs ABI 4)"
                        )));
                    }
                    // Reported as `network: not_enforced` in the session's info.
                    network = true;
                }
                Some(LandlockSpec {
                    abi,
                    writable_roots: self
                        .writable_roots()
                        .unwrap_or_default()
                        .into_iter()
                        .filter(|root| root.is_dir())
                        .collect(),
                    writable_files: writable_files.to_vec(),
                    network,
                })
            }
        };
        Ok(Spec {
            namespaces: policy.support.namespaces,
            hidden: policy.hidden.iter().map(PathBuf::from).collect(),
            // `network = false` holds for an escalated call too: `sandbox: false` lifts the
            // write rules only.
            isolate_network: !policy.network && policy.support.namespaces,
            landlock,
            // Nor does it let a tool signal drover's processes.
            scoped: true,
        })
    }

    /// Prepares `command` for a tool process: the cut environment and, unless `off`, the
    /// confinement plan (see [`Sandbox::spec`]). Gives what is enforced; `Err` is the tool
    /// error (a required layer missing, or the plan could not be built).
    pub fn confine(
        &self,
        command: &mut std::process::Command,
        escalated: bool,
        writable_files: &[PathBuf],
    ) -> Result<Enforced, String> {
        command.env_clear();
        command.envs(tool_env(std::env::vars_os(), &self.policy.env));
        let spec = self.spec(escalated, writable_files)?;
        if spec == Spec::default() {
            return Ok(Enforced::default());
        }
        if let Some(dir) = command.get_current_dir() {
            self.check_workdir(dir)?;
        }
        let plan = Plan::new(&spec).map_err(|e| format!("could not prepare the sandbox: {e}"))?;
        let enforced = plan.enforced();
        plan.install(command);
        Ok(enforced)
    }

    /// Whether a process may start in `dir`: never inside a hidden path (the drover home). A
    /// process whose working directory were there would reach the home's files by relative
    /// paths, under the mount that hides it; the platform also enters the directory again
    /// after the mount, so this refusal is the clear error and not the only guard.
    pub fn check_workdir(&self, dir: &Path) -> Result<(), String> {
        if self.policy.mode == SandboxMode::Off {
            return Ok(());
        }
        let dir = real(dir);
        match self.hidden_around(&dir) {
            Some(hidden) => Err(format!(
                "field \"workdir\": {} is inside {}, which tools cannot see (a drover \
                 home or a browser profile); run the command in another directory",
                dir.display(),
                hidden.display()
            )),
            None => Ok(()),
        }
    }

    /// Whether a file tool may read `target` (absolute, symlinks resolved): never inside a
    /// hidden path (a drover home, a browser profile), whose token and ledger the worker can reach but tools must
    /// not. Anything goes in `off`. `Err` is the tool error, naming the field `path`.
    pub fn check_read(&self, target: &Path) -> Result<(), String> {
        if self.policy.mode == SandboxMode::Off {
            return Ok(());
        }
        if let Some(what) = process_secret(target) {
            return Err(format!(
                "field \"path\": {} is a process's {what}, which tools cannot read (the \
                 daemon's and the worker's hold your keys)",
                target.display()
            ));
        }
        match self.hidden_around(target) {
            Some(hidden) => Err(format!(
                "field \"path\": {} is inside {}, which tools cannot read (a drover \
                 home or a browser profile)",
                target.display(),
                hidden.display()
            )),
            None => Ok(()),
        }
    }

    /// The hidden path (symlinks resolved) that `path` is inside of, if any.
    fn hidden_around(&self, path: &Path) -> Option<PathBuf> {
        self.policy
            .hidden
            .iter()
            .map(|hidden| real(Path::new(hidden)))
            .find(|hidden| path.starts_with(hidden))
    }

    /// [`Sandbox::check_read`] of what `file` really is once open (its `/proc/self/fd` link),
    /// so a path swapped between the check and the open cannot lead into the home.
    pub fn check_opened(&self, file: &std::fs::File) -> Result<(), String> {
        if self.policy.mode == SandboxMode::Off {
            return Ok(());
        }
        let real = opened_path(file)
            .map_err(|e| format!("field \"path\": could not tell what was opened: {e}"))?;
        self.check_read(&real)
    }

    /// Whether a write to `target` (absolute, symlinks resolved) is allowed: never inside a
    /// hidden path (the drover home), and only under the writable roots (none in
    /// `read-only`). Anything goes in `off`. `Err` is the tool error, naming the field `path`.
    pub fn check_write(&self, target: &Path) -> Result<(), String> {
        let Some(roots) = self.writable_roots() else {
            return Ok(());
        };
        if let Some(hidden) = self.hidden_around(target) {
            return Err(format!(
                "field \"path\": {} is inside {}, which tools never write (a drover \
                 home or a browser profile)",
                target.display(),
                hidden.display()
            ));
        }
        if self.policy.mode == SandboxMode::ReadOnly {
            return Err(format!(
                "field \"path\": refused: the sandbox is read-only ([sandbox] mode = \"read-only\"), \
                 so {} cannot be written",
                target.display()
            ));
        }
        if roots.iter().any(|root| target.starts_with(real(root))) {
            return Ok(());
        }
        Err(format!(
            "field \"path\": refused: {} is outside the sandbox's writable roots ({}); write \
             under one of them, or ask the user to add the directory to [sandbox] writable_roots",
            target.display(),
            show_roots(&roots)
        ))
    }

    /// The note added to a failed sandboxed command whose output looks like a refusal.
    pub fn refusal_note(&self) -> String {
        let roots = match self.writable_roots() {
            Some(roots) if !roots.is_empty() => {
                format!("writes go only under {}", show_roots(&roots))
            }
            _ => "the sandbox is read-only: nothing can be written".to_string(),
        };
        let network = if self.policy.network {
            String::new()
        } else if self.policy.support.namespaces {
            "; there is no network ([sandbox] network = false): only the sandbox's own loopback"
                .to_string()
        } else {
            "; network access (TCP) is refused".to_string()
        };
        format!(
            "the sandbox may have refused this command: {roots}{network}. If the command must \
             write elsewhere, call terminal again with \"sandbox\": false to ask the user to run \
             it outside the sandbox."
        )
    }
}

/// The path an open file or directory really is: its `/proc/self/fd` link, which no later
/// rename or symlink swap changes.
pub fn opened_path(file: &std::fs::File) -> std::io::Result<PathBuf> {
    use std::os::fd::AsRawFd;
    std::fs::read_link(format!("/proc/self/fd/{}", file.as_raw_fd()))
}

/// `path` with its symlinks resolved, or as it is when it does not exist.
fn real(path: &Path) -> PathBuf {
    path.canonicalize().unwrap_or_else(|_| path.to_path_buf())
}

fn show_roots(roots: &[PathBuf]) -> String {
    roots
        .iter()
        .map(|r| r.display().to_string())
        .collect::<Vec<_>>()
        .join(", ")
}

/// Whether output of a failed command looks like the sandbox refused it.
pub fn looks_refused(output: &str) -> bool {
    [
        "Permission denied",
        "Operation not permitted",
        "Read-only file system",
    ]
    .iter()
    .any(|needle| output.contains(needle))
}

/// The environment of a tool process: `worker` (the worker's own) minus every `DROVER_*`
/// variable, and every name containing one of [`SECRET_WORDS`] (any case) or naming an
/// OpenTelemetry exporter's headers (`exporter_headers`) unless named in `env.keep`, then
/// `env.set` added (it wins over a kept value). `DROVER_*` names are removed even when kept:
/// tools get no pointer into drover.
pub fn tool_env(
    worker: impl IntoIterator<Item = (OsString, OsString)>,
    env: &ToolEnv,
) -> Vec<(OsString, OsString)> {
    let mut out: Vec<(OsString, OsString)> = worker
        .into_iter()
        .filter(|(name, _)| {
            let name = name.to_string_lossy();
            if name.starts_with("DROVER_") {
                return false;
            }
            let upper = name.to_ascii_uppercase();
            let secret =
                SECRET_WORDS.iter().any(|word| upper.contains(word)) || exporter_headers(&upper);
            !secret || env.keep.iter().any(|kept| *kept == name)
        })
        .filter(|(name, _)| !env.set.contains_key(&*name.to_string_lossy()))
        .collect();
    out.extend(
        env.set
            .iter()
            .map(|(name, value)| (OsString::from(name), OsString::from(value))),
    );
    out
}

/// Whether `upper` (a variable name in upper case) carries an OpenTelemetry exporter's
/// headers: `OTEL_EXPORTER_OTLP_HEADERS` and the per-signal `OTEL_EXPORTER_OTLP_TRACES_HEADERS`,
/// `..._METRICS_HEADERS`, `..._LOGS_HEADERS` (and any later signal), where the collector's
/// credential (`Authorization=Bearer ...`) goes.
fn exporter_headers(upper: &str) -> bool {
    upper.starts_with("OTEL_EXPORTER_") && upper.ends_with("_HEADERS")
}

/// What `path` is when it is a process's environment or memory under `/proc`
/// (`/proc/<pid>/environ`, `/proc/<pid>/task/<tid>/mem`, `/proc/self/...`). The file tools run
/// in the worker, outside the namespace that hides these from tool processes, and a worker
/// running as root could otherwise read the daemon's environment (an API key exported in the
/// shell that started it).
fn process_secret(path: &Path) -> Option<&'static str> {
    let mut parts = path
        .strip_prefix("/proc")
        .ok()?
        .components()
        .map(|c| c.as_os_str().to_str().unwrap_or_default());
    let process = parts.next()?;
    let numeric = !process.is_empty() && process.chars().all(|c| c.is_ascii_digit());
    if !(numeric || process == "self" || process == "thread-self") {
        return None;
    }
    let rest: Vec<&str> = parts.collect();
    let file = match rest.as_slice() {
        [file] | ["task", _, file] => *file,
        _ => return None,
    };
    match file {
        "environ" => Some("environment"),
        "mem" => Some("memory"),
        _ => None,
    }
}

/// Whether output of a command run without a network (`network = false`) looks like it
/// missed one: a connection refused by the namespace's empty loopback, no route, no resolver.
pub fn looks_offline(output: &str) -> bool {
    [
        "Network is unreachable",
        "Connection refused",
        "Temporary failure in name resolution",
        "Name or service not known",
        "Could not resolve host",
    ]
    .iter()
    .any(|needle| output.contains(needle))
}

#[cfg(test)]
mod tests {
    use super::*;
    use drover_protocol::sandbox::SandboxSupport;

    #[test]
    fn a_processs_environment_and_memory_are_named_as_such() {
        let secret = |p: &str| process_secret(Path::new(p));
        assert_eq!(secret("/proc/123/environ"), Some("environment"));
        assert_eq!(secret("/proc/self/mem"), Some("memory"));
        assert_eq!(secret("/proc/123/task/124/environ"), Some("environment"));
        assert_eq!(secret("/proc/thread-self/mem"), Some("memory"));
        assert_eq!(secret("/proc/123/status"), None);
        assert_eq!(secret("/proc/sys/environ"), None);
        assert_eq!(secret("/home/x/proc/1/environ"), None);
        assert_eq!(secret("/proc/123/task/124/x/environ"), None);
    }

    fn vars(pairs: &[(&str, &str)]) -> Vec<(OsString, OsString)> {
        pairs
            .iter()
            .map(|(name, value)| (OsString::from(name), OsString::from(value)))
            .collect()
    }

    #[test]
    fn the_tool_env_drops_drover_and_secret_names_keeps_what_is_kept_and_adds_the_set() {
        let worker = vars(&[
            ("PATH", "/bin"),
            ("HOME", "/root"),
            ("DROVER_OWNER_PID", "42"),
            ("DROVER_DISPATCH_SECRET", "s"),
            ("OPENAI_API_KEY", "k"),
            ("github_token", "t"),
            ("DB_Password", "p"),
            ("AWS_SECRET_ACCESS_KEY", "a"),
            ("GOOGLE_APPLICATION_CREDENTIALS", "/c.json"),
            ("KEYBOARD_LAYOUT", "us"),
            ("SSH_AUTH_SOCK", "/tmp/agent"),
            ("NPM_TOKEN", "kept"),
            ("OTEL_EXPORTER_OTLP_HEADERS", "Authorization=Bearer x"),
            ("OTEL_EXPORTER_OTLP_TRACES_HEADERS", "api-key=t"),
            ("OTEL_EXPORTER_OTLP_METRICS_HEADERS", "api-key=m"),
            ("otel_exporter_otlp_logs_headers", "api-key=l"),
            ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://collector:4318"),
        ]);
        let env = ToolEnv {
            keep: vec!["NPM_TOKEN".into(), "DROVER_OWNER_PID".into()],
            set: [("PATH".to_string(), "/usr/bin".to_string())]
                .into_iter()
                .chain([("CI".to_string(), "1".to_string())])
                .collect(),
        };
        let mut out: Vec<(String, String)> = tool_env(worker, &env)
            .into_iter()
            .map(|(name, value)| (name.into_string().unwrap(), value.into_string().unwrap()))
            .collect();
        out.sort();
        let expected: Vec<(String, String)> = [
            ("CI", "1"),
            ("HOME", "/root"),
            ("NPM_TOKEN", "kept"),
            ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://collector:4318"),
            ("PATH", "/usr/bin"),
            ("SSH_AUTH_SOCK", "/tmp/agent"),
        ]
        .iter()
        .map(|(name, value)| (name.to_string(), value.to_string()))
        .collect();
        // KEYBOARD_LAYOUT contains KEY: removed too (the rule is by substring, as documented).
        assert_eq!(out, expected);
    }

    fn policy(mode: SandboxMode, namespaces: bool, abi: Option<u32>, required: bool) -> Sandbox {
        Sandbox::new(
            SandboxPolicy {
                mode,
                writable_roots: vec!["/work/project".into()],
                network: false,
                hidden: vec!["/home/u/.drover".into()],
                required,
                support: SandboxSupport {
                    namespaces,
                    landlock_abi: abi,
                    problems: vec!["no luck".into()],
                },
                env: ToolEnv::default(),
            },
            PathBuf::from("/tmp"),
        )
    }

    #[test]
    fn required_refuses_a_missing_layer_and_otherwise_runs_with_what_there_is() {
        use SandboxMode::*;
        let err = policy(WorkspaceWrite, false, Some(7), true)
            .spec(false, &[])
            .expect_err("no namespaces");
        assert!(
            err.contains("user namespace") && err.contains("no luck"),
            "{err}"
        );
        let err = policy(WorkspaceWrite, true, None, true)
            .spec(false, &[])
            .expect_err("no landlock");
        assert!(err.contains("Landlock"), "{err}");
        // network = false is a network namespace, which needs no TCP rules of Landlock.
        let spec = policy(WorkspaceWrite, true, Some(3), true)
            .spec(false, &[])
            .expect("a network namespace");
        assert!(spec.isolate_network && spec.scoped);
        assert!(
            spec.landlock.expect("landlock").network,
            "no TCP rules asked"
        );
        // An escalated call keeps the network namespace and the scopes.
        let spec = policy(WorkspaceWrite, true, Some(7), true)
            .spec(true, &[])
            .expect("escalated");
        assert!(spec.isolate_network && spec.scoped && spec.landlock.is_none());
        // An escalated call needs no Landlock, but still the namespaces.
        assert!(policy(WorkspaceWrite, true, None, true)
            .spec(true, &[])
            .is_ok());
        assert!(policy(WorkspaceWrite, false, None, true)
            .spec(true, &[])
            .is_err());

        let spec = policy(WorkspaceWrite, false, None, false)
            .spec(false, &[])
            .expect("best available");
        assert!(!spec.namespaces && spec.landlock.is_none());
        // Without namespaces, Landlock's TCP rules are the fallback.
        let spec = policy(WorkspaceWrite, false, Some(7), false)
            .spec(false, &[])
            .expect("no namespaces, not required");
        assert!(!spec.isolate_network);
        assert!(!spec.landlock.expect("landlock").network, "TCP refused");
        let spec = policy(WorkspaceWrite, false, Some(3), false)
            .spec(false, &[])
            .expect("no TCP rules, not required");
        assert!(
            spec.landlock.expect("landlock").network,
            "not enforced, reported so"
        );
        let spec = policy(Off, true, Some(7), true)
            .spec(false, &[])
            .expect("off");
        assert_eq!(spec, Spec::default());
        let spec = policy(ReadOnly, true, Some(7), true)
            .spec(false, &[])
            .expect("ro");
        assert!(spec.landlock.expect("landlock").writable_roots.is_empty());
        assert_eq!(spec.hidden, vec![PathBuf::from("/home/u/.drover")]);
    }

    #[test]
    fn writes_are_checked_against_the_roots_and_the_home() {
        use SandboxMode::*;
        let ws = policy(WorkspaceWrite, true, Some(7), false);
        assert!(ws.check_write(Path::new("/work/project/src/a.rs")).is_ok());
        assert!(ws.check_write(Path::new("/tmp/x")).is_ok());
        let err = ws
            .check_write(Path::new("/etc/passwd"))
            .expect_err("outside");
        assert!(
            err.contains("\"path\"") && err.contains("/work/project"),
            "{err}"
        );
        let err = ws
            .check_write(Path::new("/home/u/.drover/daemon.json"))
            .expect_err("home");
        assert!(err.contains("drover home"), "{err}");
        let ro = policy(ReadOnly, true, Some(7), false);
        assert!(ro.check_write(Path::new("/work/project/a")).is_err());
        let off = policy(Off, true, Some(7), false);
        assert!(off.check_write(Path::new("/etc/passwd")).is_ok());
    }

    #[test]
    fn refusals_are_recognised_by_their_messages() {
        assert!(looks_refused("touch: cannot touch '/x': Permission denied"));
        assert!(looks_refused("rm: Read-only file system"));
        assert!(!looks_refused("No such file or directory"));
        assert!(looks_offline(
            "curl: (6) Could not resolve host: example.com"
        ));
        assert!(looks_offline(
            "ConnectionRefusedError: [Errno 111] Connection refused"
        ));
        assert!(!looks_offline("No such file or directory"));
    }
}
