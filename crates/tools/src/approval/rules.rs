//! The dangerous-command rules, applied to the parsed shell (`docs/approvals.md` lists them).
//!
//! Every simple command is looked at after its wrappers are peeled off (`argv.rs`: `sudo`,
//! `env`, leading `VAR=x`, `timeout`, `flock`, `xargs`, ...), and every script the command line
//! would run is classified too: substitutions, `sh -c` strings, `eval` arguments, `find -exec`
//! commands, here-documents fed to a shell, `git -c` values, and the command strings of awk,
//! Python, Perl, Ruby, Node and PHP programs given on the command line.

use super::argv::{
    command_name, has_option, is_long_option, is_short_cluster, join_texts, operands, option_value,
    push_text, short_value, unwrap, Invocation,
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
                return Some(danger(
                    "pipe_to_shell",
                    &render_pipeline(&pipeline.commands[..=i]),
                ));
            }
            // `echo 'rm -rf x' | sh`: what the previous stages print is the script (a
            // program, for an interpreter).
            let mut fed = String::new();
            for stage in upstream {
                printed_script(stage, &mut fed);
            }
            let program = matches!(invocation, Invocation::Argv(_))
                && is_interpreter(command_name(&argv[0].text));
            let found = if program {
                let shown = render_pipeline(&pipeline.commands[..=i]);
                check_program(&fed, INTERPRETER_RUNS, &shown, depth)
            } else {
                check_source(&fed, depth + 1)
            };
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
        Invocation::StdinShell => stdin_script(words, command, depth),
        Invocation::Split(source) => {
            check_source(&source, depth + 1).or_else(|| {
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

/// A program in another language (`awk '...'`, `python3 -c '...'`, `perl -e '...'`, or one
/// read from a here-document or here-string): a download run as the program, a tree delete by
/// library call, or a string it hands to a shell (see [`check_program`]).
fn program(argv: &[Word], command: &SimpleCommand, runs: &[&str], depth: usize) -> Option<Danger> {
    // `ruby -e "$(curl ...)"`, `python3 <(curl ...)`: a download is the program.
    if argv[1..].iter().any(|w| subs_download(w, depth)) {
        return Some(danger("pipe_to_shell", &render(argv)));
    }
    let mut code = inline_code(argv);
    if reads_script_from_stdin(argv) {
        for fed in fed_words(command) {
            if subs_download(fed, depth) {
                return Some(danger("pipe_to_shell", &render(argv)));
            }
            push_line(&mut code, &fed.text);
        }
    }
    check_program(&code, runs, &render(argv), depth)
}

/// A program's text: a tree delete by library call is a `recursive_delete`; when the program
/// runs commands at all (one of `runs`), its string literals are checked as command lines.
fn check_program(code: &str, runs: &[&str], shown: &str, depth: usize) -> Option<Danger> {
    if TREE_DELETES.iter().any(|call| code.contains(call)) || node_tree_delete(code) {
        return Some(danger("recursive_delete", shown));
    }
    if !runs.iter().any(|call| code.contains(call)) {
        return None;
    }
    program_strings(code)
        .iter()
        .find_map(|text| check_source(text, depth + 1))
}

/// Node's `fs.rmSync(p, { recursive: true })` (also `rmdirSync`, `fs.promises.rm`): a remove
/// call with `recursive` in its arguments.
fn node_tree_delete(code: &str) -> bool {
    ["rmSync(", "rmdirSync(", ".rm(", ".rmdir("]
        .iter()
        .any(|call| {
            code.match_indices(call).any(|(at, _)| {
                let rest = &code[at + call.len()..];
                let args = rest.find(')').map_or(rest, |end| &rest[..end]);
                args.contains("recursive")
            })
        })
}

/// The program text a command line gives inline: awk's program operand (or `-e`/`--source`;
/// nothing with `-f`), `python -c`, `perl -e`/`-E`, `ruby -e`, `node -e`/`-p`/`--eval`/
/// `--print`, `php -r`. Scanning stops at the first operand (a script file or module, whose
/// arguments follow).
fn inline_code(argv: &[Word]) -> String {
    let name = command_name(&argv[0].text);
    let args = &argv[1..];
    let mut code = String::new();
    let (letters, with_arg, longs): (&str, &str, &[&str]) = match name {
        _ if AWKS.contains(&name) => ("e", "Fvf", &["--source"]),
        _ if name.starts_with("python") => ("c", "WXm", &[]),
        "perl" => ("eE", "I", &[]),
        "ruby" => ("e", "Ir", &[]),
        "node" => ("ep", "r", &["--eval", "--print"]),
        "php" => ("r", "cdz", &["--run"]),
        _ => return code,
    };
    let mut from_file = false;
    let mut i = 0;
    while let Some(word) = args.get(i) {
        let a = word.text.as_str();
        let next = args.get(i + 1).map(|w| w.text.as_str());
        if a == "--" {
            i += 1;
            break;
        }
        if a.starts_with("--") {
            let value = a.split_once('=').map(|(_, v)| v);
            if longs.iter().any(|o| is_long_option(a, o)) {
                push_line(&mut code, value.or(next).unwrap_or_default());
                i += if value.is_some() { 1 } else { 2 };
            } else {
                from_file |= is_long_option(a, "--file");
                i += 1;
            }
            continue;
        }
        if !is_short_cluster(a) {
            break;
        }
        let mut all = letters.to_string();
        all.push_str(with_arg);
        if let Some((option, value)) = short_value(a, &all) {
            let value = if value.is_empty() {
                i += 1;
                next.unwrap_or_default()
            } else {
                value
            };
            if letters.contains(option) {
                push_line(&mut code, value);
            }
            // `python -m module`: a module runs, with its own arguments.
            if option == 'm' {
                return code;
            }
            from_file |= option == 'f';
        }
        i += 1;
    }
    // awk's first operand is its program, unless `-f` or `-e` gave one.
    if AWKS.contains(&name) && !from_file && code.is_empty() {
        if let Some(program) = args.get(i) {
            push_line(&mut code, &program.text);
        }
    }
    code
}

/// The string literals of a program in another language (`"..."`, `'...'`, `` `...` ``, with
/// escapes undone, and Ruby's `%x(...)` and Perl's `qx(...)`), each alone and, where only
/// commas, blanks and brackets separate them (`["rm", "-rf", "/"]`, `"git", ["push"]`), joined
/// by spaces as one command line.
fn program_strings(code: &str) -> Vec<String> {
    let chars: Vec<char> = code.chars().collect();
    let mut out = Vec::new();
    let mut group: Vec<String> = Vec::new();
    let close_group = |group: &mut Vec<String>, out: &mut Vec<String>| {
        if group.len() > 1 {
            out.push(group.join(" "));
        }
        group.clear();
    };
    let mut i = 0;
    while let Some(&c) = chars.get(i) {
        i += 1;
        let quoted_command = c == 'x'
            && i >= 2
            && matches!(chars[i - 2], '%' | 'q')
            && chars.get(i).and_then(|open| closing(*open)).is_some();
        if quoted_command {
            let close = chars.get(i).and_then(|open| closing(*open)).unwrap_or(')');
            let start = i + 1;
            let end = chars[start.min(chars.len())..]
                .iter()
                .position(|&d| d == close)
                .map_or(chars.len(), |p| start + p);
            close_group(&mut group, &mut out);
            out.push(chars[start.min(end)..end].iter().collect());
            i = end + 1;
            continue;
        }
        match c {
            '"' | '\'' | '`' => {
                let mut literal = String::new();
                while let Some(&d) = chars.get(i) {
                    i += 1;
                    match d {
                        '\\' => {
                            match chars.get(i) {
                                Some('n') => literal.push('\n'),
                                Some(&escaped) => literal.push(escaped),
                                None => {}
                            }
                            i += 1;
                        }
                        _ if d == c => break,
                        _ => literal.push(d),
                    }
                }
                group.push(literal.clone());
                out.push(literal);
            }
            // `spawnSync("git", ["push", "--force"])`: a list continues the command.
            ',' | '[' | ']' => {}
            _ if c.is_whitespace() => {}
            _ => close_group(&mut group, &mut out),
        }
    }
    close_group(&mut group, &mut out);
    out
}

/// The bracket that closes `open` in `%x(...)` / `qx{...}`; `None` for a character that does
/// not open one.
fn closing(open: char) -> Option<char> {
    match open {
        '(' => Some(')'),
        '{' => Some('}'),
        '[' => Some(']'),
        '<' => Some('>'),
        '|' | '!' | '/' => Some(open),
        _ => None,
    }
}

fn disk(argv: &[Word]) -> Option<Danger> {
    let args = &argv[1..];
    let has = |short: char, long: &str| has_option(args, short, long);
    let word = |w: &str| args.iter().any(|a| a.text == w);
    // Listing, printing, dumping and verifying write nothing.
    let reads_only = match command_name(&argv[0].text) {
        "fdisk" | "gdisk" => has('l', "--list"),
        "sfdisk" => {
            ['l', 'd', 's', 'J', 'V', 'g'].iter().any(|c| has(*c, "--"))
                || [
                    "--list",
                    "--dump",
                    "--json",
                    "--show-size",
                    "--verify",
                    "--show-geometry",
                ]
                .iter()
                .any(|o| args.iter().any(|a| is_long_option(&a.text, o)))
        }
        "sgdisk" => has('p', "--print") || has('i', "--info") || has('v', "--verify"),
        "parted" => has('l', "--list") || word("print"),
        // wipefs only lists the signatures it finds unless told to erase them.
        "wipefs" => !(has('a', "--all") || has('o', "--offset")),
        _ => false,
    };
    (!reads_only).then(|| danger("disk_format", &render(argv)))
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
    // Subcommands that hand a command line to a shell.
    let script = match subcommand {
        // `git submodule foreach [--recursive] 'git reset --hard'`
        "submodule" if rest.first().is_some_and(|w| w.text == "foreach") => {
            let command: Vec<&Word> = rest[1..]
                .iter()
                .skip_while(|w| w.text.starts_with('-'))
                .collect();
            Some(
                command
                    .iter()
                    .map(|w| w.text.as_str())
                    .collect::<Vec<_>>()
                    .join(" "),
            )
        }
        // `git rebase -x 'make test' HEAD~3`
        "rebase" => option_value(rest, 'x', "--exec", "sCX").map(str::to_string),
        // `git bisect run ./test.sh`
        "bisect" if rest.first().is_some_and(|w| w.text == "run") => Some(join_texts(&rest[1..])),
        _ => None,
    };
    if let Some(found) = script.and_then(|script| check_source(&script, depth + 1)) {
        return Some(found);
    }
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
    let args = &argv[1..];
    // `cp -t DIR FILE...` names the destination first.
    let target = option_value(args, 't', "--target-directory", "S");
    let mut files: Vec<&str> = operands(args).map(|w| w.text.as_str()).collect();
    let destination = match target {
        Some(dir) => {
            files.retain(|f| *f != dir);
            dir
        }
        None => files.pop()?,
    };
    if target.is_none() && is_raw_device(destination) {
        return Some(danger("device_write", &render(argv)));
    }
    // Onto a startup file, or a file named like one into the home (`cp dotfiles/.bashrc ~/`).
    let into_home = is_home_dir(destination)
        && files
            .iter()
            .any(|f| STARTUP_FILE_NAMES.contains(&f.rsplit('/').next().unwrap_or(f)));
    ((target.is_none() && is_startup_file(destination)) || into_home)
        .then(|| danger("startup_file_overwrite", &render(argv)))
}

/// `~`, `~/`, `$HOME`, `${HOME}/`: the home directory itself.
fn is_home_dir(path: &str) -> bool {
    matches!(path.trim_end_matches('/'), "~" | "$HOME" | "${HOME}")
}

fn su(argv: &[Word], command: &SimpleCommand, depth: usize) -> Option<Danger> {
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
    // No `-c`: the user's shell reads this command's stdin (`sudo su - <<EOF`).
    stdin_script(argv, command, depth)
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
            // fish: `--command 'rm -rf x'`.
            has_c |= is_long_option(a, "--command");
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
        (false, Some(file)) if is_stdin_path(&file.text) => ShellInput::Stdin,
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
        ShellInput::Stdin => stdin_script(argv, command, depth),
    }
}

/// The script a shell reads from this command's standard input: a here-document or
/// here-string (checked), or a file whose name is a download (`bash < <(curl ...)`).
/// `words` are shown in the description.
fn stdin_script(words: &[Word], command: &SimpleCommand, depth: usize) -> Option<Danger> {
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
            return Some(danger("pipe_to_shell", &render(words)));
        }
        if redirect.op != RedirectOp::Read {
            if let Some(found) = check_source(&source.text, depth + 1) {
                return Some(found);
            }
        }
    }
    None
}

