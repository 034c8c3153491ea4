//! The test bed judges the agent, so it takes none of the agent's decisions: restart
//! policy, stop order, who waits for whom, grace arithmetic and kill recognition are its
//! own here, checked against the tables of `kubelet-rules/` taken from upstream. It may use
//! the contract, the runtime's client, the handshake's files, the webhook's mutation (what a
//! cluster runs) and the presets' data.

/// The agent's modules that decide: none may be named in `testbed/src`.
const DECISIONS: [&str; 7] = [
    "decide", "kubelet", "view", "agent", "cluster", "jobs", "podspec",
];

fn sources(dir: &std::path::Path, out: &mut Vec<std::path::PathBuf>) {
    for e in std::fs::read_dir(dir)
        .expect("the crate's sources")
        .flatten()
    {
        let path = e.path();
        if path.is_dir() {
            sources(&path, out);
        } else if path.extension().is_some_and(|x| x == "rs") {
            out.push(path);
        }
    }
}

/// Each use of the agent's crate in code (comments aside, and a log line's `"target"`
/// string aside), its path written without spaces.
fn uses(text: &str) -> Vec<String> {
    let code: String = text
        .lines()
        .map(|l| l.split("//").next().unwrap_or_default())
        .collect::<Vec<_>>()
        .join("\n")
        .split_whitespace()
        .collect();
    let mut out = Vec::new();
    let mut rest = code.as_str();
    while let Some(at) = rest.find("exitorder::") {
        let quoted = rest[..at].ends_with('"');
        rest = &rest[at + "exitorder::".len()..];
        if quoted {
            continue;
        }
        // `exitorder::{a, b::c}`: every path in the braces.
        if let Some(group) = rest.strip_prefix('{') {
            let end = group.find('}').unwrap_or(group.len());
            out.extend(group[..end].split(',').map(str::to_owned));
        } else {
            let end = rest
                .find(|c: char| !(c.is_alphanumeric() || c == '_'))
                .unwrap_or(rest.len());
            out.push(rest[..end].to_owned());
        }
    }
    out
}

#[test]
fn no_decision_of_the_agent_is_used_by_the_test_bed() {
    let mut files = Vec::new();
    sources(
        &std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("src"),
        &mut files,
    );
    assert!(files.len() > 20, "the sources were found: {files:?}");
    let mut found = Vec::new();
    for f in &files {
        let text = std::fs::read_to_string(f).expect("a source file");
        for u in uses(&text) {
            let module = u.split("::").next().unwrap_or_default();
            if DECISIONS.contains(&module) {
                found.push(format!("{}: exitorder::{u}", f.display()));
            }
        }
    }
    assert!(
        found.is_empty(),
        "the test bed uses the agent's decisions: {found:#?}"
    );
}

#[test]
fn the_check_sees_every_way_of_naming_a_module() {
    let named = |t: &str| uses(t).iter().any(|u| u.starts_with("decide"));
    assert!(named("use exitorder::decide::restart::Restart;"));
    assert!(named(
        "let r = exitorder :: decide::stoporder::StopOrder::new(v);"
    ));
    assert!(named("use exitorder::{cri, decide::priority};"));
    assert!(named("use exitorder::{\n    decide,\n    cri,\n};"));
    assert!(!named("// exitorder::decide in a comment"));
    assert!(!named(
        r#"let line = "{\"target\":\"exitorder::decide\"}";"#
    ));
}
