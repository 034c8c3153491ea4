//! Hostile pods: every field of a pod the agent reads, at its type's full range and beyond
//! what any sane pod says, through everything the agent derives from it (proptest).
//!
//! A pod is made of what a tenant controls (container names, annotations, env, grace periods,
//! restart policies, init containers) and what the runtime reports of it (attempts, creation
//! times, states, labels, verbose info), as the CRI's own messages and as the API server's
//! Pod. It goes through the runtime's conversion into the node view, the view, the facts, the
//! decision, Job completion, the pod watch's conversion and the webhook. Properties:
//!
//! - never a panic;
//! - a decision is an allow, or a wait that ends at the pod's deadline (or sooner), never
//!   before the first exit file nor more than [`MAX_SPAN`] after it, and at the deadline
//!   every wait is allowed;
//! - a malformed exit priority (annotation or env) makes the pod unordered: every container
//!   0, nothing held; a well-formed one gives exactly the priorities it names;
//! - the deadline is the first exit file plus the bounded grace period (the API server's,
//!   else the kubelet's annotation, else 30 s) minus the reserve, whatever the grace says;
//! - the pod watch reads any API pod: bounded grace periods, its native sidecars in order;
//! - a Job's sidecars are shut down only after its main containers, one level at a time;
//! - the webhook answers any such pod with an AdmissionReview that echoes its uid;
//! - the node view stays consistent under any sequence of runtime answers and events.

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::time::{Duration, Instant};

use exitorder::cluster::podwatch::ApiPod;
use exitorder::cri::{
    Container, ContainerEventResponse, ContainerMetadata, ContainerStatus, ContainerStatusResponse,
    PodSandbox, PodSandboxMetadata,
};
use exitorder::decide::bounds::{Later as _, MAX_SPAN};
use exitorder::decide::restart::{Policy, Restart};
use exitorder::decide::{self, Deletion, Reason, RunState, Verdict};
use exitorder::jobs::completion::{self, Member, Participation, Step};
use exitorder::pod::PodUid;
use exitorder::runtime::source;
use exitorder::runtime::{self, ANNOTATION_GRACE, LABEL_CONTAINER_NAME, LABEL_POD_UID};
use exitorder::view::facts::{self, Clock, DEFAULT_GRACE};
use exitorder::view::{Change, ContainerInfo, EnvPriority, Listing, NodeView, SandboxInfo};
use exitorder::webhook::{review, Settings};
use exitorder_contract::annotation;
use exitorder_contract::env as envs;
use k8s_openapi::api::core::v1::Pod;
use proptest::prelude::*;
use serde_json::{json, Value};

/// Larger than every cap the agent puts on an annotation (64 KiB).
const HUGE: usize = 70 * 1024;

/// Any text a pod may carry: empty, DNS-like, presets, control characters, any char, lossy
/// bytes, and now and then one larger than every cap.
fn junk() -> BoxedStrategy<String> {
    prop_oneof![
        4 => "[a-z0-9]([a-z0-9-]{0,10}[a-z0-9])?",
        1 => Just(String::new()),
        1 => Just("linkerd-proxy".to_owned()),
        1 => Just("istio-proxy".to_owned()),
        1 => "[\\x00-\\x1f\\x7f]{1,6}",
        2 => proptest::collection::vec(any::<char>(), 0..12).prop_map(String::from_iter),
        2 => proptest::collection::vec(any::<u8>(), 0..24)
            .prop_map(|b| String::from_utf8_lossy(&b).into_owned()),
        1 => (1usize..=2).prop_map(|k| "n".repeat(k * HUGE / 2 + 7)),
    ]
    .boxed()
}

/// An int64 field of the API: anywhere in its range, its edges more often than chance.
fn api_int() -> BoxedStrategy<i64> {
    prop_oneof![
        3 => any::<i64>(),
        1 => Just(i64::MAX),
        1 => Just(i64::MIN),
        1 => Just(0),
        1 => Just(-1),
        1 => Just(1),
        2 => Just(30),
        1 => 0i64..=100_000,
    ]
    .boxed()
}

/// An int64 grace period as the kubelet counts it (negative is 0), at most the agent's bound.
fn bounded(secs: i64) -> Duration {
    Duration::from_secs(u64::try_from(secs).unwrap_or(0)).min(MAX_SPAN)
}

/// The kubelet's grace annotation's text, and the grace period it means (`None`: no number).
fn grace_text() -> BoxedStrategy<(String, Option<Duration>)> {
    prop_oneof![
        api_int().prop_map(|s| (s.to_string(), Some(bounded(s)))),
        Just((u64::MAX.to_string(), Some(MAX_SPAN))),
        Just(("9".repeat(400), Some(MAX_SPAN))),
        Just((" 45\n".to_owned(), Some(Duration::from_secs(45)))),
        Just(("+7".to_owned(), Some(Duration::from_secs(7)))),
        Just(("-0".to_owned(), Some(Duration::ZERO))),
        prop::sample::select(vec![
            "", " ", "-", "30s", "1e9", "0x10", "3 0", "--1", "١٢", "NaN"
        ])
        .prop_map(|s| (s.to_owned(), None)),
        junk().prop_map(|j| (format!("x{j}"), None)),
    ]
    .boxed()
}

/// A value of a priority annotation, and the priorities it names when it is well formed.
fn priority_value(names: Vec<String>) -> BoxedStrategy<(String, Option<BTreeMap<String, u8>>)> {
    let well_formed = proptest::collection::vec(
        (prop::sample::select(names.clone()), any::<u8>()),
        0..=names.len(),
    )
    .prop_map(|pairs| {
        let map: BTreeMap<String, u8> = pairs.into_iter().collect();
        let text = serde_json::to_string(&map).unwrap_or_default();
        // Past the cap, no priorities at all.
        let valid = (text.len() <= 64 * 1024).then_some(map);
        (text, valid)
    });
    let bad_member = (
        proptest::collection::btree_map(prop::sample::select(names.clone()), any::<u8>(), 0..3),
        prop::sample::select(names),
        prop_oneof![
            Just(json!(-1)),
            Just(json!(256)),
            Just(json!(1.5)),
            Just(json!(1.0)),
            Just(json!("1")),
            Just(json!(null)),
            Just(json!(true)),
            Just(json!([1])),
            Just(json!({"a": 1})),
            Just(json!(u64::MAX)),
            Just(json!(i64::MIN)),
            any::<i64>()
                .prop_filter("not 0..=255", |n| !(0..=255).contains(n))
                .prop_map(|n| json!(n)),
        ],
    )
        .prop_map(|(good, name, bad)| {
            let mut m: serde_json::Map<String, Value> =
                good.into_iter().map(|(k, v)| (k, json!(v))).collect();
            m.insert(name, bad);
            (Value::Object(m).to_string(), None)
        });
    let no_object_of_integers = prop_oneof![
        prop::sample::select(vec![
            "",
            "null",
            "[]",
            "1",
            "\"x\"",
            "{",
            "{\"a\":1,}",
            "{\"a\":1e400}",
            "{\"a\": 18446744073709551616}",
            "{'a': 1}",
            "{\"a\":1}}",
            "not json",
        ])
        .prop_map(|s| (s.to_owned(), None)),
        junk().prop_map(|j| (format!("!{j}"), None)),
        proptest::collection::vec(junk(), 0..3)
            .prop_map(|v| (serde_json::to_string(&v).unwrap_or_default(), None)),
    ];
    prop_oneof![3 => well_formed, 1 => bad_member, 1 => no_object_of_integers].boxed()
}

