//! Where an `always` rule applies (`docs/approvals.md`, "Always rules and their scope"): the
//! words every surface shows for a scope ([`scope_text`]), the offers a prompt makes
//! ([`offers`]), and whether a rule bound to a directory tree covers an action ([`covers`]).
//!
//! The tree check reads a command with the classifier's own shell parser and is conservative:
//! whatever it cannot place inside the tree (a word with `$`, a `~`, a brace or a glob that may
//! reach `..`, a `cd` it cannot follow, names read from elsewhere, a command run on another
//! host or in a home, scripts nested too deep) means the rule does not apply, and the person
//! is asked. Paths are resolved through the symlinks that exist when the command is checked.

use std::path::{Component, Path, PathBuf};

use drover_protocol::words::{ApprovalScope, ApprovalScopeOffer};

use super::argv::{self, Invocation};
use super::shell::{self, Command, RedirectOp, Script, Word};
use super::PATTERNS;

/// How deep nested scripts (`sh -c '...'`, substitutions) are followed before giving up.
const MAX_DEPTH: usize = 8;

/// The sentence naming a command class: the pattern's sentence for a key of [`PATTERNS`],
/// else what the other approval keys allow (a file write outside the working directory, a
/// remote job, one exact command outside the sandbox or unconfined), else the key itself.
pub fn class_of(key: &str) -> String {
    if let Some((_, sentence)) = PATTERNS.iter().find(|(k, _)| *k == key) {
        return (*sentence).to_string();
    }
    if let Some(command) = key.strip_prefix("sandbox_escape:") {
        return format!("runs `{command}` outside the sandbox");
    }
    if let Some(command) = key.strip_prefix("exec_unconfined:") {
        return format!("runs `{command}` unconfined as an exec job");
    }
    match key {
        "write_outside_cwd" => "writes files outside the session's working directory".into(),
        "remote_job" => "dispatches a job to a runner on another host".into(),
        other => other.replace('_', " "),
    }
}

/// The command classes a rule may bind to a directory tree: those whose harm lies in the files
/// the command names or in its working tree. The others act on something no path bounds (a
/// script from the network, every process, a database, a remote's history), so a tree would
/// only say where the command was typed: they are offered `everywhere` alone.
pub const TREE_CLASSES: &[&str] = &[
    "recursive_delete",
    "forced_delete",
    "find_delete",
    "disk_format",
    "device_write",
    "system_permissions",
    "git_reset_hard",
    "git_clean",
    "startup_file_overwrite",
    "write_outside_cwd",
];

/// Whether a rule of `key` may be bound to a directory tree ([`TREE_CLASSES`]).
pub fn tree_bound(key: &str) -> bool {
    TREE_CLASSES.contains(&key)
}

/// The words for an `always` rule of `class` in `scope` (`path` being the tree's root).
pub fn scope_text(class: &str, scope: ApprovalScope, path: Option<&str>) -> String {
    match (scope, path) {
        (ApprovalScope::Directory, Some(path)) => {
            format!("every command that {class}, in {path} and below (this directory tree)")
        }
        (ApprovalScope::Workspace, Some(path)) => {
            format!("every command that {class}, in {path} and below (this workspace)")
        }
        _ => format!(
            "every command that {class}, anywhere, in every session of this home (everywhere)"
        ),
    }
}

/// What a tree-bound rule is checked against.
#[derive(Debug, Clone, Copy)]
pub enum Subject<'a> {
    /// A shell command and the directory it runs in.
    Command {
        /// The command as the shell gets it.
        command: &'a str,
        /// Its working directory (absolute).
        workdir: &'a Path,
    },
    /// A file a tool writes (absolute).
    File(&'a Path),
}

impl Subject<'_> {
    /// The directory a `directory` rule is made for: the command's working directory, or the
    /// file's parent directory, as it really is ([`real`]).
    fn directory(&self) -> PathBuf {
        match self {
            Subject::Command { workdir, .. } => real(workdir),
            Subject::File(target) => {
                let target = real(target);
                target.parent().map(Path::to_path_buf).unwrap_or(target)
            }
        }
    }
}

/// The scopes an approval prompt about `subject` offers, narrowest first, with their words:
/// `directory` when that tree is not the workspace (`workspace`, the session's working
/// directory), each tree only when it covers the subject, and always `everywhere`. Without a
/// subject (keys that name one exact command or a runner), `everywhere` only.
pub fn offers(
    class: &str,
    workspace: &Path,
    subject: Option<Subject<'_>>,
) -> Vec<ApprovalScopeOffer> {
    let mut offers = Vec::new();
    if let Some(subject) = subject {
        let workspace = real(workspace);
        let directory = subject.directory();
        let trees = [
            (ApprovalScope::Directory, directory.clone()),
            (ApprovalScope::Workspace, workspace.clone()),
        ];
        for (scope, tree) in trees {
            if scope == ApprovalScope::Directory && tree == workspace {
                continue;
            }
            if covers(&tree, subject) {
                let path = tree.display().to_string();
                offers.push(ApprovalScopeOffer {
                    scope,
                    text: scope_text(class, scope, Some(&path)),
                    path: Some(path),
                });
            }
        }
    }
    offers.push(ApprovalScopeOffer {
        scope: ApprovalScope::Everywhere,
        path: None,
        text: scope_text(class, ApprovalScope::Everywhere, None),
    });
    offers
}

