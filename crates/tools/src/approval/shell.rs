//! A small, lenient parser for the part of POSIX shell syntax the classifier needs.
//!
//! It turns a command string into [`Script`] -> [`Pipeline`] -> [`Command`] with quote removal,
//! and records every script the string would run on the side: command substitutions `$(...)`
//! and backticks, process substitutions `<(...)` / `>(...)`, and here-document bodies. The
//! classifier parses those again, recursively.
//!
//! Why not a word-splitting crate alone: `shlex`-style splitters know quotes but not operators
//! (`&&`, `|`, `;`, `>`), substitutions or here-documents. Splitting operators first and words
//! second would run two quoting models side by side, and where they disagree a dangerous command
//! slips through. One lexer that knows all of it is simpler to trust.
//!
//! Leniency is deliberate: the parser never fails. An unterminated quote ends at the end of the
//! string, a stray `)` separates commands, reserved words (`if`, `then`, `do`, ...) are skipped
//! in command position. Over-reading is fine for a classifier; an error path that hides a
//! command is not.

/// How deep `( ... )` and `{ ...; }` groups may nest before the parser flattens them (keeps
/// hostile input from exhausting the stack; the commands are still all seen).
const MAX_GROUP_DEPTH: usize = 64;

/// Reserved words that may start a command and are skipped there (`if rm -rf x; then ...`).
const RESERVED_PREFIXES: &[&str] = &[
    "if", "then", "else", "elif", "fi", "do", "done", "while", "until", "esac", "!",
];

/// One shell word after quote removal.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Word {
    /// The text after quote removal. Parameter expansions and substitutions stay as written
    /// (`$HOME`, `$(pwd)`), since their values are unknown here.
    pub text: String,
    /// Whether any part of the word was quoted or escaped.
    pub quoted: bool,
    /// Scripts that expanding this word runs, in order.
    pub subs: Vec<Substitution>,
}

/// A script run while a word expands.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Substitution {
    pub kind: SubstitutionKind,
    /// The inner script, as written (backslash escapes of backticks already undone).
    pub script: String,
}

/// Where a substitution's script comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum SubstitutionKind {
    /// `$(...)` or `` `...` ``: its output becomes text.
    Command,
    /// `<(...)`: its output is readable as a file.
    ProcessInput,
    /// `>(...)`: it reads what is written to a file.
    ProcessOutput,
}

/// What a redirection does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum RedirectOp {
    /// `>`, `>|`, `&>`, `>&file`: truncates the target.
    Write,
    /// `>>`, `&>>`.
    Append,
    /// `<>`: opens the target read-write without truncating.
    ReadWrite,
    /// `<`.
    Read,
    /// `>&N`, `<&N`, `>&-`: duplicates or closes a descriptor; no file.
    Duplicate,
    /// `<<` and `<<-`: the body is in [`Redirect::body`].
    HereDoc,
    /// `<<<`: the target word is the input.
    HereString,
}

/// One redirection of a command.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Redirect {
    pub op: RedirectOp,
    /// The file, descriptor, here-string or here-document delimiter.
    pub target: Word,
    /// A here-document's body (substitutions recorded when the delimiter was unquoted).
    pub body: Option<Word>,
}

/// A list of pipelines, whatever separates them (`;`, `&&`, `||`, `&`, newlines).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Script {
    pub pipelines: Vec<Pipeline>,
}

/// Commands joined by `|` or `|&`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Pipeline {
    pub commands: Vec<Command>,
}

/// One stage of a pipeline.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Command {
    /// Words and redirections.
    Simple(SimpleCommand),
    /// `( ... )` or `{ ...; }`, with the redirections that follow it.
    Group {
        body: Script,
        redirects: Vec<Redirect>,
    },
}

/// Words (assignments and wrappers included) and redirections.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct SimpleCommand {
    pub words: Vec<Word>,
    pub redirects: Vec<Redirect>,
}

