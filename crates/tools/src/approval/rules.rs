//! The dangerous-command rules, applied to the parsed shell (`docs/approvals.md` lists them).
//!
//! Every simple command is looked at after its wrappers are peeled off (`argv.rs`: `sudo`,
//! `env`, leading `VAR=x`, `timeout`, `flock`, `xargs`, ...), and every script the command line
//! would run is classified too: substitutions, `sh -c` strings, `eval` arguments, `find -exec`
//! commands, here-documents fed to a shell, `git -c` values, and the command strings of awk,
//! Python, Perl, Ruby, Node and PHP programs given on the command line.

use super::argv::{
    command_name, is_long_option, is_short_cluster, join_texts, operands, unwrap, Invocation,
};
use super::shell::{self, Command, Pipeline, Redirect, RedirectOp, Script, SimpleCommand, Word};
use super::{Danger, PATTERNS};

mod command_rules;
mod script_rules;

use command_rules::{
    copy, disk, find, git, is_raw_device, is_startup_file, is_system_path, kill, killall, pkill,
    rm, tee,
};
use script_rules::{
    check_program, command_downloads, command_text, is_interpreter, is_shell_variable,
    printed_script, program, reads_script_from_stdin, shell, split_reads_stdin, sql,
    sql_client_position, sql_danger, stdin_script, su, subs_download,
};

/// How many scripts deep (substitution in `sh -c` in `eval` ...) classification follows. Deeper
/// input is itself reported as dangerous rather than waved through.
const MAX_DEPTH: usize = 16;

/// At most this many characters of the offending command go into a description.
const DETAIL_MAX_CHARS: usize = 120;

const SHELLS: &[&str] = &[
    "sh", "bash", "dash", "zsh", "ksh", "mksh", "ash", "rbash", "fish", "csh", "tcsh",
];

/// Interpreters that run a script read from stdin when given none (besides `python*`).
const INTERPRETERS: &[&str] = &["perl", "ruby", "node", "php"];

const AWKS: &[&str] = &["awk", "gawk", "mawk", "nawk"];

/// What in an awk program runs a command: `system(...)`, `print | "sh"`, `"cmd" | getline`.
const AWK_RUNS: &[&str] = &["system", "|"];

/// What in a Python, Perl, Ruby, Node or PHP program runs a command.
const INTERPRETER_RUNS: &[&str] = &[
    "system",
    "exec",
    "popen",
    "spawn",
    "subprocess",
    "shell_exec",
    "passthru",
    "proc_open",
    "`",
    "%x",
    "qx",
    "Open3",
    "IPC::",
];

/// Library calls that delete a tree (`shutil.rmtree`, `FileUtils.rm_rf`, Perl's `remove_tree`).
const TREE_DELETES: &[&str] = &[
    "rmtree",
    "rm_rf",
    "FileUtils.rm_r",
    "remove_entry",
    "remove_tree",
];

const DOWNLOADERS: &[&str] = &["curl", "wget", "fetch", "http", "https", "xh"];

const SQL_CLIENTS: &[&str] = &[
    "psql",
    "pgcli",
    "mysql",
    "mariadb",
    "mycli",
    "sqlite3",
    "sqlite",
    "litecli",
    "duckdb",
    "sqlcmd",
    "clickhouse-client",
    "clickhouse",
    "cockroach",
];

const DISK_TOOLS: &[&str] = &[
    "mke2fs",
    "mkdosfs",
    "mkntfs",
    "mkexfatfs",
    "mkswap",
    "fdisk",
    "sfdisk",
    "cfdisk",
    "gdisk",
    "sgdisk",
    "parted",
    "wipefs",
    "blkdiscard",
];

/// Directories whose ownership or permissions are never changed casually. Compared after
/// trailing `/`, `/.` and `/*` are removed.
const SYSTEM_PATHS: &[&str] = &[
    "/",
    "/bin",
    "/boot",
    "/dev",
    "/etc",
    "/home",
    "/lib",
    "/lib32",
    "/lib64",
    "/libx32",
    "/opt",
    "/proc",
    "/root",
    "/sbin",
    "/srv",
    "/sys",
    "/usr",
    "/usr/bin",
    "/usr/lib",
    "/usr/sbin",
    "/usr/share",
    "/var",
    "/var/lib",
    "~",
    "$HOME",
    "${HOME}",
];

