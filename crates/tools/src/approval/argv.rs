//! Reading a simple command's words (`docs/approvals.md`, "How commands are checked"): the
//! wrappers peeled off in front of the command that runs (`sudo`, `env`, `timeout`, `flock`,
//! ...), and the option syntax the rules need to see through: short clusters (`-rf`, `-uroot`),
//! long options written out, with `=value` or abbreviated (`--recu`), and operands.
//!
//! Pure functions on [`Word`]s; the rules in `rules.rs` decide what is dangerous.

use super::shell::Word;

/// A simple command's words with its wrappers peeled off.
pub(super) enum Invocation<'w> {
    /// The command that runs, and its arguments.
    Argv(&'w [Word]),
    /// `env -S STRING`: a string split into a command line.
    Split(String),
    /// A shell that reads its script from standard input: `ssh host` with no command,
    /// `sudo -i` / `sudo -s` with none.
    StdinShell,
    /// Nothing runs (only assignments, or `command -v`).
    Nothing,
}

pub(super) fn unwrap(words: &[Word]) -> Invocation<'_> {
    let mut rest = words;
    loop {
        while rest.first().is_some_and(is_assignment) {
            rest = &rest[1..];
        }
        let Some(first) = rest.first() else {
            return Invocation::Nothing;
        };
        let args = &rest[1..];
        rest = match command_name(&first.text) {
            "sudo" => {
                let (options, command) = split_options(
                    args,
                    "CDghpRrTtUu",
                    &[
                        "--user",
                        "--group",
                        "--close-from",
                        "--chdir",
                        "--host",
                        "--prompt",
                        "--chroot",
                        "--role",
                        "--type",
                        "--command-timeout",
                        "--other-user",
                    ],
                );
                // `sudo -i` / `sudo -s` alone: a root shell reading this command's stdin.
                let shell =
                    has_option(options, 'i', "--login") || has_option(options, 's', "--shell");
                if command.is_empty() && shell {
                    return Invocation::StdinShell;
                }
                command
            }
            "docker" | "podman" | "nerdctl" => match args.first().map(|w| w.text.as_str()) {
                Some("exec") => container_exec(&args[1..]),
                Some("compose") => match compose_exec(&args[1..]) {
                    Some(command) => command,
                    None => return Invocation::Argv(rest),
                },
                _ => return Invocation::Argv(rest),
            },
            "docker-compose" => match compose_exec(args) {
                Some(command) => command,
                None => return Invocation::Argv(rest),
            },
            "kubectl" | "oc" => match kubectl_exec(args) {
                Some(command) => command,
                None => return Invocation::Argv(rest),
            },
            "doas" => skip_options(args, "uC", &[]),
            "env" => match env_command(args) {
                Ok(command) => command,
                Err(split) => return Invocation::Split(split),
            },
            "command" => {
                let describes = args
                    .iter()
                    .take_while(|w| w.text.starts_with('-') && w.text != "--")
                    .any(|w| w.text.contains(['v', 'V']));
                if describes {
                    return Invocation::Nothing;
                }
                skip_options(args, "", &[])
            }
            "exec" => skip_options(args, "a", &[]),
            "nohup" | "builtin" | "busybox" | "setsid" => skip_options(args, "", &[]),
            "time" => skip_options(args, "fo", &["--format", "--output"]),
            "nice" => skip_options(args, "n", &["--adjustment"]),
            "ionice" => skip_options(
                args,
                "cnpPu",
                &["--class", "--classdata", "--pid", "--pgid", "--uid"],
            ),
            "timeout" => {
                let after = skip_options(args, "sk", &["--signal", "--kill-after"]);
                // The first operand is the duration.
                after.get(1..).unwrap_or_default()
            }
            "stdbuf" => skip_options(args, "ioe", &["--input", "--output", "--error"]),
            "xargs" => skip_options(
                args,
                "adEILnPs",
                &[
                    "--arg-file",
                    "--delimiter",
                    "--max-lines",
                    "--max-args",
                    "--max-procs",
                    "--max-chars",
                    "--process-slot-var",
                ],
            ),
            "unbuffer" | "eatmydata" | "catchsegv" | "valgrind" => skip_options(args, "p", &[]),
            "fakeroot" => skip_options(args, "lsib", &["--lib", "--faked"]),
            "torsocks" => skip_options(args, "upaP", &["--user", "--pass", "--address", "--port"]),
            "proxychains" | "proxychains4" => skip_options(args, "f", &[]),
            "pkexec" => skip_options(args, "", &["--user"]),
            // `runuser -u USER [--] COMMAND...` runs the command itself (`runuser -c '...'`
            // is `su`'s form, checked as a script).
            "runuser" if has_option(args, 'u', "--user") => skip_options(
                args,
                "ugGsw",
                &[
                    "--user",
                    "--group",
                    "--supp-group",
                    "--shell",
                    "--whitelist-environment",
                ],
            ),
            // GNU parallel runs its command once per argument after `:::`; a command given as
            // one word goes through a shell.
            "parallel" => {
                let command = skip_options(
                    args,
                    "jSadEINnPsC",
                    &[
                        "--jobs",
                        "--sshlogin",
                        "--arg-file",
                        "--delimiter",
                        "--colsep",
                        "--joblog",
                        "--results",
                        "--tmpdir",
                        "--workdir",
                        "--timeout",
                        "--retries",
                        "--halt",
                        "--max-args",
                        "--max-replace-args",
                        "--max-procs",
                    ],
                );
                if command
                    .first()
                    .is_some_and(|w| w.text.contains(char::is_whitespace))
                {
                    return Invocation::Split(join_texts(command));
                }
                command
            }
            "strace" => skip_options(
                args,
                "abeEIoOpPsSuUX",
                &[
                    "--output",
                    "--attach",
                    "--trace-path",
                    "--string-limit",
                    "--summary-sort-by",
                    "--user",
                    "--env",
                    "--columns",
                ],
            ),
            "ltrace" => skip_options(args, "aADeFlnopsuwx", &["--output", "--library"]),
            "nsenter" => skip_options(args, "tSG", &["--target", "--setuid", "--setgid"]),
            "unshare" => skip_options(
                args,
                "SGRw",
                &[
                    "--setuid",
                    "--setgid",
                    "--root",
                    "--wd",
                    "--propagation",
                    "--setgroups",
                    "--map-user",
                    "--map-group",
                    "--map-users",
                    "--map-groups",
                ],
            ),
            "setpriv" => skip_options(args, "", SETPRIV_LONG_WITH_ARG),
            "prlimit" => skip_options(args, "p", &["--pid", "--output"]),
            "numactl" => skip_options(
                args,
                "iNmCpPw",
                &[
                    "--interleave",
                    "--cpunodebind",
                    "--membind",
                    "--physcpubind",
                    "--preferred",
                    "--preferred-many",
                    "--weighted-interleave",
                ],
            ),
            // The first operand is a directory, a CPU mask, a priority or a time.
            "chroot" => after_operand(skip_options(args, "", &["--userspec", "--groups"])),
            "faketime" => after_operand(skip_options(args, "", &[])),
            "taskset" => {
                let (options, rest) = split_options(args, "", &[]);
                if has_option(options, 'p', "--pid") {
                    return Invocation::Nothing;
                }
                after_operand(rest)
            }
            "chrt" => {
                let (options, rest) = split_options(
                    args,
                    "TPD",
                    &["--sched-runtime", "--sched-period", "--sched-deadline"],
                );
                if has_option(options, 'p', "--pid") || has_option(options, 'm', "--max") {
                    return Invocation::Nothing;
                }
                // The priority may be left out for policies without one.
                match rest.first() {
                    Some(w) if w.text.chars().all(|c| c.is_ascii_digit()) => &rest[1..],
                    _ => rest,
                }
            }
            // `flock FILE COMMAND...` or `flock FILE -c STRING`.
            "flock" => {
                let rest = after_operand(skip_options(
                    args,
                    "wE",
                    &["--timeout", "--wait", "--conflict-exit-code"],
                ));
                match rest.first().map(|w| w.text.as_str()) {
                    Some(c) if c == "-c" || is_long_option(c, "--command") => {
                        return Invocation::Split(join_texts(rest.get(1..2).unwrap_or_default()));
                    }
                    _ => rest,
                }
            }
            // `script -c STRING`; without one it starts an interactive shell.
            "script" => {
                return match option_value(args, 'c', "--command", "BEIOTmo") {
                    Some(text) => Invocation::Split(text.to_string()),
                    None => Invocation::Nothing,
                }
            }
            // `sg GROUP [-c] COMMAND`: the rest is given to `sh -c`.
            "sg" => {
                let rest = match args.first() {
                    Some(w) if w.text == "-" => &args[1..],
                    _ => args,
                };
                let rest = after_operand(rest);
                let rest = match rest.first() {
                    Some(w) if w.text == "-c" => &rest[1..],
                    _ => rest,
                };
                return if rest.is_empty() {
                    Invocation::Nothing
                } else {
                    Invocation::Split(join_texts(rest))
                };
            }
            // The remote side runs the rest as a shell command line.
            "ssh" => return ssh(args),
            // `watch` passes its arguments to `sh -c`.
            "watch" => {
                let after = skip_options(args, "n", &["--interval"]);
                return if after.is_empty() {
                    Invocation::Nothing
                } else {
                    Invocation::Split(join_texts(after))
                };
            }
            _ => return Invocation::Argv(rest),
        };
    }
}