/// Whether a rule bound to the tree of `root` covers `subject`: the working directory (a
/// file's directory) is inside the tree, and every path the command names resolves inside it.
pub fn covers(root: &Path, subject: Subject<'_>) -> bool {
    // The tree as stored, not followed: its path was resolved when the rule was made, and a
    // symlink put in its place later (`ln -s / tree`) must not widen it.
    let root = normalize(root);
    if !root.is_absolute() {
        return false;
    }
    match subject {
        Subject::File(target) => physical(target).is_some_and(|t| t.starts_with(&root)),
        Subject::Command { command, workdir } => {
            let Some(workdir) = physical(workdir) else {
                return false;
            };
            let mut place = Place {
                dirs: vec![workdir.clone()],
                unknown: false,
            };
            workdir.starts_with(&root)
                && script_inside(&shell::parse(command), &root, &mut place, 0)
        }
    }
}

/// The most directories a command's `cd`s may leave it in before the check gives up.
const MAX_PLACES: usize = 64;

/// Where the shell may be when a word is read. A `cd` adds its target and drops nothing: it
/// may fail (`cd sub || rm -rf ../x`), or run in a subshell, a pipeline stage or a child
/// shell, and then the shell stays where it was. So a relative word must resolve inside from
/// every directory it may be in; `unknown` once the shell may be anywhere (a script read from
/// a file, a `cd` through `CDPATH`).
struct Place {
    dirs: Vec<PathBuf>,
    unknown: bool,
}

impl Place {
    /// Whether `value` names a path inside `root` from wherever the shell may be.
    fn resolves_inside(&self, value: &str, root: &Path) -> bool {
        let inside = |dir: &Path| resolve(dir, value).is_some_and(|p| p.starts_with(root));
        if Path::new(value).is_absolute() {
            return physical(Path::new(value)).is_some_and(|p| p.starts_with(root));
        }
        !self.unknown && self.dirs.iter().all(|dir| inside(dir))
    }

    /// Whether every symlink in the directory `dir` names (from wherever the shell may be)
    /// leads to a place inside `root`.
    fn links_inside(&self, dir: &str, root: &Path) -> bool {
        let dirs: Vec<Option<PathBuf>> = if Path::new(dir).is_absolute() {
            vec![physical(Path::new(dir))]
        } else {
            self.dirs.iter().map(|d| resolve(d, dir)).collect()
        };
        dirs.into_iter().all(|dir| {
            let Some(dir) = dir else { return false };
            let Ok(entries) = std::fs::read_dir(&dir) else {
                // Nothing to match, or nothing this check can read: the glob stays literal
                // or fails.
                return true;
            };
            entries.flatten().all(|entry| {
                !entry.file_type().is_ok_and(|t| t.is_symlink())
                    || physical(&entry.path()).is_some_and(|p| p.starts_with(root))
            })
        })
    }

    /// Whether the git working tree around every place the shell may be stays where this
    /// check sees it: with `whole`, a repository is found (without one, git would look
    /// further: `GIT_DIR`, ...); its config does not move the working tree (`core.worktree`,
    /// which a command allowed without asking may have set); and with `whole`, its top (the
    /// nearest directory above holding `.git`) is in the tree.
    fn repository_inside(&self, root: &Path, whole: bool) -> bool {
        !self.unknown
            && self.dirs.iter().all(|dir| {
                let Some(top) = dir.ancestors().find(|a| a.join(".git").exists()) else {
                    // A `git clean` outside a repository fails.
                    return !whole;
                };
                let config = std::fs::read_to_string(top.join(".git/config")).unwrap_or_default();
                !config.to_ascii_lowercase().contains("worktree")
                    && (!whole || top.starts_with(root))
            })
    }

