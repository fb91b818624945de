//! The dangerous-command rules, applied to the parsed shell (`docs/approvals.md` lists them).
//!
//! Every simple command is looked at after its wrappers are peeled off (`argv.rs`: `sudo`,
//! `env`, leading `VAR=x`, `timeout`, `flock`, `xargs`, ...), and every script the command line
//! would run is classified too: substitutions, `sh -c` strings, `eval` arguments, `find -exec`
//! commands, here-documents fed to a shell, `git -c` values, and the command strings of awk,
//! Python, Perl, Ruby, Node and PHP programs given on the command line.

use super::argv::{
    command_name, is_long_option, is_short_cluster, join_texts, operands, push_text, short_value,
    unwrap, Invocation,
};
use super::shell::{
    self, Command, Pipeline, Redirect, RedirectOp, Script, SimpleCommand, SubstitutionKind, Word,
};
use super::{Danger, PATTERNS};

/// How many scripts deep (substitution in `sh -c` in `eval` ...) classification follows. Deeper
/// input is itself reported as dangerous rather than waved through.
const MAX_DEPTH: usize = 16;

/// At most this many characters of the offending command go into a description.
const DETAIL_MAX_CHARS: usize = 120;

const SHELLS: &[&str] = &[
    "sh", "bash", "dash", "zsh", "ksh", "mksh", "ash", "rbash", "fish",
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
];
/// Library calls that delete a tree (`shutil.rmtree`, `FileUtils.rm_rf`, Perl's `remove_tree`).
const TREE_DELETES: &[&str] = &["rmtree", "rm_rf", "rm_r(", "remove_tree"];
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
    "ptmx",
];
const SAFE_DEVICE_PREFIXES: &[&str] = &["fd/", "pts/", "tty", "shm/", "tcp/", "udp/", "mqueue/"];

pub(super) fn classify(command: &str) -> Option<Danger> {
    check_source(command, 0)
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
        .find_map(|pipeline| check_pipeline(pipeline, depth))
}

fn check_pipeline(pipeline: &Pipeline, depth: usize) -> Option<Danger> {
    for (i, command) in pipeline.commands.iter().enumerate() {
        if let Some(found) = check_command(command, depth) {
            return Some(found);
        }
        let upstream = &pipeline.commands[..i];
        let Command::Simple(simple) = command else {
            continue;
        };
        let Invocation::Argv(argv) = unwrap(&simple.words) else {
            continue;
        };
        if upstream.is_empty() {
            continue;
        }
        if reads_script_from_stdin(argv) {
            if upstream.iter().any(|c| command_downloads(c, depth)) {
                return Some(danger(
                    "pipe_to_shell",
                    &render_pipeline(&pipeline.commands[..=i]),
                ));
            }
            // `echo 'rm -rf x' | sh`: what the previous stages print is the script.
            let mut fed = String::new();
            for stage in upstream {
                printed_script(stage, &mut fed);
            }
            if let Some(found) = check_source(&fed, depth + 1) {
                return Some(found);
            }
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
                return Some(danger(key, &shown));
            }
        }
    }
    None
}

fn check_command(command: &Command, depth: usize) -> Option<Danger> {
    match command {
        Command::Simple(simple) => check_simple(simple, depth),
        Command::Group { body, redirects } => {
            check_redirects(redirects, &[]).or_else(|| check_script(body, depth))
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
            if let Some(found) = check_source(&sub.script, depth + 1) {
                return Some(found);
            }
        }
    }
    check_redirects(&command.redirects, &command.words)
        .or_else(|| check_words(&command.words, command, depth))
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
            return Some(danger("device_write", &shown()));
        }
        if redirect.op == RedirectOp::Write && is_startup_file(target) {
            return Some(danger("startup_file_overwrite", &shown()));
        }
    }
    None
}

