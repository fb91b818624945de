//! Confinement of tool processes (`docs/sandbox.md`): what the kernel offers
//! ([`probe`]), and the steps a tool process takes between fork and exec ([`Plan`]).
//!
//! A [`Plan`] is built in the parent from a [`Spec`]: every allocation happens there (the
//! paths to hide as C strings, the `uid_map`/`gid_map` lines, a Landlock ruleset fd holding
//! its rules). [`Plan::install`] adds a `pre_exec` step to a command that only makes plain
//! syscalls, in this order:
//!
//! 1. **namespaces** (when [`Spec::namespaces`]): `unshare(CLONE_NEWUSER | CLONE_NEWNS)`,
//!    with `CLONE_NEWNET` too when [`Spec::isolate_network`], `setgroups` `deny`, and a
//!    one-line `uid_map`/`gid_map` mapping the process's own ids to themselves (all a process
//!    may write from inside its new namespace);
//! 2. **the network namespace** (when [`Spec::isolate_network`]): its loopback brought up
//!    (`SIOCSIFFLAGS`), and nothing else: no route leaves it, so TCP, MPTCP, UDP, DNS and the
//!    abstract unix sockets of the machine (they belong to a network namespace) are all out of
//!    reach, while a server and its client inside the same tool process tree still talk;
//! 3. **the hidden paths**: the mount tree made private (`MS_REC | MS_PRIVATE`, so nothing
//!    reaches the parent's namespace), then an empty read-only tmpfs over each of
//!    [`Spec::hidden`] (drover homes, browser profiles);
//! 4. `PR_SET_NO_NEW_PRIVS`, then **Landlock** (when [`Spec::landlock`] or [`Spec::scoped`]):
//!    `landlock_restrict_self` with the prepared ruleset. Landlock also refuses `mount` and
//!    `umount` to the confined process. With [`Spec::scoped`] on ABI 6 or later the ruleset
//!    also scopes signals and abstract unix sockets to the process's own domain: a tool can
//!    signal (or connect to) only what it started itself, never the owner, the worker or a
//!    tool of another call;
//! 5. **no capabilities** (with the namespaces): the bounding and ambient sets emptied, the
//!    securebits `NOROOT` family set and locked, then every set cleared by `capset`, so even
//!    without Landlock the tool cannot `umount` the tmpfs and uncover the home, and an exec
//!    of a root-owned or setuid binary gives nothing back.
//!
//! Landlock rules ([`LandlockSpec`]): read and execute everywhere (`/`) with device ioctls;
//! every right under each writable root; file rights on `/dev/null`, `/dev/zero`,
//! `/dev/full`, `/dev/tty`, `/dev/ptmx`, `/dev/pts` and every right on `/dev/shm` (those that
//! exist); `network = false` handles TCP connect and bind (ABI 4 and later) with no rule, so
//! both are refused. The ruleset is built for exactly the ABI given, with the crate's hard
//! requirement: a right the kernel cannot enforce is an error, never silently dropped.
//! [`Plan::enforced`] says what the plan really applies.

use std::ffi::{CStr, CString};
use std::io;
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};

use landlock::{
    Access, AccessFs, AccessNet, BitFlags, CompatLevel, Compatible, PathBeneath, PathFd, Ruleset,
    RulesetAttr, RulesetCreatedAttr, Scope, ABI,
};
use nix::libc;

/// What the kernel lets drover do, found once at daemon start.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct KernelSupport {
    /// A new user and mount namespace can be made by this process's children.
    pub namespaces: bool,
    /// The Landlock ABI version, if the kernel has Landlock.
    pub landlock_abi: Option<u32>,
    /// Why a layer is missing (empty when both work).
    pub problems: Vec<String>,
}

/// Finds what the kernel offers: the Landlock ABI (`landlock_create_ruleset` with the version
/// flag), and whether a child can make a new user, mount and network namespace, bring its
/// loopback up and mount a tmpfs in it (`/bin/true` is spawned through the very namespace step
/// tools get). Cheap enough to call once at start; never panics.
pub fn probe() -> KernelSupport {
    let mut problems = Vec::new();
    let landlock_abi = match landlock_abi() {
        Ok(abi) => Some(abi),
        Err(reason) => {
            problems.push(reason);
            None
        }
    };
    let namespaces = match probe_namespaces() {
        Ok(()) => true,
        Err(reason) => {
            problems.push(reason);
            false
        }
    };
    KernelSupport {
        namespaces,
        landlock_abi,
        problems,
    }
}

