//! The exit priorities a pod names: its annotation's JSON and a container's env value, as
//! the agent and the webhook read them from any pod an API user creates.
//!
//! Input: a selector byte, then up to three values separated by NUL. The first value is read
//! as an annotation on its own; the selector's bits say which of our annotation, the Kruise
//! alias and an unrelated one carry the values, and which env names do.
//!
//! Oracle: no panic; an accepted annotation is a JSON object whose every member is an
//! integer 0..=255, and the priorities are exactly its members; a refusal is the error
//! that says why, naming the annotation; the alias is read only when ours is absent; an env
//! value is accepted exactly when it is a number 0..=255 (around whitespace).
#![no_main]

use exitorder::decide::priority::{
    self, PodPriorities, PriorityError, ANNOTATION, ANNOTATION_KRUISE, ENV, ENV_KRUISE,
};
use libfuzzer_sys::fuzz_target;
use serde_json::Value;

/// The parser's own cap, which is private: above it the value is refused unread.
const MAX_ANNOTATION_BYTES: usize = 64 * 1024;

fuzz_target!(|data: &[u8]| {
    let Some((&selector, rest)) = data.split_first() else {
        return;
    };
    let text = String::from_utf8_lossy(rest);
    let values: Vec<&str> = text.splitn(3, '\0').collect();
    let first = values[0];

    check_annotation(
        ANNOTATION,
        first,
        &priority::parse_annotation(ANNOTATION, first),
    );

    let keys = [ANNOTATION, ANNOTATION_KRUISE, "example.com/other"];
    let annotations: Vec<(&str, &str)> = keys
        .iter()
        .zip(&values)
        .enumerate()
        .filter(|(i, _)| selector & (1 << i) != 0)
        .map(|(_, (k, v))| (*k, *v))
        .collect();
    let got = priority::from_annotations(annotations.iter().copied());
    let chosen = [ANNOTATION, ANNOTATION_KRUISE]
        .into_iter()
        .find_map(|key| annotations.iter().find(|(k, _)| *k == key));
    match chosen {
        None => assert_eq!(got, Ok(None), "no priority annotation: {annotations:?}"),
        Some((key, value)) => {
            assert_eq!(
                got,
                priority::parse_annotation(key, value).map(Some),
                "{key} chosen"
            );
            if let Ok(Some(p)) = &got {
                check_resolve(p);
            }
        }
    }

    let envs: Vec<(&str, &str)> = [ENV, ENV_KRUISE, "PATH"]
        .iter()
        .zip(&values)
        .enumerate()
        .filter(|(i, _)| selector & (1 << (i + 3)) != 0)
        .map(|(_, (k, v))| (*k, *v))
        .collect();
    let chosen = [ENV, ENV_KRUISE]
        .into_iter()
        .find_map(|name| envs.iter().find(|(k, _)| *k == name));
    match (priority::from_env(envs.iter().copied()), chosen) {
        (Ok(None), None) => {}
        (Ok(Some(n)), Some((_, value))) => {
            assert_eq!(
                number(value.trim()),
                Some(u64::from(n)),
                "{value:?} read as {n}"
            )
        }
        (Err(PriorityError::BadEnv { name, value }), Some((k, v))) => {
            assert_eq!((name.as_str(), value.as_str()), (*k, *v));
            let n = number(v.trim());
            assert!(n.is_none_or(|n| n > 255), "{v:?} refused");
        }
        (other, chosen) => panic!("{chosen:?} read as {other:?}"),
    }
});

/// A decimal number with an optional `+`, as Rust's integer parsing takes it (which the
/// env reading uses): anything else must be refused.
fn number(text: &str) -> Option<u64> {
    let digits = text.strip_prefix('+').unwrap_or(text);
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    // Past u64, still a number, and out of range.
    Some(digits.parse().unwrap_or(u64::MAX))
}

fn check_annotation(key: &str, value: &str, got: &Result<PodPriorities, PriorityError>) {
    if value.len() > MAX_ANNOTATION_BYTES {
        assert!(
            matches!(got, Err(PriorityError::TooLarge { .. })),
            "{got:?}"
        );
        return;
    }
    let json = serde_json::from_str::<Value>(value);
    match (got, json) {
        (Ok(p), Ok(Value::Object(map))) => {
            assert_eq!(p.len(), map.len(), "every member becomes a priority");
            for (name, n) in p {
                assert_eq!(map.get(name).and_then(Value::as_u64), Some(u64::from(*n)));
            }
        }
        (Err(PriorityError::Json { annotation, .. }), Err(_)) => assert_eq!(annotation, key),
        (Err(PriorityError::NotObject { annotation }), Ok(v)) => {
            assert_eq!(annotation, key);
            assert!(!v.is_object(), "{v}");
        }
        (
            Err(PriorityError::BadValue {
                annotation,
                container,
                value: shown,
            }),
            Ok(Value::Object(map)),
        ) => {
            assert_eq!(annotation, key);
            let bad = map
                .get(container)
                .expect("the refused member is in the object");
            assert_eq!(&bad.to_string(), shown);
            assert!(bad.as_u64().is_none_or(|n| n > 255), "{bad} refused");
        }
        (got, json) => panic!("{value:?}: {got:?} for {json:?}"),
    }
    if let Err(e) = got {
        assert!(e.to_string().contains(key), "{e}");
    }
}

/// The annotation wins over everything when it names the container.
fn check_resolve(p: &PodPriorities) {
    for (name, n) in p {
        assert_eq!(
            priority::resolve(name, Some(p), Some(n.wrapping_add(1))),
            *n
        );
        assert_eq!(priority::resolve_as(name, Some(p), None, true), *n);
    }
}
