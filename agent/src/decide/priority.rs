//! Exit priorities: where they come from and how they combine.
//!
//! A pod says how its containers are ordered with an annotation (a JSON object of container
//! name to 0..=255); a container can also say it with an env variable, and known mesh proxies get
//! a preset. Larger exits later. The annotation wins over env, env over the preset.

use std::collections::BTreeMap;

/// Pod annotation (a JSON object `{"container": N}`), exitorder's own name.
pub use exitorder_contract::annotation::PRIORITY as ANNOTATION;
/// The same annotation under the OpenKruise proposal's name; used only when ours is absent.
pub use exitorder_contract::annotation::PRIORITY_KRUISE as ANNOTATION_KRUISE;
/// Container env variable carrying one container's priority.
pub use exitorder_contract::env::PRIORITY as ENV;
/// The OpenKruise proposal's env name; ours wins when both are set.
pub use exitorder_contract::env::PRIORITY_KRUISE as ENV_KRUISE;

/// Annotation values are user input; cap what we parse so a huge value costs nothing.
const MAX_ANNOTATION_BYTES: usize = 64 * 1024;

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PriorityError {
    #[error("annotation {annotation} is not valid JSON: {reason}")]
    Json { annotation: String, reason: String },
    #[error("annotation {annotation} must be a JSON object of container name to integer")]
    NotObject { annotation: String },
    #[error("annotation {annotation}: priority of {container:?} is {value}, expected an integer 0..=255")]
    BadValue {
        annotation: String,
        container: String,
        value: String,
    },
    #[error("annotation {annotation} is larger than {MAX_ANNOTATION_BYTES} bytes")]
    TooLarge { annotation: String },
    #[error("env {name}={value:?} is not an integer 0..=255")]
    BadEnv { name: String, value: String },
}

/// Priorities named by the pod's annotations, if it has one.
pub type PodPriorities = BTreeMap<String, u8>;

/// Reads the pod's priority annotation (ours first, then the Kruise alias). `Ok(None)` when
/// the pod names no priorities.
pub fn from_annotations<'a, I>(annotations: I) -> Result<Option<PodPriorities>, PriorityError>
where
    I: IntoIterator<Item = (&'a str, &'a str)> + Clone,
{
    for key in [ANNOTATION, ANNOTATION_KRUISE] {
        if let Some((_, value)) = annotations.clone().into_iter().find(|(k, _)| *k == key) {
            return parse_annotation(key, value).map(Some);
        }
    }
    Ok(None)
}

/// Parses one annotation value: `{"name": N, ...}` with N an integer 0..=255.
pub fn parse_annotation(annotation: &str, value: &str) -> Result<PodPriorities, PriorityError> {
    if value.len() > MAX_ANNOTATION_BYTES {
        return Err(PriorityError::TooLarge {
            annotation: annotation.to_owned(),
        });
    }
    let json: serde_json::Value = serde_json::from_str(value).map_err(|e| PriorityError::Json {
        annotation: annotation.to_owned(),
        reason: e.to_string(),
    })?;
    let serde_json::Value::Object(map) = json else {
        return Err(PriorityError::NotObject {
            annotation: annotation.to_owned(),
        });
    };
    map.into_iter()
        .map(|(container, v)| {
            // as_u64 rejects negatives and floats (1.5, and also 1.0: a priority is an integer).
            match v.as_u64().and_then(|n| u8::try_from(n).ok()) {
                Some(n) => Ok((container, n)),
                None => Err(PriorityError::BadValue {
                    annotation: annotation.to_owned(),
                    value: v.to_string(),
                    container,
                }),
            }
        })
        .collect()
}

/// Reads a container's priority from its env (ours first, then the Kruise alias).
pub fn from_env<'a, I>(envs: I) -> Result<Option<u8>, PriorityError>
where
    I: IntoIterator<Item = (&'a str, &'a str)> + Clone,
{
    for name in [ENV, ENV_KRUISE] {
        if let Some((_, value)) = envs.clone().into_iter().find(|(k, _)| *k == name) {
            return value
                .trim()
                .parse::<u8>()
                .map(Some)
                .map_err(|_| PriorityError::BadEnv {
                    name: name.to_owned(),
                    value: value.to_owned(),
                });
        }
    }
    Ok(None)
}

/// A container's priority from the literal values of its spec's env. A value set from a
/// Secret or a field is not in the spec: the agent reads it from the runtime, where it is.
pub fn from_spec_env(
    c: &k8s_openapi::api::core::v1::Container,
) -> Result<Option<u8>, PriorityError> {
    from_env(
        c.env
            .iter()
            .flatten()
            .filter_map(|e| e.value.as_deref().map(|v| (e.name.as_str(), v))),
    )
}

/// The priority a container ends up with.
pub fn resolve(container: &str, pod: Option<&PodPriorities>, env: Option<u8>) -> u8 {
    resolve_as(container, pod, env, false)
}

/// The priority a native sidecar gets when neither the annotation nor its env names one:
/// it is a sidecar, so it exits after the main containers.
pub const NATIVE_DEFAULT: u8 = 1;

/// [`resolve`] for a container that may be a native sidecar (an init container with
/// `restartPolicy: Always`).
pub fn resolve_as(
    container: &str,
    pod: Option<&PodPriorities>,
    env: Option<u8>,
    native: bool,
) -> u8 {
    resolve_from(container, pod, env, native).0
}