const STARTUP_FILE_NAMES: &[&str] = &[
    ".bashrc",
    ".bash_profile",
    ".bash_login",
    ".bash_logout",
    ".profile",
    ".zshrc",
    ".zshenv",
    ".zprofile",
    ".zlogin",
    ".zlogout",
    ".cshrc",
    ".tcshrc",
    ".kshrc",
    ".mkshrc",
    ".login",
];

const SYSTEM_STARTUP_FILES: &[&str] = &[
    "/etc/profile",
    "/etc/bash.bashrc",
    "/etc/bashrc",
    "/etc/zshrc",
    "/etc/zshenv",
    "/etc/zsh/zshrc",
    "/etc/zsh/zshenv",
    "/etc/environment",
];

/// Device files that are safe to write: not disks, memory or ports.
const SAFE_DEVICES: &[&str] = &[
    "null", "zero", "full", "random", "urandom", "stdin", "stdout", "stderr", "tty", "console",
    "ptmx", "kmsg",
];

/// Also safe: serial ports (`/dev/serial/by-id/...`, `/dev/cu.usbmodem1101`) and the rest.
const SAFE_DEVICE_PREFIXES: &[&str] = &[
    "fd/", "pts/", "tty", "shm/", "tcp/", "udp/", "mqueue/", "serial/", "cu.",
];

pub(super) fn classify(command: &str) -> Option<Danger> {
    check_source(command, 0)
}

