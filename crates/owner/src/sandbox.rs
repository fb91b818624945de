//! The owner's side of the sandbox (`docs/sandbox.md`): what the kernel offers
//! (probed once at daemon start), the `policy.sandbox` each worker gets, and
//! `session.resume`'s `info.confinement`. Pure functions over the session's frozen
//! [`SessionSandbox`] and the probe, so what is claimed is computed in one place.
//!
//! Never claim more than is in force: `unavailable` when the mode asks for Landlock and the
//! kernel has none; the homes count as hidden only with user namespaces; `network = false`
//! counts as `blocked` only with a network namespace (user namespaces), as `tcp_refused` with
//! Landlock ABI 4 or later alone; signals are scoped only with Landlock ABI 6 or later.

use std::io::{Read, Seek, Write};
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

use drover_ledger::SessionSandbox;
use drover_protocol::sandbox::{Confinement, SandboxMode, SandboxPolicy, SandboxSupport, ToolEnv};

/// The first Landlock ABI with TCP connect and bind rules.
pub const LANDLOCK_NETWORK_ABI: u32 = 4;

/// The first Landlock ABI that scopes signals and abstract unix sockets.
pub const LANDLOCK_SCOPE_ABI: u32 = drover_platform::confine::SCOPE_ABI;

/// What [`drover_platform::confine::probe`] found, in the protocol's shape.
pub fn probe() -> SandboxSupport {
    let found = drover_platform::confine::probe();
    SandboxSupport {
        namespaces: found.namespaces,
        landlock_abi: found.landlock_abi,
        problems: found.problems,
    }
}

/// What the owner claims when the probe itself could not finish (it panicked): nothing, with
/// the reason, so that `[sandbox] required = true` refuses tools rather than trusting layers no
/// one checked.
pub fn unprobed(why: &dyn std::fmt::Display) -> SandboxSupport {
    SandboxSupport {
        namespaces: false,
        landlock_abi: None,
        problems: vec![format!("the sandbox probe did not finish: {why}")],
    }
}

/// One line at daemon start: INFO when both layers are available, else one WARN naming what
/// is missing.
pub fn log_support(support: &SandboxSupport) {
    let missing = missing_layers(support);
    if missing.is_empty() {
        tracing::info!(
            landlock_abi = support.landlock_abi,
            "sandbox available: user namespaces and Landlock"
        );
    } else {
        tracing::warn!(
            missing = %missing.join(", "),
            problems = %support.problems.join("; "),
            "sandbox incomplete: tools run with less confinement; with [sandbox] required = \
             true they are refused instead"
        );
    }
}

/// The layers the kernel does not offer, as words for a log line.
fn missing_layers(support: &SandboxSupport) -> Vec<&'static str> {
    let mut missing = Vec::new();
    if !support.namespaces {
        missing.push("user namespaces (the drover home stays visible to tools)");
    }
    if support.landlock_abi.is_none() {
        missing.push("Landlock (writes are not confined)");
    }
    missing
}

/// Where, under the user's home (from the account database), every daemon records its home at
/// start: the list of homes, one absolute path a line (`docs/sandbox.md`). The directory is
/// hidden from tools itself, so no tool can strike a home off it.
pub const HOMES_DIR: &str = ".local/state/drover";
const HOMES_FILE: &str = "homes";

/// The browsers' profile directories under a user's home (where the dashboard login is
/// stored), hidden from tools.
pub const BROWSER_PROFILES: &[&str] = &[
    ".config/chromium",
    ".config/google-chrome",
    ".config/google-chrome-beta",
    ".config/google-chrome-unstable",
    ".config/BraveSoftware",
    ".config/microsoft-edge",
    ".config/vivaldi",
    ".config/opera",
    ".mozilla",
    ".librewolf",
    ".waterfox",
    "snap/chromium",
    "snap/firefox",
    ".var/app/org.chromium.Chromium",
    ".var/app/com.google.Chrome",
    ".var/app/com.brave.Browser",
    ".var/app/org.mozilla.firefox",
    ".var/app/io.gitlab.librewolf-community",
];

