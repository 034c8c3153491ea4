//! The container runtime's answers, as the agent reads them: ListPodSandbox and
//! ListContainers responses, a verbose ContainerStatus (with the `info` JSON the agent reads
//! a container's env from), and the event streams' messages, all through the agent's own
//! conversion (`runtime::listing`, `runtime::described`, `source::cri_change`,
//! `source::containerd_change`) into the node view, then everything decided from it. The
//! runtime passes along what pods wrote: names, labels, annotations, env.
//!
//! Input: up to five parts separated by `|cri|`: a prost-encoded ListPodSandboxResponse, a
//! ListContainersResponse, a ContainerStatusResponse, the verbose `info` JSON text (set on
//! that status when not empty), and events (records of a kind byte, a length byte and a
//! payload: a prost-encoded CRI ContainerEventResponse or a containerd task start, task exit
//! or container delete).
//!
//! Oracle: no panic; the listing holds the sandboxes and containers the kubelet labelled (a
//! pod-UID label that is a pod UID) and only those, with their labels' UID and name and a
//! grace period of at most a year; a described container is one the kubelet labelled, and an
//! env priority it gives is an env value it has; the view keeps every container indexed once under its own pod; and every
//! pod of the view passes the checks of `common::pod` (priorities, deadline, decisions, Job
//! shutdown).
#![no_main]

#[path = "common/pod.rs"]
mod pod;

use std::collections::HashMap;
use std::time::Instant;

use exitorder::cri::{
    ContainerEventResponse, ContainerStatusResponse, ListContainersResponse, ListPodSandboxResponse,
};
use exitorder::decide::bounds::{self, MAX_SPAN};
use exitorder::decide::priority::{ENV, ENV_KRUISE};
use exitorder::pod::PodUid;
use exitorder::runtime::source;
use exitorder::runtime::{self, ANNOTATION_GRACE, LABEL_CONTAINER_NAME, LABEL_POD_UID};
use exitorder::view::{Change, NodeView};
use libfuzzer_sys::fuzz_target;
use prost::Message as _;

const SEP: &[u8] = b"|cri|";
/// How many listed containers are described with the status answer.
const DESCRIBED: usize = 8;

fn parts(data: &[u8]) -> Vec<&[u8]> {
    let mut out = Vec::new();
    let mut rest = data;
    while out.len() < 4 {
        match rest.windows(SEP.len()).position(|w| w == SEP) {
            Some(i) => {
                out.push(&rest[..i]);
                rest = &rest[i + SEP.len()..];
            }
            None => break,
        }
    }
    out.push(rest);
    out.resize(5, &[]);
    out
}

