//! Event field selectors and shapes as the API server has them: core/v1's selectable fields
//! (`pkg/registry/core/event/strategy.go` `ToSelectableFields`), events.k8s.io/v1's labels
//! mapped onto them, and the two shapes of one stored Event (`pkg/apis/events/v1`
//! conversion).

use serde_json::{json, Value};

/// The two APIs Events are served by.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Group {
    Core,
    EventsV1,
}

impl Group {
    pub(super) fn api_version(self) -> &'static str {
        match self {
            Group::Core => "v1",
            Group::EventsV1 => "events.k8s.io/v1",
        }
    }
}

/// core/v1 and events.k8s.io/v1 field names (`pkg/apis/events/v1` conversion): core first.
const RENAMES: [(&str, &str); 6] = [
    ("involvedObject", "regarding"),
    ("message", "note"),
    ("reportingComponent", "reportingController"),
    ("source", "deprecatedSource"),
    ("firstTimestamp", "deprecatedFirstTimestamp"),
    ("lastTimestamp", "deprecatedLastTimestamp"),
];

fn renamed(v: &Value, pairs: &[(&str, &str)], api_version: &str) -> Value {
    let mut out = v.clone();
    if let Some(o) = out.as_object_mut() {
        for (from, to) in pairs {
            if let Some(x) = o.remove(*from) {
                o.insert((*to).to_owned(), x);
            }
        }
        o.insert("apiVersion".to_owned(), json!(api_version));
        o.insert("kind".to_owned(), json!("Event"));
    }
    out
}

/// A core/v1 Event in events.k8s.io/v1's shape.
pub(super) fn to_events_v1(core: &Value) -> Value {
    let mut pairs: Vec<(&str, &str)> = RENAMES.to_vec();
    pairs.push(("count", "deprecatedCount"));
    renamed(core, &pairs, "events.k8s.io/v1")
}

/// An events.k8s.io/v1 Event in core/v1's shape.
pub(super) fn to_core(v1: &Value) -> Value {
    let mut pairs: Vec<(&str, &str)> = RENAMES.iter().map(|(a, b)| (*b, *a)).collect();
    pairs.push(("deprecatedCount", "count"));
    renamed(v1, &pairs, "v1")
}

/// One term of a field selector.
#[derive(Debug)]
pub(super) struct Term {
    /// JSON pointers into a core/v1 Event: the first one present is the field's value.
    pointers: Vec<&'static str>,
    value: String,
    equal: bool,
}

impl Term {
    pub(super) fn matches(&self, e: &Value) -> bool {
        let found = self
            .pointers
            .iter()
            .find_map(|p| {
                e.pointer(p)
                    .and_then(Value::as_str)
                    .filter(|s| !s.is_empty())
            })
            .unwrap_or("");
        (found == self.value) == self.equal
    }
}

/// `pkg/registry/core/event/strategy.go` `ToSelectableFields`, as pointers into a core/v1
/// Event; `source` is `source.component`, else `reportingComponent`.
fn core_field(label: &str) -> Option<Vec<&'static str>> {
    Some(match label {
        "involvedObject.kind" => vec!["/involvedObject/kind"],
        "involvedObject.namespace" => vec!["/involvedObject/namespace"],
        "involvedObject.name" => vec!["/involvedObject/name"],
        "involvedObject.uid" => vec!["/involvedObject/uid"],
        "involvedObject.apiVersion" => vec!["/involvedObject/apiVersion"],
        "involvedObject.resourceVersion" => vec!["/involvedObject/resourceVersion"],
        "involvedObject.fieldPath" => vec!["/involvedObject/fieldPath"],
        "reason" => vec!["/reason"],
        "reportingComponent" => vec!["/reportingComponent"],
        "type" => vec!["/type"],
        "source" => vec!["/source/component", "/reportingComponent"],
        "metadata.name" => vec!["/metadata/name"],
        "metadata.namespace" => vec!["/metadata/namespace"],
        _ => return None,
    })
}

/// `pkg/apis/events/v1` `AddFieldLabelConversionsForEvent`: events.k8s.io's labels as core's.
fn events_v1_label(label: &str) -> Option<String> {
    if let Some(rest) = label.strip_prefix("regarding.") {
        return Some(format!("involvedObject.{rest}"));
    }
    match label {
        "reportingController" => Some("reportingComponent".to_owned()),
        "reason" | "source" | "type" | "metadata.name" | "metadata.namespace" => {
            Some(label.to_owned())
        }
        _ => None,
    }
}

/// A field selector (`a=b,c!=d`, `==` too; `\` escapes `,`, `=`, `!` and itself, as
/// `fields.EscapeValue` writes them): its terms, or the API server's refusal.
pub(super) fn parse_selector(s: &str, group: Group) -> Result<Vec<Term>, String> {
    let mut terms = Vec::new();
    for part in split_unescaped(s) {
        if part.is_empty() {
            continue;
        }
        let (label, op_len, equal) = if let Some(i) = part.find("!=") {
            (&part[..i], 2, false)
        } else if let Some(i) = part.find("==") {
            (&part[..i], 2, true)
        } else if let Some(i) = part.find('=') {
            (&part[..i], 1, true)
        } else {
            return Err(format!(
                "invalid selector: '{s}'; can't understand '{part}'"
            ));
        };
        let value = unescape(&part[label.len() + op_len..]);
        let core_label = match group {
            Group::Core => Some(label.to_owned()),
            Group::EventsV1 => events_v1_label(label),
        };
        let pointers = core_label
            .as_deref()
            .and_then(core_field)
            .ok_or_else(|| format!("field label not supported: {label}"))?;
        terms.push(Term {
            pointers,
            value,
            equal,
        });
    }
    Ok(terms)
}

fn split_unescaped(s: &str) -> Vec<String> {
    let mut parts = vec![String::new()];
    let mut escaped = false;
    for ch in s.chars() {
        let cur = parts.last_mut().expect("one part at least");
        match ch {
            _ if escaped => {
                cur.push('\\');
                cur.push(ch);
                escaped = false;
            }
            '\\' => escaped = true,
            ',' => parts.push(String::new()),
            _ => cur.push(ch),
        }
    }
    parts
}

fn unescape(s: &str) -> String {
    let mut out = String::new();
    let mut escaped = false;
    for ch in s.chars() {
        if escaped || ch != '\\' {
            out.push(ch);
            escaped = false;
        } else {
            escaped = true;
        }
    }
    out
}