/// Records `home` in this user's list of homes ([`HOMES_DIR`]), dropping entries whose
/// directory is gone. Called when a daemon prepares its home; a failure is logged by the
/// caller and costs only the hiding of this home from other daemons' tools.
pub fn register_home(home: &Path) -> std::io::Result<()> {
    match drover_platform::confine::account_home() {
        Some(account) => register_home_in(&account.join(HOMES_DIR), home),
        None => Ok(()),
    }
}

fn register_home_in(dir: &Path, home: &Path) -> std::io::Result<()> {
    register_home_within(dir, home, HOMES_LIST_REWRITE_WAIT)
}

/// [`register_home_in`], waiting at most `wait` for the list's lock.
fn register_home_within(dir: &Path, home: &Path, wait: std::time::Duration) -> std::io::Result<()> {
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)?;
    let mut file = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .mode(0o600)
        .open(dir.join(HOMES_FILE))?;
    // Daemons start side by side: one rewrite at a time. A daemon stopped (SIGSTOP) in the
    // middle of its rewrite holds the lock until it is continued: this one goes on without
    // its home in the list.
    if !lock_within(&file, false, wait)? {
        return Err(std::io::Error::new(
            std::io::ErrorKind::WouldBlock,
            format!(
                "another process has held the lock of {} for {wait:?}",
                dir.join(HOMES_FILE).display()
            ),
        ));
    }
    let mut text = String::new();
    file.read_to_string(&mut text)?;
    let mut homes: Vec<PathBuf> = text
        .lines()
        .map(PathBuf::from)
        .filter(|h| h.is_absolute() && h.as_path() != home && h.is_dir())
        .collect();
    homes.dedup();
    homes.push(home.to_path_buf());
    let mut out = String::new();
    for h in &homes {
        // A path with a newline cannot be a line of the list (and no home has one).
        if let Some(line) = h.to_str().filter(|l| !l.contains('\n')) {
            out.push_str(line);
            out.push('\n');
        }
    }
    file.set_len(0)?;
    file.rewind()?;
    file.write_all(out.as_bytes())?;
    file.unlock()
}

/// How long a turn waits to read the list of homes while another daemon rewrites it (a
/// rewrite takes microseconds; one that takes this long is a stopped daemon's).
const HOMES_LIST_READ_WAIT: std::time::Duration = std::time::Duration::from_millis(100);
/// How long a daemon's start waits to add its home to the list.
const HOMES_LIST_REWRITE_WAIT: std::time::Duration = std::time::Duration::from_secs(2);

/// Takes `file`'s `flock` (shared or exclusive), waiting at most `wait`: `Ok(false)` when
/// another open file held it all that time.
fn lock_within(
    file: &std::fs::File,
    shared: bool,
    wait: std::time::Duration,
) -> std::io::Result<bool> {
    let end = std::time::Instant::now() + wait;
    loop {
        let tried = if shared {
            file.try_lock_shared()
        } else {
            file.try_lock()
        };
        match tried {
            Ok(()) => return Ok(true),
            Err(std::fs::TryLockError::WouldBlock) if std::time::Instant::now() < end => {
                std::thread::sleep(std::time::Duration::from_millis(1));
            }
            Err(std::fs::TryLockError::WouldBlock) => return Ok(false),
            Err(std::fs::TryLockError::Error(e)) => return Err(e),
        }
    }
}

/// The homes in the list of `dir`, as recorded (existing or not: a missing one is skipped
/// when the tool starts); `None` when another process held the list's lock for
/// [`HOMES_LIST_READ_WAIT`].
fn listed_homes(dir: &Path) -> Option<Vec<PathBuf>> {
    let Ok(mut file) = std::fs::File::open(dir.join(HOMES_FILE)) else {
        return Some(Vec::new());
    };
    match lock_within(&file, true, HOMES_LIST_READ_WAIT) {
        Ok(true) => {}
        Ok(false) => return None,
        Err(_) => return Some(Vec::new()),
    }
    let mut text = String::new();
    if file.read_to_string(&mut text).is_err() {
        return Some(Vec::new());
    }
    Some(
        text.lines()
            .map(PathBuf::from)
            .filter(|h| h.is_absolute())
            .collect(),
    )
}

