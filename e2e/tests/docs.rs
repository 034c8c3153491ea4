//! The documentation stays true: every relative link in every Markdown file of the
//! repository leads to a file that exists (and, with `#anchor`, to a heading in it, as the
//! forge makes anchors); every flag a command line in the docs gives one of exitorder's
//! commands is one that command takes (checked against its `--help`); every `--set KEY` of a
//! helm command names a value the chart has; and the agent's flags table lists every flag the
//! agent takes, and no other.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::Command;

use clap::{Args, CommandFactory};
use exitorder_e2e::support;

/// Every Markdown file of the repository, but build output and vendored trees.
fn markdown_files() -> Vec<PathBuf> {
    fn walk(dir: &Path, out: &mut Vec<PathBuf>) {
        let Ok(entries) = std::fs::read_dir(dir) else {
            return;
        };
        for e in entries.flatten() {
            let path = e.path();
            let name = e.file_name().to_string_lossy().into_owned();
            if path.is_dir() {
                if !matches!(name.as_str(), "target" | "node_modules" | ".git" | "corpus") {
                    walk(&path, out);
                }
            } else if name.ends_with(".md") {
                out.push(path);
            }
        }
    }
    let mut out = Vec::new();
    walk(exitorder_e2e::repo(), &mut out);
    out.sort();
    out
}

/// The text with fenced code blocks and inline code blanked out (links in them are not
/// links), and the code itself, span by span (what command lines are read from).
fn split_code(text: &str) -> (String, Vec<String>) {
    let mut prose = String::new();
    let mut code: Vec<String> = Vec::new();
    let mut fenced = false;
    for line in text.lines() {
        if line.trim_start().starts_with("```") {
            fenced = !fenced;
            prose.push('\n');
            continue;
        }
        if fenced {
            // A command continued on the next line (`\`) is one command line.
            match code.last_mut() {
                Some(last) if last.ends_with('\\') => {
                    last.pop();
                    last.push(' ');
                    last.push_str(line);
                }
                _ => code.push(line.to_owned()),
            }
            prose.push('\n');
            continue;
        }
        let mut in_code = false;
        let mut span = String::new();
        for ch in line.chars() {
            if ch == '`' {
                if in_code {
                    code.push(std::mem::take(&mut span));
                }
                in_code = !in_code;
                prose.push(' ');
            } else if in_code {
                span.push(ch);
                prose.push(' ');
            } else {
                prose.push(ch);
            }
        }
        prose.push('\n');
    }
    (prose, code)
}

/// The anchors the forge gives a Markdown file's headings: lower case, punctuation but `-`
/// and `_` dropped, spaces as `-`, a repeated one suffixed `-1`, `-2`...
fn anchors(text: &str) -> BTreeSet<String> {
    let mut seen: BTreeMap<String, usize> = BTreeMap::new();
    let mut out = BTreeSet::new();
    let mut fenced = false;
    for line in text.lines() {
        if line.trim_start().starts_with("```") {
            fenced = !fenced;
            continue;
        }
        if fenced || !line.starts_with('#') {
            continue;
        }
        let title = line.trim_start_matches('#').trim();
        let slug: String = title
            .to_lowercase()
            .chars()
            .filter_map(|c| match c {
                ' ' => Some('-'),
                c if c.is_alphanumeric() || c == '-' || c == '_' => Some(c),
                _ => None,
            })
            .collect();
        let n = seen.entry(slug.clone()).or_insert(0);
        out.insert(if *n == 0 {
            slug.clone()
        } else {
            format!("{slug}-{n}")
        });
        *n += 1;
    }
    out
}

/// `[text](target)` targets in `prose`.
fn links(prose: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut rest = prose;
    while let Some(at) = rest.find("](") {
        rest = &rest[at + 2..];
        if let Some(end) = rest.find(')') {
            let target = rest[..end].trim();
            if !target.contains(char::is_whitespace) {
                out.push(target.to_owned());
            }
            rest = &rest[end..];
        }
    }
    out
}

fn rel(path: &Path) -> String {
    path.strip_prefix(exitorder_e2e::repo())
        .unwrap_or(path)
        .display()
        .to_string()
}

