//! Where an `always` rule applies (`docs/approvals.md`, "Always rules and their scope"): the
//! words every surface shows for a scope ([`scope_text`]), the offers a prompt makes
//! ([`offers`]), and whether a rule bound to a directory tree covers an action ([`covers`]).
//!
//! The tree check reads a command with the classifier's own shell parser and is conservative:
//! whatever it cannot place inside the tree (a word with `$`, a `~`, a brace or a glob that may
//! reach `..`, a `cd` it cannot follow, scripts nested too deep) means the rule does not apply,
//! and the person is asked.

use std::path::{Component, Path, PathBuf};

use drover_protocol::words::{ApprovalScope, ApprovalScopeOffer};

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
    /// file's parent directory.
    fn directory(&self) -> PathBuf {
        match self {
            Subject::Command { workdir, .. } => normalize(workdir),
            Subject::File(target) => {
                let target = normalize(target);
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
        let workspace = normalize(workspace);
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
    let root = normalize(root);
    if !root.is_absolute() {
        return false;
    }
    match subject {
        Subject::File(target) => normalize(target).starts_with(&root),
        Subject::Command { command, workdir } => {
            let mut cwd = normalize(workdir);
            cwd.starts_with(&root) && script_inside(&shell::parse(command), &root, &mut cwd, 0)
        }
    }
}

fn script_inside(script: &Script, root: &Path, cwd: &mut PathBuf, depth: usize) -> bool {
    if depth > MAX_DEPTH {
        return false;
    }
    script.pipelines.iter().all(|pipeline| {
        pipeline
            .commands
            .iter()
            .all(|command| command_inside(command, root, cwd, depth))
    })
}

fn command_inside(command: &Command, root: &Path, cwd: &mut PathBuf, depth: usize) -> bool {
    let (words, redirects): (&[Word], _) = match command {
        Command::Simple(simple) => (&simple.words, &simple.redirects),
        Command::Group { body, redirects } => {
            if !script_inside(body, root, cwd, depth + 1) {
                return false;
            }
            (&[], redirects)
        }
    };
    for redirect in redirects {
        let fine = match redirect.op {
            RedirectOp::Duplicate => true,
            // A here-document's body or a here-string may be a script read by a shell.
            RedirectOp::HereDoc | RedirectOp::HereString => redirect
                .body
                .iter()
                .chain(std::iter::once(&redirect.target))
                .all(|w| word_inside(w, root, cwd, depth)),
            _ => word_inside(&redirect.target, root, cwd, depth),
        };
        if !fine {
            return false;
        }
    }
    if !words.iter().all(|w| word_inside(w, root, cwd, depth)) {
        return false;
    }
    // `cd DIR` moves where later words resolve; its target was checked above as a path. A
    // `cd` this check cannot follow (home, `-`, a variable) ends what it can place.
    let mut rest = words;
    while rest
        .first()
        .is_some_and(|w| w.text.contains('=') && !w.text.starts_with('-'))
    {
        rest = &rest[1..];
    }
    if let Some(first) = rest.first() {
        if matches!(first.text.as_str(), "cd" | "pushd" | "popd") {
            let operands: Vec<&Word> = rest[1..]
                .iter()
                .filter(|w| !(w.text.starts_with('-') && w.text.len() > 1))
                .collect();
            match (first.text.as_str(), operands.as_slice()) {
                ("cd" | "pushd", [dir]) if dir.text != "-" => *cwd = resolve(cwd, &dir.text),
                _ => return false,
            }
        }
    }
    true
}

/// Whether one word keeps the command inside the tree: a word that may hold a script (spaces,
/// operators) is read as one; a word that looks like a path (or an option's or assignment's
/// value that does) resolves inside; a word whose value is unknown here is not.
fn word_inside(word: &Word, root: &Path, cwd: &Path, depth: usize) -> bool {
    let text = word.text.as_str();
    if text.contains(['$', '`', '~', '{']) || !word.subs.is_empty() {
        return false;
    }
    if text.contains(|c: char| c.is_whitespace() || ";&|<>()".contains(c)) {
        let mut inner = cwd.to_path_buf();
        return script_inside(&shell::parse(text), root, &mut inner, depth + 1);
    }
    let value = match text.split_once('=') {
        Some((_, value)) => value,
        None if text.starts_with('-') && text.contains('/') => return false,
        None if text.starts_with('-') => return true,
        None => text,
    };
    if value.is_empty() {
        return true;
    }
    // A glob component that may match `..` (`.*`, `[.]*`) reaches above its directory.
    let reaches_up = value
        .split('/')
        .any(|c| c.contains(['*', '?', '[']) && (c.starts_with('.') || c.starts_with('[')));
    !reaches_up && resolve(cwd, value).starts_with(root)
}

/// `path` against `cwd`, `..` and `.` folded lexically.
fn resolve(cwd: &Path, path: &str) -> PathBuf {
    normalize(&cwd.join(path))
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