/// `LANDLOCK_CREATE_RULESET_VERSION`: `landlock_create_ruleset(NULL, 0, this)` answers the ABI.
const LANDLOCK_CREATE_RULESET_VERSION: u32 = 1;

/// The Landlock ABI version of the running kernel, or why there is none.
fn landlock_abi() -> Result<u32, String> {
    // SAFETY: with a null attribute pointer, size 0 and the version flag, the kernel reads no
    // memory and returns the ABI version or -1; no fd is created.
    let version = unsafe {
        libc::syscall(
            libc::SYS_landlock_create_ruleset,
            std::ptr::null::<libc::c_void>(),
            0usize,
            LANDLOCK_CREATE_RULESET_VERSION,
        )
    };
    if version > 0 {
        return u32::try_from(version).map_err(|_| format!("Landlock answered ABI {version}"));
    }
    let err = io::Error::last_os_error();
    Err(match err.raw_os_error() {
        Some(libc::ENOSYS) => "the kernel has no Landlock (built without it)".to_string(),
        Some(libc::EOPNOTSUPP) => {
            "Landlock is not enabled in this kernel (add it to the lsm= boot parameter)".to_string()
        }
        _ => format!("Landlock could not be queried: {err}"),
    })
}

/// Spawns `/bin/true` through the namespace step (hiding the temp dir, so the mount step is
/// tried too) and checks it ran.
fn probe_namespaces() -> Result<(), String> {
    let program = ["/bin/true", "/usr/bin/true"]
        .into_iter()
        .find(|p| Path::new(p).exists())
        .ok_or("no /bin/true to probe user namespaces with")?;
    let temp = std::env::temp_dir();
    let spec = Spec {
        namespaces: true,
        hidden: vec![temp],
        isolate_network: true,
        ..Spec::default()
    };
    let plan = Plan::new(&spec).map_err(|e| format!("user namespaces not probed: {e}"))?;
    let mut command = std::process::Command::new(program);
    // The step enters the child's working directory again after hiding the temp dir; run from
    // "/", so that a process working below the temp dir (a daemon started from a project in
    // /tmp) does not see its probe fail and run every tool with the home in plain sight.
    command
        .current_dir("/")
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null());
    plan.install(&mut command);
    let status = command.status().map_err(|e| {
        format!(
            "a new user, mount and network namespace could not be made ({e}); unprivileged user \
             namespaces may be refused (user.max_user_namespaces, \
             kernel.apparmor_restrict_unprivileged_userns, a container's seccomp profile)"
        )
    })?;
    if status.success() {
        Ok(())
    } else {
        Err(format!(
            "{program} in a new user, mount and network namespace ended with {status}"
        ))
    }
}

/// The home directory of this process's user in the account database (`getpwuid_r`), not
/// `$HOME`: where the user's browsers keep their profiles and drover its list of homes
/// (`docs/sandbox.md`), whatever the environment a daemon was started with says.
pub fn account_home() -> Option<PathBuf> {
    use std::os::unix::ffi::OsStringExt;
    // SAFETY: getuid(2) cannot fail and touches no memory.
    let uid = unsafe { libc::getuid() };
    let mut buf = vec![0 as libc::c_char; 4096];
    loop {
        // SAFETY: an all-zero passwd is a valid value to be filled in.
        let mut entry: libc::passwd = unsafe { std::mem::zeroed() };
        let mut found: *mut libc::passwd = std::ptr::null_mut();
        // SAFETY: getpwuid_r(3) with a passwd, a buffer and its length, and a result pointer,
        // all owned by this frame; on success `entry`'s strings point into `buf`.
        let rc =
            unsafe { libc::getpwuid_r(uid, &mut entry, buf.as_mut_ptr(), buf.len(), &mut found) };
        if rc == libc::ERANGE && buf.len() < 1 << 20 {
            buf.resize(buf.len() * 2, 0);
            continue;
        }
        if rc != 0 || found.is_null() || entry.pw_dir.is_null() {
            return None;
        }
        // SAFETY: pw_dir is a NUL-terminated string inside `buf`, alive until this returns.
        let dir = unsafe { CStr::from_ptr(entry.pw_dir) };
        let dir = PathBuf::from(std::ffi::OsString::from_vec(dir.to_bytes().to_vec()));
        return dir.is_absolute().then_some(dir);
    }
}