#[test]
fn every_relative_link_in_the_docs_leads_somewhere() {
    let mut broken = Vec::new();
    let mut checked = 0;
    for file in markdown_files() {
        let text = std::fs::read_to_string(&file).expect("read");
        let (prose, _) = split_code(&text);
        for target in links(&prose) {
            if target.contains("://") || target.starts_with("mailto:") {
                continue;
            }
            checked += 1;
            let (path, anchor) = match target.split_once('#') {
                Some((p, a)) => (p, Some(a)),
                None => (target.as_str(), None),
            };
            let dest = if path.is_empty() {
                file.clone()
            } else {
                file.parent().expect("a directory").join(path)
            };
            if !dest.exists() {
                broken.push(format!("{}: {target}: no such file", rel(&file)));
                continue;
            }
            if let Some(anchor) = anchor {
                let dest_text = std::fs::read_to_string(&dest).unwrap_or_default();
                if !anchors(&dest_text).contains(anchor) {
                    broken.push(format!("{}: {target}: no such heading", rel(&file)));
                }
            }
        }
    }
    assert!(
        checked > 20,
        "only {checked} links found: is the scan broken?"
    );
    assert!(broken.is_empty(), "broken links:\n{}", broken.join("\n"));
}

/// What each of exitorder's commands takes, from its own `--help`.
fn helps() -> Vec<(&'static str, String)> {
    let mut cli = exitorder::cli::Cli::command();
    let mut sub = |name: &str| {
        cli.find_subcommand_mut(name)
            .unwrap_or_else(|| panic!("no subcommand {name}"))
            .render_long_help()
            .to_string()
    };
    let agent = sub("agent");
    let webhook = sub("webhook");
    let explain = sub("explain");
    let demo = exitorder_testbed::demo::DemoArgs::augment_args(clap::Command::new("demo"))
        .render_long_help()
        .to_string();
    let bench = exitorder_testbed::bench::BenchArgs::augment_args(clap::Command::new("bench"))
        .render_long_help()
        .to_string();
    let out = Command::new(support::static_entrypoint())
        .arg("--help")
        .output()
        .expect("the entrypoint runs");
    let entrypoint = String::from_utf8_lossy(&out.stdout).into_owned();
    // A script's own flags are those its usage (the comment at its top) names.
    let script = |name: &str| {
        std::fs::read_to_string(exitorder_e2e::repo().join("scripts").join(name))
            .expect("the script")
            .lines()
            .skip(1)
            .take_while(|l| l.starts_with('#'))
            .collect::<Vec<_>>()
            .join("\n")
    };
    vec![
        ("exitorder agent", agent),
        ("exitorder webhook", webhook),
        ("exitorder explain", explain.clone()),
        ("exitorder demo", demo.clone()),
        ("exitorder-testbed demo", demo.clone()),
        // The scripts take their own few flags and hand the rest on.
        ("scripts/demo", format!("{demo}\n{}", script("demo"))),
        ("exitorder bench", bench.clone()),
        ("exitorder-testbed bench", bench.clone()),
        ("scripts/bench", format!("{bench}\n{}", script("bench"))),
        ("exitorder-entrypoint", entrypoint),
    ]
}

/// Whether `help` names `flag` (`--name`) as a flag.
fn names_flag(help: &str, flag: &str) -> bool {
    help.match_indices(flag).any(|(at, _)| {
        !help[at + flag.len()..]
            .chars()
            .next()
            .is_some_and(|c| c.is_ascii_alphanumeric() || c == '-')
    })
}

/// The long flags in `args` (what follows a command on its line).
fn flags_in(args: &str) -> Vec<String> {
    args.split(|c: char| c.is_whitespace() || c == '[' || c == ']' || c == '|' || c == '(')
        // A JSON or YAML array's items: `"--timeout",`.
        .map(|w| w.trim_matches(|c| c == '"' || c == '\'' || c == ','))
        .filter_map(|w| w.strip_prefix("--"))
        .map(|w| w.split(['=', ',', ')', '`', '.']).next().unwrap_or(""))
        .filter(|w| !w.is_empty() && w.chars().next().is_some_and(|c| c.is_ascii_lowercase()))
        .map(|w| format!("--{w}"))
        .collect()
}