    /// The shell (or one command) may now also be in `target` (checked inside by the
    /// caller). A `cd` to a bare relative target (`cd sub`) is looked up through `CDPATH`
    /// when the tools' environment sets one, so it may lead anywhere.
    fn cd(&mut self, target: &str, cdpath: bool) {
        let bare = !(target.starts_with('/')
            || target == "."
            || target == ".."
            || target.starts_with("./")
            || target.starts_with("../"));
        if cdpath && bare && std::env::var_os("CDPATH").is_some_and(|v| !v.is_empty()) {
            self.unknown = true;
        }
        let added: Vec<PathBuf> = self
            .dirs
            .iter()
            .filter_map(|dir| resolve(dir, target))
            .collect();
        for dir in added {
            if !self.dirs.contains(&dir) {
                self.dirs.push(dir);
            }
        }
    }
}

fn script_inside(script: &Script, root: &Path, place: &mut Place, depth: usize) -> bool {
    if depth > MAX_DEPTH {
        return false;
    }
    script.pipelines.iter().all(|pipeline| {
        pipeline
            .commands
            .iter()
            .all(|command| command_inside(command, root, place, depth))
    })
}

fn command_inside(command: &Command, root: &Path, place: &mut Place, depth: usize) -> bool {
    let (words, redirects): (&[Word], _) = match command {
        Command::Simple(simple) => (&simple.words, &simple.redirects),
        Command::Group { body, redirects } => {
            if !script_inside(body, root, place, depth + 1) {
                return false;
            }
            (&[], redirects)
        }
    };
    // A command run elsewhere (another host, a container, another mount namespace) or from
    // a login shell (its home) names paths this tree does not hold.
    if elsewhere(words) {
        return false;
    }
    // A command that runs in a directory of its own (`env -C sub`, `git -C sub`): its
    // relative words resolve from there too.
    for target in own_directories(words) {
        place.cd(target, false);
    }
    for redirect in redirects {
        let fine = match redirect.op {
            RedirectOp::Duplicate => true,
            // A here-document's body or a here-string may be a script read by a shell.
            RedirectOp::HereDoc | RedirectOp::HereString => redirect
                .body
                .iter()
                .chain(std::iter::once(&redirect.target))
                .all(|w| word_inside(w, root, place, depth)),
            // Output thrown away or sent to the terminal names no file (`2>/dev/null`).
            _ if matches!(
                redirect.target.text.as_str(),
                "/dev/null" | "/dev/stdout" | "/dev/stderr" | "/dev/tty"
            ) =>
            {
                true
            }
            _ => word_inside(&redirect.target, root, place, depth),
        };
        if !fine {
            return false;
        }
    }
    if !words.iter().all(|w| word_inside(w, root, place, depth)) {
        return false;
    }
    // A walk that follows symlinks (`find -L . -delete`, `chmod -RL`) leaves the tree through
    // any link in it that leads out.
    if words.iter().any(|w| {
        matches!(w.text.as_str(), "-follow" | "--dereference")
            || argv::is_long_option(&w.text, "--dereference")
            || (argv::is_short_cluster(&w.text) && w.text.contains('L'))
    }) {
        return false;
    }
    // Names read from standard input or a list (`cat list | xargs rm -rf`) are not known
    // here; `find -execdir` runs its command in each found file's directory.
    if words.iter().any(|w| {
        matches!(
            argv::command_name(&w.text),
            "xargs" | "parallel" | "-execdir" | "-okdir"
        )
    }) {
        return false;
    }
    // `cd DIR` (also behind `builtin`, `command` and the other wrappers) moves where later
    // words resolve; its target was checked above as a path. A `cd` this check cannot follow
    // (home, `-`, `popd`) ends what it can place; a script read from a file may move anywhere.
    let Invocation::Argv(argv) = argv::unwrap(words) else {
        return true;
    };
    let Some(first) = argv.first() else {
        return true;
    };
    match argv::command_name(&first.text) {
        name @ ("cd" | "pushd") => {
            let operands: Vec<&Word> = argv::operands(&argv[1..]).collect();
            match operands.as_slice() {
                [dir] if dir.text != "-" => place.cd(&dir.text, true),
                // `pushd` alone swaps the two top directories, both places seen already.
                [] if name == "pushd" => {}
                _ => return false,
            }
        }
        "popd" => return false,
        "source" | "." => place.unknown = true,
        // `git reset --hard` rewrites the whole working tree, not the directory it runs in; a
        // `git clean` stays below it, unless the repository moved its working tree.
        "git"
            if ["reset", "clean"]
                .iter()
                .any(|sub| argv[1..].iter().any(|w| w.text == *sub))
                && !place.repository_inside(root, argv[1..].iter().any(|w| w.text == "reset")) =>
        {
            return false
        }
        _ => {}
    }
    place.dirs.len() <= MAX_PLACES
}

/// Programs that run their command on another host, in a container or in another mount
/// namespace.
const ELSEWHERE: &[&str] = &[
    "ssh",
    "docker",
    "podman",
    "nerdctl",
    "docker-compose",
    "kubectl",
    "oc",
    "nsenter",
    // Runs its command in the target user's home.
    "pkexec",
];

