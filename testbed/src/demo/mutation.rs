//! The demo's pass through the admission webhook's own mutation, and what it added, in words.

use anyhow::Context;
use exitorder::webhook::{HandshakeVolume, Settings};
use serde_json::Value;

use super::PROJECT_IMAGE;
use crate::admission::{admit, Admitted};

/// Passes `pod` through the webhook's own mutation with the handshake in `mode`, as the API
/// server admits it: refused with the webhook's message, or patched with its JSONPatch.
pub(super) fn inject(
    pod: &mut Value,
    mode: HandshakeVolume,
    out: &mut dyn FnMut(&str),
) -> anyhow::Result<()> {
    if ensure_opted_in(pod)? {
        out(&format!(
            "The pod did not carry `{}: \"true\"`, which the webhook acts on: set it.",
            exitorder_contract::annotation::INJECT
        ));
    }
    let settings = Settings {
        handshake_volume: mode,
        install_image: PROJECT_IMAGE.to_owned(),
        ..Settings::default()
    };
    let Admitted {
        pod: admitted,
        warnings,
    } = admit(pod, &settings)?;
    let before = std::mem::replace(pod, admitted);
    let mode = clap::ValueEnum::to_possible_value(&mode)
        .map(|v| v.get_name().to_owned())
        .unwrap_or_default();
    out(&format!(
        "The webhook ({mode} handshake) added {}.",
        added(&before, pod)
    ));
    for w in warnings {
        out(&format!("  webhook warning: {w}"));
    }
    Ok(())
}

/// Sets `exitorder.io/inject: "true"` unless the pod opted in already; whether it did.
fn ensure_opted_in(pod: &mut Value) -> anyhow::Result<bool> {
    let current = exitorder::webhook::mutate::annotations_of(pod);
    if exitorder::webhook::mutate::opted_in(&current) {
        return Ok(false);
    }
    annotations_mut(pod)?.insert(
        exitorder_contract::annotation::INJECT.to_owned(),
        Value::String("true".to_owned()),
    );
    Ok(true)
}

/// What the mutation added to `before`, in words on one line.
fn added(before: &Value, after: &Value) -> String {
    let mut parts = Vec::new();
    let volumes = new_named(before, after, "volumes", describe_volume);
    if !volumes.is_empty() {
        parts.push(format!("volumes {}", volumes.join(", ")));
    }
    let inits = new_named(before, after, "initContainers", describe_init);
    if !inits.is_empty() {
        parts.push(format!("init container {}", inits.join(", ")));
    }
    for list in ["initContainers", "containers"] {
        for c in named_list(after, list) {
            let old = named_list(before, list).find(|o| o["name"] == c["name"]);
            if let Some(more) = old.and_then(|old| container_additions(old, c)) {
                parts.push(more);
            }
        }
    }
    if parts.is_empty() {
        "nothing (no container has an exit priority above 0)".to_owned()
    } else {
        parts.join("; ")
    }
}

/// The items of the pod's `spec.<list>`.
fn named_list<'a>(pod: &'a Value, list: &str) -> impl Iterator<Item = &'a Value> {
    pod["spec"][list].as_array().into_iter().flatten()
}

/// The items of `spec.<list>` in `after` whose name `before` does not have, described.
fn new_named(
    before: &Value,
    after: &Value,
    list: &str,
    describe: fn(&Value) -> String,
) -> Vec<String> {
    named_list(after, list)
        .filter(|v| !named_list(before, list).any(|o| o["name"] == v["name"]))
        .map(describe)
        .collect()
}

fn describe_volume(v: &Value) -> String {
    let name = v["name"].as_str().unwrap_or("?");
    match v["hostPath"]["path"].as_str() {
        Some(path) => format!("{name} (hostPath {path})"),
        None if v.get("emptyDir").is_some() => format!("{name} (emptyDir)"),
        None => name.to_owned(),
    }
}

fn describe_init(c: &Value) -> String {
    format!(
        "{} (image {}, runs `{}`)",
        c["name"].as_str().unwrap_or("?"),
        c["image"].as_str().unwrap_or("?"),
        words(&c["command"])
    )
}

/// A JSON array of strings as a command line.
fn words(v: &Value) -> String {
    let words: Vec<&str> = v
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(Value::as_str)
        .collect();
    words.join(" ")
}

/// The mounts, env and preStop hook `new` has and `old` had not: "NAME: ...", or `None`.
fn container_additions(old: &Value, new: &Value) -> Option<String> {
    let added = |field: &str, key: &str| -> Vec<&Value> {
        named_items(new, field)
            .filter(|n| !named_items(old, field).any(|o| o[key] == n[key]))
            .collect()
    };
    let mut parts = Vec::new();
    let mounts: Vec<String> = added("volumeMounts", "mountPath")
        .into_iter()
        .map(|m| {
            let ro = if m["readOnly"] == true {
                " read-only"
            } else {
                ""
            };
            format!("{}{ro}", m["mountPath"].as_str().unwrap_or("?"))
        })
        .collect();
    if !mounts.is_empty() {
        parts.push(format!("mounts {}", mounts.join(", ")));
    }
    let env: Vec<&str> = added("env", "name")
        .into_iter()
        .filter_map(|e| e["name"].as_str())
        .collect();
    if !env.is_empty() {
        parts.push(format!("env {}", env.join(", ")));
    }
    let hook = &new["lifecycle"]["preStop"]["exec"]["command"];
    if old["lifecycle"]["preStop"].is_null() && !hook.is_null() {
        parts.push(format!("preStop `{}`", words(hook)));
    }
    let name = new["name"].as_str().unwrap_or("?");
    (!parts.is_empty()).then(|| format!("{name}: {}", parts.join(" and ")))
}

/// The items of a container's array `field` (volumeMounts, env).
fn named_items<'a>(c: &'a Value, field: &str) -> impl Iterator<Item = &'a Value> {
    c[field].as_array().into_iter().flatten()
}

/// The pod's `metadata.annotations`, created empty when it has none.
pub(super) fn annotations_mut(
    pod: &mut Value,
) -> anyhow::Result<&mut serde_json::Map<String, Value>> {
    let metadata = pod
        .get_mut("metadata")
        .and_then(Value::as_object_mut)
        .context("the pod has no metadata")?;
    let annotations = metadata
        .entry("annotations")
        .or_insert_with(|| Value::Object(serde_json::Map::new()));
    if annotations.is_null() {
        *annotations = Value::Object(serde_json::Map::new());
    }
    annotations
        .as_object_mut()
        .context("the pod's metadata.annotations is not a map")
}