fn check_words(words: &[Word], command: &SimpleCommand, depth: usize) -> Option<Danger> {
    match unwrap(words) {
        Invocation::Nothing => None,
        Invocation::Split(source) => check_source(&source, depth + 1),
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
        "su" | "runuser" => su(argv, depth),
        "dropdb" => Some(danger("sql_drop", &render(argv))),
        "mysqladmin" => argv[1..]
            .iter()
            .any(|w| w.text.eq_ignore_ascii_case("drop"))
            .then(|| danger("sql_drop", &render(argv))),
        _ if SHELLS.contains(&name) => shell(argv, command, depth),
        _ if name.starts_with("mkfs") || DISK_TOOLS.contains(&name) => disk(argv),
        _ if AWKS.contains(&name) => program(argv, AWK_RUNS, depth),
        _ if INTERPRETERS.contains(&name) || name.starts_with("python") => {
            program(argv, INTERPRETER_RUNS, depth).or_else(|| sql(argv, command))
        }
        _ => sql(argv, command),
    }
}

fn rm(argv: &[Word]) -> Option<Danger> {
    let (mut recursive, mut force) = (false, false);
    for word in &argv[1..] {
        let a = word.text.as_str();
        if a == "--" {
            break;
        }
        if a.starts_with("--") {
            recursive |= is_long_option(a, "--recursive");
            force |= is_long_option(a, "--force");
        } else if a.len() > 1 && a.starts_with('-') {
            recursive |= a.contains(['r', 'R']);
            force |= a.contains('f');
        }
    }
    if recursive {
        Some(danger("recursive_delete", &render(argv)))
    } else if force {
        Some(danger("forced_delete", &render(argv)))
    } else {
        None
    }
}

fn find(argv: &[Word], command: &SimpleCommand, depth: usize) -> Option<Danger> {
    let args = &argv[1..];
    let mut i = 0;
    while let Some(word) = args.get(i) {
        match word.text.as_str() {
            "-delete" => return Some(danger("find_delete", &render(argv))),
            "-exec" | "-execdir" | "-ok" | "-okdir" => {
                let start = i + 1;
                let end = args[start.min(args.len())..]
                    .iter()
                    .position(|w| w.text == ";" || w.text == "+")
                    .map_or(args.len(), |p| start + p);
                let run = &args[start.min(end)..end];
                if let Invocation::Argv(inner) = unwrap(run) {
                    if matches!(command_name(&inner[0].text), "rm" | "shred" | "unlink") {
                        return Some(danger("find_delete", &render(argv)));
                    }
                }
                if let Some(found) = check_words(run, command, depth) {
                    return Some(found);
                }
                i = end + 1;
            }
            _ => i += 1,
        }
    }
    None
}

/// A program in another language given on the command line (`awk '...'`, `python3 -c '...'`,
/// `perl -e '...'`): a tree delete by library call, or a string it hands to a shell. Its string
/// literals are checked as command lines when the program runs commands at all.
fn program(argv: &[Word], runs: &[&str], depth: usize) -> Option<Danger> {
    let code = join_texts(&argv[1..]);
    let node_tree_delete = code.contains("recursive")
        && ["rmSync", "rmdirSync", "rm(", "rmdir("]
            .iter()
            .any(|call| code.contains(call));
    if node_tree_delete || TREE_DELETES.iter().any(|call| code.contains(call)) {
        return Some(danger("recursive_delete", &render(argv)));
    }
    if !runs.iter().any(|call| code.contains(call)) {
        return None;
    }
    program_strings(&code)
        .iter()
        .find_map(|text| check_source(text, depth + 1))
}