/// Options that run a command in another directory (`env -C`, `sudo -D`, `git -C`,
/// `unshare --wd`, `make --directory`); a short one may glue its value (`-Csub`).
const CHDIR_SHORT: &[&str] = &["-C", "-D", "-w"];
const CHDIR_LONG: &[&str] = &[
    "--chdir",
    "--directory",
    "--wd",
    "--workdir",
    "--work-tree",
    "--working-directory",
];

/// Whether `words` run their command where this tree's paths mean something else: on
/// another host or in a container ([`ELSEWHERE`]), or through a login shell, which starts
/// in the user's home (`sudo -i`, `su -`, `runuser -l`).
fn elsewhere(words: &[Word]) -> bool {
    let names: Vec<&str> = words.iter().map(|w| argv::command_name(&w.text)).collect();
    if names.iter().any(|name| ELSEWHERE.contains(name)) {
        return true;
    }
    let login = |w: &Word| {
        matches!(w.text.as_str(), "-" | "--login") || argv::is_long_option(&w.text, "--login")
    };
    let short =
        |w: &Word, letter: char| argv::is_short_cluster(&w.text) && w.text[1..].contains(letter);
    (names.contains(&"sudo") && words.iter().any(|w| login(w) || short(w, 'i')))
        || (names.iter().any(|n| matches!(*n, "su" | "runuser"))
            && words.iter().any(|w| login(w) || short(w, 'l')))
}

/// The directories `words` ask their command to run in ([`CHDIR_SHORT`], [`CHDIR_LONG`]).
fn own_directories(words: &[Word]) -> Vec<&str> {
    let mut out = Vec::new();
    for (i, word) in words.iter().enumerate() {
        let text = word.text.as_str();
        let next = || words.get(i + 1).map(|w| w.text.as_str());
        if CHDIR_SHORT.contains(&text) || CHDIR_LONG.contains(&text) {
            out.extend(next());
        } else if let Some((name, value)) = text.split_once('=') {
            if CHDIR_LONG.contains(&name) {
                out.push(value);
            }
        } else if !text.starts_with("--") && text.len() > 2 {
            if let Some(value) = CHDIR_SHORT.iter().find_map(|o| text.strip_prefix(o)) {
                out.push(value);
            }
        }
    }
    out
}

/// Whether one word keeps the command inside the tree: a word that may hold a script (spaces,
/// operators) is read as one; a word that looks like a path (or an option's or assignment's
/// value that does) resolves inside; a word whose value is unknown here is not.
fn word_inside(word: &Word, root: &Path, place: &mut Place, depth: usize) -> bool {
    let text = word.text.as_str();
    // A backslash left in the text is a character given by its code (`$'\x2fws'`).
    if text.contains(['$', '`', '~', '{', '\\']) || !word.subs.is_empty() {
        return false;
    }
    // Names git reads from the top of the repository (`:/`, `:(top)`), which may lie above
    // the tree; a `CDPATH` (or bash's `cdable_vars`) that sends a later `cd` elsewhere.
    if text.starts_with(":/")
        || text.starts_with(":(")
        || text.contains("CDPATH")
        || text.contains("cdable_vars")
    {
        return false;
    }
    if text.contains(|c: char| c.is_whitespace() || ";&|<>()".contains(c)) {
        // The word may be one name too (`rm -rf 's/t u/../../..'`), whose `..`s climb from
        // deeper than its parts' do.
        if !text.starts_with('-') && !path_inside(text, root, place) {
            return false;
        }
        // A script in a word (`eval '...'`, `sh -c '...'`) shares the places: an `eval`'s
        // `cd` moves this shell, a child shell's adds a place this shell does not reach.
        return script_inside(&shell::parse(text), root, place, depth + 1);
    }
    let value = match text.split_once('=') {
        // Names read from a file (`--files-from=list`, `-files0-from`).
        Some((name, _)) if name.starts_with('-') && name.contains("from") => return false,
        // `x=y` may be an assignment or an option's value, or a file named so (`/ws/b/x=y`).
        Some((name, value)) => {
            if !name.starts_with('-') && !path_inside(text, root, place) {
                return false;
            }
            value
        }
        None if text.starts_with('-') => {
            // A path glued to an option's letter (`-C/ws/b`, `-C..`), or a list of names
            // read from a file.
            return !(text.contains('/') || text.contains("..") || text.contains("from"));
        }
        None => text,
    };
    path_inside(value, root, place)
}

