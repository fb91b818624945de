//! The import graph of each crate's top-level modules has no cycle ("Done when").
//!
//! For every crate root under `crates/*/src` (`lib.rs`, and `main.rs` as its own crate), the
//! test walks the module tree from the root's `mod x;` declarations, and records an edge
//! `a -> b` when a file of top-level module `a` names `crate::b` (in a path, a `use` tree, or a
//! macro's tokens), or `super::...::b` climbing to the root, or a name the root re-exports from
//! `b` (`pub use b::Name;`), or links to `crate::b` in its docs (a lower layer's docs do not
//! point up either). Items under `#[cfg(test)]`, and the files of `#[cfg(test)] mod x;`, are
//! left out: a test module may reach anywhere. It fails naming each cycle, with a file holding
//! each edge. Files are read as Rust tokens (`proc-macro2`), so plain comments and string
//! literals never count.

// Test helpers: clippy.toml's allow-unwrap-in-tests covers only #[test] functions.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use proc_macro2::{Delimiter, TokenStream, TokenTree};

/// The import graph of one crate root.
#[derive(Default)]
struct Graph {
    /// Top-level modules, each with the modules it names and where (preferring code).
    edges: BTreeMap<String, BTreeMap<String, Site>>,
    /// Names `lib.rs` re-exports, with the top-level module each comes from.
    reexports: BTreeMap<String, String>,
}

/// Where an edge was seen: a file, and whether only in doc comments there.
#[derive(Debug, Clone, PartialEq)]
struct Site {
    file: PathBuf,
    doc_only: bool,
}

/// What one file names and declares.
#[derive(Default)]
struct Found {
    /// Crate-level names used in code.
    code: BTreeSet<String>,
    /// Crate-level names in intra-doc links (`[`crate::x`]`): a lower module's docs pointing
    /// up the layers count too.
    docs: BTreeSet<String>,
    /// Modules declared with `mod x;` (not under `#[cfg(test)]`), as paths from this file.
    children: Vec<Vec<String>>,
}

/// A file being scanned: where it sits in the module tree.
struct Scan<'a> {
    file: &'a Path,
    /// Its module path from the crate root (empty for the root itself).
    module: Vec<String>,
}

fn workspace_crates() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("crates/test-support sits in crates/")
        .to_path_buf()
}

fn parse(file: &Path) -> TokenStream {
    let text =
        std::fs::read_to_string(file).unwrap_or_else(|e| panic!("reading {}: {e}", file.display()));
    text.parse()
        .unwrap_or_else(|e| panic!("{} is not Rust tokens: {e:?}", file.display()))
}

fn is_punct(t: Option<&TokenTree>, c: char) -> bool {
    matches!(t, Some(TokenTree::Punct(p)) if p.as_char() == c)
}

fn ident(t: Option<&TokenTree>) -> Option<String> {
    match t {
        Some(TokenTree::Ident(i)) => Some(i.to_string()),
        _ => None,
    }
}

/// `#[cfg(test)]` exactly (the `#` at `i`).
fn is_cfg_test(tokens: &[TokenTree], i: usize) -> bool {
    if !is_punct(tokens.get(i), '#') {
        return false;
    }
    let Some(TokenTree::Group(g)) = tokens.get(i + 1) else {
        return false;
    };
    g.delimiter() == Delimiter::Bracket && g.stream().to_string().replace(' ', "") == "cfg(test)"
}

/// Index just past the item that starts at `i`: its further attributes, then everything up
/// to a `;` or a `{...}` group (a `mod x;` so skipped is never walked into).
fn skip_item(tokens: &[TokenTree], mut i: usize) -> usize {
    while is_punct(tokens.get(i), '#') && matches!(tokens.get(i + 1), Some(TokenTree::Group(_))) {
        i += 2;
    }
    while let Some(t) = tokens.get(i) {
        i += 1;
        match t {
            TokenTree::Punct(p) if p.as_char() == ';' => break,
            TokenTree::Group(g) if g.delimiter() == Delimiter::Brace => break,
            _ => {}
        }
    }
    i
}