/// The string literals of a program in another language (`"..."`, `'...'`, `` `...` ``, with
/// escapes undone), each alone and, where only commas and blanks separate them
/// (`["rm", "-rf", "/"]`), joined by spaces as one command line.
fn program_strings(code: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut group: Vec<String> = Vec::new();
    let mut chars = code.chars();
    let close_group = |group: &mut Vec<String>, out: &mut Vec<String>| {
        if group.len() > 1 {
            out.push(group.join(" "));
        }
        group.clear();
    };
    while let Some(c) = chars.next() {
        match c {
            '"' | '\'' | '`' => {
                let mut literal = String::new();
                while let Some(d) = chars.next() {
                    match d {
                        '\\' => match chars.next() {
                            Some('n') => literal.push('\n'),
                            Some(escaped) => literal.push(escaped),
                            None => {}
                        },
                        _ if d == c => break,
                        _ => literal.push(d),
                    }
                }
                group.push(literal.clone());
                out.push(literal);
            }
            ',' => {}
            _ if c.is_whitespace() => {}
            _ => close_group(&mut group, &mut out),
        }
    }
    close_group(&mut group, &mut out);
    out
}

fn disk(argv: &[Word]) -> Option<Danger> {
    let lists_only = matches!(
        command_name(&argv[0].text),
        "fdisk" | "sfdisk" | "gdisk" | "parted"
    ) && argv[1..]
        .iter()
        .any(|w| w.text == "-l" || w.text.starts_with("--list"));
    (!lists_only).then(|| danger("disk_format", &render(argv)))
}

fn git(argv: &[Word], depth: usize) -> Option<Danger> {
    let mut i = 1;
    while let Some(word) = argv.get(i) {
        let a = word.text.as_str();
        // `-c alias.x='!rm -rf ~'`, `-c core.pager='...'`: a value may be run by a shell.
        if a == "-c" {
            let value = argv.get(i + 1).and_then(|w| w.text.split_once('='));
            if let Some((_, value)) = value {
                let script = value.strip_prefix('!').unwrap_or(value);
                if let Some(found) = check_source(script, depth + 1) {
                    return Some(found);
                }
            }
        }
        if matches!(
            a,
            "-C" | "-c" | "--git-dir" | "--work-tree" | "--namespace" | "--config-env"
        ) {
            i += 2;
        } else if a.starts_with('-') {
            i += 1;
        } else {
            break;
        }
    }
    let subcommand = argv.get(i)?.text.as_str();
    let rest = &argv[i + 1..];
    let key = match subcommand {
        "push" if push_forces(rest) => "git_force_push",
        "reset" if rest.iter().any(|w| is_long_option(&w.text, "--hard")) => "git_reset_hard",
        "clean" if clean_forces(rest) => "git_clean",
        _ => return None,
    };
    Some(danger(key, &render(argv)))
}

fn push_forces(args: &[Word]) -> bool {
    let mut i = 0;
    let mut options_done = false;
    while let Some(word) = args.get(i) {
        let a = word.text.as_str();
        i += 1;
        if options_done || !a.starts_with('-') {
            // `+main` is a forced refspec.
            if a.len() > 1 && a.starts_with('+') {
                return true;
            }
            continue;
        }
        if a == "--" {
            options_done = true;
        } else if ["--force", "--mirror", "--force-with-lease"]
            .iter()
            .any(|o| is_long_option(a, o))
        {
            return true;
        } else if !a.contains('=')
            && ["--repo", "--receive-pack", "--exec", "--push-option"]
                .iter()
                .any(|o| is_long_option(a, o))
        {
            i += 1;
        } else if !a.starts_with("--") && a.len() > 1 {
            if a.contains('f') {
                return true;
            }
            if a.ends_with('o') {
                i += 1;
            }
        }
    }
    false
}

fn clean_forces(args: &[Word]) -> bool {
    let short = |c: char| {
        args.iter().any(|w| {
            w.text.len() > 1
                && w.text.starts_with('-')
                && !w.text.starts_with("--")
                && w.text.contains(c)
        })
    };
    let long = |s: &str| args.iter().any(|w| is_long_option(&w.text, s));
    (short('f') || long("--force")) && !(short('n') || long("--dry-run"))
}