/// An env variable: its name, its value, and the priority the value gives when well formed.
type EnvVar = (String, (String, Result<u8, ()>));

/// A container's priority env value, and the priority it gives when it is well formed.
fn env_value() -> BoxedStrategy<(String, Result<u8, ()>)> {
    prop_oneof![
        12 => (any::<u8>(), prop::sample::select(vec!["", " ", "\t", "\n"]))
            .prop_map(|(n, pad)| (format!("{pad}{n}{pad}"), Ok(n))),
        1 => prop::sample::select(vec![
            "", "-1", "256", "1.0", "0x1", "1e2", "one", "- 1", "99999999999999999999999",
        ])
        .prop_map(|s| (s.to_owned(), Err(()))),
        1 => junk().prop_map(|j| (format!("x{j}"), Err(()))),
        1 => api_int().prop_filter("not 0..=255", |n| !(0..=255).contains(n))
            .prop_map(|n| (n.to_string(), Err(()))),
    ]
    .boxed()
}

/// Env variables: the two priority names, in any order and number, among others.
fn env_list() -> BoxedStrategy<Vec<EnvVar>> {
    proptest::collection::vec(
        (
            prop_oneof![
                1 => Just(envs::PRIORITY.to_owned()),
                1 => Just(envs::PRIORITY_KRUISE.to_owned()),
                2 => junk(),
            ],
            env_value(),
        ),
        0..3,
    )
    .boxed()
}

/// The priority a container's env gives, by the contract: ours, else the Kruise name; the
/// first of each.
fn env_meaning(env: &[EnvVar]) -> Result<Option<u8>, ()> {
    for name in [envs::PRIORITY, envs::PRIORITY_KRUISE] {
        if let Some((_, (_, meaning))) = env.iter().find(|(k, _)| k == name) {
            return meaning.map(Some);
        }
    }
    Ok(None)
}

/// How the runtime's verbose info carries a container's env.
#[derive(Debug, Clone, Copy)]
enum InfoForm {
    /// containerd: `config.envs`.
    Containerd,
    /// CRI-O: the OCI spec's `process.env`.
    Crio,
    /// No `info` key at all (no env known: none).
    Absent,
    /// Unreadable JSON: the read fails.
    Broken,
}

#[derive(Debug, Clone)]
struct HostileContainer {
    id: String,
    name: String,
    attempt: u32,
    created_at: i64,
    state: i32,
    /// Whether the kubelet's labels are on it (else the agent leaves it alone).
    labelled: bool,
    /// Whether the kubelet's grace annotation is on it.
    graced: bool,
    env: Vec<EnvVar>,
    info: InfoForm,
    /// The JSON junk around the env in the verbose info.
    pid: Value,
}

#[derive(Debug, Clone)]
struct ApiSpec {
    uid: Option<String>,
    deleting: bool,
    deletion_grace: Option<i64>,
    grace: Option<i64>,
    restart_policy: Option<String>,
    phase: Option<String>,
    /// Its own priority annotation (else the sandbox's annotations).
    priority: Option<(String, Option<BTreeMap<String, u8>>)>,
    /// Init containers: name and restartPolicy.
    init: Vec<(String, Option<String>)>,
    opted_in: bool,
}

#[derive(Debug, Clone)]
struct HostilePod {
    uid: String,
    names: Vec<String>,
    containers: Vec<HostileContainer>,
    sandbox_labelled: bool,
    /// Which annotation carries the priorities: ours, the Kruise alias, or both (ours wins).
    priority_key: u8,
    priority: Option<(String, Option<BTreeMap<String, u8>>)>,
    kruise_value: String,
    /// The webhook's native sidecar annotation and whether it is well formed.
    native: Option<(String, bool)>,
    grace: (String, Option<Duration>),
    /// CRI events: target (a container's index, or junk) and any event type.
    events: Vec<(Result<usize, String>, i32)>,
    api: Option<ApiSpec>,
    reserve: Duration,
    settle: Duration,
    staying: bool,
    exit_codes: Vec<Option<i32>>,
}

fn container(i: usize, names: Vec<String>) -> BoxedStrategy<HostileContainer> {
    (
        (prop::sample::select(names), junk()),
        prop_oneof![3 => 0u32..3, 1 => any::<u32>()],
        prop_oneof![2 => 0i64..5, 1 => api_int()],
        // Mostly running: what a wait waits for.
        prop_oneof![6 => Just(1i32), 1 => 0i32..4, 1 => any::<i32>()],
        prop::bool::weighted(0.9),
        any::<bool>(),
        env_list(),
        prop_oneof![
            3 => Just(InfoForm::Containerd),
            2 => Just(InfoForm::Crio),
            1 => Just(InfoForm::Absent),
            1 => Just(InfoForm::Broken),
        ],
        prop_oneof![
            Just(json!(1)),
            Just(json!(-1)),
            Just(json!(u64::MAX)),
            Just(json!("1")),
            Just(json!(null)),
            Just(json!(1e300)),
        ],
    )
        .prop_map(
            move |(
                (name, suffix),
                attempt,
                created_at,
                state,
                labelled,
                graced,
                env,
                info,
                pid,
            )| {
                HostileContainer {
                    // Unique, as the runtime's ids are, however the junk reads.
                    id: format!("c{i}-{suffix}"),
                    name,
                    attempt,
                    created_at,
                    state,
                    labelled,
                    graced,
                    env,
                    info,
                    pid,
                }
            },
        )
        .boxed()
}

