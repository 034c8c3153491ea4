//! The code's map stays true and its modules form no circles.
//!
//! - Every module that has parts lists them in its `//! Parts:` doc (`//! - `name`: ...`), no
//!   more and no fewer than it declares.
//! - Between the parts of any one module, imports go one way: a part may use what its parent
//!   defines, and its siblings, but no two siblings (files or whole folders) use each other,
//!   directly or round a longer loop. `tests` modules are left out: they may reach anywhere.
//! - The README's map and `docs/architecture.md`'s "where changes go" table name folders that
//!   exist, and the README's Layout stays short.
//! - No source file passes 600 lines before its tests.
//! - The agent's library is `pub` only in the parts its `//! Face:` doc names.
//! - The test bed turns on no feature in a crate of the agent's build, so the demo's build
//!   reuses the image's.
//!
//! The sources are read as text: `use` trees and `crate::`, `super::`, `self::` and child-module
//! paths, with comments and string literals blanked first.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// One module of a crate: its path from the crate root, its file, its declared children.
struct Module {
    path: Vec<String>,
    file: PathBuf,
    children: Vec<String>,
}

/// The crates whose module trees are checked, by root file (a binary's `main.rs` is its own tree).
const ROOTS: &[&str] = &[
    "agent/src/lib.rs",
    "agent/src/main.rs",
    "contract/src/lib.rs",
    "kubelet-rules/src/lib.rs",
    "entrypoint/src/lib.rs",
    "entrypoint/src/main.rs",
    "testbed/src/lib.rs",
    "testbed/src/main.rs",
    "e2e/src/lib.rs",
];

fn repo() -> &'static Path {
    exitorder_e2e::repo()
}

/// A path as the repository names it.
fn relative(path: &Path) -> String {
    path.strip_prefix(repo())
        .unwrap_or(path)
        .display()
        .to_string()
}

