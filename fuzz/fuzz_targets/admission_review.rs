//! The admission webhook's whole answer (`review::answer`): an AdmissionReview body as the
//! API server posts it, with a pod any user who can create pods wrote.
//!
//! Oracle: no panic; the answer is an AdmissionReview carrying the request's uid; a denial
//! carries a message; a patch applies, as the API server applies it, to the object as sent,
//! and the result is a valid Pod that a second pass leaves unchanged (the API server may
//! call the webhook again with its own output); and every entrypoint command the webhook
//! wrote is one the entrypoint accepts (a refused one would fail the hook and leave the
//! sidecar unordered). `exitorder explain` reads the same object without a panic, and says
//! the webhook refuses it exactly when the mutation does.
#![no_main]

use std::collections::BTreeMap;
use std::ffi::CString;

use base64::Engine as _;
use exitorder::webhook::review::{self, Outcome};
use exitorder::webhook::{mutate, Admission, Settings};
use exitorder_contract::mount::ENTRYPOINTS;
use exitorder_entrypoint::cli::{self, Command, Env};
use k8s_openapi::api::core::v1::{Container, LifecycleHandler, Pod};
use libfuzzer_sys::fuzz_target;
use serde_json::Value;

fuzz_target!(|data: &[u8]| {
    let settings = Settings::default();
    let Ok(answer) = review::answer(data, &settings) else {
        return;
    };
    let body: Value = serde_json::from_slice(data).expect("an answered review is JSON");
    let request = &body["request"];
    let out: Value = serde_json::from_slice(&answer.body).expect("the answer is JSON");
    assert_eq!(out["apiVersion"], "admission.k8s.io/v1");
    assert_eq!(out["kind"], "AdmissionReview");
    let response = &out["response"];
    assert_eq!(response["uid"], request["uid"], "{out}");
    match answer.outcome {
        Outcome::Denied => {
            assert_eq!(response["allowed"], false);
            let message = answer.message.as_deref().unwrap_or_default();
            assert!(!message.is_empty(), "a denial says why");
            assert!(response["status"]["message"]
                .as_str()
                .is_some_and(|m| m.contains(message)));
            assert!(response.get("patch").is_none());
        }
        Outcome::Unchanged => {
            assert_eq!(response["allowed"], true);
            assert!(response.get("patch").is_none(), "{out}");
        }
        Outcome::Patched => {
            assert_eq!(response["allowed"], true);
            assert_eq!(response["patchType"], "JSONPatch");
            let object = &request["object"];
            let patched = apply(object, &response["patch"]);
            let pod: Pod = serde_json::from_value(patched.clone())
                .unwrap_or_else(|e| panic!("the patched object is not a Pod: {e}: {patched}"));
            match mutate(&patched, &settings) {
                Admission::Allow { patch, .. } if patch.0.is_empty() => {}
                again => panic!("a second pass answered {again:?} for {patched}"),
            }
            let before: Pod = serde_json::from_value(object.clone()).expect("it was read as a Pod");
            check_hooks(&before, &pod);
        }
    }
    let object = &request["object"];
    let refused = matches!(mutate(object, &settings), Admission::Deny(_));
    let options = exitorder::cli::explain::Options {
        settings,
        ..Default::default()
    };
    if let Ok(e) = exitorder::cli::explain::explain("fuzz", object, &options) {
        let denied = matches!(
            e.injection,
            exitorder::cli::explain::Injection::Denied { .. }
        );
        assert_eq!(denied, refused, "{e:?}");
    }
});

fn apply(object: &Value, patch: &Value) -> Value {
    let bytes = base64::engine::general_purpose::STANDARD
        .decode(patch.as_str().expect("the patch is a string"))
        .expect("the patch is base64");
    let patch: json_patch::Patch =
        serde_json::from_slice(&bytes).expect("the patch is a JSONPatch");
    let mut out = object.clone();
    json_patch::patch(&mut out, &patch)
        .unwrap_or_else(|e| panic!("the patch does not apply: {e}: {patch:?} to {object}"));
    out
}

fn containers(pod: &Pod) -> impl Iterator<Item = &Container> {
    pod.spec.iter().flat_map(|s| {
        s.containers
            .iter()
            .chain(s.init_containers.iter().flatten())
    })
}

/// The exec commands of a container's preStop and postStart hooks.
#[derive(PartialEq)]
struct Hooks {
    pre_stop: Option<Vec<String>>,
    post_start: Option<Vec<String>>,
}

fn hooks(c: &Container) -> Hooks {
    let lifecycle = c.lifecycle.as_ref();
    let exec = |h: Option<&LifecycleHandler>| {
        h.and_then(|h| h.exec.as_ref())
            .and_then(|e| e.command.clone())
    };
    Hooks {
        pre_stop: exec(lifecycle.and_then(|l| l.pre_stop.as_ref())),
        post_start: exec(lifecycle.and_then(|l| l.post_start.as_ref())),
    }
}

/// Every entrypoint hook the webhook wrote (hooks the pod came with are the pod's own).
fn check_hooks(before: &Pod, after: &Pod) {
    let mut original: BTreeMap<&str, Vec<Hooks>> = BTreeMap::new();
    for c in containers(before) {
        original.entry(c.name.as_str()).or_default().push(hooks(c));
    }
    for c in containers(after) {
        let now = hooks(c);
        let had = original
            .get(c.name.as_str())
            .map(Vec::as_slice)
            .unwrap_or_default();
        if let Some(argv) = &now.pre_stop {
            if !had.iter().any(|h| h.pre_stop.as_ref() == Some(argv)) {
                let parsed = entrypoint(argv);
                assert!(
                    matches!(parsed, Some(Ok(Command::Wait(_) | Command::Mark(_))) | None),
                    "preStop {argv:?} of {:?}: {parsed:?}",
                    c.name
                );
            }
        }
        if let Some(argv) = &now.post_start {
            if !had.iter().any(|h| h.post_start.as_ref() == Some(argv)) {
                let parsed = entrypoint(argv);
                assert!(
                    matches!(parsed, Some(Ok(Command::Await(_))) | None),
                    "postStart {argv:?} of {:?}: {parsed:?}",
                    c.name
                );
            }
        }
    }
}

/// The entrypoint's reading of a hook's command; `None` when the command is not the
/// entrypoint, or holds a NUL, which no runtime would exec.
fn entrypoint(argv: &[String]) -> Option<Result<Command, cli::UsageError>> {
    let (program, args) = argv.split_first()?;
    assert!(
        ENTRYPOINTS.contains(&program.as_str()),
        "the webhook's hooks run the entrypoint: {argv:?}"
    );
    let args: Vec<CString> = args
        .iter()
        .map(|a| CString::new(a.as_str()))
        .collect::<Result<_, _>>()
        .ok()?;
    Some(cli::parse(args, &Env::default()))
}