thread_local! {
    /// The keys [`classify_except`] passes over. Thread-local so the walk's many functions
    /// need no extra argument; the walk never awaits, and the set is cleared when it ends.
    static PASSED: std::cell::RefCell<Vec<&'static str>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// The first danger of `command` whose key is not in `passed`: a command may hold dangers of
/// several classes (`rm -rf x; kill -9 -1`), and a grant of one covers only its own.
pub(super) fn classify_except(command: &str, passed: &[&'static str]) -> Option<Danger> {
    PASSED.with(|p| *p.borrow_mut() = passed.to_vec());
    let found = kept(check_source(command, 0));
    PASSED.with(|p| p.borrow_mut().clear());
    found
}

/// `found` unless [`classify_except`] passes over its key; each step of the walk that would
/// stop at a danger asks this first, so a passed one lets the walk go on.
fn kept(found: Option<Danger>) -> Option<Danger> {
    found.filter(|d| !PASSED.with(|p| p.borrow().contains(&d.key)))
}

fn danger(key: &'static str, detail: &str) -> Danger {
    let sentence = PATTERNS
        .iter()
        .find(|(k, _)| *k == key)
        .map_or(key, |(_, sentence)| sentence);
    Danger {
        key,
        description: format!("{sentence}: {}", clip(detail)),
    }
}

fn check_source(source: &str, depth: usize) -> Option<Danger> {
    if depth > MAX_DEPTH {
        return Some(danger("nesting_too_deep", source));
    }
    check_script(&shell::parse(source), depth)
}

fn check_script(script: &Script, depth: usize) -> Option<Danger> {
    script
        .pipelines
        .iter()
        .find_map(|pipeline| kept(check_pipeline(pipeline, depth)))
}

fn check_pipeline(pipeline: &Pipeline, depth: usize) -> Option<Danger> {
    for (i, command) in pipeline.commands.iter().enumerate() {
        if let Some(found) = kept(check_command(command, depth)) {
            return Some(found);
        }
        let upstream = &pipeline.commands[..i];
        let Command::Simple(simple) = command else {
            continue;
        };
        if upstream.is_empty() {
            continue;
        }
        let invocation = unwrap(&simple.words);
        let (argv, reads_stdin) = match &invocation {
            Invocation::Argv(argv) => (*argv, reads_script_from_stdin(argv)),
            // `echo 'rm -rf x' | ssh host`: the remote shell reads the pipe.
            Invocation::StdinShell => (&simple.words[..], true),
            Invocation::Split(source) => (&simple.words[..], split_reads_stdin(source)),
            Invocation::Nothing => continue,
        };
        if reads_stdin {
            if upstream.iter().any(|c| command_downloads(c, depth)) {
                let found = kept(Some(danger(
                    "pipe_to_shell",
                    &render_pipeline(&pipeline.commands[..=i]),
                )));
                if found.is_some() {
                    return found;
                }
            }
            // `echo 'rm -rf x' | sh`: what the previous stages print is the script (a
            // program, for an interpreter).
            let mut fed = String::new();
            for stage in upstream {
                printed_script(stage, &mut fed);
            }
            let program = matches!(invocation, Invocation::Argv(_))
                && is_interpreter(command_name(&argv[0].text));
            let found = kept(if program {
                let shown = render_pipeline(&pipeline.commands[..=i]);
                check_program(&fed, INTERPRETER_RUNS, &shown, depth)
            } else {
                check_source(&fed, depth + 1)
            });
            if found.is_some() {
                return found;
            }
        }
        if !matches!(invocation, Invocation::Argv(_)) {
            continue;
        }
        if let Some(client) = sql_client_position(argv) {
            let mut text = String::new();
            for stage in upstream {
                command_text(stage, &mut text);
            }
            if let Some(key) = sql_danger(&text) {
                let shown = format!(
                    "{} | {}",
                    render_pipeline(upstream),
                    render(&argv[client..])
                );
                if let Some(found) = kept(Some(danger(key, &shown))) {
                    return Some(found);
                }
            }
        }
    }
    None
}

fn check_command(command: &Command, depth: usize) -> Option<Danger> {
    match command {
        Command::Simple(simple) => check_simple(simple, depth),
        Command::Group { body, redirects } => {
            kept(check_redirects(redirects, &[])).or_else(|| kept(check_script(body, depth)))
        }
    }
}

fn check_simple(command: &SimpleCommand, depth: usize) -> Option<Danger> {
    // What expanding the words runs, runs first.
    let redirect_words = command
        .redirects
        .iter()
        .flat_map(|r| std::iter::once(&r.target).chain(r.body.as_ref()));
    for word in command.words.iter().chain(redirect_words) {
        for sub in &word.subs {
            if let Some(found) = kept(check_source(&sub.script, depth + 1)) {
                return Some(found);
            }
        }
    }
    kept(check_redirects(&command.redirects, &command.words))
        .or_else(|| kept(check_words(&command.words, command, depth)))
}

fn check_redirects(redirects: &[Redirect], words: &[Word]) -> Option<Danger> {
    for redirect in redirects {
        let target = redirect.target.text.as_str();
        let writes = matches!(
            redirect.op,
            RedirectOp::Write | RedirectOp::Append | RedirectOp::ReadWrite
        );
        let shown = || {
            let op = if redirect.op == RedirectOp::Write {
                ">"
            } else {
                ">>"
            };
            format!("{} {op} {}", render(words), render_word(&redirect.target))
                .trim_start()
                .to_string()
        };
        if writes && is_raw_device(target) {
            if let Some(found) = kept(Some(danger("device_write", &shown()))) {
                return Some(found);
            }
        }
        if redirect.op == RedirectOp::Write && is_startup_file(target) {
            if let Some(found) = kept(Some(danger("startup_file_overwrite", &shown()))) {
                return Some(found);
            }
        }
    }
    None
}

fn check_words(words: &[Word], command: &SimpleCommand, depth: usize) -> Option<Danger> {
    match unwrap(words) {
        Invocation::Nothing => None,
        Invocation::StdinShell => stdin_script(words, command, depth),
        Invocation::Split(source) => {
            kept(check_source(&source, depth + 1)).or_else(|| {
                // `ssh host 'bash -s' <<EOF`: the split command line reads this one's stdin.
                split_reads_stdin(&source)
                    .then(|| stdin_script(words, command, depth))
                    .flatten()
            })
        }
        Invocation::Argv(argv) => {
            // `$(curl ...)` as the command: the download is the command line.
            if subs_download(&argv[0], depth) {
                return Some(danger("pipe_to_shell", &render(argv)));
            }
            check_argv(argv, command, depth)
        }
    }
}

fn check_argv(argv: &[Word], command: &SimpleCommand, depth: usize) -> Option<Danger> {
    let name = command_name(&argv[0].text);
    match name {
        "rm" => rm(argv),
        "find" => find(argv, command, depth),
        "dd" => argv[1..]
            .iter()
            .filter_map(|w| w.text.strip_prefix("of="))
            .any(is_raw_device)
            .then(|| danger("device_write", &render(argv))),
        "chmod" | "chown" | "chgrp" => operands(&argv[1..])
            .any(|w| is_system_path(&w.text))
            .then(|| danger("system_permissions", &render(argv))),
        "git" => git(argv, depth),
        "kill" => kill(argv),
        "killall5" => Some(danger("kill_all", &render(argv))),
        "pkill" => pkill(argv),
        "killall" => killall(argv),
        "tee" => tee(argv),
        "cp" | "mv" | "install" => copy(argv),
        "ln" if argv[1..].iter().any(|w| {
            is_long_option(&w.text, "--force")
                || (is_short_cluster(&w.text) && w.text.contains('f'))
        }) =>
        {
            copy(argv)
        }
        "shred" => operands(&argv[1..])
            .any(|w| is_raw_device(&w.text))
            .then(|| danger("device_write", &render(argv))),
        "truncate" => operands(&argv[1..])
            .any(|w| is_startup_file(&w.text))
            .then(|| danger("startup_file_overwrite", &render(argv))),
        "eval" => {
            if argv[1..].iter().any(|w| subs_download(w, depth)) {
                return Some(danger("pipe_to_shell", &render(argv)));
            }
            check_source(&join_texts(&argv[1..]), depth + 1)
        }
        "source" | "." => argv
            .get(1)
            .is_some_and(|w| subs_download(w, depth))
            .then(|| danger("pipe_to_shell", &render(argv))),
        "su" | "runuser" => su(argv, command, depth),
        // `trap 'rm -rf "$tmp"' EXIT`: the shell runs the string later.
        "trap" => operands(&argv[1..])
            .next()
            .filter(|_| argv.len() > 2)
            .and_then(|script| check_source(&script.text, depth + 1)),
        "cryptsetup" | "nvme" => argv[1..]
            .iter()
            .any(|w| {
                matches!(
                    w.text.as_str(),
                    "luksFormat" | "luksErase" | "erase" | "format" | "sanitize" | "reencrypt"
                )
            })
            .then(|| danger("disk_format", &render(argv))),
        "ddrescue" | "bmaptool" => operands(&argv[1..])
            .last()
            .is_some_and(|w| is_raw_device(&w.text))
            .then(|| danger("device_write", &render(argv))),
        "dropdb" => Some(danger("sql_drop", &render(argv))),
        "mysqladmin" => argv[1..]
            .iter()
            .any(|w| w.text.eq_ignore_ascii_case("drop"))
            .then(|| danger("sql_drop", &render(argv))),
        _ if SHELLS.contains(&name) || is_shell_variable(&argv[0].text) => {
            shell(argv, command, depth)
        }
        _ if name.starts_with("mkfs") || DISK_TOOLS.contains(&name) => disk(argv),
        _ if AWKS.contains(&name) => program(argv, command, AWK_RUNS, depth),
        _ if is_interpreter(name) => {
            program(argv, command, INTERPRETER_RUNS, depth).or_else(|| sql(argv, command))
        }
        _ => sql(argv, command),
    }
}

fn render_word(word: &Word) -> String {
    let plain = !word.text.is_empty()
        && !word
            .text
            .contains(|c: char| c.is_whitespace() || "'\"\\;&|<>`".contains(c));
    if plain {
        return word.text.clone();
    }
    shlex::try_quote(&word.text).map_or_else(|_| word.text.clone(), |q| q.into_owned())
}

fn render(words: &[Word]) -> String {
    words.iter().map(render_word).collect::<Vec<_>>().join(" ")
}

fn render_pipeline(commands: &[Command]) -> String {
    commands
        .iter()
        .map(|c| match c {
            Command::Simple(simple) => render(&simple.words),
            Command::Group { .. } => "( ... )".to_string(),
        })
        .collect::<Vec<_>>()
        .join(" | ")
}

/// One line, at most [`DETAIL_MAX_CHARS`] characters.
fn clip(detail: &str) -> String {
    let line: String = detail
        .chars()
        .map(|c| if c.is_control() { ' ' } else { c })
        .collect();
    if line.chars().count() <= DETAIL_MAX_CHARS {
        return line;
    }
    let mut out: String = line.chars().take(DETAIL_MAX_CHARS - 1).collect();
    out.push('…');
    out
}