/// What to apply to one tool process.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Spec {
    /// Make a new user and mount namespace, hide [`Spec::hidden`] in it and drop every
    /// capability.
    pub namespaces: bool,
    /// Absolute directories covered by an empty read-only tmpfs (only with
    /// [`Spec::namespaces`]). Paths that do not exist are skipped: there is nothing to hide; a
    /// path inside another one is covered with it.
    pub hidden: Vec<PathBuf>,
    /// A network namespace of the process's own too, with only its loopback (only with
    /// [`Spec::namespaces`]): no network at all.
    pub isolate_network: bool,
    /// The Landlock rules, or `None` for no Landlock write rules.
    pub landlock: Option<LandlockSpec>,
    /// Scope signals and abstract unix sockets to the process's own Landlock domain, with or
    /// without [`Spec::landlock`], when the kernel has Landlock ABI 6 or later (silently
    /// nothing before: [`Enforced::scoped`] says what was done).
    pub scoped: bool,
}

/// The Landlock layer of a [`Spec`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LandlockSpec {
    /// The ABI to build the rules for: the kernel's ([`KernelSupport::landlock_abi`]).
    pub abi: u32,
    /// Directories under which every access is allowed (empty in `read-only`).
    pub writable_roots: Vec<PathBuf>,
    /// Single files that may be written besides (a background process's own log, which it may
    /// reopen through `/dev/stdout`).
    pub writable_files: Vec<PathBuf>,
    /// Whether TCP connect and bind are allowed (`false` handles both with no rule; a
    /// network namespace, [`Spec::isolate_network`], is the stronger way to refuse).
    pub network: bool,
}

/// The first Landlock ABI with scopes (signals, abstract unix sockets).
pub const SCOPE_ABI: u32 = 6;

/// What a [`Plan`] applies, to be reported as it is.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Enforced {
    /// The namespace layer: the hidden paths are covered and no capability is left.
    pub namespaces: bool,
    /// The Landlock ABI the rules were built for, when the Landlock layer is applied.
    pub landlock_abi: Option<u32>,
    /// TCP connect and bind are refused by Landlock.
    pub network_blocked: bool,
    /// The process has a network namespace of its own, with only its loopback.
    pub network_isolated: bool,
    /// Signals and abstract unix sockets are scoped to the process's own Landlock domain.
    pub scoped: bool,
}

/// Errors building a [`Plan`].
#[derive(Debug, thiserror::Error)]
pub enum ConfineError {
    /// A path holds a NUL byte, so no syscall can take it.
    #[error("path {0} holds a NUL byte")]
    NulInPath(PathBuf),
    /// A hidden path exists but is not a directory (only directories can be covered).
    #[error("cannot hide {0}: not a directory")]
    NotADirectory(PathBuf),
    /// `network = false` asked for, and the kernel's Landlock cannot refuse TCP (ABI < 4).
    #[error("Landlock ABI {0} cannot refuse TCP connect and bind (ABI 4 and later can)")]
    NetworkUnsupported(u32),
    /// A path of a rule could not be opened.
    #[error("Landlock rule for {path}: {source}")]
    RulePath {
        /// The path of the rule.
        path: PathBuf,
        /// Why it could not be opened.
        source: io::Error,
    },
    /// The ruleset could not be made or a rule added (the kernel refused, or the ABI lacks a
    /// right).
    #[error("Landlock ruleset: {0}")]
    Ruleset(#[from] landlock::RulesetError),
    /// The kernel gave no ruleset (it has no Landlock).
    #[error("the kernel made no Landlock ruleset")]
    NoRuleset,
}

/// Everything the child needs, prepared in the parent (see the module docs).
pub struct Plan {
    namespaces: Option<NamespaceStep>,
    /// The Landlock ruleset, its rules added.
    ruleset: Option<OwnedFd>,
    enforced: Enforced,
}

impl std::fmt::Debug for Plan {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Plan")
            .field("enforced", &self.enforced)
            .finish_non_exhaustive()
    }
}