/// Whether `value`, read as a path (a glob included), lies inside the tree from wherever the
/// shell may be.
fn path_inside(value: &str, root: &Path, place: &Place) -> bool {
    if value.is_empty() {
        return true;
    }
    let glob = |c: &str| c.contains(['*', '?', '[']);
    let components: Vec<&str> = value.split('/').filter(|c| !c.is_empty()).collect();
    // A glob component that may match `..` (`.*`, `[.]*`) reaches above its directory; one
    // before the last may match a symlink that leads out.
    let reaches_up = components
        .iter()
        .any(|c| glob(c) && (c.starts_with('.') || c.starts_with('[')));
    let through = components
        .split_last()
        .is_some_and(|(_, before)| before.iter().any(|c| glob(c)));
    if reaches_up || through || !place.resolves_inside(value, root) {
        return false;
    }
    // A last component that is a glob may match a symlink that leads out (`chmod -R 777 *`
    // changes what a link names): every link in that directory must stay inside.
    match components.last() {
        Some(last) if glob(last) => {
            let parent = value.rsplit_once('/').map_or(".", |(parent, _)| parent);
            let parent = if parent.is_empty() { "/" } else { parent };
            place.links_inside(parent, root)
        }
        _ => true,
    }
}

/// `path` against `cwd`, as the kernel would find it today ([`physical`]).
fn resolve(cwd: &Path, path: &str) -> Option<PathBuf> {
    physical(&cwd.join(path))
}

/// `path` through its symlinks ([`physical`]), for a rule's tree: it is stored so, and later
/// paths are compared with it after the same resolution.
fn real(path: &Path) -> PathBuf {
    physical(path).unwrap_or_else(|| normalize(path))
}

/// How many symlinks one path may pass through (the kernel's limit) before it is not placed.
const MAX_SYMLINKS: usize = 40;

/// `path` as the kernel resolves it: `.` dropped, every symlink that exists now followed (the
/// last component's too: `chmod`, `cd`, `> file` and `rm -rf link/` act on its target), and
/// `..` taken from the directory it is really in. A part that does not exist is kept as
/// written, with `..` folded. `None` when it passes through too many symlinks.
fn physical(path: &Path) -> Option<PathBuf> {
    use std::ffi::OsString;
    // The components still to walk, the next one last.
    let mut pending: Vec<OsString> = Vec::new();
    let push_front = |pending: &mut Vec<OsString>, path: &Path| {
        for component in path.components().rev() {
            match component {
                Component::RootDir => pending.push("/".into()),
                Component::CurDir | Component::Prefix(_) => {}
                Component::ParentDir => pending.push("..".into()),
                Component::Normal(name) => pending.push(name.to_os_string()),
            }
        }
    };
    push_front(&mut pending, path);
    let mut out = PathBuf::new();
    let mut links = 0;
    while let Some(next) = pending.pop() {
        if next == "/" {
            out = PathBuf::from("/");
        } else if next == ".." {
            if !out.pop() || out.as_os_str().is_empty() {
                out.push(Component::RootDir);
            }
        } else {
            out.push(&next);
            if let Ok(target) = std::fs::read_link(&out) {
                links += 1;
                if links > MAX_SYMLINKS {
                    return None;
                }
                out.pop();
                push_front(&mut pending, &target);
            }
        }
    }
    Some(out)
}