/// `ssh [options] host [options] [--] [command]`: OpenSSH reads options after the host too,
/// until `--` or the command. With no command the remote shell reads this one's stdin.
fn ssh(args: &[Word]) -> Invocation<'_> {
    let mut i = 0;
    let mut host = false;
    while let Some(word) = args.get(i) {
        let a = word.text.as_str();
        if a == "--" {
            i += 1;
            if !host {
                host = i < args.len();
                i += 1;
            }
            break;
        }
        if is_short_cluster(a) {
            let value_follows =
                short_value(a, "BbcDEeFIiJLlmOoPpQRSWw").is_some_and(|(_, value)| value.is_empty());
            i += if value_follows { 2 } else { 1 };
        } else if host {
            break;
        } else {
            host = true;
            i += 1;
        }
    }
    match args.get(i..) {
        _ if !host => Invocation::Nothing,
        Some(remote) if !remote.is_empty() => Invocation::Split(join_texts(remote)),
        _ => Invocation::StdinShell,
    }
}

/// `docker exec [options] CONTAINER COMMAND...` (also podman, nerdctl): the command.
fn container_exec(args: &[Word]) -> &[Word] {
    after_operand(skip_options(
        args,
        "eluw",
        &[
            "--env",
            "--env-file",
            "--user",
            "--workdir",
            "--detach-keys",
        ],
    ))
}