/// The namespace and mount steps, as bytes ready for syscalls.
struct NamespaceStep {
    /// The `unshare` flags.
    flags: libc::c_int,
    /// With a network namespace: the loopback's name, as `SIOCSIFFLAGS` takes it.
    loopback: Option<[libc::c_char; libc::IFNAMSIZ]>,
    setgroups: CString,
    uid_map_path: CString,
    gid_map_path: CString,
    uid_map: Vec<u8>,
    gid_map: Vec<u8>,
    root: CString,
    tmpfs: CString,
    tmpfs_options: CString,
    hidden: Vec<CString>,
    /// Every ancestor of a hidden path but `/`, bound onto itself so that it is a mount point
    /// of the tool's namespace: a directory holding a mount point cannot be renamed there
    /// (`EBUSY`), so a tool cannot move the home aside, make a decoy at its path, and have the
    /// daemon write a new `daemon.json` into it.
    pinned: Vec<CString>,
    /// The working directory, entered again after the mounts (set by [`Plan::install`]).
    cwd: Option<CString>,
    /// Whether the process runs as root (euid 0), whose `/proc/self` files it may write even
    /// when it is not dumpable.
    as_root: bool,
}

fn c_path(path: &Path) -> Result<CString, ConfineError> {
    CString::new(path.as_os_str().as_bytes()).map_err(|_| ConfineError::NulInPath(path.into()))
}

fn c_text(text: &'static str) -> CString {
    // The literals below hold no NUL byte, so this never falls back.
    CString::new(text).unwrap_or_default()
}

/// The devices every sandboxed process may open for writing, when they exist.
const DEVICE_FILES: &[&str] = &[
    "/dev/null",
    "/dev/zero",
    "/dev/full",
    "/dev/tty",
    "/dev/ptmx",
];
/// Device directories: terminals (file rights on what is below) and POSIX shared memory (every
/// right).
const PTS_DIR: &str = "/dev/pts";
const SHM_DIR: &str = "/dev/shm";

impl Plan {
    /// Prepares `spec`: opens the rule paths and builds the Landlock ruleset, formats the id
    /// maps. Nothing is applied to this process.
    pub fn new(spec: &Spec) -> Result<Plan, ConfineError> {
        let namespaces = if spec.namespaces {
            Some(NamespaceStep::new(&spec.hidden, spec.isolate_network)?)
        } else {
            None
        };
        // Scopes need ABI 6; without write rules the kernel's own ABI is asked.
        let scope_abi = match (&spec.landlock, spec.scoped) {
            (_, false) => None,
            (Some(rules), true) => Some(rules.abi),
            (None, true) => landlock_abi().ok(),
        }
        .filter(|abi| *abi >= SCOPE_ABI);
        let (ruleset, network_blocked) = match &spec.landlock {
            Some(rules) => {
                let (fd, blocked) = build_ruleset(rules, scope_abi.is_some())?;
                (Some(fd), blocked)
            }
            None => match scope_abi {
                Some(_) => (Some(build_scope_ruleset()?), false),
                None => (None, false),
            },
        };
        let enforced = Enforced {
            namespaces: namespaces.is_some(),
            landlock_abi: spec
                .landlock
                .as_ref()
                .filter(|_| ruleset.is_some())
                .map(|rules| rules.abi),
            network_blocked,
            network_isolated: namespaces
                .as_ref()
                .is_some_and(|step| step.loopback.is_some()),
            scoped: scope_abi.is_some() && ruleset.is_some(),
        };
        Ok(Plan {
            namespaces,
            ruleset,
            enforced,
        })
    }

    /// What this plan applies.
    pub fn enforced(&self) -> Enforced {
        self.enforced
    }

    /// Adds the steps to `command`, run in the child between fork and exec, after the
    /// `pre_exec` steps already added (`tokio::process::Command::as_std_mut` gives the std
    /// command of a tokio one). A step that fails makes the spawn fail with its errno: the
    /// command never runs with less than the plan.
    pub fn install(mut self, command: &mut std::process::Command) {
        // The child's working directory is entered before this step runs (std does chdir
        // first), so it still points below the hidden mounts: enter it again afterwards, by
        // path, so it resolves through them (a directory inside the home becomes the empty
        // tmpfs, or is not found).
        if let Some(step) = self.namespaces.as_mut() {
            let dir = command
                .get_current_dir()
                .map(Path::to_path_buf)
                .or_else(|| std::env::current_dir().ok());
            step.cwd = dir
                .map(|dir| match dir.is_absolute() {
                    true => dir,
                    false => std::env::current_dir().unwrap_or_default().join(dir),
                })
                .and_then(|dir| CString::new(dir.as_os_str().as_bytes()).ok());
        }
        // SAFETY: the closure runs in the forked child before exec. `Plan::enter` makes only
        // plain syscalls (unshare, open, write, close, mount, prctl, capset,
        // landlock_restrict_self) on memory prepared in the parent, and builds errors from raw
        // errnos, which does not allocate. It takes no lock.
        unsafe {
            command.pre_exec(move || self.enter());
        }
    }