fn api_spec(uid: String, names: Vec<String>) -> BoxedStrategy<ApiSpec> {
    let policy = prop_oneof![
        Just(Some("Never".to_owned())),
        Just(Some("OnFailure".to_owned())),
        Just(Some("Always".to_owned())),
        Just(None),
        junk().prop_map(Some),
    ];
    (
        prop_oneof![8 => Just(Some(uid)), 1 => Just(None), 1 => junk().prop_map(Some)],
        any::<bool>(),
        proptest::option::of(api_int()),
        proptest::option::of(api_int()),
        policy.clone(),
        prop_oneof![
            Just(None),
            Just(Some("Running".to_owned())),
            Just(Some("Failed".to_owned())),
            junk().prop_map(Some),
        ],
        proptest::option::of(priority_value(names.clone())),
        proptest::collection::vec((prop::sample::select(names), policy), 0..3),
        any::<bool>(),
    )
        .prop_map(
            |(
                uid,
                deleting,
                deletion_grace,
                grace,
                restart_policy,
                phase,
                priority,
                init,
                opted_in,
            )| {
                ApiSpec {
                    uid,
                    deleting,
                    deletion_grace,
                    grace,
                    restart_policy,
                    phase,
                    priority,
                    init,
                    opted_in,
                }
            },
        )
        .boxed()
}

fn hostile_pod() -> BoxedStrategy<HostilePod> {
    (
        prop_oneof![
            3 => Just("0f5c7a1e-8d2b-4c3e-9f00-123456789abc".to_owned()),
            1 => junk(),
        ],
        proptest::collection::vec(junk(), 1..=4),
    )
        .prop_flat_map(|(uid, mut names)| {
            // Names the presets and native sidecars act on, now and then.
            names.push("linkerd-proxy".to_owned());
            let n = names.len();
            let containers = (0..n + 2)
                .map(|i| container(i, names.clone()))
                .collect::<Vec<_>>();
            (
                (
                    Just(uid.clone()),
                    Just(names.clone()),
                    containers,
                    prop::bool::weighted(0.9),
                ),
                (
                    0u8..3,
                    proptest::option::of(priority_value(names.clone())),
                    junk(),
                    proptest::option::of(prop_oneof![
                        proptest::collection::vec(prop::sample::select(names.clone()), 0..3)
                            .prop_map(|v| {
                                let text = serde_json::to_string(&v).unwrap_or_default();
                                let ok = text.len() <= 16 * 1024;
                                (text, ok)
                            }),
                        junk().prop_map(|j| (format!("{{{j}"), false)),
                    ]),
                    grace_text(),
                ),
                proptest::collection::vec(
                    (
                        prop_oneof![3 => (0..n + 2).prop_map(Ok), 1 => junk().prop_map(Err)],
                        prop_oneof![3 => 0i32..4, 1 => any::<i32>()],
                    ),
                    0..6,
                ),
                proptest::option::weighted(0.7, api_spec(uid, names)),
                (
                    prop_oneof![
                        4 => Just(Duration::from_secs(5)),
                        1 => Just(Duration::ZERO),
                        1 => Just(Duration::MAX),
                        1 => any::<u64>().prop_map(Duration::from_secs),
                    ],
                    prop_oneof![
                        Just(Duration::from_millis(250)),
                        Just(Duration::MAX),
                        any::<u64>().prop_map(Duration::from_nanos),
                    ],
                    any::<bool>(),
                    proptest::collection::vec(proptest::option::of(any::<i32>()), n + 2),
                ),
            )
        })
        .prop_map(
            |(
                (uid, names, containers, sandbox_labelled),
                (priority_key, priority, kruise_value, native, grace),
                events,
                api,
                (reserve, settle, staying, exit_codes),
            )| HostilePod {
                uid,
                names,
                containers,
                sandbox_labelled,
                priority_key,
                priority,
                kruise_value,
                native,
                grace,
                events,
                api,
                reserve,
                settle,
                staying,
                exit_codes,
            },
        )
        .boxed()
}

impl HostilePod {
    /// The pod's annotations, as the kubelet copies them to the sandbox.
    fn annotations(&self) -> HashMap<String, String> {
        let mut a = HashMap::new();
        if let Some((value, _)) = &self.priority {
            match self.priority_key {
                0 => {
                    a.insert(annotation::PRIORITY.to_owned(), value.clone());
                }
                1 => {
                    a.insert(annotation::PRIORITY_KRUISE.to_owned(), value.clone());
                }
                _ => {
                    a.insert(annotation::PRIORITY.to_owned(), value.clone());
                    a.insert(
                        annotation::PRIORITY_KRUISE.to_owned(),
                        self.kruise_value.clone(),
                    );
                }
            }
        }
        if let Some((value, _)) = &self.native {
            a.insert(annotation::NATIVE_SIDECARS.to_owned(), value.clone());
        }
        a
    }

    fn sandbox(&self) -> PodSandbox {
        let mut labels = HashMap::new();
        if self.sandbox_labelled {
            labels.insert(LABEL_POD_UID.to_owned(), self.uid.clone());
        }
        PodSandbox {
            id: "sandbox".to_owned(),
            metadata: Some(PodSandboxMetadata {
                name: "web".to_owned(),
                uid: self.uid.clone(),
                namespace: "default".to_owned(),
                attempt: 0,
            }),
            state: 0,
            created_at: 1,
            labels,
            annotations: self.annotations(),
            runtime_handler: String::new(),
        }
    }

    fn labels(&self, c: &HostileContainer) -> HashMap<String, String> {
        if !c.labelled {
            return HashMap::new();
        }
        [
            (LABEL_POD_UID.to_owned(), self.uid.clone()),
            (LABEL_CONTAINER_NAME.to_owned(), c.name.clone()),
        ]
        .into()
    }

    fn container_annotations(&self, c: &HostileContainer) -> HashMap<String, String> {
        if c.graced {
            [(ANNOTATION_GRACE.to_owned(), self.grace.0.clone())].into()
        } else {
            HashMap::new()
        }
    }

    /// ListContainers' entry.
    fn cri_container(&self, c: &HostileContainer) -> Container {
        Container {
            id: c.id.clone(),
            pod_sandbox_id: "sandbox".to_owned(),
            metadata: Some(ContainerMetadata {
                name: c.name.clone(),
                attempt: c.attempt,
            }),
            image: None,
            image_ref: String::new(),
            state: c.state,
            created_at: c.created_at,
            labels: self.labels(c),
            annotations: self.container_annotations(c),
        }
    }