fn kill(argv: &[Word]) -> Option<Danger> {
    let args = &argv[1..];
    let first = args.first()?.text.as_str();
    let targets_from = match first {
        "-l" | "-L" | "--list" | "--table" => return None,
        "-s" | "-n" | "--signal" => 2,
        // `kill -1 PID` sends SIGHUP to PID; `kill -1` alone is pid -1, everything.
        _ if args.len() > 1 && first.starts_with('-') && first != "--" => 1,
        _ => 0,
    };
    args.get(targets_from..)
        .unwrap_or_default()
        .iter()
        .any(|w| w.text == "-1")
        .then(|| danger("kill_all", &render(argv)))
}

fn pkill(argv: &[Word]) -> Option<Danger> {
    let mut i = 1;
    if argv.get(1).is_some_and(|w| is_signal_option(&w.text)) {
        i = 2;
    }
    let mut by_user = false;
    let mut pattern = None;
    while let Some(word) = argv.get(i) {
        let a = word.text.as_str();
        if a == "--" {
            pattern = argv.get(i + 1).map(|w| w.text.as_str());
            break;
        }
        if a.starts_with("--") {
            let user = is_long_option(a, "--euid") || is_long_option(a, "--uid");
            by_user |= user;
            let value_follows = !a.contains('=')
                && (user || PKILL_LONG_WITH_ARG.iter().any(|o| is_long_option(a, o)));
            i += if value_follows { 2 } else { 1 };
        } else if is_short_cluster(a) {
            let value = short_value(a, "uUgGPstF");
            by_user |= value.is_some_and(|(option, _)| matches!(option, 'u' | 'U'));
            i += if value.is_some_and(|(_, value)| value.is_empty()) {
                2
            } else {
                1
            };
        } else {
            pattern = Some(a);
            break;
        }
    }
    let broad = match pattern {
        None => by_user,
        Some(p) => is_broad_pattern(p),
    };
    broad.then(|| danger("kill_all", &render(argv)))
}

/// pkill's long options that take a value (besides `--euid` and `--uid`).
const PKILL_LONG_WITH_ARG: &[&str] = &[
    "--signal",
    "--pgroup",
    "--group",
    "--parent",
    "--session",
    "--terminal",
    "--pidfile",
    "--ns",
    "--nslist",
];

fn killall(argv: &[Word]) -> Option<Danger> {
    let (mut by_user, mut regex) = (false, false);
    let mut names = Vec::new();
    let mut i = 1;
    while let Some(word) = argv.get(i) {
        let a = word.text.as_str();
        i += 1;
        if a.starts_with("--") {
            let user = is_long_option(a, "--user");
            by_user |= user;
            regex |= is_long_option(a, "--regexp");
            let value_follows = !a.contains('=')
                && (user
                    || ["--signal", "--older-than", "--younger-than", "--ns"]
                        .iter()
                        .any(|o| is_long_option(a, o)));
            i += usize::from(value_follows);
        } else if is_short_cluster(a) {
            let value = short_value(a, "usoynZ");
            by_user |= value.is_some_and(|(option, _)| option == 'u');
            // The options before the one taking a value are flags (`-ru root`).
            let cluster = &a[1..];
            let flags = value.map_or(cluster, |(_, rest)| {
                &cluster[..cluster.len() - rest.len() - 1]
            });
            regex |= flags.contains('r');
            i += usize::from(value.is_some_and(|(_, value)| value.is_empty()));
        } else {
            names.push(a);
        }
    }
    let broad =
        (names.is_empty() && by_user) || (regex && names.iter().any(|n| is_broad_pattern(n)));
    broad.then(|| danger("kill_all", &render(argv)))
}

fn tee(argv: &[Word]) -> Option<Danger> {
    let appends = argv[1..].iter().any(|w| {
        is_long_option(&w.text, "--append") || (is_short_cluster(&w.text) && w.text.contains('a'))
    });
    let files: Vec<&Word> = operands(&argv[1..]).collect();
    if files.iter().any(|w| is_raw_device(&w.text)) {
        return Some(danger("device_write", &render(argv)));
    }
    (!appends && files.iter().any(|w| is_startup_file(&w.text)))
        .then(|| danger("startup_file_overwrite", &render(argv)))
}