/// Whether a split command line (`ssh host 'bash -s'`) is a shell reading its stdin.
fn split_reads_stdin(source: &str) -> bool {
    let script = shell::parse(source);
    let [pipeline] = script.pipelines.as_slice() else {
        return false;
    };
    let [Command::Simple(simple)] = pipeline.commands.as_slice() else {
        return false;
    };
    match unwrap(&simple.words) {
        Invocation::StdinShell => true,
        Invocation::Argv(argv) => {
            SHELLS.contains(&command_name(&argv[0].text)) && reads_script_from_stdin(argv)
        }
        Invocation::Split(_) | Invocation::Nothing => false,
    }
}

fn reads_script_from_stdin(argv: &[Word]) -> bool {
    let name = command_name(&argv[0].text);
    if SHELLS.contains(&name) {
        return matches!(shell_input(&argv[1..]), ShellInput::Stdin);
    }
    if is_interpreter(name) {
        // `python3`, `perl -`, `node`, `python3 - --version 1.8` (the words after `-` are the
        // script's arguments): a script from stdin unless one is given inline (`-c`, `-e`,
        // `-m`, `-p`) or as a file.
        let inline = argv[1..].iter().any(|w| {
            let a = w.text.as_str();
            matches!(a, "--eval" | "--print" | "--command")
                || (a.len() > 1
                    && a.starts_with('-')
                    && !a.starts_with("--")
                    && a.contains(['c', 'm', 'e', 'E', 'p', 'r']))
        });
        return !inline
            && operands(&argv[1..])
                .next()
                .is_none_or(|w| is_stdin_path(&w.text));
    }
    matches!(name, "source" | ".") && argv.get(1).is_some_and(|w| is_stdin_path(&w.text))
}