/// `path` with `.` dropped and `..` folded lexically (`/a/../..` is `/`); symlinks are not
/// followed.
pub fn normalize(path: &Path) -> PathBuf {
    let mut out = PathBuf::new();
    for component in path.components() {
        match component {
            Component::CurDir => {}
            Component::ParentDir => {
                if !out.pop() || out.as_os_str().is_empty() {
                    out.push(Component::RootDir);
                }
            }
            other => out.push(other),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn in_a(command: &str) -> bool {
        covers(
            Path::new("/ws/a"),
            Subject::Command {
                command,
                workdir: Path::new("/ws/a"),
            },
        )
    }

    #[test]
    fn a_tree_rule_covers_paths_inside_it_only() {
        for inside in [
            "rm -rf /ws/a/x",
            "rm -rf x",
            "rm -rf ./x/y",
            "rm -rf 'my dir'",
            "cd sub && rm -rf y",
            "rm -rf /ws/a/b/../c",
            "sh -c 'rm -rf x'",
            "rm -rf x 2>&1 > /ws/a/log",
            "git push --force origin main",
            "rm -rf *",
        ] {
            assert!(in_a(inside), "{inside}");
        }
        for outside in [
            "rm -rf /ws/b/y",
            "cd /ws/b && rm -rf y",
            "cd .. && rm -rf b",
            "rm -rf /ws/a/../b/y",
            "rm -rf ../b",
            "rm -rf $HOME/x",
            "rm -rf ~/x",
            "rm -rf ~",
            "rm -rf \"$(pwd)/x\"",
            "rm -rf `pwd`",
            "sh -c 'rm -rf /ws/b'",
            "echo 'rm -rf /etc' | sh",
            "rm -rf x; rm -rf /tmp/y",
            "(cd /; rm -rf ws)",
            "rm -rf .*",
            "rm -rf {x,../b}",
            "cd && rm -rf x",
            "cd - && rm -rf x",
            "rm -rf x > /tmp/log",
            "git -C /ws/b reset --hard",
            "make --directory=/ws/b clean",
            "rm -rf /ws/ab",
            "rm -rf /ws/a*",
        ] {
            assert!(!in_a(outside), "{outside}");
        }
        // The working directory must be inside the tree too.
        assert!(!covers(
            Path::new("/ws/a"),
            Subject::Command {
                command: "rm -rf /ws/a/x",
                workdir: Path::new("/ws"),
            }
        ));
        assert!(covers(
            Path::new("/ws"),
            Subject::File(Path::new("/ws/a/f"))
        ));
        assert!(!covers(
            Path::new("/ws/a"),
            Subject::File(Path::new("/ws/a/../b/f"))
        ));
    }

    /// What a careless or hostile command does to leave a rule's tree, each asked: a `cd`
    /// that may not happen (it fails, or runs in a subshell or a pipeline stage), one the check
    /// reads through a wrapper or `eval`, a path glued to an option, names read from elsewhere
    /// (`xargs`, `--files-from`, git's pathspec magic, `CDPATH`).
    #[test]
    fn a_tree_rule_asks_when_a_command_may_leave_it() {
        let outside = [
            "rm -rf /ws/a/x /ws/b",
            "rm -rf /ws/a/x; rm -rf /ws/b",
            "rm -rf \"$(echo /ws/b)\"",
            "rm -rf /ws/a/../*",
            "rm -rf /ws/a/x/../../b",
            "cd /ws/a; cd ..; rm -rf b",
            "pushd .. && rm -rf b",
            "pushd sub && popd && rm -rf b",
            "find /ws/a /ws/b -delete",
            "sh -c 'cd /; rm -rf ws'",
            "bash -c 'rm -rf ../b'",
            "eval 'rm -rf ../b'",
            "env -C /ws/b rm -rf y",
            "env --chdir=/ws/b rm -rf y",
            "git -C /ws/b clean -fdx",
            "rm -rf /ws/a-other",
            "rm -rf x >& /ws/b/f",
            // A `cd` that fails, or runs in a subshell or a pipeline stage, leaves the shell
            // where it was: `../x` is then /ws/x.
            "cd sub || rm -rf ../x",
            "cd sub; rm -rf ../x",
            "(cd sub); rm -rf ../x",
            "cd sub | true; rm -rf ../x",
            "cd sub & rm -rf ../x",
            // A `cd` read through a wrapper or `eval` still moves the shell.
            "builtin cd sub; rm -rf ../../ws/a/x",
            "command cd sub && rm -rf ../../ws/a/x",
            "eval 'cd sub'; rm -rf ../../ws/a/x",
            "f() { cd sub; }; f; rm -rf ../../ws/a/x",
            // A script read from a file may move the shell anywhere.
            ". ./env.sh; rm -rf ws",
            "source env.sh && rm -rf ws",
            // A directory glued to an option's letter.
            "git -C.. clean -fdx",
            "env -C.. rm -rf b",
            "make -C.. clean",
            // Names read from elsewhere.
            "xargs rm -rf < list",
            "cat list | xargs rm -rf",
            "cat list | xargs -0 rm -rf",
            "find . -files0-from list -delete",
            "git clean -fdx --pathspec-from-file=list",
            "git clean -fdx :/",
            "git clean -fdx -- ':(top)'",
            "git clean -fdx ':/!x'",
            "export CDPATH=.:..; cd b && rm -rf y",
            "CDPATH=/ws cd b; rm -rf y",
            "shopt -s cdable_vars; cd HOME && rm -rf x",
            // A word with `=` is a path as a whole too.
            "rm -rf /ws/b/x=y",
            "rm -rf ../b=c",
            // A command run in a directory of its own resolves its words from there.
            "env -C sub rm -rf ../../ws/a/x",
            "env --chdir=sub rm -rf ../../ws/a/x",
            "sudo -D sub rm -rf ../../ws/a/x",
            "git -Csub clean -fdx ../../ws/a/x",
            // Elsewhere: another host, a container, a login shell's home.
            "ssh host rm -rf /ws/a/x",
            "docker exec box rm -rf /ws/a/x",
            "kubectl exec pod -- rm -rf /ws/a/x",
            "sudo -i rm -rf x",
            "sudo -iu root rm -rf x",
            "sudo --login rm -rf x",
            "su - root -c 'rm -rf x'",
            "runuser -l me -c 'rm -rf x'",
            "pkexec rm -rf x",
            // Read as a script, its parts resolve inside; as one name it climbs out.
            "rm -rf 's/t u/../../../ws/a/x'",
            // Characters given by their codes.
            "rm -rf $'\\x2fws/b'",
            "rm -rf $'\\057ws/b'",
            "rm -rf $'\\u002fws/b'",
            "rm -rf x#y /ws/b",
            "rm -rf x # y\nrm -rf /ws/b",
            "find . -name y -execdir rm -rf ../../ws/a/y \\;",
            "rm -rf x\\ /ws/b",
            "if true; then rm -rf /ws/b; fi",
            "for d in /ws/b; do rm -rf y; done",
            "case x in x) rm -rf /ws/b;; esac",
            "while rm -rf /ws/b; do :; done",
            "rm -rf x <<< /ws/b",
            "time { rm -rf /ws/b; }",
            "! rm -rf /ws/b",
            "coproc rm -rf /ws/b",
            "trap 'rm -rf /ws/b' EXIT",
            "nohup rm -rf ../b &",
            "rm -rf /dev/null",
            "find -L . -delete",
            "find . -follow -delete",
            "chmod -RL 777 x",
            "chown -R -L me x",
            "chown -R --dereference me x",
            "rm -rf x > /dev/sda",
        ];
        let approved: Vec<&str> = outside.into_iter().filter(|c| in_a(c)).collect();
        assert!(
            approved.is_empty(),
            "approved, may leave /ws/a: {approved:#?}"
        );
        for inside in [
            "find . -delete",
            "find /ws/a -name '*.o' -delete",
            "rm -rf -- -x",
            "rm -rf /ws/a/link",
            "cd sub && rm -rf y",
            "cd /ws/a/sub && rm -rf y",
            "cd sub && cd deeper && rm -rf y",
            "chown -R me:staff x",
            "chown -R :staff x",
            "git clean -fdx -- ':!keep'",
            "rm -rf x 2>&1",
            "rm -rf x 2>/dev/null || true",
            "rm -rf x &> /dev/null",
            "env -C sub rm -rf x",
            "git -C sub clean -fdx",
            "sudo rm -rf x",
            "su -c 'rm -rf x'",
            // A line continued with a backslash is one word, `x/ws/b`.
            "rm -rf x\\\n/ws/b",
        ] {
            assert!(in_a(inside), "{inside}");
        }
        // A working directory or a file outside the tree, however it is spelt.
        for workdir in ["/ws", "/ws/b", "/ws/a/../b", "/ws/a-other", "ws/a"] {
            assert!(
                !covers(
                    Path::new("/ws/a"),
                    Subject::Command {
                        command: "rm -rf x",
                        workdir: Path::new(workdir),
                    }
                ),
                "{workdir}"
            );
        }
        for file in [
            "/ws/b/f",
            "/ws/a/../b/f",
            "/ws/a-other/f",
            "ws/a/f",
            "/ws/a",
        ] {
            assert!(
                !covers(Path::new("/ws/a/sub"), Subject::File(Path::new(file))),
                "{file}"
            );
        }
    }

    #[test]
    fn a_git_reset_is_covered_only_when_its_repository_is_inside_the_tree() {
        let tmp = tempfile::tempdir().unwrap();
        let repo = tmp.path().join("repo");
        std::fs::create_dir_all(repo.join(".git")).unwrap();
        std::fs::create_dir_all(repo.join("a/sub")).unwrap();
        let reset = |root: &Path, workdir: &Path, command: &str| {
            covers(root, Subject::Command { command, workdir })
        };
        let a = repo.join("a");
        // From a subdirectory `git reset --hard` rewrites the whole working tree.
        assert!(!reset(&a, &a, "git reset --hard"));
        assert!(!reset(&a, &a, "git -C sub reset --hard HEAD~1"));
        assert!(!reset(&a, &a, "cd sub && git reset --hard"));
        // A `git clean` stays below where it runs.
        assert!(reset(&a, &a, "git clean -fdx"));
        assert!(reset(&repo, &a, "git reset --hard"));
        assert!(reset(&repo, &repo, "cd a/sub && git reset --hard"));
        // A repository whose config moves its working tree elsewhere.
        let moved = tmp.path().join("moved");
        std::fs::create_dir_all(moved.join(".git")).unwrap();
        std::fs::write(
            moved.join(".git/config"),
            "[core]\n\tworkTree = /elsewhere\n",
        )
        .unwrap();
        assert!(!reset(&moved, &moved, "git reset --hard"));
        assert!(!reset(&moved, &moved, "git clean -fdx"));
        // No repository around: git would look elsewhere.
        let bare = tmp.path().join("bare");
        std::fs::create_dir_all(&bare).unwrap();
        assert!(!reset(&bare, &bare, "git reset --hard"));
    }

    #[test]
    fn a_symlink_inside_the_tree_that_leads_out_is_outside() {
        let tmp = tempfile::tempdir().unwrap();
        let ws = tmp.path().canonicalize().unwrap();
        let (a, b) = (ws.join("a"), ws.join("b"));
        std::fs::create_dir_all(a.join("sub/deeper")).unwrap();
        std::fs::create_dir_all(b.join("y")).unwrap();
        std::os::unix::fs::symlink("../b", a.join("link")).unwrap();
        std::os::unix::fs::symlink("sub", a.join("inner")).unwrap();
        std::os::unix::fs::symlink("loop", a.join("loop")).unwrap();
        let in_a =
            |command: &str, workdir: &Path| covers(&a, Subject::Command { command, workdir });
        let outside = [
            "rm -rf link/",
            "rm -rf link/y",
            "rm -rf ./link/y/..",
            "cd link && rm -rf y",
            "echo x > link/f",
            "chmod -R 777 *",
            "rm -rf */y",
            "rm -rf link",
            "rm -rf loop/x",
        ];
        let approved: Vec<&str> = outside.into_iter().filter(|c| in_a(c, &a)).collect();
        assert!(
            approved.is_empty(),
            "approved, may leave the tree: {approved:#?}"
        );
        let absolute = format!("rm -rf {}/y", a.join("link").display());
        assert!(!in_a(&absolute, &a));
        assert!(!in_a("rm -rf x", &a.join("link")));
        assert!(!covers(&a, Subject::File(&a.join("link/f"))));
        for inside in [
            "rm -rf inner/",
            "rm -rf inner/deeper",
            "cd inner && rm -rf deeper",
            "chmod -R 777 sub/*",
            "rm -rf x",
        ] {
            assert!(in_a(inside, &a), "{inside}");
        }
        assert!(in_a("rm -rf deeper", &a.join("inner")));
        assert!(covers(&a, Subject::File(&a.join("inner/f"))));

        // A tree is offered as it really is, so the rule is not tied to a link's target.
        let offered: Vec<Option<String>> = offers(
            "c",
            &ws,
            Some(Subject::Command {
                command: "rm -rf deeper",
                workdir: &a.join("inner"),
            }),
        )
        .into_iter()
        .map(|o| o.path)
        .collect();
        let sub = a.join("sub").display().to_string();
        assert_eq!(offered, [Some(sub), Some(ws.display().to_string()), None]);
        // A rule's tree that is replaced by a symlink later does not follow it out.
        let tree = ws.join("tree");
        std::os::unix::fs::symlink("b", &tree).unwrap();
        let command = Subject::Command {
            command: "rm -rf y",
            workdir: &tree,
        };
        assert!(!covers(&tree, command));
        assert!(!covers(&tree, Subject::File(&tree.join("y/f"))));
    }

    #[test]
    fn offers_name_each_tree_once_narrowest_first() {
        let class = "deletes files recursively";
        let subject = Subject::Command {
            command: "rm -rf build",
            workdir: Path::new("/home/u/proj/sub/./"),
        };
        let offers = offers(class, Path::new("/home/u/proj"), Some(subject));
        let texts: Vec<&str> = offers.iter().map(|o| o.text.as_str()).collect();
        assert_eq!(
            texts,
            [
                "every command that deletes files recursively, in /home/u/proj/sub and below (this directory tree)",
                "every command that deletes files recursively, in /home/u/proj and below (this workspace)",
                "every command that deletes files recursively, anywhere, in every session of this home (everywhere)",
            ]
        );
        // The same tree is offered once, as the workspace; a tree the command leaves is not.
        let same = Subject::Command {
            command: "rm -rf /tmp/x",
            workdir: Path::new("/home/u/proj"),
        };
        let scopes: Vec<ApprovalScope> =
            super::offers(class, Path::new("/home/u/proj"), Some(same))
                .into_iter()
                .map(|o| o.scope)
                .collect();
        assert_eq!(scopes, [ApprovalScope::Everywhere]);
        let here = Subject::Command {
            command: "rm -rf x",
            workdir: Path::new("/home/u/proj"),
        };
        let scopes: Vec<ApprovalScope> =
            super::offers(class, Path::new("/home/u/proj"), Some(here))
                .into_iter()
                .map(|o| o.scope)
                .collect();
        assert_eq!(
            scopes,
            [ApprovalScope::Workspace, ApprovalScope::Everywhere]
        );
    }

    #[test]
    fn normalize_folds_dots_lexically() {
        assert_eq!(normalize(Path::new("/a/b/../c/./d")), Path::new("/a/c/d"));
        assert_eq!(normalize(Path::new("/a/../../..")), Path::new("/"));
    }
}
