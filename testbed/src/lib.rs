//! A one-node Kubernetes test bed for exitorder: a private containerd with a Pod runner that
//! plays the kubelet, and the two front ends built on it, `demo` and `bench`.
//!
//! Not part of the node's image: the DaemonSet binary holds the agent only. The end-to-end
//! tests, the demo and the benchmark all run their pods through this crate, from Kubernetes
//! Pod specs, the way a cluster would run them.

pub mod agentlog;
pub mod bench;
pub mod clock;
pub mod demo;
pub mod install;
pub mod kubelet;
pub mod manifest;
pub mod node;
pub mod priorities;
pub mod skip;
pub mod verdict;

pub use kubelet::api::{ApiLog, DisruptionTarget, Reported};
pub use kubelet::{
    ApiSink, ApiStatus, DeleteOptions, Deletion, EventType, Kill, KubeletEvent, Phase, PodRef,
    PodStatus, RunOptions, RunningPod, Shorten, Timeline, What,
};
pub use node::*;