fn copy(argv: &[Word]) -> Option<Danger> {
    let destination = operands(&argv[1..]).last()?;
    if is_raw_device(&destination.text) {
        Some(danger("device_write", &render(argv)))
    } else if is_startup_file(&destination.text) {
        Some(danger("startup_file_overwrite", &render(argv)))
    } else {
        None
    }
}

fn su(argv: &[Word], depth: usize) -> Option<Danger> {
    let mut i = 1;
    while let Some(word) = argv.get(i) {
        let a = word.text.as_str();
        i += 1;
        // The word holding the script (for its substitutions) and the script's text.
        let next = || argv.get(i).map(|w| (w, w.text.as_str()));
        let script = if a.starts_with("--") {
            let command = is_long_option(a, "--command") || is_long_option(a, "--session-command");
            match a.split_once('=') {
                _ if !command => None,
                Some((_, text)) => Some((word, text)),
                None => next(),
            }
        } else {
            match short_value(a, "cgGsw") {
                Some(('c', "")) => next(),
                Some(('c', text)) => Some((word, text)),
                _ => None,
            }
        };
        if let Some((script, text)) = script {
            if subs_download(script, depth) {
                return Some(danger("pipe_to_shell", &render(argv)));
            }
            return check_source(text, depth + 1);
        }
    }
    None
}

/// Where a shell invocation reads its script from.
enum ShellInput<'w> {
    /// `-c STRING`.
    String(&'w Word),
    /// A script file operand.
    File(&'w Word),
    /// Standard input (no operand, or `-s`).
    Stdin,
    /// `-c` without a string: nothing runs.
    Nothing,
}

fn shell_input(args: &[Word]) -> ShellInput<'_> {
    let (mut has_c, mut has_s) = (false, false);
    let mut i = 0;
    while let Some(word) = args.get(i) {
        let a = word.text.as_str();
        if a == "--" || a == "-" {
            i += 1;
            break;
        }
        if a.starts_with("--") {
            i += if matches!(a, "--rcfile" | "--init-file") {
                2
            } else {
                1
            };
        } else if a.len() > 1 && (a.starts_with('-') || a.starts_with('+')) {
            let cluster = &a[1..];
            has_c |= a.starts_with('-') && cluster.contains('c');
            has_s |= cluster.contains('s');
            // `-o pipefail`, `+O extglob`: the option name follows.
            i += if cluster.ends_with(['o', 'O']) { 2 } else { 1 };
        } else {
            break;
        }
    }
    let operand = args.get(i);
    match (has_c, operand) {
        (true, Some(script)) => ShellInput::String(script),
        (true, None) => ShellInput::Nothing,
        (false, Some(_)) if has_s => ShellInput::Stdin,
        (false, Some(file)) => ShellInput::File(file),
        (false, None) => ShellInput::Stdin,
    }
}

fn shell(argv: &[Word], command: &SimpleCommand, depth: usize) -> Option<Danger> {
    let downloaded = || Some(danger("pipe_to_shell", &render(argv)));
    match shell_input(&argv[1..]) {
        ShellInput::String(script) => {
            if subs_download(script, depth) {
                return downloaded();
            }
            check_source(&script.text, depth + 1)
        }
        ShellInput::File(file) => {
            if subs_download(file, depth) {
                return downloaded();
            }
            None
        }
        ShellInput::Nothing => None,
        ShellInput::Stdin => {
            for redirect in &command.redirects {
                let source = match redirect.op {
                    RedirectOp::Read | RedirectOp::HereString => &redirect.target,
                    RedirectOp::HereDoc => match &redirect.body {
                        Some(body) => body,
                        None => continue,
                    },
                    _ => continue,
                };
                if subs_download(source, depth) {
                    return downloaded();
                }
                if redirect.op != RedirectOp::Read {
                    if let Some(found) = check_source(&source.text, depth + 1) {
                        return Some(found);
                    }
                }
            }
            None
        }
    }
}