/// The chart's values, as dotted paths.
fn value_paths() -> BTreeSet<String> {
    fn walk(v: &serde_json::Value, at: &str, out: &mut BTreeSet<String>) {
        if let serde_json::Value::Object(m) = v {
            for (k, v) in m {
                let path = if at.is_empty() {
                    k.clone()
                } else {
                    format!("{at}.{k}")
                };
                out.insert(path.clone());
                walk(v, &path, out);
            }
        }
    }
    let text =
        std::fs::read_to_string(exitorder_e2e::repo().join("deploy/helm/exitorder/values.yaml"))
            .expect("values.yaml");
    let docs = exitorder_testbed::manifest::documents(&text).expect("values.yaml is YAML");
    let mut out = BTreeSet::new();
    walk(&docs[0], "", &mut out);
    out
}

#[test]
fn every_flag_the_docs_give_a_command_is_one_it_takes() {
    let helps = helps();
    let values = value_paths();
    let mut wrong = Vec::new();
    let mut checked = 0;
    for file in markdown_files() {
        let text = std::fs::read_to_string(&file).expect("read");
        let (_, code) = split_code(&text);
        for span in code {
            // The longest command name that starts here wins (`exitorder-entrypoint`
            // over `exitorder`).
            for (at, _) in span
                .match_indices("exitorder")
                .chain(span.match_indices("scripts/"))
            {
                let here = &span[at..];
                let Some((name, help)) = helps
                    .iter()
                    .filter(|(name, _)| here.starts_with(name))
                    .max_by_key(|(name, _)| name.len())
                else {
                    continue;
                };
                let args = here[name.len()..].split('#').next().unwrap_or("");
                for flag in flags_in(args) {
                    checked += 1;
                    if !names_flag(help, &flag) {
                        wrong.push(format!("{}: `{name}` takes no {flag}: {span}", rel(&file)));
                    }
                }
            }
            if let Some(at) = span.find("helm ") {
                let mut words = span[at..].split_whitespace();
                while let Some(w) = words.next() {
                    let kv = match w {
                        "--set" | "--set-string" => words.next().unwrap_or(""),
                        w => match w.strip_prefix("--set=") {
                            Some(kv) => kv,
                            None => continue,
                        },
                    };
                    let key = kv.split('=').next().unwrap_or("");
                    checked += 1;
                    if !values.contains(key) {
                        wrong.push(format!(
                            "{}: the chart has no value {key}: {span}",
                            rel(&file)
                        ));
                    }
                }
            }
        }
    }
    assert!(
        checked > 30,
        "only {checked} flags found: is the scan broken?"
    );
    assert!(
        wrong.is_empty(),
        "wrong flags in the docs:\n{}",
        wrong.join("\n")
    );
}

#[test]
fn the_agent_flags_table_lists_every_flag_of_the_agent() {
    let text = std::fs::read_to_string(exitorder_e2e::repo().join("docs/install.md"))
        .expect("docs/install.md");
    let section = text
        .split("\n## ")
        .find(|s| s.starts_with("Agent flags"))
        .expect("an Agent flags section");
    let listed: BTreeSet<String> = section
        .lines()
        .filter_map(|l| l.strip_prefix("| `--"))
        .map(|l| format!("--{}", l.split([' ', '`']).next().unwrap_or("")))
        .collect();
    let help = exitorder::cli::Cli::command()
        .find_subcommand_mut("agent")
        .expect("agent")
        .render_long_help()
        .to_string();
    // Flag lines: `--name <VALUE>`, or `-x, --name <VALUE>`.
    let taken: BTreeSet<String> = help
        .lines()
        .map(str::trim_start)
        .filter(|l| l.starts_with('-'))
        .filter_map(|l| l.split_once("--").map(|(_, rest)| rest))
        .map(|l| format!("--{}", l.split([' ', '=', '<', ',']).next().unwrap_or("")))
        .filter(|f| f != "--help" && f != "--version")
        .collect();
    assert_eq!(
        listed, taken,
        "docs/install.md's Agent flags table and `exitorder agent --help`"
    );
}