/// The first segment of each entry of a `use` group: `{a::b, c, self}` gives `a`, `c`.
fn group_heads(stream: TokenStream) -> Vec<String> {
    let tokens: Vec<TokenTree> = stream.into_iter().collect();
    let mut heads = Vec::new();
    let mut at_start = true;
    for t in &tokens {
        if is_punct(Some(t), ',') {
            at_start = true;
        } else if at_start {
            at_start = false;
            if let Some(name) = ident(Some(t)).filter(|n| n != "self") {
                heads.push(name);
            }
        }
    }
    heads
}

/// After `crate` or a root-reaching `super` chain at `i` (the token after the last `::`): the
/// crate-level names it uses.
fn names_at(tokens: &[TokenTree], i: usize) -> Vec<String> {
    match tokens.get(i) {
        Some(TokenTree::Ident(name)) => vec![name.to_string()],
        Some(TokenTree::Group(g)) if g.delimiter() == Delimiter::Brace => group_heads(g.stream()),
        _ => Vec::new(),
    }
}

/// `::` at `i`.
fn is_path_sep(tokens: &[TokenTree], i: usize) -> bool {
    is_punct(tokens.get(i), ':') && is_punct(tokens.get(i + 1), ':')
}

/// `crate::x` in the text of a doc attribute (`doc = "..."`).
fn doc_links(attribute: TokenStream, found: &mut Found) {
    let tokens: Vec<TokenTree> = attribute.into_iter().collect();
    if ident(tokens.first()).as_deref() != Some("doc") || !is_punct(tokens.get(1), '=') {
        return;
    }
    let Some(TokenTree::Literal(text)) = tokens.get(2) else {
        return;
    };
    let text = text.to_string();
    for (at, _) in text.match_indices("crate::") {
        let name: String = text[at + "crate::".len()..]
            .chars()
            .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
            .collect();
        if !name.is_empty() {
            found.docs.insert(name);
        }
    }
}

/// What `tokens` name (outside `#[cfg(test)]` items) and declare.
fn scan(tokens: &[TokenTree], at: &Scan, inline: &mut Vec<String>, found: &mut Found) {
    let mut i = 0;
    while i < tokens.len() {
        if is_cfg_test(tokens, i) {
            i = skip_item(tokens, i + 2);
            continue;
        }
        if is_punct(tokens.get(i), '#') {
            let bang = usize::from(is_punct(tokens.get(i + 1), '!'));
            if let Some(TokenTree::Group(g)) = tokens.get(i + 1 + bang) {
                if g.delimiter() == Delimiter::Bracket {
                    doc_links(g.stream(), found);
                }
            }
        }
        let here = ident(tokens.get(i));
        match here.as_deref() {
            Some("crate") if is_path_sep(tokens, i + 1) => {
                found.code.extend(names_at(tokens, i + 3));
            }
            Some("super") => {
                // `super::super::x`: does the chain climb to the crate root?
                let mut ups = 0;
                let mut j = i;
                while ident(tokens.get(j)).as_deref() == Some("super") && is_path_sep(tokens, j + 1)
                {
                    ups += 1;
                    j += 3;
                }
                let depth = at.module.len() + inline.len();
                if ups > 0 && ups == depth {
                    found.code.extend(names_at(tokens, j));
                }
                i = j.max(i + 1);
                continue;
            }
            Some("mod") => {
                if let Some(name) = ident(tokens.get(i + 1)) {
                    match tokens.get(i + 2) {
                        Some(TokenTree::Punct(p)) if p.as_char() == ';' => {
                            let mut path = inline.clone();
                            path.push(name);
                            found.children.push(path);
                            i += 3;
                            continue;
                        }
                        Some(TokenTree::Group(g)) if g.delimiter() == Delimiter::Brace => {
                            inline.push(name);
                            let inner: Vec<TokenTree> = g.stream().into_iter().collect();
                            scan(&inner, at, inline, found);
                            inline.pop();
                            i += 3;
                            continue;
                        }
                        _ => {}
                    }
                }
            }
            _ => {}
        }
        if let Some(TokenTree::Group(g)) = tokens.get(i) {
            let inner: Vec<TokenTree> = g.stream().into_iter().collect();
            scan(&inner, at, inline, found);
        }
        i += 1;
    }
}