    /// The child's side (async-signal-safe: no allocation, no lock).
    fn enter(&self) -> io::Result<()> {
        if let Some(step) = &self.namespaces {
            step.enter()?;
        }
        // SAFETY: prctl(2) with integer arguments only.
        check(unsafe { libc::prctl(libc::PR_SET_NO_NEW_PRIVS, ONE, ZERO, ZERO, ZERO) })?;
        if let Some(ruleset) = &self.ruleset {
            // SAFETY: landlock_restrict_self(2) with a ruleset fd this plan owns (inherited
            // through fork, still open: it is only closed at exec) and no flags.
            let rc = unsafe {
                libc::syscall(libc::SYS_landlock_restrict_self, ruleset.as_raw_fd(), 0u32)
            };
            if rc != 0 {
                return Err(io::Error::last_os_error());
            }
        }
        if self.namespaces.is_some() {
            drop_capabilities()?;
        }
        // Descriptors the daemon inherited from whoever started it (a terminal, a CI runner)
        // are not close-on-exec; a tool gets none of them. Marked, not closed, so a later
        // step may still hand one over on purpose (`pass_fd`). A kernel without close_range
        // (before 5.11) leaves them as they are.
        // SAFETY: close_range(2) with integer arguments only.
        let _ = unsafe {
            libc::syscall(
                libc::SYS_close_range,
                3u32,
                u32::MAX,
                libc::CLOSE_RANGE_CLOEXEC,
            )
        };
        Ok(())
    }
}

impl NamespaceStep {
    fn new(hidden: &[PathBuf], isolate_network: bool) -> Result<NamespaceStep, ConfineError> {
        let mut paths = Vec::new();
        let mut ancestors: Vec<PathBuf> = Vec::new();
        // A path inside another hidden one is covered with it (and could not be mounted on
        // once the outer tmpfs hides it); each path once.
        let mut hidden: Vec<&PathBuf> = hidden.iter().collect();
        hidden.sort_by_key(|p| p.components().count());
        hidden.dedup();
        let mut kept: Vec<&PathBuf> = Vec::new();
        for path in hidden {
            if kept.iter().any(|outer| path.starts_with(outer)) {
                continue;
            }
            match std::fs::metadata(path) {
                Ok(meta) if meta.is_dir() => {
                    kept.push(path);
                    paths.push(c_path(path)?);
                    ancestors.extend(
                        path.ancestors()
                            .skip(1)
                            .filter(|a| a.parent().is_some())
                            .map(Path::to_path_buf),
                    );
                }
                Ok(_) => return Err(ConfineError::NotADirectory(path.clone())),
                // Nothing there, nothing to hide.
                Err(_) => {}
            }
        }
        // Outermost first, each once: a bind below an earlier one lands in it.
        ancestors.sort_by_key(|a| a.components().count());
        ancestors.dedup();
        let pinned = ancestors
            .iter()
            .map(|a| c_path(a))
            .collect::<Result<Vec<_>, _>>()?;
        // SAFETY: geteuid(2) and getegid(2) cannot fail and touch no memory.
        let (uid, gid) = unsafe { (libc::geteuid(), libc::getegid()) };
        let mut flags = libc::CLONE_NEWUSER | libc::CLONE_NEWNS;
        let loopback = isolate_network.then(|| {
            flags |= libc::CLONE_NEWNET;
            let mut name = [0 as libc::c_char; libc::IFNAMSIZ];
            for (slot, byte) in name.iter_mut().zip(b"lo") {
                *slot = libc::c_char::from_ne_bytes([*byte]);
            }
            name
        });
        Ok(NamespaceStep {
            flags,
            loopback,
            setgroups: c_text("/proc/self/setgroups"),
            uid_map_path: c_text("/proc/self/uid_map"),
            gid_map_path: c_text("/proc/self/gid_map"),
            uid_map: format!("{uid} {uid} 1\n").into_bytes(),
            gid_map: format!("{gid} {gid} 1\n").into_bytes(),
            root: c_text("/"),
            tmpfs: c_text("tmpfs"),
            tmpfs_options: c_text("mode=0555,size=4k"),
            hidden: paths,
            pinned,
            cwd: None,
            as_root: uid == 0,
        })
    }