    /// The verbose ContainerStatus answer.
    fn status(&self, c: &HostileContainer) -> ContainerStatusResponse {
        let pairs: Vec<(&str, &str)> = c
            .env
            .iter()
            .map(|(k, (v, _))| (k.as_str(), v.as_str()))
            .collect();
        let info = match c.info {
            InfoForm::Containerd => Some(
                json!({
                    "pid": c.pid,
                    "config": {"envs": pairs.iter().map(|(k, v)| json!({"key": k, "value": v})).collect::<Vec<_>>()},
                    "runtimeSpec": {"process": {"env": ["PATH=/bin"]}, "mounts": [{"destination": "/var/run/exitorder"}]},
                })
                .to_string(),
            ),
            InfoForm::Crio => Some(
                json!({
                    "pid": c.pid,
                    "runtimeSpec": {"process": {"env": pairs.iter().map(|(k, v)| format!("{k}={v}")).collect::<Vec<_>>()}},
                })
                .to_string(),
            ),
            InfoForm::Absent => None,
            InfoForm::Broken => Some(format!("{{\"pid\": {}", c.pid)),
        };
        ContainerStatusResponse {
            status: Some(ContainerStatus {
                id: c.id.clone(),
                metadata: Some(ContainerMetadata {
                    name: c.name.clone(),
                    attempt: c.attempt,
                }),
                state: c.state,
                created_at: c.created_at,
                labels: self.labels(c),
                annotations: self.container_annotations(c),
                ..Default::default()
            }),
            info: info
                .map(|i| [("info".to_owned(), i)].into())
                .unwrap_or_default(),
        }
    }

    /// The env the runtime reports: what a CRI-O `KEY=VALUE` can carry (a name with `=`
    /// splits at the first one).
    fn reported_env(&self, c: &HostileContainer) -> Vec<EnvVar> {
        match c.info {
            InfoForm::Containerd if !c.env.is_empty() => c.env.clone(),
            InfoForm::Crio => c
                .env
                .iter()
                .map(|(k, v)| match k.split_once('=') {
                    // The value is then no priority name's: its meaning does not matter.
                    Some((k, rest)) => (k.to_owned(), (format!("{rest}={}", v.0), Err(()))),
                    None => (k.clone(), v.clone()),
                })
                .collect(),
            _ => Vec::new(),
        }
    }

    /// The API server's Pod, as JSON (what the watch and the webhook read).
    fn api_json(&self, api: &ApiSpec) -> Value {
        let mut annotations: serde_json::Map<String, Value> = match &api.priority {
            Some((value, _)) => [(annotation::PRIORITY.to_owned(), json!(value))]
                .into_iter()
                .collect(),
            None => self
                .annotations()
                .into_iter()
                .filter(|(k, _)| k != annotation::NATIVE_SIDECARS)
                .map(|(k, v)| (k, json!(v)))
                .collect(),
        };
        if api.opted_in {
            annotations.insert(annotation::INJECT.to_owned(), json!("true"));
        }
        let mut metadata = json!({
            "name": "web",
            "namespace": "default",
            "annotations": annotations,
        });
        if let Some(uid) = &api.uid {
            metadata["uid"] = json!(uid);
        }
        if api.deleting {
            metadata["deletionTimestamp"] = json!("2024-05-01T10:00:00Z");
        }
        if let Some(g) = api.deletion_grace {
            metadata["deletionGracePeriodSeconds"] = json!(g);
        }
        let mut seen = HashSet::new();
        let containers: Vec<Value> = self
            .containers
            .iter()
            .filter(|c| seen.insert(c.name.clone()))
            .map(|c| {
                json!({
                    "name": c.name,
                    "image": "example.com/app:1",
                    "env": c.env.iter().map(|(k, (v, _))| json!({"name": k, "value": v})).collect::<Vec<_>>(),
                })
            })
            .collect();
        let init: Vec<Value> = api
            .init
            .iter()
            .map(|(name, policy)| {
                let mut c = json!({"name": name, "image": "example.com/init:1"});
                if let Some(p) = policy {
                    c["restartPolicy"] = json!(p);
                }
                c
            })
            .collect();
        let mut spec = json!({"containers": containers, "initContainers": init});
        if let Some(g) = api.grace {
            spec["terminationGracePeriodSeconds"] = json!(g);
        }
        if let Some(p) = &api.restart_policy {
            spec["restartPolicy"] = json!(p);
        }
        let mut pod =
            json!({"apiVersion": "v1", "kind": "Pod", "metadata": metadata, "spec": spec});
        if let Some(phase) = &api.phase {
            pod["status"] = json!({"phase": phase});
        }
        pod
    }
}

/// A text short enough for a failure's message.
fn short(text: &str) -> String {
    match text.char_indices().nth(120) {
        Some((i, _)) => format!("{}... ({} bytes)", &text[..i], text.len()),
        None => text.to_owned(),
    }
}

/// The grace period the kubelet gives a pod, from its API fields: the deletion's own when
/// set and positive, else the spec's, at least 1 s.
fn api_grace(api: &ApiSpec) -> Option<Duration> {
    api.deletion_grace
        .map(bounded)
        .filter(|g| !g.is_zero())
        .or(api.grace.map(bounded))
        .map(|g| g.max(Duration::from_secs(1)))
}

/// What a pod UID is (a UUID, or a static pod's hex hash: lowercase hex and dashes, 8 to 64
/// bytes, no leading dash), written apart from the agent's parser so that a parser letting
/// junk through fails here.
fn is_pod_uid(s: &str) -> bool {
    (8..=64).contains(&s.len())
        && !s.starts_with('-')
        && s.bytes()
            .all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f' | b'-'))
}

