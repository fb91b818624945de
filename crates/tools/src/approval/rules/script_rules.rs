//! The rules of scripts a command line runs inside itself: a shell's `-c` string, file or
//! stdin (and `su -c`), an interpreter's program (awk, Python, Perl, Ruby, Node, PHP), a
//! download fed to a shell, and SQL fed to a database client.

use super::{
    check_source, danger, render, render_word, AWKS, DOWNLOADERS, INTERPRETERS, MAX_DEPTH, SHELLS,
    SQL_CLIENTS, TREE_DELETES,
};
use crate::approval::argv::{
    command_name, is_long_option, is_short_cluster, join_texts, operands, push_text, short_value,
    unwrap, Invocation,
};
use crate::approval::shell::{
    self, Command, RedirectOp, Script, SimpleCommand, SubstitutionKind, Word,
};
use crate::approval::Danger;

/// A program in another language (`awk '...'`, `python3 -c '...'`, `perl -e '...'`, or one
/// read from a here-document or here-string): a download run as the program, a tree delete by
/// library call, or a string it hands to a shell (see [`check_program`]).
pub(super) fn program(
    argv: &[Word],
    command: &SimpleCommand,
    runs: &[&str],
    depth: usize,
) -> Option<Danger> {
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
pub(super) fn check_program(
    code: &str,
    runs: &[&str],
    shown: &str,
    depth: usize,
) -> Option<Danger> {
    // A danger passed over (`classify_except`) lets the program's command strings be read.
    if TREE_DELETES.iter().any(|call| code.contains(call)) || node_tree_delete(code) {
        let found = super::kept(Some(danger("recursive_delete", shown)));
        if found.is_some() {
            return found;
        }
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

pub(super) fn su(argv: &[Word], command: &SimpleCommand, depth: usize) -> Option<Danger> {
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

pub(super) fn shell(argv: &[Word], command: &SimpleCommand, depth: usize) -> Option<Danger> {
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
pub(super) fn stdin_script(
    words: &[Word],
    command: &SimpleCommand,
    depth: usize,
) -> Option<Danger> {
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
pub(super) fn split_reads_stdin(source: &str) -> bool {
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

pub(super) fn reads_script_from_stdin(argv: &[Word]) -> bool {
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
pub(super) fn is_interpreter(name: &str) -> bool {
    INTERPRETERS.contains(&name) || name.starts_with("python")
}

/// Whether a substitution in `word` downloads something (its output then becomes a script).
pub(super) fn subs_download(word: &Word, depth: usize) -> bool {
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

pub(super) fn command_downloads(command: &Command, depth: usize) -> bool {
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
pub(super) fn sql_client_position(argv: &[Word]) -> Option<usize> {
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
pub(super) fn sql(argv: &[Word], command: &SimpleCommand) -> Option<Danger> {
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
pub(super) fn sql_danger(text: &str) -> Option<&'static str> {
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
pub(super) fn printed_script(command: &Command, out: &mut String) {
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
pub(super) fn command_text(command: &Command, out: &mut String) {
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
pub(super) fn is_shell_variable(text: &str) -> bool {
    let name = text
        .trim_start_matches('$')
        .trim_start_matches('{')
        .trim_end_matches('}');
    text.starts_with('$') && matches!(name, "SHELL" | "BASH" | "ZSH_NAME" | "0")
}