    /// Steps 1 to 3 of the module docs, in the child.
    fn enter(&self) -> io::Result<()> {
        // SAFETY: unshare(2) with flags only; the child is single-threaded after fork, as
        // CLONE_NEWUSER requires.
        check(unsafe { libc::unshare(self.flags) })?;
        // A child of a non-dumpable worker is non-dumpable too, and then its /proc/self files
        // belong to root: a process that is not root could not write its own maps. So it is
        // dumpable just for these three writes, and non-dumpable again before anything else
        // (exec makes it dumpable anyway, with the worker's memory gone).
        if !self.as_root {
            // SAFETY: prctl(2) with integer arguments only.
            check(unsafe { libc::prctl(libc::PR_SET_DUMPABLE, ONE, ZERO, ZERO, ZERO) })?;
        }
        // From inside the namespace, a gid_map can only be written once setgroups is denied
        // (even by root: the writer has no capability over the parent namespace any more).
        let maps = write_all(&self.setgroups, b"deny")
            .and_then(|()| write_all(&self.uid_map_path, &self.uid_map))
            .and_then(|()| write_all(&self.gid_map_path, &self.gid_map));
        if !self.as_root {
            // SAFETY: prctl(2) with integer arguments only.
            check(unsafe { libc::prctl(libc::PR_SET_DUMPABLE, ZERO, ZERO, ZERO, ZERO) })?;
        }
        maps?;
        if let Some(name) = &self.loopback {
            loopback_up(name)?;
        }
        // SAFETY: mount(2) with a NUL-terminated target prepared in the parent and null
        // source, type and data, as a propagation change takes.
        check(unsafe {
            libc::mount(
                std::ptr::null(),
                self.root.as_ptr(),
                std::ptr::null(),
                libc::MS_REC | libc::MS_PRIVATE,
                std::ptr::null(),
            )
        })?;
        for path in &self.pinned {
            // SAFETY: mount(2) with NUL-terminated paths prepared in the parent and null type
            // and data, as a bind takes.
            unless_gone(unsafe {
                libc::mount(
                    path.as_ptr(),
                    path.as_ptr(),
                    std::ptr::null(),
                    libc::MS_BIND | libc::MS_REC,
                    std::ptr::null(),
                )
            })?;
        }
        for path in &self.hidden {
            // SAFETY: mount(2) with NUL-terminated strings prepared in the parent.
            unless_gone(unsafe {
                libc::mount(
                    self.tmpfs.as_ptr(),
                    path.as_ptr(),
                    self.tmpfs.as_ptr(),
                    libc::MS_RDONLY | libc::MS_NOSUID | libc::MS_NODEV | libc::MS_NOEXEC,
                    self.tmpfs_options.as_ptr().cast(),
                )
            })?;
        }
        if let Some(cwd) = &self.cwd {
            // SAFETY: chdir(2) with a NUL-terminated path prepared in the parent.
            check(unsafe { libc::chdir(cwd.as_ptr()) })?;
        }
        Ok(())
    }
}