fn read(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// The source with comments and string and char literals blanked (same length, same lines).
fn code_only(src: &str) -> String {
    let b = src.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    let blank = |c: u8| if c == b'\n' { b'\n' } else { b' ' };
    while i < b.len() {
        let rest = &b[i..];
        if rest.starts_with(b"//") {
            while i < b.len() && b[i] != b'\n' {
                out.push(b' ');
                i += 1;
            }
        } else if rest.starts_with(b"/*") {
            let mut depth = 0;
            while i < b.len() {
                if b[i..].starts_with(b"/*") {
                    depth += 1;
                    out.extend_from_slice(b"  ");
                    i += 2;
                } else if b[i..].starts_with(b"*/") {
                    depth -= 1;
                    out.extend_from_slice(b"  ");
                    i += 2;
                    if depth == 0 {
                        break;
                    }
                } else {
                    out.push(blank(b[i]));
                    i += 1;
                }
            }
        } else if raw_string_at(b, i) {
            // A raw string: r"...", r#"..."#, br##"..."##: as many hashes closing as opening.
            let start = i;
            while b[i] != b'r' {
                i += 1;
            }
            i += 1;
            let mut hashes = 0;
            while b[i] == b'#' {
                hashes += 1;
                i += 1;
            }
            i += 1;
            let mut close = vec![b'"'];
            close.extend(std::iter::repeat_n(b'#', hashes));
            while i < b.len() && !b[i..].starts_with(&close) {
                i += 1;
            }
            i = (i + close.len()).min(b.len());
            out.extend(b[start..i].iter().map(|&c| blank(c)));
        } else if b[i] == b'"' {
            out.push(b' ');
            i += 1;
            while i < b.len() && b[i] != b'"' {
                if b[i] == b'\\' {
                    out.push(b' ');
                    i += 1;
                }
                if i < b.len() {
                    out.push(blank(b[i]));
                    i += 1;
                }
            }
            out.push(b' ');
            i += 1;
        } else if b[i] == b'\'' && (rest.get(2) == Some(&b'\'') || (rest.get(1) == Some(&b'\\'))) {
            // A char literal ('a', '\n', '\''), not a lifetime.
            let start = i;
            i += if rest.get(1) == Some(&b'\\') { 3 } else { 2 };
            while i < b.len() && b[i] != b'\'' {
                i += 1;
            }
            i += 1;
            out.extend(b[start..i.min(b.len())].iter().map(|&c| blank(c)));
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    out.truncate(b.len());
    String::from_utf8_lossy(&out).into_owned()
}

/// Whether a raw string literal (`r"`, `r#"`, `br##"`...) starts at `i`, not a raw identifier.
fn raw_string_at(b: &[u8], i: usize) -> bool {
    let ident = |c: u8| c.is_ascii_alphanumeric() || c == b'_';
    if i > 0 && ident(b[i - 1]) {
        return false;
    }
    let mut j = i;
    if b.get(j) == Some(&b'b') {
        j += 1;
    }
    if b.get(j) != Some(&b'r') {
        return false;
    }
    j += 1;
    while b.get(j) == Some(&b'#') {
        j += 1;
    }
    b.get(j) == Some(&b'"')
}

/// The product part of a file: what comes before its `#[cfg(test)]` module of tests (any
/// visibility, other attributes between).
fn without_tests(code: &str) -> &str {
    let lines: Vec<(usize, &str)> = code
        .split_inclusive('\n')
        .scan(0, |at, l| {
            let start = *at;
            *at += l.len();
            Some((start, l))
        })
        .collect();
    for (i, (at, line)) in lines.iter().enumerate() {
        if !line.trim_start().starts_with("#[cfg(test)]") {
            continue;
        }
        let next = lines[i + 1..]
            .iter()
            .map(|(_, l)| l.trim_start())
            .find(|l| !l.starts_with("#["));
        let item = next.map(|l| strip_visibility(l.trim_start()));
        if item.is_some_and(|l| l.starts_with("mod ")) {
            return &code[..*at];
        }
    }
    code
}

/// An item's text without its `pub`, `pub(crate)`, `pub(super)`, `pub(self)` or `pub(in ...)`.
fn strip_visibility(item: &str) -> &str {
    let Some(rest) = item.strip_prefix("pub") else {
        return item;
    };
    let rest = rest.trim_start();
    match rest.strip_prefix('(') {
        Some(inner) => inner
            .find(')')
            .map_or(item, |end| inner[end + 1..].trim_start()),
        None => rest,
    }
}

/// The `mod name;` declarations of a file (not inline modules, not `tests`).
fn declared_children(code: &str) -> Vec<String> {
    let mut out = Vec::new();
    for line in code.lines() {
        let mut t = line.trim();
        if t.starts_with("#[") {
            // A one-line attribute before the declaration: `#[cfg(...)] mod x;`.
            t = t.find(']').map_or(t, |end| t[end + 1..].trim_start());
        }
        t = strip_visibility(t);
        if let Some(rest) = t.strip_prefix("mod ") {
            if let Some(name) = rest.trim().strip_suffix(';') {
                if name != "tests" {
                    out.push(name.trim().to_string());
                }
            }
        }
    }
    out
}

/// The file of a child module, as rustc finds it.
fn child_file(parent: &Path, name: &str) -> PathBuf {
    let stem = parent.file_stem().and_then(|s| s.to_str()).unwrap_or("");
    let dir = parent.parent().unwrap_or(Path::new("."));
    let dir = if matches!(stem, "mod" | "lib" | "main") {
        dir.to_path_buf()
    } else {
        dir.join(stem)
    };
    let flat = dir.join(format!("{name}.rs"));
    if flat.exists() {
        flat
    } else {
        dir.join(name).join("mod.rs")
    }
}

/// Every module of the crate rooted at `root`.
fn modules(root: &Path) -> Vec<Module> {
    let mut out = Vec::new();
    let mut todo = vec![(Vec::<String>::new(), root.to_path_buf())];
    while let Some((path, file)) = todo.pop() {
        let code = code_only(&read(&file));
        let children = declared_children(without_tests(&code));
        for c in &children {
            let mut p = path.clone();
            p.push(c.clone());
            let f = child_file(&file, c);
            assert!(f.exists(), "{}: `mod {c};` has no file", file.display());
            todo.push((p, f));
        }
        out.push(Module {
            path,
            file,
            children,
        });
    }
    out
}

/// The names listed under a file's `//! Parts:` (`//! - `name`...` or `//! - [`name`]...`).
fn listed_parts(src: &str) -> Option<BTreeSet<String>> {
    let mut lines = src
        .lines()
        .map(str::trim)
        .take_while(|l| l.starts_with("//!") || l.is_empty() || l.starts_with("#!"));
    lines
        .by_ref()
        .find(|l| l.trim_start_matches("//!").trim() == "Parts:")?;
    let mut names = BTreeSet::new();
    for l in lines {
        let Some(item) = l.strip_prefix("//!") else {
            break;
        };
        let item = item.trim();
        let Some(item) = item.strip_prefix("- ") else {
            if item.is_empty() {
                break;
            }
            continue; // an item's continuation line
        };
        let item = item.trim_start_matches('[');
        if let Some(rest) = item.strip_prefix('`') {
            if let Some(end) = rest.find('`') {
                names.insert(rest[..end].trim_end_matches('/').to_string());
            }
        }
    }
    Some(names)
}

#[test]
fn every_module_with_parts_lists_them() {
    let mut wrong = Vec::new();
    for root in ROOTS {
        for m in modules(&repo().join(root)) {
            if m.children.is_empty() {
                continue;
            }
            let rel = relative(&m.file);
            let declared: BTreeSet<String> = m.children.iter().cloned().collect();
            match listed_parts(&read(&m.file)) {
                None => wrong.push(format!("{rel}: no `//! Parts:` list ({declared:?})")),
                Some(listed) => {
                    let missing: Vec<_> = declared.difference(&listed).collect();
                    let extra: Vec<_> = listed.difference(&declared).collect();
                    if !missing.is_empty() || !extra.is_empty() {
                        wrong.push(format!(
                            "{rel}: Parts misses {missing:?}, lists what is not a module: {extra:?}"
                        ));
                    }
                }
            }
        }
    }
    assert!(wrong.is_empty(), "maps out of date:\n{}", wrong.join("\n"));
}

/// The module paths a file's code names: `use` trees expanded, and inline paths.
fn named_paths(code: &str) -> Vec<Vec<String>> {
    let mut out = Vec::new();
    // `use` trees, braces expanded.
    let mut rest = code;
    while let Some(at) = find_word(rest, "use") {
        let after = &rest[at + 3..];
        let Some(end) = after.find(';') else { break };
        expand_use(after[..end].trim(), Vec::new(), &mut out);
        rest = &after[end..];
    }
    // Inline paths: every `a::b::c` run of identifiers.
    let bytes = code.as_bytes();
    let mut i = 0;
    while i < bytes.len() {
        let is_ident = |c: u8| c.is_ascii_alphanumeric() || c == b'_';
        if is_ident(bytes[i]) && (i == 0 || !(is_ident(bytes[i - 1]) || bytes[i - 1] == b':')) {
            let start = i;
            let mut j = i;
            loop {
                while j < bytes.len() && is_ident(bytes[j]) {
                    j += 1;
                }
                if code[j..].starts_with("::") && bytes.get(j + 2).is_some_and(|&c| is_ident(c)) {
                    j += 2;
                } else {
                    break;
                }
            }
            let run = &code[start..j];
            if run.contains("::") {
                out.push(run.split("::").map(str::to_string).collect());
            }
            i = j.max(i + 1);
        } else {
            i += 1;
        }
    }
    out
}

fn find_word(s: &str, word: &str) -> Option<usize> {
    let b = s.as_bytes();
    let mut from = 0;
    while let Some(at) = s[from..].find(word) {
        let at = from + at;
        let before_ok = at == 0 || !(b[at - 1].is_ascii_alphanumeric() || b[at - 1] == b'_');
        let after = b.get(at + word.len()).copied().unwrap_or(b' ');
        if before_ok && after.is_ascii_whitespace() {
            return Some(at);
        }
        from = at + word.len();
    }
    None
}

/// `a::{b, c::{d, e}}` into `a::b`, `a::c::d`, `a::c::e`.
fn expand_use(tree: &str, prefix: Vec<String>, out: &mut Vec<Vec<String>>) {
    let tree = tree.trim();
    if let Some(open) = tree.find('{') {
        let head = tree[..open].trim_end_matches("::").trim();
        let mut p = prefix;
        p.extend(
            head.split("::")
                .filter(|s| !s.is_empty())
                .map(|s| s.trim().to_string()),
        );
        let inner = &tree[open + 1..tree.rfind('}').unwrap_or(tree.len())];
        let mut depth = 0;
        let mut start = 0;
        for (k, c) in inner.char_indices() {
            match c {
                '{' => depth += 1,
                '}' => depth -= 1,
                ',' if depth == 0 => {
                    expand_use(&inner[start..k], p.clone(), out);
                    start = k + 1;
                }
                _ => {}
            }
        }
        expand_use(&inner[start..], p, out);
    } else {
        let tree = tree.split(" as ").next().unwrap_or("").trim();
        if tree.is_empty() {
            return;
        }
        let mut p = prefix;
        p.extend(tree.split("::").map(|s| s.trim().to_string()));
        out.push(p);
    }
}

/// The deepest module a path names, from the module `at` (None: outside the crate).
fn resolve(tree: &BTreeSet<Vec<String>>, at: &[String], path: &[String]) -> Option<Vec<String>> {
    let mut base: Vec<String>;
    let mut segs = path;
    match segs.first().map(String::as_str) {
        Some("crate") => {
            base = Vec::new();
            segs = &segs[1..];
        }
        Some("self") => {
            base = at.to_vec();
            segs = &segs[1..];
        }
        Some("super") => {
            base = at.to_vec();
            while segs.first().map(String::as_str) == Some("super") {
                base.pop()?;
                segs = &segs[1..];
            }
        }
        Some(first) => {
            // A relative path: only a child module of this one counts.
            let mut child = at.to_vec();
            child.push(first.to_string());
            if !tree.contains(&child) {
                return None;
            }
            base = at.to_vec();
        }
        None => return None,
    }
    for s in segs {
        let mut next = base.clone();
        next.push(s.clone());
        if tree.contains(&next) {
            base = next;
        } else {
            break;
        }
    }
    Some(base)
}

/// Part -> (part it uses, what shows it).
type Graph = BTreeMap<String, BTreeSet<(String, String)>>;

/// For each module, the edges between its parts: part A uses something in part B.
fn sibling_edges(root: &Path) -> BTreeMap<Vec<String>, Graph> {
    let mods = modules(root);
    let tree: BTreeSet<Vec<String>> = mods.iter().map(|m| m.path.clone()).collect();
    let mut edges: BTreeMap<Vec<String>, Graph> = BTreeMap::new();
    for m in &mods {
        let code = code_only(&read(&m.file));
        let rel = relative(&m.file);
        for path in named_paths(without_tests(&code)) {
            let Some(target) = resolve(&tree, &m.path, &path) else {
                continue;
            };
            let common = m
                .path
                .iter()
                .zip(&target)
                .take_while(|(a, b)| a == b)
                .count();
            if common >= m.path.len() || common >= target.len() {
                continue; // a module and its ancestor or descendant
            }
            let parent = m.path[..common].to_vec();
            edges
                .entry(parent)
                .or_default()
                .entry(m.path[common].clone())
                .or_default()
                .insert((
                    target[common].clone(),
                    format!("{rel} uses {}", path.join("::")),
                ));
        }
    }
    edges
}

/// A loop in a graph, if there is one.
fn find_loop(graph: &Graph) -> Option<Vec<String>> {
    fn visit(
        n: &str,
        graph: &Graph,
        state: &mut BTreeMap<String, u8>,
        stack: &mut Vec<String>,
    ) -> Option<Vec<String>> {
        state.insert(n.to_string(), 1);
        stack.push(n.to_string());
        for (to, why) in graph.get(n).into_iter().flatten() {
            match state.get(to.as_str()) {
                Some(1) => {
                    let from = stack.iter().position(|s| s == to).unwrap_or(0);
                    let mut l = stack[from..].to_vec();
                    l.push(format!("{to} ({why})"));
                    return Some(l);
                }
                Some(_) => {}
                None => {
                    if let Some(l) = visit(to, graph, state, stack) {
                        return Some(l);
                    }
                }
            }
        }
        stack.pop();
        state.insert(n.to_string(), 2);
        None
    }
    let mut state = BTreeMap::new();
    for n in graph.keys() {
        if !state.contains_key(n.as_str()) {
            if let Some(l) = visit(n, graph, &mut state, &mut Vec::new()) {
                return Some(l);
            }
        }
    }
    None
}

#[test]
fn no_two_parts_of_a_module_use_each_other() {
    let mut loops = Vec::new();
    for root in ROOTS {
        for (parent, graph) in sibling_edges(&repo().join(root)) {
            if let Some(l) = find_loop(&graph) {
                loops.push(format!(
                    "{root} :: {}: {}",
                    parent.join("::"),
                    l.join(" -> ")
                ));
            }
        }
    }
    assert!(loops.is_empty(), "import circles:\n{}", loops.join("\n"));
}

#[test]
fn the_checker_reads_the_real_tree() {
    // Not vacuous: the agent's modules are found, and an edge that must exist is seen.
    let agent = modules(&repo().join("agent/src/lib.rs"));
    assert!(
        agent.len() > 60,
        "only {} modules found in the agent",
        agent.len()
    );
    let edges = sibling_edges(&repo().join("agent/src/lib.rs"));
    let root = edges
        .get(&Vec::new())
        .expect("edges between the agent's top modules");
    assert!(root
        .get("agent")
        .is_some_and(|to| to.iter().any(|(t, _)| t == "handshake")));
    let code =
        code_only("let s = r##\"a \"quoted\" crate::x::y\"##; let c = '\"'; crate::real::z();");
    let paths = named_paths(&code);
    assert_eq!(
        paths,
        vec![["crate", "real", "z"].map(String::from).to_vec()]
    );
    assert_eq!(strip_visibility("pub(in crate::a) mod x;"), "mod x;");
    let src = "fn a() {}\n#[cfg(test)]\n#[allow(dead_code)]\npub(super) mod tests {\n}\n";
    assert_eq!(without_tests(src), "fn a() {}\n");
}

#[test]
fn the_checker_sees_a_circle_and_a_missing_part() {
    // The checks themselves can fail: a planted loop and a planted omission are found.
    let mut g: Graph = BTreeMap::new();
    g.entry("a".into())
        .or_default()
        .insert(("b".into(), "a uses b".into()));
    assert!(find_loop(&g).is_none());
    g.entry("b".into())
        .or_default()
        .insert(("a".into(), "b uses a".into()));
    assert!(find_loop(&g).is_some());
    let src = "//! Doc.\n//!\n//! Parts:\n//! - `one`: a part;\n//!   more of it\n//! - [`two`]: another.\n\nmod one;\nmod two;\nmod three;\n";
    let listed = listed_parts(src).unwrap_or_default();
    let declared: BTreeSet<String> = declared_children(src).into_iter().collect();
    assert_eq!(
        listed,
        ["one", "two"].map(String::from).into_iter().collect()
    );
    assert_ne!(listed, declared);
    let mut out = Vec::new();
    expand_use("crate::{a::X, b::{c, d as e}}", Vec::new(), &mut out);
    assert_eq!(out.len(), 3);
    assert_eq!(out[2], ["crate", "b", "d"].map(String::from));
}

/// The lines of a Markdown section, from its `## ` heading to the next.
fn section<'a>(doc: &'a str, heading: &str) -> Vec<&'a str> {
    let mut lines = doc.lines().skip_while(|l| l.trim() != heading);
    let Some(first) = lines.next() else {
        return Vec::new();
    };
    std::iter::once(first)
        .chain(lines.take_while(|l| !l.starts_with("## ")))
        .collect()
}

/// The backticked paths ending in `/` on a line: folders.
fn folders(line: &str) -> Vec<&str> {
    line.split('`')
        .skip(1)
        .step_by(2)
        .filter(|s| s.ends_with('/') && !s.contains(' '))
        .collect()
}

#[test]
fn the_readme_map_is_short_and_names_folders_that_exist() {
    let readme = read(&repo().join("README.md"));
    let layout = section(&readme, "## Layout");
    assert!(!layout.is_empty(), "README.md has no Layout section");
    assert!(
        layout.len() < 40,
        "README.md's Layout is {} lines (under 40)",
        layout.len()
    );
    for line in &layout {
        for f in folders(line) {
            assert!(
                repo().join(f).is_dir(),
                "README.md's Layout names {f}, which is not a folder"
            );
        }
    }
    assert!(
        layout
            .iter()
            .any(|l| l.contains("docs/architecture.md#where-changes-go")),
        "README.md's Layout points to docs/architecture.md's \"Where changes go\""
    );
}

#[test]
fn where_changes_go_names_folders_that_exist_for_every_kind_of_change() {
    let arch = read(&repo().join("docs/architecture.md"));
    let table = section(&arch, "## Where changes go");
    let rows: Vec<&str> = table
        .iter()
        .copied()
        .filter(|l| l.starts_with('|') && !l.starts_with("|---") && !l.starts_with("| change"))
        .collect();
    for kind in [
        "kubelet model",
        "handshake",
        "webhook",
        "chart",
        "test bed",
        "bench",
    ] {
        let row = rows
            .iter()
            .find(|r| r.split('|').nth(1).is_some_and(|c| c.contains(kind)));
        let Some(row) = row else {
            panic!("docs/architecture.md's \"Where changes go\" has no row for {kind}");
        };
        assert!(!folders(row).is_empty(), "the {kind} row names no folder");
    }
    for row in &rows {
        for f in folders(row) {
            assert!(
                repo().join(f).is_dir(),
                "\"Where changes go\" names {f}, which is not a folder"
            );
        }
    }
}

/// The backticked names of a `//! Face:` doc, to its first blank doc line.
fn listed_face(src: &str) -> BTreeSet<String> {
    let mut names = BTreeSet::new();
    let mut lines = src.lines().map(str::trim);
    if lines
        .by_ref()
        .find(|l| l.starts_with("//! Face:"))
        .is_none()
    {
        return names;
    }
    for l in lines {
        let Some(text) = l.strip_prefix("//!") else {
            break;
        };
        if text.trim().is_empty() {
            break;
        }
        // Only a line of names: the prose before them names `pub` and `pub(crate)` too.
        let words: Vec<&str> = text
            .split(',')
            .map(str::trim)
            .filter(|w| !w.is_empty())
            .collect();
        if words.iter().all(|w| w.starts_with('`')) {
            for w in words {
                names.insert(w.trim_end_matches('.').trim_matches('`').to_owned());
            }
        }
    }
    names
}

/// The modules a crate root declares `pub` (not `pub(crate)` or narrower), inline or in files;
/// its own items only (unindented), not what an inline module holds.
fn public_modules(code: &str) -> BTreeSet<String> {
    code.lines()
        .filter_map(|l| l.strip_prefix("pub mod "))
        .filter_map(|rest| rest.split([';', ' ', '{']).next())
        .map(str::to_owned)
        .collect()
}

#[test]
fn the_agents_public_face_is_the_documented_one() {
    let lib = read(&repo().join("agent/src/lib.rs"));
    let face = listed_face(&lib);
    assert!(
        face.len() >= 5,
        "agent/src/lib.rs lists its face under `//! Face:`: {face:?}"
    );
    let public = public_modules(&code_only(&lib));
    let undocumented: Vec<_> = public.difference(&face).collect();
    let missing: Vec<_> = face.difference(&public).collect();
    assert!(
        undocumented.is_empty() && missing.is_empty(),
        "agent/src/lib.rs: `pub mod` beyond its face (make them pub(crate), or name them in \
         the face): {undocumented:?}; named in the face but not `pub mod`: {missing:?}"
    );
}

#[test]
fn the_face_checker_reads_what_it_is_given() {
    let lib = "//! Parts:\n//! - `a`: x;\n//!\n//! Face: what is `pub`, the rest `pub(crate)`:\n\
               //! `a`,\n//! `b`.\n\npub mod a;\npub(crate) mod c {\n    pub mod d;\n}\npub mod b {\n}\n";
    assert_eq!(
        listed_face(lib),
        BTreeSet::from(["a".to_owned(), "b".to_owned()])
    );
    assert_eq!(
        public_modules(lib),
        BTreeSet::from(["a".to_owned(), "b".to_owned()])
    );
}

#[test]
fn no_source_file_passes_600_lines_before_its_tests() {
    let mut long = Vec::new();
    for root in ROOTS {
        for m in modules(&repo().join(root)) {
            let code = code_only(&read(&m.file));
            let before = without_tests(&code).lines().count();
            if before > 600 {
                let rel = relative(&m.file);
                long.push(format!("{rel}: {before} lines before its tests"));
            }
        }
    }
    assert!(
        long.is_empty(),
        "split these along their roles:\n{}",
        long.join("\n")
    );
}

/// `cargo clean -p PACKAGE`, which CI and `scripts/fuzz` use to take another clone's crates
/// out of a shared build directory, removes the build of every target named as one of the
/// package's targets: a test target named as a dependency (`entrypoint/tests/http.rs` was)
/// takes that dependency's build with it, and everything built on it is compiled again.
#[test]
fn no_test_target_is_named_as_a_dependency() {
    let mut dependencies = BTreeSet::new();
    for lock in ["Cargo.lock", "fuzz/Cargo.lock"] {
        for line in read(&repo().join(lock)).lines() {
            if let Some(name) = line.strip_prefix("name = \"") {
                dependencies.insert(name.trim_end_matches('"').replace('-', "_"));
            }
        }
    }
    assert!(dependencies.contains("tokio"), "Cargo.lock read");
    let mut clashes = Vec::new();
    for dir in ["entrypoint/tests", "e2e/tests", "testbed/tests"] {
        let entries = std::fs::read_dir(repo().join(dir)).unwrap_or_else(|e| panic!("{dir}: {e}"));
        for entry in entries {
            let path = entry.unwrap_or_else(|e| panic!("{dir}: {e}")).path();
            let Some(stem) = path.file_stem().and_then(|s| s.to_str()) else {
                continue;
            };
            if path.extension().is_some_and(|e| e == "rs") && dependencies.contains(stem) {
                clashes.push(relative(&path));
            }
        }
    }
    assert!(
        clashes.is_empty(),
        "test targets named as a dependency (rename them): {clashes:?}"
    );
}

/// `cargo tree`'s packages with their features (`name version features`), one per line, for
/// the packages given: what a build of them together compiles.
fn features_of(packages: &[&str]) -> BTreeSet<String> {
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let mut cmd = std::process::Command::new(cargo);
    cmd.current_dir(repo()).args([
        "tree",
        "--locked",
        "--offline",
        "-e",
        "normal,build",
        "--prefix",
        "none",
        "-f",
        "{p} {f}",
    ]);
    for p in packages {
        cmd.args(["-p", p]);
    }
    let out = cmd.output().expect("cargo tree runs");
    assert!(
        out.status.success(),
        "cargo tree: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout)
        .lines()
        // "name vX.Y.Z (path)? features": the path (a workspace member's) and the
        // repetition mark `(*)` are not part of what is compiled.
        .map(|l| {
            l.split_whitespace()
                .filter(|w| !w.starts_with('('))
                .collect::<Vec<_>>()
                .join(" ")
        })
        .collect()
}

#[test]
fn the_test_bed_changes_no_feature_of_the_agents_build() {
    // The demo builds the test bed into the image's release target directory: a feature the
    // test bed turns on in a crate the agent also uses changes that crate's hash and every
    // crate above it (tokio, hyper, kube), and the demo compiled the agent's whole tree again.
    let agent = features_of(&["exitorder"]);
    let together = features_of(&["exitorder", "exitorder-testbed"]);
    let package = |line: &str| line.split(' ').take(2).collect::<Vec<_>>().join(" ");
    let agents: BTreeSet<String> = agent.iter().map(|l| package(l)).collect();
    assert!(
        agents.iter().any(|p| p.starts_with("tokio v")),
        "{agents:?}"
    );
    let changed: Vec<&String> = together
        .iter()
        .filter(|l| agents.contains(&package(l)) && !agent.contains(*l))
        .collect();
    assert!(
        changed.is_empty(),
        "built with the test bed, these crates of the agent's build get other features: {changed:?}"
    );
}
