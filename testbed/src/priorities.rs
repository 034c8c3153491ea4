//! Each container's exit priority as the pod's author asked for it, read by the test bed on
//! its own: the contract's annotation (a JSON object of container name to 0..=255, or the
//! same under OpenKruise's name when ours is absent), then the container's env variable, then
//! 1 for a native sidecar, then the presets' table of known sidecars (data the README
//! documents), else 0. Larger leaves later. The grammar is the contract's; this reader is
//! not the agent's, so a verdict never agrees with the agent's mistake.

use std::collections::BTreeMap;

use exitorder_contract::{annotation, env};

/// The priorities a pod's annotation names.
pub type Named = BTreeMap<String, u8>;

/// The largest annotation value read: a larger one leaves the pod unordered (an API
/// server's annotations may total 256 KiB; a priority map is a few hundred bytes).
const MAX_ANNOTATION_BYTES: usize = 64 * 1024;

/// The pod's annotation, ours first; `Ok(None)` when it has none. Anything but an object of
/// integers 0..=255, or a value over 64 KiB, is an error (the pod is not ordered at all).
pub fn from_annotations(annotations: &BTreeMap<String, String>) -> Result<Option<Named>, String> {
    let Some((key, value)) = [annotation::PRIORITY, annotation::PRIORITY_KRUISE]
        .into_iter()
        .find_map(|k| annotations.get(k).map(|v| (k, v)))
    else {
        return Ok(None);
    };
    if value.len() > MAX_ANNOTATION_BYTES {
        return Err(format!("{key}: larger than {MAX_ANNOTATION_BYTES} bytes"));
    }
    let object: serde_json::Map<String, serde_json::Value> =
        serde_json::from_str(value).map_err(|e| format!("{key}: {e}"))?;
    object
        .into_iter()
        .map(|(name, n)| match n.as_u64().map(u8::try_from) {
            Some(Ok(p)) => Ok((name, p)),
            _ => Err(format!("{key}: {name:?} is {n}, not 0..=255")),
        })
        .collect::<Result<Named, String>>()
        .map(Some)
}

/// A container's env variable, ours first; `Ok(None)` when it sets neither.
pub fn from_env<'a>(
    vars: impl IntoIterator<Item = (&'a str, &'a str)> + Clone,
) -> Result<Option<u8>, String> {
    for key in [env::PRIORITY, env::PRIORITY_KRUISE] {
        if let Some((_, v)) = vars.clone().into_iter().find(|(k, _)| *k == key) {
            return v
                .trim()
                .parse()
                .map(Some)
                .map_err(|_| format!("{key}={v:?} is not 0..=255"));
        }
    }
    Ok(None)
}

/// The priority `name` ends up with.
pub fn resolve(name: &str, named: Option<&Named>, env: Option<u8>, native_sidecar: bool) -> u8 {
    named
        .and_then(|n| n.get(name).copied())
        .or(env)
        .or(native_sidecar.then_some(1))
        .or_else(|| exitorder::presets::by_name(name).map(|p| p.priority))
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_annotation_wins_over_env_over_a_native_sidecar_over_a_preset() {
        let named: Named = [("app".to_owned(), 3)].into();
        assert_eq!(resolve("app", Some(&named), Some(7), true), 3);
        assert_eq!(resolve("app", None, Some(7), true), 7);
        assert_eq!(resolve("app", None, None, true), 1);
        assert_eq!(resolve("linkerd-proxy", None, None, false), 1);
        assert_eq!(resolve("app", None, None, false), 0);
    }

    #[test]
    fn the_contract_grammar_is_read_and_anything_else_refused() {
        let with = |k: &str, v: &str| BTreeMap::from([(k.to_owned(), v.to_owned())]);
        let ours = with(annotation::PRIORITY, r#"{"proxy": 1, "app": 0}"#);
        assert_eq!(
            from_annotations(&ours).expect("read").expect("named")["proxy"],
            1
        );
        let kruise = with(annotation::PRIORITY_KRUISE, r#"{"proxy": 2}"#);
        assert_eq!(
            from_annotations(&kruise).expect("read").expect("named")["proxy"],
            2
        );
        for bad in [
            r#"{"proxy": 256}"#,
            r#"{"proxy": -1}"#,
            r#"{"proxy": 1.5}"#,
            "[1]",
            "{",
        ] {
            assert!(
                from_annotations(&with(annotation::PRIORITY, bad)).is_err(),
                "{bad}"
            );
        }
        // Valid but for its size.
        let huge = format!(r#"{{"proxy": 1{}}}"#, " ".repeat(MAX_ANNOTATION_BYTES));
        assert!(from_annotations(&with(annotation::PRIORITY, &huge)).is_err());
        assert_eq!(from_env([(env::PRIORITY, " 4 ")]), Ok(Some(4)));
        assert!(from_env([(env::PRIORITY_KRUISE, "x")]).is_err());
        assert_eq!(from_env([("OTHER", "1")]), Ok(None));
    }
}