/// Everything hidden from a tool of the daemon whose home is `home`: that home first, every
/// home in the user's list and the list itself, the default `~/.drover`, and the browsers'
/// profiles, under the account's home (`account`) and under `$HOME` when that differs. Never
/// `/` or a user's home itself, which would hide everything.
/// `None` when the list of homes could not be read in time ([`listed_homes`]).
fn hidden_paths(home: &str, account: Option<PathBuf>) -> Option<Vec<String>> {
    let listed = match &account {
        Some(account) => listed_homes(&account.join(HOMES_DIR))?,
        None => Vec::new(),
    };
    Some(hidden_paths_of(
        home,
        &user_homes(account.as_deref()),
        account.as_deref(),
        &listed,
    ))
}

/// The account's home and `$HOME`, when that differs.
fn user_homes(account: Option<&Path>) -> Vec<PathBuf> {
    let env_home = std::env::var_os("HOME")
        .map(PathBuf::from)
        .filter(|h| h.is_absolute());
    let mut user_homes: Vec<PathBuf> = account
        .map(Path::to_path_buf)
        .into_iter()
        .chain(env_home)
        .collect();
    user_homes.dedup();
    user_homes
}

/// How long after its last change the list of homes is read again at every turn: a rewrite
/// within the file system's clock tick (a few milliseconds) may leave its size and times as
/// they were, so a list changed this recently proves nothing by its stamp (as git treats an
/// index entry as racy).
const HOMES_LIST_SETTLE: std::time::Duration = std::time::Duration::from_secs(2);

/// The paths hidden from one daemon's tools, kept between turns: a claim's bootstrap used to
/// read the account database and the list of homes (under a lock) and build the ~40 paths each
/// time, about 0.2 ms before the worker could start. The account's home is read once; the list
/// again whenever its file's stamp (inode, size, modification and change times) differs from
/// the one the kept paths were built from, or it changed within the last 2 seconds; `$HOME` is
/// compared at each call. So a daemon started since is hidden from the next turn's tools, as
/// before.
#[derive(Debug, Default)]
pub struct HiddenPaths {
    account: std::sync::OnceLock<Option<PathBuf>>,
    kept: std::sync::Mutex<Option<KeptHidden>>,
}

#[derive(Debug)]
struct KeptHidden {
    home: String,
    env_home: Option<std::ffi::OsString>,
    list: Option<ListStamp>,
    paths: Vec<String>,
}

/// What identifies one state of the list of homes' file.
#[derive(Debug, Clone, PartialEq, Eq)]
struct ListStamp {
    inode: u64,
    len: u64,
    modified: (i64, i64),
    changed: (i64, i64),
}

/// The list of homes' file as a turn finds it.
#[derive(Debug)]
enum ListState {
    /// Unchanged for [`HOMES_LIST_SETTLE`] (`None`: there is no list): paths kept for the same
    /// stamp are still right.
    Settled(Option<ListStamp>),
    /// Changed more recently: nothing kept may be trusted.
    Recent,
}

impl ListState {
    fn of(path: &Path) -> ListState {
        use std::os::unix::fs::MetadataExt;
        let Ok(meta) = std::fs::symlink_metadata(path) else {
            return ListState::Settled(None);
        };
        let settled = meta
            .modified()
            .ok()
            .and_then(|m| m.elapsed().ok())
            .is_some_and(|age| age >= HOMES_LIST_SETTLE);
        if !settled {
            return ListState::Recent;
        }
        ListState::Settled(Some(ListStamp {
            inode: meta.ino(),
            len: meta.len(),
            modified: (meta.mtime(), meta.mtime_nsec()),
            changed: (meta.ctime(), meta.ctime_nsec()),
        }))
    }
}