/// The file of module `path` (relative to the root's folder `src`).
fn module_file(src: &Path, path: &[String]) -> PathBuf {
    let mut dir = src.to_path_buf();
    for part in &path[..path.len() - 1] {
        dir.push(part);
    }
    let name = &path[path.len() - 1];
    let flat = dir.join(format!("{name}.rs"));
    if flat.exists() {
        flat
    } else {
        dir.join(name).join("mod.rs")
    }
}

/// `pub use m::Name;` and `pub use m::{A, B as C};` in the root: `Name`, `A`, `C` come from `m`.
fn reexports(tokens: &[TokenTree]) -> BTreeMap<String, String> {
    let mut out = BTreeMap::new();
    for (i, t) in tokens.iter().enumerate() {
        if ident(Some(t)).as_deref() != Some("pub")
            || ident(tokens.get(i + 1)).as_deref() != Some("use")
        {
            continue;
        }
        let Some(module) = ident(tokens.get(i + 2)) else {
            continue;
        };
        let mut j = i + 3;
        let mut last = None;
        while let Some(t) = tokens.get(j) {
            match t {
                TokenTree::Punct(p) if p.as_char() == ';' => break,
                TokenTree::Ident(name) => last = Some(name.to_string()),
                TokenTree::Group(g) => {
                    let inner: Vec<TokenTree> = g.stream().into_iter().collect();
                    for entry in inner.split(|t| is_punct(Some(t), ',')) {
                        if let Some(name) = entry.iter().rev().find_map(|t| ident(Some(t))) {
                            out.insert(name, module.clone());
                        }
                    }
                }
                _ => {}
            }
            j += 1;
        }
        if let Some(name) = last {
            out.insert(name, module.clone());
        }
    }
    out
}

/// The graph of the crate whose root file is `root`.
fn graph_of(root: &Path) -> Graph {
    let src = root.parent().expect("a root file sits in src/");
    let tokens: Vec<TokenTree> = parse(root).into_iter().collect();
    let mut graph = Graph {
        reexports: reexports(&tokens),
        ..Graph::default()
    };
    let root_scan = Scan {
        file: root,
        module: Vec::new(),
    };
    let mut found = Found::default();
    scan(&tokens, &root_scan, &mut Vec::new(), &mut found);
    let mut pending = found.children;
    for top in &pending {
        graph.edges.entry(top[0].clone()).or_default();
    }
    while let Some(module) = pending.pop() {
        let file = module_file(src, &module);
        let tokens: Vec<TokenTree> = parse(&file).into_iter().collect();
        let at = Scan {
            file: &file,
            module: module.clone(),
        };
        let mut found = Found::default();
        scan(&tokens, &at, &mut Vec::new(), &mut found);
        let top = &module[0];
        let named = found.code.iter().map(|n| (n, false));
        let linked = found.docs.iter().map(|n| (n, true));
        for (name, doc_only) in named.chain(linked) {
            let target = if graph.edges.contains_key(name) {
                Some(name.clone())
            } else {
                graph
                    .reexports
                    .get(name)
                    .filter(|m| graph.edges.contains_key(*m))
                    .cloned()
            };
            let Some(target) = target.filter(|t| t != top) else {
                continue;
            };
            let site = Site {
                file: at.file.to_path_buf(),
                doc_only,
            };
            let edges = graph.edges.entry(top.clone()).or_default();
            match edges.get(&target) {
                Some(seen) if !seen.doc_only || doc_only => {}
                _ => {
                    edges.insert(target, site);
                }
            }
        }
        for child in found.children {
            let mut path = module.clone();
            path.extend(child);
            pending.push(path);
        }
    }
    graph
}