/// `docker compose [options] exec|run [options] SERVICE COMMAND...` (also `docker-compose`):
/// the command, or `None` for another subcommand.
fn compose_exec(args: &[Word]) -> Option<&[Word]> {
    let rest = skip_options(
        args,
        "fp",
        &[
            "--file",
            "--project-name",
            "--project-directory",
            "--env-file",
            "--profile",
        ],
    );
    let (subcommand, rest) = rest.split_first()?;
    if !matches!(subcommand.text.as_str(), "exec" | "run") {
        return None;
    }
    Some(after_operand(skip_options(
        rest,
        "euwp",
        &[
            "--env",
            "--user",
            "--workdir",
            "--index",
            "--name",
            "--entrypoint",
            "--publish",
            "--volume",
        ],
    )))
}

/// `kubectl [options] exec [options] POD [--] COMMAND...` (also `oc`): the command, or `None`
/// for another subcommand.
fn kubectl_exec(args: &[Word]) -> Option<&[Word]> {
    let rest = skip_options(
        args,
        "ns",
        &[
            "--namespace",
            "--context",
            "--cluster",
            "--user",
            "--kubeconfig",
            "--server",
        ],
    );
    let (subcommand, rest) = rest.split_first()?;
    if subcommand.text != "exec" {
        return None;
    }
    if let Some(dash) = rest.iter().position(|w| w.text == "--") {
        return Some(&rest[dash + 1..]);
    }
    Some(after_operand(skip_options(
        rest,
        "nc",
        &["--namespace", "--container", "--context"],
    )))
}