fn reads_script_from_stdin(argv: &[Word]) -> bool {
    let name = command_name(&argv[0].text);
    if SHELLS.contains(&name) {
        return matches!(shell_input(&argv[1..]), ShellInput::Stdin);
    }
    if INTERPRETERS.contains(&name) || name.starts_with("python") {
        // `python3`, `perl -`, `node`: a script from stdin unless one is given inline (`-c`,
        // `-e`, `-m`, `-p`) or as a file.
        let inline = argv[1..].iter().any(|w| {
            let a = w.text.as_str();
            matches!(a, "--eval" | "--print" | "--command")
                || (a.len() > 1
                    && a.starts_with('-')
                    && !a.starts_with("--")
                    && a.contains(['c', 'm', 'e', 'E', 'p']))
        });
        return !inline && operands(&argv[1..]).all(|w| w.text == "-");
    }
    matches!(name, "source" | ".")
        && argv
            .get(1)
            .is_some_and(|w| matches!(w.text.as_str(), "/dev/stdin" | "/proc/self/fd/0"))
}

/// Whether a substitution in `word` downloads something (its output then becomes a script).
fn subs_download(word: &Word, depth: usize) -> bool {
    word.subs.iter().any(|sub| {
        matches!(
            sub.kind,
            SubstitutionKind::Command | SubstitutionKind::ProcessInput
        ) && depth < MAX_DEPTH
            && script_downloads(&shell::parse(&sub.script), depth + 1)
    })
}

fn script_downloads(script: &Script, depth: usize) -> bool {
    script
        .pipelines
        .iter()
        .flat_map(|p| &p.commands)
        .any(|c| command_downloads(c, depth))
}

fn command_downloads(command: &Command, depth: usize) -> bool {
    match command {
        Command::Group { body, .. } => script_downloads(body, depth),
        Command::Simple(simple) => {
            let direct = match unwrap(&simple.words) {
                Invocation::Argv(argv) => DOWNLOADERS.contains(&command_name(&argv[0].text)),
                Invocation::Split(source) => {
                    depth < MAX_DEPTH && script_downloads(&shell::parse(&source), depth + 1)
                }
                Invocation::Nothing => false,
            };
            // `echo "$(curl ...)"` passes a download on as well.
            direct || simple.words.iter().any(|w| subs_download(w, depth))
        }
    }
}

fn sql_client_position(argv: &[Word]) -> Option<usize> {
    argv.iter()
        .position(|w| SQL_CLIENTS.contains(&command_name(&w.text)))
}

/// A database client (also behind `docker exec`, `kubectl exec`, `ssh`, ...) given SQL in its
/// arguments, a here-document or a here-string.
fn sql(argv: &[Word], command: &SimpleCommand) -> Option<Danger> {
    let client = sql_client_position(argv)?;
    let mut text = join_texts(&argv[client + 1..]);
    let mut shown = render(&argv[client..]);
    for redirect in &command.redirects {
        let fed = match redirect.op {
            RedirectOp::HereString => Some(&redirect.target),
            RedirectOp::HereDoc => redirect.body.as_ref(),
            _ => None,
        };
        if let Some(fed) = fed {
            push_text(&mut text, &fed.text);
            shown.push_str(" <<< ");
            shown.push_str(&render_word(fed));
        }
    }
    sql_danger(&text).map(|key| danger(key, &shown))
}

