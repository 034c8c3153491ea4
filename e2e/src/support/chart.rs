//! The chart as the tests render it: the in-tree chart, by a real helm, into documents.

use std::path::PathBuf;

use exitorder_testbed::install::{Helm, CHART_IN_TREE, NAMESPACE};
use exitorder_testbed::manifest;
use serde_json::Value;

use super::skip_or_fail;

/// The chart in the tree.
pub fn chart() -> PathBuf {
    crate::repo().join(CHART_IN_TREE)
}

/// helm, or `None` (the test skips; in CI it fails).
pub fn helm() -> Option<Helm> {
    match Helm::find() {
        Ok(h) => Some(h),
        Err(e) => {
            skip_or_fail(&format!("the chart tests need helm: {e}"));
            None
        }
    }
}

/// `--set` pairs as helm takes them.
pub fn set(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
    pairs
        .iter()
        .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
        .collect()
}

/// The chart rendered with `values`, one document per object.
pub fn render(helm: &Helm, values: &[(&str, &str)]) -> Vec<Value> {
    let text = helm
        .template(&chart(), NAMESPACE, &set(values))
        .unwrap_or_else(|e| panic!("{e}"));
    manifest::documents(&text).unwrap_or_else(|e| panic!("{e}"))
}

/// The first object of `kind`.
pub fn kind<'a>(docs: &'a [Value], kind: &str) -> &'a Value {
    manifest::find(docs, kind, None).unwrap_or_else(|| panic!("no {kind} rendered"))
}

/// How many objects of `kind` were rendered.
pub fn count(docs: &[Value], kind: &str) -> usize {
    docs.iter().filter(|d| d["kind"] == kind).count()
}

/// The object of `kind` as its k8s-openapi type.
pub fn typed<T: serde::de::DeserializeOwned>(docs: &[Value], kind_name: &str) -> T {
    serde_json::from_value(kind(docs, kind_name).clone())
        .unwrap_or_else(|e| panic!("the {kind_name} does not deserialize: {e}"))
}