impl HiddenPaths {
    /// The paths hidden from the tools of the daemon whose home is `home`, rebuilt only when
    /// something they are built from changed.
    pub fn of(&self, home: &str) -> Vec<String> {
        let account = self
            .account
            .get_or_init(drover_platform::confine::account_home)
            .clone();
        let env_home = std::env::var_os("HOME");
        let list = match &account {
            Some(account) => ListState::of(&account.join(HOMES_DIR).join(HOMES_FILE)),
            None => ListState::Settled(None),
        };
        let Ok(mut kept) = self.kept.lock() else {
            return hidden_paths(home, account.clone())
                .unwrap_or_else(|| unlisted(home, account.as_deref()));
        };
        if let (Some(k), ListState::Settled(list)) = (kept.as_ref(), &list) {
            if k.home == home && k.env_home == env_home && k.list == *list {
                return k.paths.clone();
            }
        }
        let Some(paths) = hidden_paths(home, account.clone()) else {
            // Another daemon is stuck in its rewrite of the list (stopped): this turn keeps
            // what was hidden before, or at least every path but the other listed homes; the
            // next turn reads the list again.
            tracing::warn!(
                "the list of drover homes stayed locked for {HOMES_LIST_READ_WAIT:?}; this turn hides the homes it hid before"
            );
            return match kept.as_ref() {
                Some(k) if k.home == home => k.paths.clone(),
                _ => unlisted(home, account.as_deref()),
            };
        };
        *kept = match list {
            ListState::Settled(list) => Some(KeptHidden {
                home: home.to_string(),
                env_home,
                list,
                paths: paths.clone(),
            }),
            ListState::Recent => None,
        };
        paths
    }
}

/// What [`hidden_paths`] hides without the other listed homes (the list could not be read).
fn unlisted(home: &str, account: Option<&Path>) -> Vec<String> {
    hidden_paths_of(home, &user_homes(account), account, &[])
}

fn hidden_paths_of(
    home: &str,
    user_homes: &[PathBuf],
    account: Option<&Path>,
    listed: &[PathBuf],
) -> Vec<String> {
    let mut hidden: Vec<PathBuf> = vec![PathBuf::from(home)];
    if let Some(account) = account {
        let dir = account.join(HOMES_DIR);
        hidden.extend(listed.iter().cloned());
        hidden.push(dir);
    }
    for user in user_homes {
        hidden.push(user.join(".drover"));
        hidden.extend(BROWSER_PROFILES.iter().map(|p| user.join(p)));
    }
    let mut out: Vec<String> = Vec::new();
    for path in hidden {
        let too_wide = path.parent().is_none() || user_homes.contains(&path);
        let text = path.display().to_string();
        if !too_wide && !text.is_empty() && !out.contains(&text) {
            out.push(text);
        }
    }
    out
}

/// `hidden` without the paths, after the first (the session's own home), that hold one of
/// `needed` (the cwd, a writable root, the temp dir): another daemon whose home is `/tmp` or a
/// project's parent must not take those away from this session's tools. Such a home stays
/// readable here, and the file tools say nothing of it.
fn clear_of(hidden: Vec<String>, needed: &[&Path]) -> Vec<String> {
    hidden
        .into_iter()
        .enumerate()
        .filter(|(i, path)| *i == 0 || !needed.iter().any(|n| n.starts_with(path.as_str())))
        .map(|(_, path)| path)
        .collect()
}

/// `policy.sandbox` of a turn: the session's frozen settings, its cwd as the first writable
/// root, every drover home and the browsers' profiles hidden (`hidden`'s paths of `home`; none
/// in `off`), the probe, and `[sandbox.env]` as read now.
pub fn policy(
    frozen: &SessionSandbox,
    cwd: &str,
    (home, hidden): (&str, &HiddenPaths),
    support: &SandboxSupport,
    env: ToolEnv,
) -> SandboxPolicy {
    let mut writable_roots = vec![cwd.to_string()];
    for root in &frozen.writable_roots {
        if !writable_roots.contains(root) {
            writable_roots.push(root.clone());
        }
    }
    let hidden = if frozen.mode == SandboxMode::Off || home.is_empty() {
        Vec::new()
    } else {
        let temp = std::env::temp_dir();
        let needed: Vec<&Path> = writable_roots
            .iter()
            .map(Path::new)
            .chain(std::iter::once(temp.as_path()))
            .collect();
        clear_of(hidden.of(home), &needed)
    };
    SandboxPolicy {
        mode: frozen.mode,
        writable_roots,
        network: frozen.network,
        hidden,
        required: frozen.required,
        support: support.clone(),
        env,
    }
}