/// `-`, `/dev/stdin`, `/proc/self/fd/0`: a script file operand that is standard input.
fn is_stdin_path(text: &str) -> bool {
    matches!(text, "-" | "/dev/stdin" | "/proc/self/fd/0" | "/dev/fd/0")
}

/// Python, Perl, Ruby, Node or PHP.
fn is_interpreter(name: &str) -> bool {
    INTERPRETERS.contains(&name) || name.starts_with("python")
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
                Invocation::StdinShell | Invocation::Nothing => false,
            };
            // `echo "$(curl ...)"` passes a download on as well.
            direct || simple.words.iter().any(|w| subs_download(w, depth))
        }
    }
}

/// Where the database client is: the command itself, once wrappers (`sudo -u postgres`,
/// `docker exec db`, `kubectl exec pod --`) are peeled off. A word named like a client further
/// on is an argument (`grep psql`).
fn sql_client_position(argv: &[Word]) -> Option<usize> {
    SQL_CLIENTS
        .contains(&command_name(&argv[0].text))
        .then_some(0)
}

/// What a command's here-strings and here-documents feed to its standard input.
fn fed_words(command: &SimpleCommand) -> impl Iterator<Item = &Word> {
    command.redirects.iter().filter_map(|r| match r.op {
        RedirectOp::HereString => Some(&r.target),
        RedirectOp::HereDoc => r.body.as_ref(),
        _ => None,
    })
}