/// The destructive statement in `text`, by pattern key: `DROP TABLE|DATABASE|SCHEMA` (also
/// `DROP TEMPORARY TABLE`) or `TRUNCATE`.
fn sql_danger(text: &str) -> Option<&'static str> {
    let tokens: Vec<String> = text
        .split(|c: char| !(c.is_alphanumeric() || c == '_'))
        .filter(|t| !t.is_empty())
        .map(str::to_ascii_lowercase)
        .collect();
    for (i, token) in tokens.iter().enumerate() {
        let next = tokens.get(i + 1).map(String::as_str);
        match (token.as_str(), next) {
            ("drop", Some("table" | "database" | "schema")) => return Some("sql_drop"),
            ("drop", Some("temporary" | "temp"))
                if tokens.get(i + 2).is_some_and(|t| t == "table") =>
            {
                return Some("sql_drop")
            }
            ("truncate", Some(_)) => return Some("sql_truncate"),
            _ => {}
        }
    }
    None
}

/// What a pipeline stage prints, when that is plain to see: `echo` and `printf` arguments and
/// here-texts. A stdin shell downstream runs it.
fn printed_script(command: &Command, out: &mut String) {
    let Command::Simple(simple) = command else {
        return;
    };
    if let Invocation::Argv(argv) = unwrap(&simple.words) {
        match command_name(&argv[0].text) {
            "echo" => push_line(out, &join_texts(&argv[1..])),
            "printf" => {
                for word in &argv[1..] {
                    push_line(out, &word.text.replace("\\n", "\n"));
                }
            }
            _ => {}
        }
    }
    for redirect in &simple.redirects {
        match redirect.op {
            RedirectOp::HereString => push_line(out, &redirect.target.text),
            RedirectOp::HereDoc => {
                if let Some(body) = &redirect.body {
                    push_line(out, &body.text);
                }
            }
            _ => {}
        }
    }
}

fn push_line(out: &mut String, text: &str) {
    if !out.is_empty() {
        out.push('\n');
    }
    out.push_str(text);
}

/// Every word and here-text of a pipeline stage, for SQL fed into a client downstream.
fn command_text(command: &Command, out: &mut String) {
    match command {
        Command::Simple(simple) => {
            push_text(out, &join_texts(&simple.words));
            for redirect in &simple.redirects {
                if redirect.op == RedirectOp::HereString {
                    push_text(out, &redirect.target.text);
                }
                if let Some(body) = &redirect.body {
                    push_text(out, &body.text);
                }
            }
        }
        Command::Group { body, .. } => {
            for command in body.pipelines.iter().flat_map(|p| &p.commands) {
                command_text(command, out);
            }
        }
    }
}

/// `-9`, `-KILL`, `-SIGKILL`: a signal given as pkill's first argument.
fn is_signal_option(text: &str) -> bool {
    text.strip_prefix('-').is_some_and(|s| {
        !s.is_empty()
            && (s.chars().all(|c| c.is_ascii_digit()) || s.chars().all(|c| c.is_ascii_uppercase()))
    })
}

/// A process-name pattern that matches every process (`.`, `.*`, `^`, empty).
fn is_broad_pattern(pattern: &str) -> bool {
    pattern.chars().all(|c| ".*^$+?".contains(c))
}

fn is_raw_device(path: &str) -> bool {
    let Some(device) = path.strip_prefix("/dev/") else {
        return false;
    };
    !(SAFE_DEVICES.contains(&device) || SAFE_DEVICE_PREFIXES.iter().any(|p| device.starts_with(p)))
}

fn is_startup_file(path: &str) -> bool {
    let name = path.rsplit('/').next().unwrap_or(path);
    STARTUP_FILE_NAMES.contains(&name)
        || SYSTEM_STARTUP_FILES.contains(&path)
        || path.starts_with("/etc/profile.d/")
        || path.ends_with(".config/fish/config.fish")
}

fn is_system_path(path: &str) -> bool {
    let mut p = path.trim();
    loop {
        if let Some(stripped) = p.strip_suffix("/*").or_else(|| p.strip_suffix("/.")) {
            p = if stripped.is_empty() { "/" } else { stripped };
        } else if p.len() > 1 && p.ends_with('/') {
            p = &p[..p.len() - 1];
        } else {
            break;
        }
    }
    SYSTEM_PATHS.contains(&p)
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