/// Brings the interface `name` (the new network namespace's loopback) up, as
/// `ip link set lo up` does: the namespace holds the capability over it until step 5.
/// Async-signal-safe.
fn loopback_up(name: &[libc::c_char; libc::IFNAMSIZ]) -> io::Result<()> {
    // SAFETY: socket(2) with integer arguments only.
    let fd = unsafe { libc::socket(libc::AF_INET, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC, 0) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: an all-zero ifreq is a valid value (a name of NULs and a zero union).
    let mut request: libc::ifreq = unsafe { std::mem::zeroed() };
    request.ifr_name = *name;
    // SAFETY: ioctl(2) SIOCGIFFLAGS then SIOCSIFFLAGS on a socket this function owns, with a
    // pointer to the ifreq on this stack frame, which both read and the first fills in;
    // `ifru_flags` is the union member both requests use.
    let result = unsafe {
        if libc::ioctl(fd, libc::SIOCGIFFLAGS, &mut request) == -1 {
            Err(io::Error::last_os_error())
        } else {
            request.ifr_ifru.ifru_flags |= IFF_UP;
            check(libc::ioctl(fd, libc::SIOCSIFFLAGS, &request))
        }
    };
    // SAFETY: closes the socket opened above, which nothing else holds.
    unsafe { libc::close(fd) };
    result
}

/// `IFF_UP` as the `short` that `ifru_flags` is.
const IFF_UP: libc::c_short = 0x1;

/// prctl(2) is variadic: every argument after the option goes as a full `unsigned long`, never
/// as an `int` whose upper bits are undefined.
const ZERO: libc::c_ulong = 0;
const ONE: libc::c_ulong = 1;

/// `-1` as the last errno, anything else as success.
/// As [`check`], but a path another process removed since the parent looked (`ENOENT`) is
/// not an error: nothing is left there to hide or to pin (another drover home deleted while a
/// tool process starts, a test's temporary home). Async-signal-safe.
fn unless_gone(rc: libc::c_int) -> io::Result<()> {
    match check(rc) {
        Err(e) if e.raw_os_error() == Some(libc::ENOENT) => Ok(()),
        other => other,
    }
}

fn check(rc: libc::c_int) -> io::Result<()> {
    if rc == -1 {
        Err(io::Error::last_os_error())
    } else {
        Ok(())
    }
}

/// Writes `bytes` to the file at `path` in one `write(2)` (the `/proc` id-map files take one
/// write). Async-signal-safe.
fn write_all(path: &CStr, bytes: &[u8]) -> io::Result<()> {
    // SAFETY: open(2) with a NUL-terminated path prepared in the parent.
    let fd = unsafe { libc::open(path.as_ptr(), libc::O_WRONLY | libc::O_CLOEXEC) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: write(2) of a buffer this function borrows, with its length.
    let written = unsafe { libc::write(fd, bytes.as_ptr().cast(), bytes.len()) };
    let result = if written < 0 {
        Err(io::Error::last_os_error())
    } else if written.unsigned_abs() != bytes.len() {
        Err(io::Error::from_raw_os_error(libc::EIO))
    } else {
        Ok(())
    };
    // SAFETY: closes the fd opened above, which nothing else holds.
    unsafe { libc::close(fd) };
    result
}

/// `_LINUX_CAPABILITY_VERSION_3`: capset takes two 32-bit words per set.
const CAPABILITY_VERSION_3: u32 = 0x2008_0522;
/// `SECBIT_NOROOT`, `SECBIT_NO_SETUID_FIXUP`, `SECBIT_KEEP_CAPS` (off) and
/// `SECBIT_NO_CAP_AMBIENT_RAISE`, each with its lock bit.
const SECUREBITS: libc::c_ulong = 0b1110_1111;

#[repr(C)]
struct CapHeader {
    version: u32,
    pid: libc::c_int,
}

#[repr(C)]
#[derive(Clone, Copy)]
struct CapData {
    effective: u32,
    permitted: u32,
    inheritable: u32,
}

/// Step 4 of the module docs, in the child (inside its new user namespace, where it holds
/// every capability until now).
fn drop_capabilities() -> io::Result<()> {
    let past_any_capability: libc::c_ulong = 64;
    for cap in 0..past_any_capability {
        // SAFETY: prctl(2) with integer arguments only.
        let rc = unsafe { libc::prctl(libc::PR_CAPBSET_DROP, cap, ZERO, ZERO, ZERO) };
        if rc == -1 {
            let err = io::Error::last_os_error();
            // Past the kernel's last capability.
            if err.raw_os_error() == Some(libc::EINVAL) && cap > 0 {
                break;
            }
            return Err(err);
        }
    }
    // SAFETY: prctl(2) with integer arguments only.
    let rc = unsafe {
        libc::prctl(
            libc::PR_CAP_AMBIENT,
            libc::c_ulong::try_from(libc::PR_CAP_AMBIENT_CLEAR_ALL).unwrap_or(ZERO),
            ZERO,
            ZERO,
            ZERO,
        )
    };
    // Kernels before 4.3 have no ambient set, so nothing to clear.
    if rc == -1 && io::Error::last_os_error().raw_os_error() != Some(libc::EINVAL) {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: prctl(2) with integer arguments only.
    check(unsafe { libc::prctl(libc::PR_SET_SECUREBITS, SECUREBITS, ZERO, ZERO, ZERO) })?;
    let mut header = CapHeader {
        version: CAPABILITY_VERSION_3,
        pid: 0,
    };
    let data = [CapData {
        effective: 0,
        permitted: 0,
        inheritable: 0,
    }; 2];
    // SAFETY: capset(2) with a version 3 header and the two data words it reads, both on
    // this stack frame.
    let rc = unsafe { libc::syscall(libc::SYS_capset, &mut header, data.as_ptr()) };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// The scopes of a scoped ruleset.
fn scopes() -> BitFlags<Scope> {
    Scope::Signal | Scope::AbstractUnixSocket
}

/// A ruleset that handles no access, only scopes (for a process without write rules: an
/// approved `sandbox: false` call).
fn build_scope_ruleset() -> Result<OwnedFd, ConfineError> {
    let created = Ruleset::default()
        .set_compatibility(CompatLevel::HardRequirement)
        .scope(scopes())?
        .create()?;
    let fd: Option<OwnedFd> = created.into();
    fd.ok_or(ConfineError::NoRuleset)
}

/// Builds the ruleset of `rules` (module docs), scoped when `scoped`, and gives its fd, and
/// whether TCP is refused.
fn build_ruleset(rules: &LandlockSpec, scoped: bool) -> Result<(OwnedFd, bool), ConfineError> {
    let abi = ABI::from(i32::try_from(rules.abi).unwrap_or(i32::MAX));
    let all = AccessFs::from_all(abi);
    let file = AccessFs::from_file(abi);
    let read_everywhere = AccessFs::from_read(abi) | (all & AccessFs::IoctlDev);
    let mut ruleset = Ruleset::default()
        .set_compatibility(CompatLevel::HardRequirement)
        .handle_access(all)?;
    let network_blocked = !rules.network;
    if network_blocked {
        if abi < ABI::V4 {
            return Err(ConfineError::NetworkUnsupported(rules.abi));
        }
        ruleset = ruleset.handle_access(AccessNet::from_all(abi))?;
    }
    if scoped {
        ruleset = ruleset.scope(scopes())?;
    }
    let mut created = ruleset.create()?;
    let mut add = |path: &Path, access: BitFlags<AccessFs>| -> Result<(), ConfineError> {
        let fd = PathFd::new(path).map_err(|e| ConfineError::RulePath {
            path: path.to_path_buf(),
            source: io::Error::other(e.to_string()),
        })?;
        (&mut created).add_rule(PathBeneath::new(fd, access))?;
        Ok(())
    };
    add(Path::new("/"), read_everywhere)?;
    for root in &rules.writable_roots {
        add(root, all)?;
    }
    for path in &rules.writable_files {
        add(path, file)?;
    }
    for device in DEVICE_FILES {
        if Path::new(device).exists() {
            add(Path::new(device), file)?;
        }
    }
    if Path::new(PTS_DIR).is_dir() {
        add(Path::new(PTS_DIR), file)?;
    }
    if Path::new(SHM_DIR).is_dir() {
        add(Path::new(SHM_DIR), all)?;
    }
    let fd: Option<OwnedFd> = created.into();
    // Under the hard requirement a kernel without Landlock fails `create`, so an fd is there.
    let fd = fd.ok_or(ConfineError::NoRuleset)?;
    Ok((fd, network_blocked))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_hidden_path_that_is_a_file_is_refused_and_a_missing_one_skipped() {
        let dir = tempfile::tempdir().expect("tempdir");
        let file = dir.path().join("f");
        std::fs::write(&file, "x").expect("file");
        let spec = |hidden: Vec<PathBuf>| Spec {
            namespaces: true,
            hidden,
            ..Spec::default()
        };
        let err = Plan::new(&spec(vec![file.clone()])).expect_err("a file");
        assert!(err.to_string().contains("not a directory"), "{err}");
        let plan = Plan::new(&spec(vec![dir.path().join("missing")])).expect("skipped");
        assert!(plan.enforced().namespaces);
        assert_eq!(plan.enforced().landlock_abi, None);
    }

    #[test]
    fn the_id_maps_map_the_process_to_itself() {
        let step = NamespaceStep::new(&[], false).expect("step");
        // SAFETY: geteuid(2) cannot fail and touches no memory.
        let uid = unsafe { libc::geteuid() };
        assert_eq!(step.uid_map, format!("{uid} {uid} 1\n").into_bytes());
    }
}