/// Parses `source` leniently (see the module docs); never fails.
pub(crate) fn parse(source: &str) -> Script {
    let tokens = Lexer::new(source).run();
    Parser {
        tokens,
        pos: 0,
        depth: 0,
    }
    .script(Closer::End)
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum Op {
    /// `;`, `&&`, `||`, `&`, `;;`, `;&`, `;;&`: all just separate pipelines here.
    Separator,
    Newline,
    Pipe,
    Open,
    Close,
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum Token {
    Word(Word),
    Op(Op),
    Redirect(Redirect),
}

struct PendingHereDoc {
    token: usize,
    delimiter: String,
    strip_tabs: bool,
    quoted: bool,
}

struct Lexer {
    chars: Vec<char>,
    pos: usize,
    tokens: Vec<Token>,
    heredocs: Vec<PendingHereDoc>,
    /// How many `${...}` are open (they recurse through double quotes).
    nesting: usize,
}

impl Lexer {
    fn new(source: &str) -> Self {
        Lexer {
            chars: source.chars().collect(),
            pos: 0,
            tokens: Vec::new(),
            heredocs: Vec::new(),
            nesting: 0,
        }
    }

    fn peek(&self) -> Option<char> {
        self.chars.get(self.pos).copied()
    }

    fn peek_at(&self, offset: usize) -> Option<char> {
        self.chars.get(self.pos + offset).copied()
    }

    fn starts_with(&self, s: &str) -> bool {
        s.chars()
            .enumerate()
            .all(|(offset, expected)| self.peek_at(offset) == Some(expected))
    }

    fn run(mut self) -> Vec<Token> {
        loop {
            self.skip_blanks();
            let Some(c) = self.peek() else { break };
            match c {
                '\n' => {
                    self.pos += 1;
                    self.tokens.push(Token::Op(Op::Newline));
                    self.read_heredoc_bodies();
                }
                '#' => {
                    while self.peek().is_some_and(|c| c != '\n') {
                        self.pos += 1;
                    }
                }
                '<' | '>' if self.peek_at(1) == Some('(') => self.push_word(),
                '<' | '>' => self.read_redirect(),
                '&' if self.peek_at(1) == Some('>') => self.read_redirect(),
                '&' | '|' | ';' | '(' | ')' => self.read_operator(),
                _ => self.push_word(),
            }
        }
        // Here-documents still open at the end take the rest of the input (none is left).
        self.tokens
    }

    fn skip_blanks(&mut self) {
        loop {
            match self.peek() {
                Some(' ' | '\t' | '\r') => self.pos += 1,
                Some('\\') if self.peek_at(1) == Some('\n') => self.pos += 2,
                _ => break,
            }
        }
    }

    fn read_operator(&mut self) {
        const OPERATORS: &[(&str, Op)] = &[
            (";;&", Op::Separator),
            (";;", Op::Separator),
            (";&", Op::Separator),
            ("&&", Op::Separator),
            ("||", Op::Separator),
            ("|&", Op::Pipe),
            (";", Op::Separator),
            ("&", Op::Separator),
            ("|", Op::Pipe),
            ("(", Op::Open),
            (")", Op::Close),
        ];
        for (text, op) in OPERATORS {
            if self.starts_with(text) {
                self.pos += text.chars().count();
                self.tokens.push(Token::Op(op.clone()));
                return;
            }
        }
        // Unreachable for the characters `run` dispatches here; never loop forever regardless.
        self.pos += 1;
    }

    fn push_word(&mut self) {
        let start = self.pos;
        let word = self.read_word();
        // `2>file`: a word of digits right before `<` or `>` is a descriptor number.
        let is_fd = !word.quoted
            && !word.text.is_empty()
            && word.text.chars().all(|c| c.is_ascii_digit())
            && matches!(self.peek(), Some('<' | '>'))
            && self.peek_at(1) != Some('(');
        if is_fd {
            self.read_redirect();
        } else if self.pos == start {
            // Nothing readable here (cannot happen for the characters dispatched); move on.
            self.pos += 1;
        } else {
            self.tokens.push(Token::Word(word));
        }
    }

    fn read_redirect(&mut self) {
        const REDIRECTS: &[(&str, RedirectOp)] = &[
            ("&>>", RedirectOp::Append),
            ("&>", RedirectOp::Write),
            ("<<<", RedirectOp::HereString),
            ("<<-", RedirectOp::HereDoc),
            ("<<", RedirectOp::HereDoc),
            ("<>", RedirectOp::ReadWrite),
            ("<&", RedirectOp::Duplicate),
            ("<", RedirectOp::Read),
            (">>", RedirectOp::Append),
            (">|", RedirectOp::Write),
            (">&", RedirectOp::Duplicate),
            (">", RedirectOp::Write),
        ];
        let Some((text, mut op)) = REDIRECTS.iter().find(|(t, _)| self.starts_with(t)).cloned()
        else {
            self.pos += 1;
            return;
        };
        self.pos += text.chars().count();
        self.skip_blanks();
        let target = match self.peek() {
            Some(c) if !matches!(c, '\n' | ';' | '&' | '|' | '(' | ')' | '<' | '>') => {
                self.read_word()
            }
            _ => Word::default(),
        };
        let is_descriptor = target.text == "-" || target.text.chars().all(|c| c.is_ascii_digit());
        if op == RedirectOp::Duplicate && text == ">&" && !is_descriptor {
            // `>&file` is `&>file`: both streams to a file.
            op = RedirectOp::Write;
        }
        if op == RedirectOp::HereDoc {
            self.heredocs.push(PendingHereDoc {
                token: self.tokens.len(),
                delimiter: target.text.clone(),
                strip_tabs: text == "<<-",
                quoted: target.quoted,
            });
        }
        self.tokens.push(Token::Redirect(Redirect {
            op,
            target,
            body: None,
        }));
    }

    fn read_heredoc_bodies(&mut self) {
        for pending in std::mem::take(&mut self.heredocs) {
            let mut body = String::new();
            while self.pos < self.chars.len() {
                let end = self.chars[self.pos..]
                    .iter()
                    .position(|&c| c == '\n')
                    .map_or(self.chars.len(), |i| self.pos + i);
                let line: String = self.chars[self.pos..end].iter().collect();
                self.pos = (end + 1).min(self.chars.len());
                let line = if pending.strip_tabs {
                    line.trim_start_matches('\t').to_string()
                } else {
                    line
                };
                if line == pending.delimiter {
                    break;
                }
                body.push_str(&line);
                body.push('\n');
            }
            let body = if pending.quoted {
                Word {
                    text: body,
                    quoted: true,
                    subs: Vec::new(),
                }
            } else {
                // An unquoted delimiter expands the body like a double-quoted string.
                let mut inner = Lexer::new(&body);
                let mut word = Word::default();
                inner.read_double_quoted(&mut word, false);
                word
            };
            if let Some(Token::Redirect(redirect)) = self.tokens.get_mut(pending.token) {
                redirect.body = Some(body);
            }
        }
    }

    fn read_word(&mut self) -> Word {
        let mut word = Word::default();
        while let Some(c) = self.peek() {
            match c {
                ' ' | '\t' | '\r' | '\n' | ';' | '&' | '|' | '(' | ')' => break,
                '<' | '>' => {
                    let at_start = word.text.is_empty() && !word.quoted;
                    if !(at_start && self.peek_at(1) == Some('(')) {
                        break;
                    }
                    let kind = if c == '<' {
                        SubstitutionKind::ProcessInput
                    } else {
                        SubstitutionKind::ProcessOutput
                    };
                    self.read_parenthesised(&mut word, 2, kind);
                }
                '\\' => {
                    self.pos += 1;
                    match self.peek() {
                        Some('\n') => self.pos += 1,
                        Some(escaped) => {
                            word.text.push(escaped);
                            word.quoted = true;
                            self.pos += 1;
                        }
                        None => word.text.push('\\'),
                    }
                }
                '\'' => {
                    self.pos += 1;
                    word.quoted = true;
                    while let Some(c) = self.peek() {
                        self.pos += 1;
                        if c == '\'' {
                            break;
                        }
                        word.text.push(c);
                    }
                }
                '"' => {
                    self.pos += 1;
                    word.quoted = true;
                    self.read_double_quoted(&mut word, true);
                }
                '$' if self.peek_at(1) == Some('\'') => {
                    self.pos += 2;
                    word.quoted = true;
                    self.read_ansi_c_quoted(&mut word);
                }
                '$' if self.peek_at(1) == Some('"') => {
                    self.pos += 2;
                    word.quoted = true;
                    self.read_double_quoted(&mut word, true);
                }
                '$' => self.read_dollar(&mut word),
                '`' => self.read_backticks(&mut word),
                _ => {
                    word.text.push(c);
                    self.pos += 1;
                }
            }
        }
        word
    }

    /// Reads the inside of `"..."` (after the opening quote) into `word`; with `terminated`
    /// false (here-document bodies), reads to the end of the input.
    fn read_double_quoted(&mut self, word: &mut Word, terminated: bool) {
        while let Some(c) = self.peek() {
            match c {
                '"' if terminated => {
                    self.pos += 1;
                    return;
                }
                '\\' => {
                    self.pos += 1;
                    match self.peek() {
                        Some('\n') => self.pos += 1,
                        Some(e @ ('$' | '`' | '"' | '\\')) => {
                            word.text.push(e);
                            self.pos += 1;
                        }
                        _ => word.text.push('\\'),
                    }
                }
                '$' => self.read_dollar(word),
                '`' => self.read_backticks(word),
                _ => {
                    word.text.push(c);
                    self.pos += 1;
                }
            }
        }
    }

    /// `$'...'` (after the opening quote): backslash escapes are decoded for the common cases.
    fn read_ansi_c_quoted(&mut self, word: &mut Word) {
        while let Some(c) = self.peek() {
            self.pos += 1;
            match c {
                '\'' => return,
                '\\' => {
                    let Some(e) = self.peek() else {
                        word.text.push('\\');
                        return;
                    };
                    self.pos += 1;
                    // A character given by its code (`\x2f`, `\057`, `\u002f`, `\cA`) is not
                    // decoded: the backslash stays, so the text is not taken for the letters
                    // that follow it (`$'\x2fetc'` is `/etc`, not `x2fetc`).
                    if matches!(e, 'x' | 'u' | 'U' | 'c' | '0'..='7') {
                        word.text.push('\\');
                    }
                    word.text.push(match e {
                        'n' => '\n',
                        't' => '\t',
                        'r' => '\r',
                        'a' => '\u{7}',
                        'e' | 'E' => '\u{1b}',
                        other => other,
                    });
                }
                _ => word.text.push(c),
            }
        }
    }

    /// At a `$`: `$(...)`, `$((...))`, `${...}` or a plain `$`.
    fn read_dollar(&mut self, word: &mut Word) {
        match self.peek_at(1) {
            // `$((1+2))` parses as a substitution of the group `(1+2)`: harmless, and a
            // substitution nested inside arithmetic is still found.
            Some('(') => self.read_parenthesised(word, 2, SubstitutionKind::Command),
            Some('{') => self.read_braced_parameter(word),
            _ => {
                word.text.push('$');
                self.pos += 1;
            }
        }
    }

    /// Reads `$(`, `<(` or `>(` (the `prefix_len` opening characters) through the matching
    /// `)`, keeps the raw text in the word and records the inner script.
    fn read_parenthesised(&mut self, word: &mut Word, prefix_len: usize, kind: SubstitutionKind) {
        let start = self.pos;
        let inner_start = self.pos + prefix_len;
        let close = scan_parens(&self.chars, inner_start);
        let inner: String = self.chars[inner_start..close.min(self.chars.len())]
            .iter()
            .collect();
        self.pos = (close + 1).min(self.chars.len());
        word.text.extend(&self.chars[start..self.pos]);
        word.subs.push(Substitution {
            kind,
            script: inner,
        });
    }

    /// `${...}`: kept as text; substitutions inside (`${x:-$(cmd)}`) are recorded.
    fn read_braced_parameter(&mut self, word: &mut Word) {
        let start = self.pos;
        if self.nesting >= MAX_GROUP_DEPTH {
            // Hostile nesting: keep the rest as text.
            self.pos = self.chars.len();
            word.text.extend(&self.chars[start..]);
            return;
        }
        self.nesting += 1;
        self.pos += 2;
        let mut depth = 1usize;
        while let Some(c) = self.peek() {
            match c {
                '\\' => self.pos += 2,
                '\'' => self.pos = skip_single_quoted(&self.chars, self.pos + 1),
                '"' => {
                    self.pos += 1;
                    let mut inner = Word::default();
                    self.read_double_quoted(&mut inner, true);
                    word.subs.append(&mut inner.subs);
                }
                '`' => {
                    let mut inner = Word::default();
                    self.read_backticks(&mut inner);
                    word.subs.append(&mut inner.subs);
                }
                '$' if self.peek_at(1) == Some('(') => {
                    let mut inner = Word::default();
                    self.read_parenthesised(&mut inner, 2, SubstitutionKind::Command);
                    word.subs.append(&mut inner.subs);
                }
                '{' => {
                    depth += 1;
                    self.pos += 1;
                }
                '}' => {
                    depth -= 1;
                    self.pos += 1;
                    if depth == 0 {
                        break;
                    }
                }
                _ => self.pos += 1,
            }
        }
        self.pos = self.pos.min(self.chars.len());
        word.text.extend(&self.chars[start..self.pos]);
        self.nesting -= 1;
    }

    /// `` `...` ``: the inner script has `\\`, `` \` `` and `\$` unescaped.
    fn read_backticks(&mut self, word: &mut Word) {
        let start = self.pos;
        self.pos += 1;
        let mut script = String::new();
        while let Some(c) = self.peek() {
            self.pos += 1;
            match c {
                '`' => break,
                '\\' => match self.peek() {
                    Some(e @ ('\\' | '`' | '$')) => {
                        script.push(e);
                        self.pos += 1;
                    }
                    _ => script.push('\\'),
                },
                _ => script.push(c),
            }
        }
        word.text.extend(&self.chars[start..self.pos]);
        word.subs.push(Substitution {
            kind: SubstitutionKind::Command,
            script,
        });
    }
}

/// The index of the `)` that closes a `(` whose inside starts at `start`, or the input length
/// when it is never closed. Quotes, nested parentheses, substitutions and comments are
/// respected, so the inner script can be parsed on its own.
fn scan_parens(chars: &[char], start: usize) -> usize {
    scan_parens_nested(chars, start, 0)
}

fn scan_parens_nested(chars: &[char], start: usize, nesting: usize) -> usize {
    if nesting > MAX_GROUP_DEPTH {
        // Hostile nesting: the rest of the input is the inner script, which the classifier
        // bounds by its own depth limit.
        return chars.len();
    }
    let mut depth = 1usize;
    // `case` statements open inside: a `)` ending a pattern closes nothing.
    let mut cases = 0usize;
    // Here-documents whose bodies start at the next new line: (delimiter, strip tabs).
    let mut heredocs: Vec<(String, bool)> = Vec::new();
    let mut i = start;
    while i < chars.len() {
        match chars[i] {
            '\\' => i += 2,
            '\'' => i = skip_single_quoted(chars, i + 1),
            '"' => i = skip_double_quoted(chars, i + 1, nesting),
            '`' => i = skip_backticks(chars, i + 1),
            '#' if i == start || chars[i - 1].is_whitespace() => {
                while i < chars.len() && chars[i] != '\n' {
                    i += 1;
                }
            }
            '<' if chars.get(i + 1) == Some(&'<') => {
                if chars.get(i + 2) == Some(&'<') {
                    i += 3;
                } else {
                    let (delimiter, strip_tabs, after) = heredoc_delimiter(chars, i + 2);
                    heredocs.push((delimiter, strip_tabs));
                    i = after;
                }
            }
            '\n' if !heredocs.is_empty() => {
                i = skip_heredoc_bodies(chars, i + 1, &heredocs);
                heredocs.clear();
            }
            'c' if keyword_at(chars, i, "case") => {
                cases += 1;
                i += 4;
            }
            'e' if keyword_at(chars, i, "esac") => {
                cases = cases.saturating_sub(1);
                i += 4;
            }
            '(' => {
                depth += 1;
                i += 1;
            }
            ')' if depth == 1 && cases > 0 => i += 1,
            ')' => {
                depth -= 1;
                if depth == 0 {
                    return i;
                }
                i += 1;
            }
            _ => i += 1,
        }
    }
    chars.len()
}

/// Whether the word `keyword` stands at `i` (not inside a longer word).
fn keyword_at(chars: &[char], i: usize, keyword: &str) -> bool {
    let boundary = |c: Option<&char>| c.is_none_or(|c| c.is_whitespace() || ";&|()".contains(*c));
    let before = if i == 0 { None } else { chars.get(i - 1) };
    let len = keyword.chars().count();
    boundary(before)
        && chars
            .get(i..i + len)
            .is_some_and(|w| w.iter().copied().eq(keyword.chars()))
        && boundary(chars.get(i + len))
}

/// The delimiter of a here-document whose `<<` ends just before `i` (quotes removed), whether
/// its body's leading tabs are stripped (`<<-`), and the index after the delimiter word.
fn heredoc_delimiter(chars: &[char], mut i: usize) -> (String, bool, usize) {
    let strip_tabs = chars.get(i) == Some(&'-');
    if strip_tabs {
        i += 1;
    }
    while chars.get(i).is_some_and(|c| *c == ' ' || *c == '\t') {
        i += 1;
    }
    let mut delimiter = String::new();
    while let Some(&c) = chars.get(i) {
        if c.is_whitespace() || ";&|<>()".contains(c) {
            break;
        }
        if c != '\'' && c != '"' && c != '\\' {
            delimiter.push(c);
        }
        i += 1;
    }
    (delimiter, strip_tabs, i)
}

/// The index after the bodies of `heredocs`, which start at `i`: each ends at a line that is
/// its delimiter.
fn skip_heredoc_bodies(chars: &[char], mut i: usize, heredocs: &[(String, bool)]) -> usize {
    for (delimiter, strip_tabs) in heredocs {
        while i < chars.len() {
            let end = chars[i..]
                .iter()
                .position(|c| *c == '\n')
                .map_or(chars.len(), |p| i + p);
            let mut line = &chars[i..end];
            if *strip_tabs {
                while line.first() == Some(&'\t') {
                    line = &line[1..];
                }
            }
            i = (end + 1).min(chars.len());
            if line.iter().copied().eq(delimiter.chars()) {
                break;
            }
        }
    }
    i
}

/// The index just after the `'` closing a single-quoted string whose inside starts at `i`.
fn skip_single_quoted(chars: &[char], mut i: usize) -> usize {
    while i < chars.len() {
        if chars[i] == '\'' {
            return i + 1;
        }
        i += 1;
    }
    chars.len()
}

/// The index just after the `"` closing a double-quoted string whose inside starts at `i`.
fn skip_double_quoted(chars: &[char], mut i: usize, nesting: usize) -> usize {
    while i < chars.len() {
        match chars[i] {
            '\\' => i += 2,
            '"' => return i + 1,
            '`' => i = skip_backticks(chars, i + 1),
            '$' if chars.get(i + 1) == Some(&'(') => {
                i = scan_parens_nested(chars, i + 2, nesting + 1) + 1;
            }
            _ => i += 1,
        }
    }
    chars.len()
}

/// The index just after the closing backtick of a substitution whose inside starts at `i`.
fn skip_backticks(chars: &[char], mut i: usize) -> usize {
    while i < chars.len() {
        match chars[i] {
            '\\' => i += 2,
            '`' => return i + 1,
            _ => i += 1,
        }
    }
    chars.len()
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Closer {
    End,
    Paren,
    Brace,
}

struct Parser {
    tokens: Vec<Token>,
    pos: usize,
    depth: usize,
}

impl Parser {
    fn peek(&self) -> Option<&Token> {
        self.tokens.get(self.pos)
    }

    fn peek_is_word(&self, text: &str) -> bool {
        self.is_word_at(self.pos, text)
    }

    fn is_word_at(&self, at: usize, text: &str) -> bool {
        matches!(self.tokens.get(at), Some(Token::Word(w)) if !w.quoted && w.text == text)
    }

    /// Whether a group opens at token `at` (`(` or `{`).
    fn group_at(&self, at: usize) -> bool {
        matches!(self.tokens.get(at), Some(Token::Op(Op::Open))) || self.is_word_at(at, "{")
    }

    fn script(&mut self, closer: Closer) -> Script {
        let mut script = Script::default();
        loop {
            match self.peek() {
                None => return script,
                Some(Token::Op(Op::Close)) => {
                    self.pos += 1;
                    if closer == Closer::Paren {
                        return script;
                    }
                    // A stray `)` (a `case` pattern, say) just separates commands.
                }
                Some(Token::Op(Op::Separator | Op::Newline | Op::Pipe)) => self.pos += 1,
                Some(Token::Word(w)) if closer == Closer::Brace && !w.quoted && w.text == "}" => {
                    self.pos += 1;
                    return script;
                }
                _ => {
                    let before = self.pos;
                    let pipeline = self.pipeline(closer);
                    if !pipeline.commands.is_empty() {
                        script.pipelines.push(pipeline);
                    }
                    if self.pos == before {
                        // No progress (cannot happen with the rules above); never spin.
                        self.pos += 1;
                    }
                }
            }
        }
    }

    fn pipeline(&mut self, closer: Closer) -> Pipeline {
        let mut pipeline = Pipeline::default();
        loop {
            if let Some(command) = self.command(closer) {
                pipeline.commands.push(command);
            }
            if !matches!(self.peek(), Some(Token::Op(Op::Pipe))) {
                return pipeline;
            }
            self.pos += 1;
            while matches!(self.peek(), Some(Token::Op(Op::Newline))) {
                self.pos += 1;
            }
        }
    }

    fn command(&mut self, closer: Closer) -> Option<Command> {
        loop {
            if RESERVED_PREFIXES.iter().any(|r| self.peek_is_word(r)) {
                self.pos += 1;
            } else if self.peek_is_word("function") {
                // `function name { ...; }`: the body follows as a group.
                self.pos += 2;
            } else if self.peek_is_word("time") && {
                let mut at = self.pos + 1;
                while self.is_word_at(at, "-p") {
                    at += 1;
                }
                self.group_at(at)
            } {
                // `time { ...; }`, `time -p ( ... )`: the keyword times a group. (Before a
                // simple command, `time` is left to the wrappers, with its options.)
                self.pos += 1;
                while self.peek_is_word("-p") {
                    self.pos += 1;
                }
            } else if self.peek_is_word("coproc") {
                // `coproc cmd`, `coproc NAME { ...; }`.
                self.pos += 1;
                if self.group_at(self.pos + 1) {
                    self.pos += 1;
                }
            } else {
                break;
            }
        }
        let opens_group =
            matches!(self.peek(), Some(Token::Op(Op::Open))) || self.peek_is_word("{");
        if opens_group {
            let inner = if matches!(self.peek(), Some(Token::Op(Op::Open))) {
                Closer::Paren
            } else {
                Closer::Brace
            };
            self.pos += 1;
            if self.depth >= MAX_GROUP_DEPTH {
                // Too deep: the opener is dropped and the contents read as if ungrouped.
                return None;
            }
            self.depth += 1;
            let body = self.script(inner);
            self.depth -= 1;
            let mut redirects = Vec::new();
            while let Some(Token::Redirect(r)) = self.peek() {
                redirects.push(r.clone());
                self.pos += 1;
            }
            return Some(Command::Group { body, redirects });
        }
        let mut simple = SimpleCommand::default();
        loop {
            match self.peek() {
                Some(Token::Word(w)) => {
                    if simple.words.is_empty()
                        && closer == Closer::Brace
                        && !w.quoted
                        && w.text == "}"
                    {
                        break;
                    }
                    simple.words.push(w.clone());
                }
                Some(Token::Redirect(r)) => simple.redirects.push(r.clone()),
                Some(Token::Op(_)) | None => break,
            }
            self.pos += 1;
        }
        if simple.words.is_empty() && simple.redirects.is_empty() {
            None
        } else {
            Some(Command::Simple(simple))
        }
    }
}

#[cfg(test)]
mod tests;