/// setpriv's long options that take a value.
pub(super) const SETPRIV_LONG_WITH_ARG: &[&str] = &[
    "--reuid",
    "--regid",
    "--ruid",
    "--euid",
    "--rgid",
    "--egid",
    "--groups",
    "--inh-caps",
    "--ambient-caps",
    "--bounding-set",
    "--securebits",
    "--pdeathsig",
    "--selinux-label",
    "--apparmor-profile",
    "--landlock-access",
    "--landlock-rule",
    "--seccomp-filter",
];

/// What follows a wrapper's first operand (`chroot DIR COMMAND...`).
pub(super) fn after_operand(args: &[Word]) -> &[Word] {
    args.get(1..).unwrap_or_default()
}

/// Whether the options hold the short option `short` (in any cluster) or the long `long`.
pub(super) fn has_option(options: &[Word], short: char, long: &str) -> bool {
    options.iter().any(|w| {
        is_long_option(&w.text, long) || (is_short_cluster(&w.text) && w.text.contains(short))
    })
}

/// The value of an option given as `-c VALUE`, `-cVALUE`, `--command VALUE` or
/// `--command=VALUE` (abbreviations included), anywhere among `args`. `short_with_arg` lists the
/// other short options that take a value, so that `-oc` is not taken for `-c`.
pub(super) fn option_value<'w>(
    args: &'w [Word],
    short: char,
    long: &str,
    short_with_arg: &str,
) -> Option<&'w str> {
    let mut with_arg = short_with_arg.to_string();
    with_arg.push(short);
    for (i, word) in args.iter().enumerate() {
        let a = word.text.as_str();
        if a == "--" {
            break;
        }
        let next = || args.get(i + 1).map(|w| w.text.as_str());
        if a.starts_with("--") {
            if is_long_option(a, long) {
                return a.split_once('=').map(|(_, value)| value).or_else(next);
            }
        } else if let Some((option, value)) = short_value(a, &with_arg) {
            if option == short {
                return if value.is_empty() {
                    next()
                } else {
                    Some(value)
                };
            }
        }
    }
    None
}

/// `env`'s arguments: the command after its options and assignments, or the `-S` string.
pub(super) fn env_command(args: &[Word]) -> Result<&[Word], String> {
    let mut i = 0;
    while let Some(word) = args.get(i) {
        let a = word.text.as_str();
        if a == "--" {
            i += 1;
            break;
        }
        let long = a.starts_with("--");
        let split = if long {
            is_long_option(a, "--split-string")
                .then(|| a.split_once('=').map_or("", |(_, value)| value))
        } else {
            short_value(a, "uCS")
                .filter(|(option, _)| *option == 'S')
                .map(|(_, value)| value)
        };
        if let Some(split) = split {
            let mut split = split.to_string();
            for word in &args[(i + 1).min(args.len())..] {
                if !split.is_empty() {
                    split.push(' ');
                }
                split.push_str(&word.text);
            }
            return Err(split);
        }
        let takes_value = if long {
            !a.contains('=') && (is_long_option(a, "--unset") || is_long_option(a, "--chdir"))
        } else {
            short_value(a, "uC").is_some_and(|(_, value)| value.is_empty())
        };
        match a {
            _ if takes_value => i += 2,
            _ if a.starts_with('-') && a.len() > 1 => i += 1,
            _ => break,
        }
    }
    Ok(&args[i.min(args.len())..])
}