/// A database client (also behind `docker exec`, `kubectl exec`, `ssh`, ...) given SQL in its
/// arguments, a here-document or a here-string.
fn sql(argv: &[Word], command: &SimpleCommand) -> Option<Danger> {
    let client = sql_client_position(argv)?;
    let mut text = join_texts(&argv[client + 1..]);
    let mut shown = render(&argv[client..]);
    for fed in fed_words(command) {
        push_text(&mut text, &fed.text);
        shown.push_str(" <<< ");
        shown.push_str(&render_word(fed));
    }
    sql_danger(&text).map(|key| danger(key, &shown))
}

/// The destructive statement in `text`, by pattern key: `DROP TABLE|DATABASE|SCHEMA` (also
/// `DROP TEMPORARY TABLE`) or `TRUNCATE`.
fn sql_danger(text: &str) -> Option<&'static str> {
    let is_word = |c: char| c.is_alphanumeric() || c == '_';
    let mut tokens: Vec<String> = Vec::new();
    // Per token: whether it is a function call (`TRUNCATE(price, 2)`) or a quoted value
    // (`'TRUNCATE'`), which are no statements.
    let mut not_statement: Vec<bool> = Vec::new();
    let mut rest = text;
    while let Some(start) = rest.find(is_word) {
        let before = rest[..start].chars().next_back();
        let after_start = &rest[start..];
        let len = after_start
            .find(|c: char| !is_word(c))
            .unwrap_or(after_start.len());
        let after = after_start[len..].trim_start().chars().next();
        tokens.push(after_start[..len].to_ascii_lowercase());
        not_statement.push(after == Some('(') || matches!(before, Some('\'' | '"' | '`')));
        rest = &after_start[len..];
    }
    for (i, token) in tokens.iter().enumerate() {
        let next = tokens.get(i + 1).map(String::as_str);
        if token == "truncate" && not_statement[i] {
            continue;
        }
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

/// `$SHELL`, `${BASH}`, `$0`: a shell named by a variable (its script is still literal).
fn is_shell_variable(text: &str) -> bool {
    let name = text
        .trim_start_matches('$')
        .trim_start_matches('{')
        .trim_end_matches('}');
    text.starts_with('$') && matches!(name, "SHELL" | "BASH" | "ZSH_NAME" | "0")
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
    // `//dev/sda` and `/dev//sda` name the same file.
    let mut squeezed = String::with_capacity(path.len());
    for c in path.chars() {
        if !(c == '/' && squeezed.ends_with('/')) {
            squeezed.push(c);
        }
    }
    let Some(device) = squeezed.strip_prefix("/dev/") else {
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