/// The strongly connected components of more than one module (Tarjan), each sorted.
fn cycles(graph: &Graph) -> Vec<Vec<String>> {
    struct Tarjan<'a> {
        graph: &'a Graph,
        index: BTreeMap<&'a str, usize>,
        low: BTreeMap<&'a str, usize>,
        stack: Vec<&'a str>,
        on_stack: BTreeSet<&'a str>,
        found: Vec<Vec<String>>,
    }
    impl<'a> Tarjan<'a> {
        fn visit(&mut self, v: &'a str) {
            let n = self.index.len();
            self.index.insert(v, n);
            self.low.insert(v, n);
            self.stack.push(v);
            self.on_stack.insert(v);
            for w in self.graph.edges[v].keys() {
                let w = w.as_str();
                if !self.index.contains_key(w) {
                    self.visit(w);
                    let low = self.low[v].min(self.low[w]);
                    self.low.insert(v, low);
                } else if self.on_stack.contains(w) {
                    let low = self.low[v].min(self.index[w]);
                    self.low.insert(v, low);
                }
            }
            if self.low[v] == self.index[v] {
                let mut component = Vec::new();
                while let Some(w) = self.stack.pop() {
                    self.on_stack.remove(w);
                    component.push(w.to_string());
                    if w == v {
                        break;
                    }
                }
                if component.len() > 1 {
                    component.sort();
                    self.found.push(component);
                }
            }
        }
    }
    let mut t = Tarjan {
        graph,
        index: BTreeMap::new(),
        low: BTreeMap::new(),
        stack: Vec::new(),
        on_stack: BTreeSet::new(),
        found: Vec::new(),
    };
    for v in graph.edges.keys() {
        if !t.index.contains_key(v.as_str()) {
            t.visit(v);
        }
    }
    t.found.sort();
    t.found
}

/// One shortest cycle through the component's first module, as `a -> b -> a`.
fn one_cycle(graph: &Graph, component: &[String]) -> Vec<String> {
    let start = &component[0];
    let inside: BTreeSet<&String> = component.iter().collect();
    let mut came_from: BTreeMap<&String, &String> = BTreeMap::new();
    let mut queue = std::collections::VecDeque::from([start]);
    while let Some(v) = queue.pop_front() {
        for w in graph.edges[v].keys().filter(|w| inside.contains(w)) {
            if w == start {
                let mut chain = Vec::new();
                let mut at = v;
                while at != start {
                    chain.push(at.clone());
                    at = came_from[at];
                }
                chain.reverse();
                let mut path = vec![start.clone()];
                path.extend(chain);
                path.push(start.clone());
                return path;
            }
            if !came_from.contains_key(w) {
                came_from.insert(w, v);
                queue.push_back(w);
            }
        }
    }
    unreachable!("a strongly connected component has a cycle through each member")
}

/// Every crate root: `(name, root file)`.
fn roots() -> Vec<(String, PathBuf)> {
    let mut roots = Vec::new();
    let crates = workspace_crates();
    let mut dirs: Vec<PathBuf> = std::fs::read_dir(&crates)
        .expect("crates/ is readable")
        .map(|e| e.expect("a crates/ entry").path())
        .collect();
    dirs.sort();
    for dir in dirs {
        let name = dir.file_name().unwrap().to_string_lossy().into_owned();
        for (file, label) in [
            ("lib.rs", name.clone()),
            ("main.rs", format!("{name} (main.rs)")),
        ] {
            let root = dir.join("src").join(file);
            if root.exists() {
                roots.push((label, root));
            }
        }
    }
    roots
}