/// Checks everything the agent derives from one pod.
fn check_pod(p: &HostilePod) -> Result<(), TestCaseError> {
    let base = Instant::now();
    // The runtime's answers, through the agent's conversion, into the view.
    let listing = runtime::listing(
        0,
        vec![p.sandbox()],
        p.containers.iter().map(|c| p.cri_container(c)).collect(),
    );
    // A pod-UID label that is no UID is none the kubelet wrote: nothing of it is listed.
    let kubelet_uid = PodUid::parse(&p.uid).ok();
    prop_assert_eq!(kubelet_uid.is_some(), is_pod_uid(&p.uid), "{:?}", &p.uid);
    prop_assert_eq!(
        listing.sandboxes.len(),
        usize::from(p.sandbox_labelled && kubelet_uid.is_some())
    );
    let listed: Vec<&str> = listing.containers.iter().map(|c| c.id.as_str()).collect();
    let labelled: Vec<&str> = p
        .containers
        .iter()
        .filter(|c| c.labelled && kubelet_uid.is_some())
        .map(|c| c.id.as_str())
        .collect();
    prop_assert_eq!(
        &listed,
        &labelled,
        "the kubelet's containers, and only those"
    );
    for (info, c) in listing.containers.iter().zip(
        p.containers
            .iter()
            .filter(|c| c.labelled && kubelet_uid.is_some()),
    ) {
        prop_assert_eq!(&info.name, &c.name);
        prop_assert_eq!(info.pod_uid.as_str(), p.uid.as_str());
        prop_assert_eq!((info.attempt, info.created_at), (c.attempt, c.created_at));
        let grace = if c.graced { p.grace.1 } else { None };
        prop_assert_eq!(info.grace, grace, "grace annotation {:?}", &p.grace.0);
        prop_assert!(info.grace.is_none_or(|g| g <= MAX_SPAN));
    }
    let mut view = NodeView::new();
    view.apply(Change::Listed(listing), base);
    view.needs(base);
    let mut removed = HashSet::new();
    for (target, kind) in &p.events {
        let id = match target {
            Ok(i) => p
                .containers
                .get(*i)
                .map_or("gone".to_owned(), |c| c.id.clone()),
            Err(junk) => junk.clone(),
        };
        let ev = ContainerEventResponse {
            container_id: id.clone(),
            container_event_type: *kind,
            created_at: 0,
            pod_sandbox_status: None,
            containers_statuses: Vec::new(),
        };
        if let Some(change) = source::cri_change(ev) {
            if matches!(change, Change::Removed { .. }) {
                removed.insert(id);
            }
            view.apply(change, base);
        }
    }
    let mut described = HashMap::new();
    for c in &p.containers {
        match runtime::described(&c.id, p.status(c)) {
            Ok(Some(d)) => {
                prop_assert!(c.labelled && kubelet_uid.is_some());
                prop_assert!(!matches!(c.info, InfoForm::Broken));
                prop_assert_eq!(&d.info.name, &c.name);
                described.insert(c.id.clone(), ());
                view.apply(d.change(), base);
            }
            Ok(None) => {
                prop_assert!(!c.labelled || kubelet_uid.is_none());
                view.apply(Change::NotAContainer { id: c.id.clone() }, base);
            }
            Err(_) => {
                prop_assert!(
                    c.labelled && kubelet_uid.is_some() && matches!(c.info, InfoForm::Broken)
                );
                view.apply(
                    Change::DescribeFailed {
                        id: c.id.clone(),
                        now: base,
                    },
                    base,
                );
            }
        }
    }
    view.needs(base);
    prop_assert!(view.next_retry().is_none_or(|t| t >= base));

    // The containers the view must hold: the kubelet's, less those removed.
    let present: Vec<&HostileContainer> = p
        .containers
        .iter()
        .filter(|c| c.labelled && kubelet_uid.is_some() && !removed.contains(&c.id))
        .collect();
    // The pod watch's reading, whether or not the runtime's pod is in the view.
    let api_pod: Option<Pod> = p
        .api
        .as_ref()
        .map(|a| serde_json::from_value(p.api_json(a)))
        .transpose()
        .map_err(|e| TestCaseError::fail(format!("the API pod: {e}")))?;
    let api = api_pod.as_ref().and_then(ApiPod::from_pod);
    if let (Some(spec), Some(pod)) = (&p.api, &api_pod) {
        check_api_pod(spec, pod, api.as_ref())?;
    }
    let Some(v) = kubelet_uid.as_ref().and_then(|u| view.pod(u)) else {
        prop_assert!(present.is_empty(), "a pod with containers is in the view");
        return Ok(());
    };
    prop_assert_eq!(v.containers.len(), present.len());

    // Facts, as the agent assembles them.
    let api_annotations = api.as_ref().map(|a| &a.annotations);
    let named = facts::pod_priorities(v, api_annotations);
    let stop = facts::stop_order(v, api.as_ref().map(|a| &a.native_sidecars[..]));
    if api.is_none() {
        let well_formed = !p.sandbox_labelled || p.native.as_ref().is_none_or(|(_, ok)| *ok);
        prop_assert_eq!(stop.is_ok(), well_formed, "native sidecars {:?}", &p.native);
    }
    let stop = stop.unwrap_or_default();
    let ordered = facts::order(v, named, &stop);

    // The priorities the pod names: the API server's annotation, else the sandbox's.
    let used = match &api {
        Some(_) => p
            .api
            .as_ref()
            .and_then(|a| a.priority.as_ref().or(p.priority.as_ref())),
        // Without its sandbox, the view has none of the pod's annotations.
        None => p.priority.as_ref().filter(|_| p.sandbox_labelled),
    };
    let map: Option<&BTreeMap<String, u8>> = match used {
        Some((_, Some(m))) => Some(m),
        Some((_, None)) => None,
        None => None,
    };
    let bad_annotation = used.is_some_and(|(_, m)| m.is_none());
    // Each name's newest attempt, when exactly one is newest.
    let mut newest: BTreeMap<&str, Vec<&HostileContainer>> = BTreeMap::new();
    for c in &present {
        let e = newest.entry(c.name.as_str()).or_default();
        match e.first() {
            Some(n) if (n.attempt, n.created_at) > (c.attempt, c.created_at) => {}
            Some(n) if (n.attempt, n.created_at) == (c.attempt, c.created_at) => e.push(c),
            _ => *e = vec![c],
        }
    }
    let bad_env = newest.iter().any(|(name, n)| {
        n.len() == 1
            && map.is_none_or(|m| !m.contains_key(*name))
            && described.contains_key(&n[0].id)
            && env_meaning(&p.reported_env(n[0])).is_err()
    });
    if ordered.malformed.is_some() {
        prop_assert!(
            ordered.attempts.iter().all(|a| a.priority == 0),
            "unordered"
        );
        prop_assert!(ordered.unknown.is_empty());
    }
    if bad_annotation || bad_env {
        prop_assert!(
            ordered.malformed.is_some(),
            "a malformed priority is reported: annotation {:?}, env {}",
            used.map(|(text, valid)| (short(text), valid.is_some())),
            bad_env
        );
    }
    let ties = newest.values().any(|n| n.len() > 1);
    if !ties {
        prop_assert_eq!(
            ordered.malformed.is_some(),
            bad_annotation || bad_env,
            "{:?}",
            &ordered.malformed
        );
    }
    if ordered.malformed.is_none() {
        for (name, n) in &newest {
            if n.len() != 1 {
                continue;
            }
            let Some(a) = ordered.attempts.iter().find(|a| {
                a.name == *name && a.attempt == n[0].attempt && a.created_at == n[0].created_at
            }) else {
                return Err(TestCaseError::fail(format!("{name:?} has no attempt")));
            };
            let named = map.and_then(|m| m.get(*name)).copied();
            let env = if described.contains_key(&n[0].id) {
                env_meaning(&p.reported_env(n[0])).ok().flatten()
            } else {
                prop_assert!(
                    named.is_some() || ordered.unknown.iter().any(|u| u == name),
                    "an env not read is an unknown priority"
                );
                continue;
            };
            let native = stop.is_native(name);
            let preset = exitorder::presets::by_name(name).map(|p| p.priority);
            let want = named
                .or(env)
                .or(native.then_some(1))
                .or(preset)
                .unwrap_or(0);
            prop_assert_eq!(a.priority, want, "priority of {:?}", name);
        }
    }

    // The clock: any grace gives a deadline at or after the first exit file, within a year.
    let clock = Clock {
        first_seen: base,
        api_grace: api.as_ref().and_then(ApiPod::grace),
        runtime_grace: v.grace(),
        reserve: p.reserve,
    };
    let runtime_grace = present
        .iter()
        .any(|c| c.graced)
        .then_some(p.grace.1)
        .flatten();
    let grace = p
        .api
        .as_ref()
        .filter(|_| api.is_some())
        .and_then(api_grace)
        .or(runtime_grace)
        .unwrap_or(DEFAULT_GRACE);
    let deadline = clock.deadline();
    prop_assert!(deadline >= base && deadline <= base.later(MAX_SPAN));
    // Minus the reserve; a grace within the reserve holds to the kubelet's cut itself.
    let held = if grace > p.reserve {
        grace.saturating_sub(p.reserve)
    } else {
        grace
    };
    prop_assert_eq!(deadline, base.later(held));

    // Decisions, at the first exit file, at the deadline and a year on.
    let malformed = ordered.malformed.is_some();
    let deletion = if p.staying {
        Deletion::NotDeleting {
            settle: p.settle,
            restarting: p.names.iter().map(|n| (n.clone(), base)).collect(),
        }
    } else {
        Deletion::Deleting
    };
    let pod_facts = facts::assemble(ordered.clone(), deletion, &clock, stop.clone());
    let mut waiting: Vec<String> = p.names.clone();
    waiting.push("not-in-the-pod".to_owned());
    for name in &waiting {
        for now in [base, deadline, base.later(MAX_SPAN)] {
            let verdict = decide::decide(Some(&pod_facts), name, base, now);
            match &verdict {
                Verdict::Allow(_) => {}
                Verdict::Wait { until, blocked_by } => {
                    prop_assert!(!malformed, "a malformed pod is never held: {:?}", verdict);
                    prop_assert!(now < deadline, "held at the deadline: {:?}", verdict);
                    prop_assert!(!blocked_by.is_empty());
                    let Some(until) = until else {
                        return Err(TestCaseError::fail("a wait without an end"));
                    };
                    prop_assert!(*until >= base && *until <= deadline, "{:?}", verdict);
                }
            }
            if !v.containers.values().any(|c| c.info.name == *name) {
                prop_assert_eq!(&verdict, &Verdict::Allow(Reason::Unknown));
            }
        }
        let _ = decide::still_running(&pod_facts, name);
        let _ = decide::beyond_stop_order(&pod_facts, name);
    }

    // A Job: its sidecars shut down after its main containers, a level at a time.
    if let Some(api) = &api {
        if let Participation::On(policy) | Participation::OptedOut(policy) =
            completion::completes(api.restart_policy.as_deref(), &api.annotations)
        {
            let _ = completion::shutdown_urls(&api.annotations);
            let attempts = decide::newest_attempts(&ordered.attempts);
            let members: Vec<Member> = api
                .containers
                .iter()
                .enumerate()
                .map(|(i, name)| {
                    let a = attempts.iter().find(|a| &a.name == name);
                    Member {
                        name: name.clone(),
                        priority: a.map_or(0, |a| a.priority),
                        state: a.map_or(RunState::Created, |a| a.state),
                        exit_code: p.exit_codes.get(i).copied().flatten(),
                        // Rules that cannot be read: the kubelet may restart it, never done.
                        restart: api
                            .restart_of(name)
                            .unwrap_or_else(|_| Restart::pod(Policy::Always)),
                    }
                })
                .collect();
            let asked: BTreeSet<String> = BTreeSet::new();
            if let Step::Shutdown(names) = completion::next_step(&members, &asked) {
                prop_assert!(!names.is_empty());
                let mains: Vec<&Member> = members.iter().filter(|m| m.priority == 0).collect();
                prop_assert!(mains.iter().all(|m| m.state == RunState::Exited));
                prop_assert!(
                    mains
                        .iter()
                        .all(|m| !m.restart.restarts(m.exit_code.unwrap_or(0))),
                    "never while the kubelet starts a main container again"
                );
                if policy == completion::Completes::OnFailure {
                    prop_assert!(
                        mains.iter().all(|m| m.exit_code == Some(0)),
                        "only a success completes"
                    );
                }
                let level = members
                    .iter()
                    .filter(|m| m.priority > 0 && m.state != RunState::Exited)
                    .map(|m| m.priority)
                    .min();
                for n in &names {
                    let m = members.iter().find(|m| &m.name == n);
                    prop_assert!(m.is_some_and(|m| Some(m.priority) == level && m.priority > 0));
                }
            }
        }
    }
    Ok(())
}

