//! The shell parser's unit tests: operators, quotes, substitutions, redirections,
//! here-documents, groups, and input that must never make it fail.

use super::*;

fn simple_words(script: &Script) -> Vec<Vec<String>> {
    let mut out = Vec::new();
    collect(script, &mut out);
    out
}

fn collect(script: &Script, out: &mut Vec<Vec<String>>) {
    for pipeline in &script.pipelines {
        for command in &pipeline.commands {
            match command {
                Command::Simple(s) => {
                    out.push(s.words.iter().map(|w| w.text.clone()).collect());
                }
                Command::Group { body, .. } => collect(body, out),
            }
        }
    }
}

#[test]
fn operators_split_commands_outside_quotes_only() {
    let script = parse(r#"ls -l && echo "a && b" ; printf 'x;y'|wc -c || true &"#);
    assert_eq!(
        simple_words(&script),
        vec![
            vec!["ls", "-l"],
            vec!["echo", "a && b"],
            vec!["printf", "x;y"],
            vec!["wc", "-c"],
            vec!["true"],
        ]
    );
    assert_eq!(script.pipelines[2].commands.len(), 2);
}

#[test]
fn quotes_and_escapes_are_removed() {
    let script = parse(r#"r\m -"rf" 'a b'"c"d \$HOME $'x\ty'"#);
    assert_eq!(
        simple_words(&script),
        vec![vec!["rm", "-rf", "a bcd", "$HOME", "x\ty"]]
    );
}

#[test]
fn substitutions_are_recorded_with_their_scripts() {
    let script = parse(r#"echo "$(rm -rf "x)")" `ls \`pwd\`` <(curl u) ${a:-$(id)}"#);
    let Command::Simple(cmd) = &script.pipelines[0].commands[0] else {
        panic!("simple command expected");
    };
    let subs: Vec<(SubstitutionKind, &str)> = cmd
        .words
        .iter()
        .flat_map(|w| w.subs.iter().map(|s| (s.kind, s.script.as_str())))
        .collect();
    assert_eq!(
        subs,
        vec![
            (SubstitutionKind::Command, r#"rm -rf "x)""#),
            (SubstitutionKind::Command, "ls `pwd`"),
            (SubstitutionKind::ProcessInput, "curl u"),
            (SubstitutionKind::Command, "id"),
        ]
    );
}

#[test]
fn redirections_are_read_with_descriptors_and_targets() {
    let script = parse("cmd 2>/dev/null >out >>log <in &>all 2>&1 >&file <<<'here'");
    let Command::Simple(cmd) = &script.pipelines[0].commands[0] else {
        panic!("simple command expected");
    };
    assert_eq!(cmd.words.len(), 1);
    let redirects: Vec<(RedirectOp, &str)> = cmd
        .redirects
        .iter()
        .map(|r| (r.op, r.target.text.as_str()))
        .collect();
    assert_eq!(
        redirects,
        vec![
            (RedirectOp::Write, "/dev/null"),
            (RedirectOp::Write, "out"),
            (RedirectOp::Append, "log"),
            (RedirectOp::Read, "in"),
            (RedirectOp::Write, "all"),
            (RedirectOp::Duplicate, "1"),
            (RedirectOp::Write, "file"),
            (RedirectOp::HereString, "here"),
        ]
    );
}

#[test]
fn heredoc_bodies_attach_to_their_redirect() {
    let script =
        parse("psql <<EOF\nDROP TABLE $(id);\nEOF\ncat <<-'X'\n\tplain $(no)\n\tX\necho after");
    let bodies: Vec<(String, usize)> = script
        .pipelines
        .iter()
        .flat_map(|p| &p.commands)
        .filter_map(|c| match c {
            Command::Simple(s) => s.redirects.first().and_then(|r| r.body.clone()),
            Command::Group { .. } => None,
        })
        .map(|b| (b.text, b.subs.len()))
        .collect();
    assert_eq!(
        bodies,
        vec![
            ("DROP TABLE $(id);\n".to_string(), 1),
            ("plain $(no)\n".to_string(), 0)
        ]
    );
    assert_eq!(
        simple_words(&script).last(),
        Some(&vec!["echo".to_string(), "after".to_string()])
    );
}

#[test]
fn groups_reserved_words_and_functions_expose_inner_commands() {
    let script = parse("(cd x; rm y) | { sort; } ; if true; then echo a; fi; f() { id; }");
    assert_eq!(
        simple_words(&script),
        vec![
            vec!["cd", "x"],
            vec!["rm", "y"],
            vec!["sort"],
            vec!["true"],
            vec!["echo", "a"],
            vec!["f"],
            vec!["id"],
        ]
    );
    assert!(matches!(
        script.pipelines[0].commands[0],
        Command::Group { .. }
    ));
}

#[test]
fn unterminated_and_hostile_input_never_fails() {
    for input in [
        "echo 'open",
        "echo \"$(",
        "((((((",
        "))))",
        "`",
        "${",
        "<<",
        "a |",
        "\\",
    ] {
        let _ = parse(input);
    }
    let deep = "(".repeat(10_000) + "rm -rf x" + &")".repeat(10_000);
    assert_eq!(simple_words(&parse(&deep)), vec![vec!["rm", "-rf", "x"]]);
}