#[test]
fn no_crate_has_an_import_cycle_between_its_top_level_modules() {
    let roots = roots();
    assert!(roots.len() >= 5, "found only {roots:?}");
    let mut report = String::new();
    for (name, root) in &roots {
        let graph = graph_of(root);
        for component in cycles(&graph) {
            let cycle = one_cycle(&graph, &component);
            let _ = writeln!(
                report,
                "{name}: {} (all of {{{}}} reach each other)",
                cycle.join(" -> "),
                component.join(", ")
            );
            for pair in cycle.windows(2) {
                let site = &graph.edges[&pair[0]][&pair[1]];
                let shown = site
                    .file
                    .strip_prefix(workspace_crates())
                    .unwrap_or(&site.file);
                let how = if site.doc_only {
                    " (a doc link only)"
                } else {
                    ""
                };
                let _ = writeln!(
                    report,
                    "    {} -> {}: crates/{}{how}",
                    pair[0],
                    pair[1],
                    shown.display()
                );
            }
        }
    }
    assert!(
        report.is_empty(),
        "import cycles between top-level modules:\n{report}"
    );
}

// The scanner itself, on small sources.

fn graph_from(files: &[(&str, &str)]) -> Graph {
    let dir = tempfile::tempdir().expect("tempdir");
    for (path, text) in files {
        let path = dir.path().join("src").join(path);
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(path, text).unwrap();
    }
    graph_of(&dir.path().join("src/lib.rs"))
}

fn edges(graph: &Graph) -> Vec<(String, String)> {
    graph
        .edges
        .iter()
        .flat_map(|(a, to)| to.keys().map(move |b| (a.clone(), b.clone())))
        .collect()
}

#[test]
fn the_scanner_follows_paths_use_trees_super_macros_and_reexports_but_not_tests() {
    let graph = graph_from(&[
        (
            "lib.rs",
            "mod a; pub mod b; mod c; mod d; mod e;\n\
             #[cfg(test)] mod tests;\n\
             pub use e::{Thing, Other as Renamed};",
        ),
        (
            "a.rs",
            "use crate::{b::X, self as _, c};\n\
             // crate::d in a comment does not count\n\
             /// A doc link to [`crate::b`] does not hide the code edge.\n\
             fn f() -> &'static str { \"crate::d in a string does not count\" }\n\
             #[cfg(test)]\nmod tests { use crate::d; }\n\
             #[cfg(test)] fn only_in_tests() { crate::d::f(); }\n\
             mod inner;",
        ),
        ("a/inner.rs", "fn g() { super::super::e::h(); }"),
        (
            "b.rs",
            "macro_rules! m { () => { $crate::c::go() }; }\nfn f() { let _ = crate::Renamed; }",
        ),
        (
            "c.rs",
            "fn f() { tokio::select! { _ = crate::d::x() => {} } }",
        ),
        (
            "d.rs",
            "#[cfg(test)]\nmod tests;\nfn f() { super::c::y(); }",
        ),
        ("d/tests.rs", "use crate::a;"),
        (
            "e.rs",
            "//! Used by [`crate::a`].\npub struct Thing; pub struct Other;",
        ),
        ("tests.rs", "use crate::a;"),
    ]);
    assert_eq!(
        edges(&graph),
        [
            ("a".into(), "b".into()),
            ("a".into(), "c".into()),
            ("a".into(), "e".into()),
            ("b".into(), "c".into()),
            ("b".into(), "e".into()),
            ("c".into(), "d".into()),
            ("d".into(), "c".into()),
            ("e".into(), "a".into()),
        ]
    );
    assert!(!graph.edges["a"]["b"].doc_only);
    assert!(graph.edges["e"]["a"].doc_only);
    assert_eq!(
        cycles(&graph),
        [
            // a -> b -> e (through the re-export) -> a (through a doc link).
            vec!["a".to_string(), "b".to_string(), "e".to_string()],
            vec!["c".to_string(), "d".to_string()]
        ]
    );
    assert_eq!(
        one_cycle(&graph, &["c".into(), "d".into()]),
        ["c", "d", "c"]
    );
}

#[test]
fn a_longer_cycle_is_named_in_order() {
    let graph = graph_from(&[
        ("lib.rs", "mod a; mod b; mod c;"),
        ("a.rs", "use crate::b;"),
        ("b.rs", "use crate::c::X;"),
        ("c.rs", "fn f() { crate::a::g() }"),
    ]);
    assert_eq!(one_cycle(&graph, &cycles(&graph)[0]), ["a", "b", "c", "a"]);
}