/// The pod watch's reading of an API pod.
fn check_api_pod(spec: &ApiSpec, pod: &Pod, api: Option<&ApiPod>) -> Result<(), TestCaseError> {
    let Some(api) = api else {
        prop_assert!(
            spec.uid
                .as_deref()
                .is_none_or(|u| PodUid::parse(u).is_err()),
            "only a pod without a pod UID is not read"
        );
        return Ok(());
    };
    prop_assert_eq!(Some(api.uid.as_str()), spec.uid.as_deref());
    prop_assert_eq!(api.deleting, spec.deleting);
    prop_assert_eq!(api.grace(), api_grace(spec));
    prop_assert!(api
        .grace()
        .is_none_or(|g| g >= Duration::from_secs(1) && g <= MAX_SPAN));
    prop_assert!(api.deletion_grace.is_none_or(|g| g <= MAX_SPAN));
    let native: Vec<String> = spec
        .init
        .iter()
        .filter(|(_, p)| p.as_deref() == Some("Always"))
        .map(|(n, _)| n.clone())
        .collect();
    prop_assert_eq!(&api.native_sidecars, &native);
    // A deletion or a terminal phase is a pod kill; a pod that looks staying proves nothing,
    // but is never read as a kill.
    prop_assert_eq!(
        api.pod_kill(0).is_some(),
        spec.deleting || matches!(spec.phase.as_deref(), Some("Failed" | "Succeeded"))
    );
    let names: Vec<&String> = pod
        .spec
        .iter()
        .flat_map(|s| s.containers.iter().map(|c| &c.name))
        .collect();
    prop_assert_eq!(api.containers.iter().collect::<Vec<_>>(), names);
    Ok(())
}