/// The arguments after a wrapper's options. `short_with_arg` lists the short options that take
/// a value (`-u root` or `-uroot`); `long_with_arg` the long ones written without `=` (also
/// abbreviated: `--us root` is `--user root`).
pub(super) fn skip_options<'w>(
    args: &'w [Word],
    short_with_arg: &str,
    long_with_arg: &[&str],
) -> &'w [Word] {
    let (_, rest) = split_options(args, short_with_arg, long_with_arg);
    rest
}

/// A wrapper's arguments split into its options and what follows them (see [`skip_options`]).
pub(super) fn split_options<'w>(
    args: &'w [Word],
    short_with_arg: &str,
    long_with_arg: &[&str],
) -> (&'w [Word], &'w [Word]) {
    let mut i = 0;
    while let Some(word) = args.get(i) {
        let a = word.text.as_str();
        if a == "--" {
            return (&args[..i], &args[i + 1..]);
        }
        let value_follows = if a.starts_with("--") {
            !a.contains('=') && long_with_arg.iter().any(|o| is_long_option(a, o))
        } else if is_short_cluster(a) {
            short_value(a, short_with_arg).is_some_and(|(_, value)| value.is_empty())
        } else {
            break;
        };
        i += if value_follows { 2 } else { 1 };
    }
    let end = i.min(args.len());
    (&args[..end], &args[end..])
}

/// Whether `text` is the long option `name` (`--recursive`), written out or abbreviated as
/// getopt_long and git accept it (`--recu`, `--rec=x`): an ambiguous abbreviation counts too,
/// since the real command refuses it anyway.
pub(super) fn is_long_option(text: &str, name: &str) -> bool {
    let (Some(given), Some(name)) = (text.strip_prefix("--"), name.strip_prefix("--")) else {
        return false;
    };
    let given = given.split_once('=').map_or(given, |(given, _)| given);
    !given.is_empty() && name.starts_with(given)
}

/// In a short option cluster (`-iS...`, `-uroot`), the first option that takes a value and the
/// text written after it (empty when the value is the next word).
pub(super) fn short_value<'t>(text: &'t str, with_arg: &str) -> Option<(char, &'t str)> {
    if !is_short_cluster(text) {
        return None;
    }
    let cluster = &text[1..];
    cluster
        .char_indices()
        .find(|(_, letter)| with_arg.contains(*letter))
        .map(|(at, letter)| (letter, &cluster[at + letter.len_utf8()..]))
}

/// Whether `text` is a short option cluster (`-rf`), not a long option or a lone `-`.
pub(super) fn is_short_cluster(text: &str) -> bool {
    text.len() > 1 && text.starts_with('-') && !text.starts_with("--")
}

pub(super) fn push_text(out: &mut String, text: &str) {
    if !out.is_empty() {
        out.push(' ');
    }
    out.push_str(text);
}

pub(super) fn join_texts(words: &[Word]) -> String {
    let mut out = String::new();
    for word in words {
        push_text(&mut out, &word.text);
    }
    out
}

/// Arguments that are not options (everything after `--` counts).
pub(super) fn operands(args: &[Word]) -> impl Iterator<Item = &Word> {
    let mut options_done = false;
    args.iter().filter(move |w| {
        if options_done {
            return true;
        }
        if w.text == "--" {
            options_done = true;
            return false;
        }
        !(w.text.len() > 1 && w.text.starts_with('-'))
    })
}

/// `NAME=value` (also `NAME+=value`) before a command.
pub(super) fn is_assignment(word: &Word) -> bool {
    let Some((name, _)) = word.text.split_once('=') else {
        return false;
    };
    let name = name.strip_suffix('+').unwrap_or(name);
    let mut chars = name.chars();
    chars
        .next()
        .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_')
}

/// The command's name without its directory (`/usr/bin/rm` is `rm`).
pub(super) fn command_name(text: &str) -> &str {
    text.rsplit('/').next().unwrap_or(text)
}