/// Where a container's priority came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Source {
    /// The pod's annotation names it.
    Annotation,
    /// Its own env.
    Env,
    /// An unnamed native sidecar.
    NativeSidecar,
    /// A preset, by the container's name.
    Preset,
    /// None of them: a main container.
    Default,
}

/// [`resolve_as`], and which of its rules answered.
pub fn resolve_from(
    container: &str,
    pod: Option<&PodPriorities>,
    env: Option<u8>,
    native: bool,
) -> (u8, Source) {
    if let Some(n) = pod.and_then(|p| p.get(container)) {
        return (*n, Source::Annotation);
    }
    if let Some(n) = env {
        return (n, Source::Env);
    }
    if native {
        return (NATIVE_DEFAULT, Source::NativeSidecar);
    }
    match crate::presets::by_name(container) {
        Some(p) => (p.priority, Source::Preset),
        None => (0, Source::Default),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ann(v: &str) -> Result<PodPriorities, PriorityError> {
        parse_annotation(ANNOTATION, v)
    }

    #[test]
    fn annotation_valid_forms() {
        let p = ann(r#"{"app":0,"linkerd-proxy":1,"logs":255}"#).unwrap();
        assert_eq!(p.get("app"), Some(&0));
        assert_eq!(p.get("linkerd-proxy"), Some(&1));
        assert_eq!(p.get("logs"), Some(&255));
        assert!(ann("{}").unwrap().is_empty());
    }

    #[test]
    fn annotation_invalid_forms_each_named() {
        for (value, want) in [
            ("{", "not valid JSON"),
            ("[1,2]", "must be a JSON object"),
            ("3", "must be a JSON object"),
            (r#"{"a":256}"#, "\"a\" is 256"),
            (r#"{"a":-1}"#, "\"a\" is -1"),
            (r#"{"a":1.5}"#, "\"a\" is 1.5"),
            (r#"{"a":"2"}"#, "\"a\" is \"2\""),
            (r#"{"a":null}"#, "\"a\" is null"),
        ] {
            let err = ann(value).expect_err(value).to_string();
            assert!(err.contains(want), "{value}: {err}");
            assert!(err.contains(ANNOTATION), "{value}: {err}");
        }
        let huge = format!("{{\"a\":\"{}\"}}", "x".repeat(MAX_ANNOTATION_BYTES));
        assert!(matches!(ann(&huge), Err(PriorityError::TooLarge { .. })));
    }

    #[test]
    fn our_annotation_wins_over_kruise_alias() {
        let a = [
            (ANNOTATION, r#"{"p":2}"#),
            (ANNOTATION_KRUISE, r#"{"p":7}"#),
        ];
        assert_eq!(from_annotations(a).unwrap().unwrap().get("p"), Some(&2));
        let k = [("other", "x"), (ANNOTATION_KRUISE, r#"{"p":7}"#)];
        assert_eq!(from_annotations(k).unwrap().unwrap().get("p"), Some(&7));
        assert_eq!(from_annotations([("other", "x")]).unwrap(), None);
        assert!(from_annotations([(ANNOTATION_KRUISE, "nope")]).is_err());
    }

    #[test]
    fn env_forms() {
        assert_eq!(from_env([(ENV, "3")]).unwrap(), Some(3));
        assert_eq!(from_env([(ENV_KRUISE, " 4 ")]).unwrap(), Some(4));
        assert_eq!(from_env([(ENV, "1"), (ENV_KRUISE, "9")]).unwrap(), Some(1));
        assert_eq!(from_env([("PATH", "/bin")]).unwrap(), None);
        for bad in ["256", "-1", "x", "", "1.0"] {
            let err = from_env([(ENV, bad)]).expect_err(bad);
            assert!(err.to_string().contains(ENV), "{err}");
        }
    }

    #[test]
    fn resolve_precedence() {
        let pod: PodPriorities = [("linkerd-proxy".to_owned(), 3)].into();
        assert_eq!(resolve("linkerd-proxy", Some(&pod), Some(9)), 3);
        assert_eq!(resolve("linkerd-proxy", None, Some(9)), 9);
        assert_eq!(resolve("linkerd-proxy", None, None), 1);
        assert_eq!(resolve("fluent-bit", None, None), 1);
        assert_eq!(resolve("istio-proxy", Some(&pod), None), 1);
        assert_eq!(resolve("app", Some(&pod), None), 0);
        assert_eq!(resolve("app", None, Some(2)), 2);
        assert_eq!(resolve_as("logs", None, None, true), NATIVE_DEFAULT);
        assert_eq!(resolve_as("logs", None, Some(3), true), 3);
        assert_eq!(resolve_as("logs", None, Some(0), true), 0);
        assert_eq!(
            resolve_as(
                "logs",
                Some(&[("logs".to_owned(), 2)].into()),
                Some(3),
                true
            ),
            2
        );
        let sources = [
            resolve_from("linkerd-proxy", Some(&pod), None, false).1,
            resolve_from("app", None, Some(2), false).1,
            resolve_from("logs", None, None, true).1,
            resolve_from("daprd", None, None, false).1,
            resolve_from("app", None, None, false).1,
        ];
        assert_eq!(
            sources,
            [
                Source::Annotation,
                Source::Env,
                Source::NativeSidecar,
                Source::Preset,
                Source::Default
            ]
        );
    }
}