/// The webhook's answer to the pod's creation.
fn check_webhook(p: &HostilePod, uid: &str) -> Result<(), TestCaseError> {
    let spec = p.api.clone().unwrap_or(ApiSpec {
        uid: None,
        deleting: false,
        deletion_grace: None,
        grace: None,
        restart_policy: None,
        phase: None,
        priority: None,
        init: Vec::new(),
        opted_in: true,
    });
    let object = p.api_json(&spec);
    let body = json!({
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {
            "uid": uid,
            "kind": {"group": "", "version": "v1", "kind": "Pod"},
            "operation": "CREATE",
            "namespace": "default",
            "object": object,
        },
    });
    let bytes = serde_json::to_vec(&body).map_err(|e| TestCaseError::fail(e.to_string()))?;
    let answer = review::answer(&bytes, &Settings::default());
    let Ok(answer) = answer else {
        return Err(TestCaseError::fail(format!("no answer: {answer:?}")));
    };
    let out: Value = serde_json::from_slice(&answer.body)
        .map_err(|e| TestCaseError::fail(format!("the answer is not JSON: {e}")))?;
    prop_assert_eq!(&out["apiVersion"], "admission.k8s.io/v1");
    prop_assert_eq!(&out["kind"], "AdmissionReview");
    prop_assert_eq!(&out["response"]["uid"], &json!(uid), "the uid is echoed");
    let allowed = out["response"]["allowed"].as_bool();
    prop_assert_eq!(allowed, Some(answer.outcome != review::Outcome::Denied));
    if answer.outcome == review::Outcome::Denied {
        prop_assert!(
            answer.message.is_some_and(|m| !m.is_empty()),
            "a denial says why"
        );
    }
    if !spec.opted_in {
        prop_assert_eq!(
            answer.outcome,
            review::Outcome::Unchanged,
            "not opted in: untouched"
        );
    }
    Ok(())
}

proptest! {
    // Few cases each, with large inputs: the whole file runs in a few seconds.
    #![proptest_config(ProptestConfig {
        cases: 256,
        failure_persistence: None,
        ..ProptestConfig::default()
    })]

    #[test]
    fn no_pod_panics_holds_past_its_deadline_or_misreads_its_priorities(p in hostile_pod()) {
        check_pod(&p)?;
    }

    #[test]
    fn the_webhook_answers_any_pod_echoing_its_uid(p in hostile_pod(), uid in junk()) {
        check_webhook(&p, &uid)?;
    }
}

/// One change of the runtime's, with junk wherever the runtime passes text along. A pod UID
/// is junk only as far as a UID can be: a label that is no UID never becomes a change
/// (`runtime::container_info`, the `cri_answers` fuzz target).
fn change() -> BoxedStrategy<(u8, String, PodUid, ContainerInfo, i64)> {
    let id = prop_oneof![3 => (0u8..6).prop_map(|i| format!("c{i}")), 1 => junk()];
    let uid = prop_oneof![
        3 => (0u8..3).prop_map(|i| format!("0f5c7a1e-8d2b-4c3e-9f00-00000000000{i}")),
        1 => "[0-9a-f][0-9a-f-]{7,63}",
    ]
    .prop_map(|u| PodUid::parse(&u).expect("a pod uid"));
    (
        0u8..11,
        id.clone(),
        uid.clone(),
        (
            id,
            uid,
            junk(),
            any::<u32>(),
            api_int(),
            0usize..4,
            proptest::option::of(any::<u64>()),
        ),
        api_int(),
    )
        .prop_map(
            |(kind, id, uid, (cid, cuid, name, attempt, created_at, state, grace), asked)| {
                let state = [
                    RunState::Created,
                    RunState::Running,
                    RunState::Exited,
                    RunState::Unknown,
                ][state];
                (
                    kind,
                    id,
                    uid,
                    ContainerInfo {
                        id: cid,
                        pod_uid: cuid,
                        name,
                        attempt,
                        created_at,
                        state,
                        grace: grace.map(Duration::from_secs),
                        marks: false,
                    },
                    asked,
                )
            },
        )
        .boxed()
}

proptest! {
    #![proptest_config(ProptestConfig {
        cases: 512,
        failure_persistence: None,
        ..ProptestConfig::default()
    })]

    /// Any sequence of runtime answers and events, with junk ids, uids and times: the view's
    /// indexes stay consistent and every read it asks for is one it can be answered.
    #[test]
    fn the_view_stays_consistent_under_any_changes(
        changes in proptest::collection::vec(change(), 1..40),
        later in proptest::collection::vec(any::<u64>(), 40),
    ) {
        let base = Instant::now();
        let mut view = NodeView::new();
        for (i, (kind, id, uid, info, asked)) in changes.into_iter().enumerate() {
            // Times of any size, saturated as the agent's own are.
            let now = base.later(Duration::from_nanos(later[i % later.len()]));
            let env = if info.attempt % 3 == 0 {
                Err(exitorder::decide::priority::PriorityError::BadEnv { name: id.clone(), value: uid.to_string() })
            } else {
                Ok(u8::try_from(info.attempt % 300).ok())
            };
            let listing = Listing {
                asked_at_ns: asked,
                asked: Some(now),
                sandboxes: vec![SandboxInfo {
                    id: id.clone(),
                    pod_uid: info.pod_uid.clone(),
                    namespace: String::new(),
                    name: String::new(),
                    annotations: HashMap::new(),
                    created_at: asked,
                }],
                containers: vec![info.clone()],
            };
            let change = match kind {
                0 => Change::Listed(listing),
                1 => Change::PodListed { uid, listing },
                2 => Change::Started { id },
                3 => Change::Exited { id },
                4 => Change::Removed { id },
                10 => Change::ProcessGone { id, at: now },
                5 => Change::Described { info, env },
                6 => Change::NotAContainer { id },
                7 => Change::DescribeFailed { id, now },
                8 => Change::SandboxFailed { uid, now },
                _ => Change::Listed(Listing { asked_at_ns: asked, ..Default::default() }),
            };
            view.apply(change, now);
            let _ = view.needs(now);
            let mut count = 0;
            for (uid, pod) in view.pods() {
                for (id, c) in &pod.containers {
                    prop_assert_eq!(id, &c.info.id);
                    prop_assert_eq!(uid, &c.info.pod_uid);
                    count += 1;
                    if let EnvPriority::Failed { retry_at, .. } = c.env {
                        prop_assert!(retry_at <= base.later(MAX_SPAN).later(MAX_SPAN));
                    }
                }
            }
            prop_assert_eq!(count, view.container_count(), "every container indexed once");
            for (uid, pod) in view.pods() {
                prop_assert!(
                    pod.sandbox.is_some() || !pod.containers.is_empty(),
                    "an empty pod is forgotten: {:?}", uid
                );
            }
            let _ = view.next_retry();
        }
    }
}

