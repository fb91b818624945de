//! The rules of single commands, by name: `rm`, `find`, disk tools, `git`, the kill family,
//! `tee`, `cp`/`mv`/`ln`, and the paths they judge (raw devices, startup files, system
//! folders).

use super::{
    check_source, check_words, danger, render, SAFE_DEVICES, SAFE_DEVICE_PREFIXES,
    STARTUP_FILE_NAMES, SYSTEM_PATHS, SYSTEM_STARTUP_FILES,
};
use crate::approval::argv::{
    command_name, has_option, is_long_option, is_short_cluster, join_texts, operands, option_value,
    short_value, unwrap, Invocation,
};
use crate::approval::shell::{SimpleCommand, Word};
use crate::approval::Danger;

pub(super) fn rm(argv: &[Word]) -> Option<Danger> {
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

pub(super) fn find(argv: &[Word], command: &SimpleCommand, depth: usize) -> Option<Danger> {
    let args = &argv[1..];
    let mut i = 0;
    while let Some(word) = args.get(i) {
        match word.text.as_str() {
            // A danger passed over (`classify_except`) lets the rest of the line be read:
            // `find . -delete -exec kill -9 -1 \;` holds two classes.
            "-delete" => {
                if let Some(found) = super::kept(Some(danger("find_delete", &render(argv)))) {
                    return Some(found);
                }
                i += 1;
            }
            "-exec" | "-execdir" | "-ok" | "-okdir" => {
                let start = i + 1;
                let end = args[start.min(args.len())..]
                    .iter()
                    .position(|w| w.text == ";" || w.text == "+")
                    .map_or(args.len(), |p| start + p);
                let run = &args[start.min(end)..end];
                if let Invocation::Argv(inner) = unwrap(run) {
                    if matches!(command_name(&inner[0].text), "rm" | "shred" | "unlink") {
                        let found = super::kept(Some(danger("find_delete", &render(argv))));
                        if found.is_some() {
                            return found;
                        }
                    }
                }
                if let Some(found) = super::kept(check_words(run, command, depth)) {
                    return Some(found);
                }
                i = end + 1;
            }
            _ => i += 1,
        }
    }
    None
}

pub(super) fn disk(argv: &[Word]) -> Option<Danger> {
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

pub(super) fn git(argv: &[Word], depth: usize) -> Option<Danger> {
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

pub(super) fn kill(argv: &[Word]) -> Option<Danger> {
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

pub(super) fn pkill(argv: &[Word]) -> Option<Danger> {
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

pub(super) fn killall(argv: &[Word]) -> Option<Danger> {
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

pub(super) fn tee(argv: &[Word]) -> Option<Danger> {
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

pub(super) fn copy(argv: &[Word]) -> Option<Danger> {
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

pub(super) fn is_raw_device(path: &str) -> bool {
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

pub(super) fn is_startup_file(path: &str) -> bool {
    let name = path.rsplit('/').next().unwrap_or(path);
    STARTUP_FILE_NAMES.contains(&name)
        || SYSTEM_STARTUP_FILES.contains(&path)
        || path.starts_with("/etc/profile.d/")
        || path.ends_with(".config/fish/config.fish")
}

pub(super) fn is_system_path(path: &str) -> bool {
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