fuzz_target!(|data: &[u8]| {
    let p = parts(data);
    let sandboxes = ListPodSandboxResponse::decode(p[0])
        .map(|r| r.items)
        .unwrap_or_default();
    let containers = ListContainersResponse::decode(p[1])
        .map(|r| r.containers)
        .unwrap_or_default();
    let mut status = ContainerStatusResponse::decode(p[2]).ok();
    if let Some(st) = status.as_mut().filter(|_| !p[3].is_empty()) {
        st.info.insert(
            "info".to_owned(),
            String::from_utf8_lossy(p[3]).into_owned(),
        );
    }

    // The listing: the kubelet's sandboxes and containers, and only those.
    let listing = runtime::listing(7, sandboxes.clone(), containers.clone());
    let labelled: Vec<_> = sandboxes.iter().filter(|s| kubelets(&s.labels)).collect();
    assert_eq!(listing.sandboxes.len(), labelled.len());
    for (info, sb) in listing.sandboxes.iter().zip(labelled) {
        assert_eq!(info.id, sb.id);
        assert_eq!(Some(info.pod_uid.as_str()), uid_label(&sb.labels));
        assert_eq!(info.annotations, sb.annotations);
    }
    let labelled: Vec<_> = containers
        .iter()
        .filter(|c| kubelets(&c.labels) && c.labels.contains_key(LABEL_CONTAINER_NAME))
        .collect();
    assert_eq!(listing.containers.len(), labelled.len());
    for (info, c) in listing.containers.iter().zip(labelled) {
        assert_eq!(info.id, c.id);
        assert_eq!(Some(info.pod_uid.as_str()), uid_label(&c.labels));
        assert_eq!(Some(&info.name), c.labels.get(LABEL_CONTAINER_NAME));
        assert_eq!(info.created_at, c.created_at);
        check_grace(info.grace, &c.annotations);
    }

    let now = Instant::now();
    let mut view = NodeView::new();
    let ids: Vec<String> = listing.containers.iter().map(|c| c.id.clone()).collect();
    view.apply(Change::Listed(listing), now);
    let _ = view.needs(now);

    // The events streams' messages.
    let mut ev = p[4];
    while let [kind, len, rest @ ..] = ev {
        let (payload, next) = rest.split_at(usize::from(*len).min(rest.len()));
        ev = next;
        let change = match kind % 4 {
            0 => ContainerEventResponse::decode(payload)
                .ok()
                .and_then(source::cri_change),
            1 => source::containerd_change("/tasks/start", payload),
            2 => source::containerd_change("/tasks/exit", payload),
            _ => source::containerd_change("/containers/delete", payload),
        };
        if let Some(change) = change {
            view.apply(change, now);
        }
    }

    // The verbose status, as the answer for its own id and for listed containers.
    if let Some(st) = status {
        let own = st.status.as_ref().map(|s| s.id.clone()).unwrap_or_default();
        for id in std::iter::once(own).chain(ids.into_iter().take(DESCRIBED)) {
            describe(&mut view, &id, st.clone(), now);
        }
    }
    let _ = view.needs(now);
    let _ = view.next_retry();

    let mut count = 0;
    for (uid, v) in view.pods() {
        for (id, c) in &v.containers {
            assert_eq!(id, &c.info.id);
            assert_eq!(uid, &c.info.pod_uid);
            count += 1;
        }
        assert!(
            v.sandbox.is_some() || !v.containers.is_empty(),
            "an empty pod is forgotten"
        );
        pod::check(v, None);
    }
    assert_eq!(
        count,
        view.container_count(),
        "every container indexed once"
    );
});

fn uid_label(labels: &HashMap<String, String>) -> Option<&str> {
    labels.get(LABEL_POD_UID).map(String::as_str)
}

/// Labels the kubelet could have written: a pod-UID label that is a pod UID.
fn kubelets(labels: &HashMap<String, String>) -> bool {
    uid_label(labels).is_some_and(|u| PodUid::parse(u).is_ok())
}

/// A grace period from the kubelet's annotation: bounded, and none only when there is no
/// number.
fn check_grace(grace: Option<std::time::Duration>, annotations: &HashMap<String, String>) {
    assert!(grace.is_none_or(|g| g <= MAX_SPAN));
    let number = annotations
        .get(ANNOTATION_GRACE)
        .is_some_and(|t| bounds::parse_seconds(t) != bounds::Seconds::Junk);
    assert_eq!(grace.is_some(), number, "{annotations:?}");
}

fn describe(view: &mut NodeView, id: &str, st: ContainerStatusResponse, now: Instant) {
    let labels = st
        .status
        .as_ref()
        .map(|s| s.labels.clone())
        .unwrap_or_default();
    let annotations = st
        .status
        .as_ref()
        .map(|s| s.annotations.clone())
        .unwrap_or_default();
    match runtime::described(id, st) {
        Ok(Some(d)) => {
            assert_eq!(d.info.id, id);
            assert_eq!(Some(d.info.pod_uid.as_str()), uid_label(&labels));
            assert_eq!(Some(&d.info.name), labels.get(LABEL_CONTAINER_NAME));
            check_grace(d.info.grace, &annotations);
            let env = d.env.clone();
            let change = d.change();
            if let Change::Described {
                env: Ok(Some(n)), ..
            } = &change
            {
                assert!(
                    env.iter()
                        .any(|(k, v)| (k == ENV || k == ENV_KRUISE)
                            && v.trim().parse::<u8>() == Ok(*n)),
                    "priority {n} from {env:?}"
                );
            }
            view.apply(change, now);
        }
        Ok(None) => {
            assert!(!(kubelets(&labels) && labels.contains_key(LABEL_CONTAINER_NAME)));
            view.apply(Change::NotAContainer { id: id.to_owned() }, now);
        }
        Err(_) => {
            view.apply(
                Change::DescribeFailed {
                    id: id.to_owned(),
                    now,
                },
                now,
            );
        }
    }
}