/// `info.confinement`: what is in force for the session's tools, never more.
pub fn confinement(frozen: &SessionSandbox, cwd: &str, support: &SandboxSupport) -> Confinement {
    let confined = frozen.mode != SandboxMode::Off;
    let landlock_abi = support.landlock_abi.filter(|_| confined);
    let mut problems = Vec::new();
    if confined {
        problems.extend(support.problems.iter().cloned());
        if !support.namespaces {
            problems.push(
                "user namespaces are not available: the drover home is not hidden from tools"
                    .to_string(),
            );
        }
        if support.landlock_abi.is_none() {
            problems.push(format!(
                "Landlock is not available: [sandbox] mode = \"{}\" is not enforced",
                frozen.mode
            ));
        }
    }
    let sandbox = if confined && landlock_abi.is_none() {
        "unavailable".to_string()
    } else {
        frozen.mode.to_string()
    };
    if confined && landlock_abi.is_none_or(|abi| abi < LANDLOCK_SCOPE_ABI) {
        problems.push(format!(
            "signals are not scoped (Landlock ABI {LANDLOCK_SCOPE_ABI} needed): a tool can \
             signal the daemon and the worker, and reach abstract unix sockets"
        ));
    }
    let network = if frozen.network {
        "open"
    } else if confined && support.namespaces {
        problems.push(
            "network = false: pathname unix sockets (files such as /run/docker.sock) are not \
             network; a tool reaches those it can open"
                .to_string(),
        );
        "blocked"
    } else if landlock_abi.is_some_and(|abi| abi >= LANDLOCK_NETWORK_ABI) {
        problems.push(
            "network = false without user namespaces: only TCP is refused (Landlock); UDP, DNS, \
             MPTCP and unix sockets still reach out"
                .to_string(),
        );
        "tcp_refused"
    } else {
        problems.push(match landlock_abi {
            _ if !confined => "[sandbox] network = false has no effect with mode = \"off\"".into(),
            Some(abi) => format!(
                "[sandbox] network = false needs user namespaces (a network namespace), or \
                 Landlock ABI {LANDLOCK_NETWORK_ABI} to refuse TCP at least; the kernel offers \
                 no namespaces and ABI {abi}"
            ),
            None => "[sandbox] network = false needs user namespaces or Landlock, and neither \
                     is available"
                .into(),
        });
        "not_enforced"
    };
    let writable_roots = match (frozen.mode, landlock_abi) {
        (SandboxMode::WorkspaceWrite, Some(_)) => {
            policy(
                frozen,
                cwd,
                ("", &HiddenPaths::default()),
                support,
                ToolEnv::default(),
            )
            .writable_roots
        }
        _ => Vec::new(),
    };
    if frozen.required && confined && !(support.namespaces && landlock_abi.is_some()) {
        problems.push(
            "[sandbox] required = true: tools are refused rather than run with less".to_string(),
        );
    }
    Confinement {
        sandbox,
        home_hidden: confined && support.namespaces,
        landlock_abi,
        network: network.to_string(),
        writable_roots,
        required: frozen.required,
        problems,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn full(abi: u32) -> SandboxSupport {
        SandboxSupport {
            namespaces: true,
            landlock_abi: Some(abi),
            problems: Vec::new(),
        }
    }

    fn none() -> SandboxSupport {
        SandboxSupport {
            namespaces: false,
            landlock_abi: None,
            problems: vec!["no kernel support".into()],
        }
    }

    fn frozen(mode: SandboxMode, network: bool) -> SessionSandbox {
        SessionSandbox {
            mode,
            writable_roots: vec!["/srv/out".into()],
            network,
            required: false,
        }
    }

    #[test]
    fn everything_available_is_claimed_as_asked() {
        let c = confinement(&frozen(SandboxMode::WorkspaceWrite, false), "/w", &full(7));
        assert_eq!(c.sandbox, "workspace-write");
        assert!(c.home_hidden);
        assert_eq!(c.landlock_abi, Some(7));
        assert_eq!(c.network, "blocked");
        assert_eq!(c.writable_roots, vec!["/w".to_string(), "/srv/out".into()]);
        // What `blocked` leaves open is said.
        assert_eq!(c.problems.len(), 1, "{:?}", c.problems);
        assert!(
            c.problems[0].contains("pathname unix sockets"),
            "{:?}",
            c.problems
        );
        let open = confinement(&frozen(SandboxMode::WorkspaceWrite, true), "/w", &full(7));
        assert!(open.problems.is_empty(), "{:?}", open.problems);

        let ro = confinement(&frozen(SandboxMode::ReadOnly, true), "/w", &full(7));
        assert_eq!(ro.sandbox, "read-only");
        assert_eq!(ro.network, "open");
        assert!(ro.writable_roots.is_empty());
    }

    #[test]
    fn without_landlock_the_mode_is_unavailable_and_nothing_is_claimed() {
        let c = confinement(&frozen(SandboxMode::WorkspaceWrite, false), "/w", &none());
        assert_eq!(c.sandbox, "unavailable");
        assert!(!c.home_hidden);
        assert_eq!(c.landlock_abi, None);
        assert_eq!(c.network, "not_enforced");
        assert!(c.writable_roots.is_empty());
        assert!(c.problems.iter().any(|p| p == "no kernel support"));
        assert!(c.problems.iter().any(|p| p.contains("Landlock")));
        assert!(c.problems.iter().any(|p| p.contains("not hidden")));
    }

    #[test]
    fn namespaces_without_landlock_hide_the_home_only() {
        let support = SandboxSupport {
            namespaces: true,
            landlock_abi: None,
            problems: Vec::new(),
        };
        let c = confinement(&frozen(SandboxMode::ReadOnly, true), "/w", &support);
        assert_eq!(c.sandbox, "unavailable");
        assert!(c.home_hidden);
        assert_eq!(c.network, "open");
    }

    #[test]
    fn without_namespaces_the_network_is_blocked_only_as_far_as_landlock_goes() {
        let mut support = full(7);
        support.namespaces = false;
        let c = confinement(&frozen(SandboxMode::WorkspaceWrite, false), "/w", &support);
        assert_eq!(c.network, "tcp_refused");
        assert!(
            c.problems.iter().any(|p| p.contains("UDP")),
            "{:?}",
            c.problems
        );
    }

    #[test]
    fn an_old_landlock_scopes_no_signal() {
        let c = confinement(&frozen(SandboxMode::WorkspaceWrite, false), "/w", &full(5));
        assert_eq!(c.network, "blocked");
        assert!(
            c.problems
                .iter()
                .any(|p| p.contains("signals are not scoped")),
            "{:?}",
            c.problems
        );
    }

    #[test]
    fn an_old_landlock_cannot_block_the_network() {
        let mut support = full(3);
        support.namespaces = false;
        let c = confinement(&frozen(SandboxMode::WorkspaceWrite, false), "/w", &support);
        assert_eq!(c.sandbox, "workspace-write");
        assert_eq!(c.network, "not_enforced");
        assert!(
            c.problems.iter().any(|p| p.contains("ABI 4")),
            "{:?}",
            c.problems
        );
    }

    #[test]
    fn off_claims_nothing_whatever_the_kernel_offers() {
        let c = confinement(&frozen(SandboxMode::Off, true), "/w", &full(7));
        assert_eq!(c.sandbox, "off");
        assert!(!c.home_hidden);
        assert_eq!(c.landlock_abi, None);
        assert_eq!(c.network, "open");
        assert!(c.writable_roots.is_empty());
        assert!(c.problems.is_empty());
        let blocked = confinement(&frozen(SandboxMode::Off, false), "/w", &full(7));
        assert_eq!(blocked.network, "not_enforced");
        // An off session is not troubled by a kernel without support.
        let bare = confinement(&frozen(SandboxMode::Off, true), "/w", &none());
        assert_eq!(bare.sandbox, "off");
        assert!(bare.problems.is_empty());
    }

    #[test]
    fn required_says_tools_are_refused_when_a_layer_is_missing() {
        let mut f = frozen(SandboxMode::WorkspaceWrite, true);
        f.required = true;
        let c = confinement(&f, "/w", &none());
        assert!(c.required);
        assert!(c.problems.iter().any(|p| p.contains("refused")));
        assert!(confinement(&f, "/w", &full(7)).problems.is_empty());
    }

    #[test]
    fn the_policy_hides_the_home_except_when_off_and_puts_the_cwd_first() {
        let env = ToolEnv {
            keep: vec!["GH_TOKEN".into()],
            set: Default::default(),
        };
        let p = policy(
            &frozen(SandboxMode::WorkspaceWrite, false),
            "/w",
            ("/home/u/.drover", &HiddenPaths::default()),
            &full(7),
            env.clone(),
        );
        assert_eq!(p.mode, SandboxMode::WorkspaceWrite);
        assert_eq!(p.writable_roots, vec!["/w".to_string(), "/srv/out".into()]);
        assert_eq!(p.hidden[0], "/home/u/.drover", "the own home first");
        assert!(!p.network);
        assert_eq!(p.support, full(7));
        assert_eq!(p.env, env);
        let off = policy(
            &frozen(SandboxMode::Off, true),
            "/w",
            ("/h", &HiddenPaths::default()),
            &full(7),
            ToolEnv::default(),
        );
        assert!(off.hidden.is_empty());
    }

    /// Sets the list's modification time `age` into the past, as a list written that long ago.
    fn age_list(list: &Path, age: std::time::Duration) {
        let file = std::fs::File::options()
            .write(true)
            .open(list.join(HOMES_FILE))
            .expect("list");
        file.set_modified(std::time::SystemTime::now() - age)
            .expect("set mtime");
    }

    #[test]
    fn kept_hidden_paths_follow_the_list_of_homes() {
        let account = tempfile::tempdir().expect("account");
        let list = account.path().join(HOMES_DIR);
        let (a, b) = (account.path().join("a"), account.path().join("b"));
        let kept = HiddenPaths {
            account: std::sync::OnceLock::from(Some(account.path().to_path_buf())),
            ..HiddenPaths::default()
        };
        register_home_in(&list, &a).expect("a");
        age_list(&list, std::time::Duration::from_secs(60));
        let first = kept.of("/srv/own");
        assert!(first.contains(&a.display().to_string()), "{first:?}");
        assert_eq!(
            kept.of("/srv/own"),
            first,
            "kept while the list is unchanged"
        );
        assert!(
            kept.kept.lock().expect("lock").is_some(),
            "a settled list is kept"
        );

        // A daemon registers its home: the next turn hides it (the list changed just now).
        register_home_in(&list, &b).expect("b");
        let second = kept.of("/srv/own");
        assert!(second.contains(&b.display().to_string()), "{second:?}");
        assert!(
            kept.kept.lock().expect("lock").is_none(),
            "a list changed just now is not kept"
        );

        // Settled, kept, then rewritten and settled again before the next turn: the stamp
        // differs, so the list is read once more.
        age_list(&list, std::time::Duration::from_secs(30));
        assert_eq!(kept.of("/srv/own"), second);
        assert!(kept.kept.lock().expect("lock").is_some());
        std::fs::write(list.join(HOMES_FILE), format!("{}\n", a.display())).expect("rewrite");
        age_list(&list, std::time::Duration::from_secs(20));
        let third = kept.of("/srv/own");
        assert!(!third.contains(&b.display().to_string()), "{third:?}");
        assert_eq!(
            Some(kept.of("/other")),
            hidden_paths("/other", Some(account.path().into()))
        );
    }

    /// `kept.of(home)` on a thread of its own, which must answer within 10 s.
    fn of_within_bound(kept: &std::sync::Arc<HiddenPaths>, home: &str) -> Vec<String> {
        let (tx, rx) = std::sync::mpsc::channel();
        let (kept, home) = (std::sync::Arc::clone(kept), home.to_string());
        std::thread::spawn(move || {
            let _ = tx.send(kept.of(&home));
        });
        rx.recv_timeout(std::time::Duration::from_secs(10))
            .expect("the hidden paths were built in time")
    }

    /// A daemon stopped (SIGSTOP) in the middle of its rewrite holds the list's lock: a turn
    /// waits for it a bounded time, then hides what it hid before (or every path but the other
    /// listed homes when it has nothing kept), and a daemon's start gives up adding its home.
    #[test]
    fn a_list_locked_by_a_stopped_daemon_stalls_no_turn() {
        let account = tempfile::tempdir().expect("account");
        let list = account.path().join(HOMES_DIR);
        let (a, b) = (account.path().join("a"), account.path().join("b"));
        let kept = std::sync::Arc::new(HiddenPaths {
            account: std::sync::OnceLock::from(Some(account.path().to_path_buf())),
            ..HiddenPaths::default()
        });
        register_home_in(&list, &a).expect("a");
        age_list(&list, std::time::Duration::from_secs(60));
        let before = of_within_bound(&kept, "/srv/own");
        assert!(before.contains(&a.display().to_string()), "{before:?}");

        register_home_in(&list, &b).expect("b");
        let holder = std::fs::File::open(list.join(HOMES_FILE)).expect("list");
        holder.lock().expect("the stopped daemon's lock");
        assert_eq!(of_within_bound(&kept, "/srv/own"), before, "the paths kept");
        let fresh = std::sync::Arc::new(HiddenPaths {
            account: std::sync::OnceLock::from(Some(account.path().to_path_buf())),
            ..HiddenPaths::default()
        });
        let unlisted = of_within_bound(&fresh, "/srv/own");
        assert_eq!(unlisted[0], "/srv/own");
        assert!(
            unlisted.contains(&list.display().to_string()),
            "{unlisted:?}"
        );
        assert!(!unlisted.contains(&a.display().to_string()), "{unlisted:?}");
        let refused = register_home_within(
            &list,
            &account.path().join("c"),
            std::time::Duration::from_millis(50),
        )
        .expect_err("no rewrite under another's lock");
        assert_eq!(refused.kind(), std::io::ErrorKind::WouldBlock);

        holder.unlock().expect("continued");
        let after = of_within_bound(&kept, "/srv/own");
        assert!(after.contains(&b.display().to_string()), "{after:?}");
    }

    #[test]
    fn the_list_of_homes_keeps_each_existing_home_once() {
        let dir = tempfile::tempdir().expect("dir");
        let list = dir.path().join("state");
        let a = dir.path().join("a");
        let b = dir.path().join("b");
        std::fs::create_dir(&a).expect("a");
        std::fs::create_dir(&b).expect("b");
        register_home_in(&list, &a).expect("a");
        register_home_in(&list, &b).expect("b");
        register_home_in(&list, &a).expect("a again");
        assert_eq!(listed_homes(&list), Some(vec![b.clone(), a.clone()]));
        std::fs::remove_dir(&b).expect("gone");
        let c = dir.path().join("c");
        register_home_in(&list, &c).expect("c");
        assert_eq!(listed_homes(&list), Some(vec![a, c]));
    }

    #[test]
    fn every_listed_home_the_default_and_the_browser_profiles_are_hidden_never_a_user_home() {
        let account = tempfile::tempdir().expect("account");
        let other = tempfile::tempdir().expect("other home");
        let list = account.path().join(HOMES_DIR);
        register_home_in(&list, other.path()).expect("other");
        register_home_in(&list, account.path()).expect("a home that is the user's home");
        let users = vec![account.path().to_path_buf()];
        let listed = listed_homes(&list).expect("listed");
        let hidden = hidden_paths_of("/srv/own", &users, Some(account.path()), &listed);
        let shown = |p: &Path| p.display().to_string();
        assert_eq!(hidden[0], "/srv/own");
        assert!(hidden.contains(&shown(other.path())), "{hidden:?}");
        assert!(hidden.contains(&shown(&list)), "{hidden:?}");
        assert!(hidden.contains(&shown(&account.path().join(".drover"))));
        assert!(hidden.contains(&shown(&account.path().join(".mozilla"))));
        assert!(hidden.contains(&shown(&account.path().join(".config/chromium"))));
        assert!(!hidden.contains(&shown(account.path())), "{hidden:?}");
    }

    #[test]
    fn a_listed_home_that_holds_the_cwd_or_the_temp_dir_is_not_hidden() {
        let hidden = vec![
            "/srv/own".to_string(),
            "/tmp".to_string(),
            "/work".to_string(),
            "/work/other/.drover".to_string(),
        ];
        let kept = clear_of(hidden, &[Path::new("/work/project"), Path::new("/tmp")]);
        assert_eq!(
            kept,
            vec!["/srv/own".to_string(), "/work/other/.drover".into()]
        );
    }
}