/// A Job's container as the Job shutdown sees it.
fn member() -> BoxedStrategy<Member> {
    (
        junk(),
        prop_oneof![3 => 0u8..3, 1 => any::<u8>()],
        prop_oneof![
            Just(RunState::Created),
            Just(RunState::Running),
            Just(RunState::Exited),
            Just(RunState::Unknown),
        ],
        prop_oneof![3 => Just(Some(0)), 1 => Just(None), 1 => any::<i32>().prop_map(Some)],
    )
        .prop_map(|(name, priority, state, exit_code)| Member {
            name,
            priority,
            state,
            exit_code,
            restart: Restart::pod(Policy::Never),
        })
        .boxed()
}

proptest! {
    #![proptest_config(ProptestConfig {
        cases: 1024,
        failure_persistence: None,
        ..ProptestConfig::default()
    })]

    /// Whatever the pod's restart policy and annotations say, only a completing pod that
    /// opted in takes part; and whatever its containers' names, priorities, states and exit
    /// codes, sidecars are shut down only once every main container is done (OnFailure: with
    /// status 0), the lowest running level first, never one already asked.
    #[test]
    fn a_jobs_sidecars_stop_after_its_main_containers_a_level_at_a_time(
        policy in prop_oneof![
            Just(Some("Never".to_owned())),
            Just(Some("OnFailure".to_owned())),
            Just(None),
            junk().prop_map(Some),
        ],
        keys in proptest::collection::vec(
            (
                prop::sample::select(vec![
                    annotation::INJECT,
                    annotation::INJECT_KRUISE,
                    annotation::PRIORITY,
                    annotation::PRIORITY_KRUISE,
                    annotation::TERMINATE_ON_COMPLETION,
                    annotation::SIDECAR_SHUTDOWN,
                ]),
                prop_oneof![Just("true".to_owned()), Just("false".to_owned()), junk()],
            ),
            0..5,
        ),
        members in proptest::collection::vec(member(), 0..8),
        asked in proptest::collection::vec(any::<proptest::sample::Index>(), 0..3),
    ) {
        let annotations: BTreeMap<String, String> =
            keys.into_iter().map(|(k, v)| (k.to_owned(), v)).collect();
        let participation = completion::completes(policy.as_deref(), &annotations);
        let opted_in = annotations.get(annotation::INJECT).is_some_and(|v| v == "true")
            || annotations.get(annotation::INJECT_KRUISE).is_some_and(|v| v == "true")
            || annotations.contains_key(annotation::PRIORITY)
            || annotations.contains_key(annotation::PRIORITY_KRUISE);
        let completes = matches!(policy.as_deref(), Some("Never" | "OnFailure"));
        prop_assert_eq!(participation == Participation::Off, !(completes && opted_in));
        let (urls, problem) = completion::shutdown_urls(&annotations);
        let presets: BTreeMap<String, String> = exitorder::presets::shutdown_urls(&annotations)
            .map(|(c, u)| (c.to_owned(), u.to_owned()))
            .collect();
        if problem.is_some() || !annotations.contains_key(annotation::SIDECAR_SHUTDOWN) {
            prop_assert_eq!(&urls, &presets, "a bad or no shutdown annotation: the presets");
        }
        prop_assert_eq!(
            problem.is_some(),
            annotations
                .get(annotation::SIDECAR_SHUTDOWN)
                .is_some_and(|v| serde_json::from_str::<BTreeMap<String, String>>(v).is_err()),
        );
        let policy = match policy.as_deref() {
            Some("OnFailure") => completion::Completes::OnFailure,
            _ => completion::Completes::Never,
        };
        let asked: BTreeSet<String> = asked
            .iter()
            .filter(|_| !members.is_empty())
            .map(|i| members[i.index(members.len())].name.clone())
            .collect();
        let members: Vec<Member> = members
            .into_iter()
            .map(|m| Member { restart: Restart::pod(policy.policy()), ..m })
            .collect();
        let step = completion::next_step(&members, &asked);
        let mains: Vec<&Member> = members.iter().filter(|m| m.priority == 0).collect();
        if let Step::Shutdown(names) = &step {
            prop_assert!(!names.is_empty());
            prop_assert!(mains.iter().all(|m| m.state == RunState::Exited), "{:?}", members);
            if policy == completion::Completes::OnFailure {
                prop_assert!(mains.iter().all(|m| m.exit_code == Some(0)), "{:?}", members);
            }
            let level = members
                .iter()
                .filter(|m| m.priority > 0 && m.state != RunState::Exited)
                .map(|m| m.priority)
                .min();
            for n in names {
                prop_assert!(!asked.contains(n), "{} asked twice", n);
                prop_assert!(
                    members.iter().any(|m| &m.name == n && Some(m.priority) == level
                        && m.state != RunState::Exited),
                    "{} is not of the lowest running level {:?}: {:?}", n, level, members
                );
            }
        }
        if let Step::ReadExitCodes(names) = &step {
            prop_assert_eq!(policy, completion::Completes::OnFailure);
            for n in names {
                prop_assert!(mains.iter().any(|m| &m.name == n && m.exit_code.is_none()));
            }
        }
    }
}
