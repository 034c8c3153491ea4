//! A one-node Kubernetes test bed for exitorder: a private containerd with a Pod runner that
//! plays the kubelet, and the two front ends built on it, `demo` and `bench`.
//!
//! Not part of the node's image: the DaemonSet binary holds the agent only. The end-to-end
//! tests, the demo and the benchmark all run their pods through this crate, from Kubernetes
//! Pod specs, the way a cluster would run them.
//!
//! Parts:
//! - `node`: a private containerd playing one node, images without a registry, the agent as
//!   a child process;
//! - `kubelet`: the Pod runner: Pod specs run and deleted the way the kubelet does it;
//! - `fakeapi`: a small API server the agent watches: pods, Events, the Node, the agent's
//!   DaemonSet, Services' EndpointSlices and their controller;
//! - `install`: the chart rendered by helm, its DaemonSet pod run from the image;
//! - `binaries`: the agent and the static entrypoint run, found and checked before use;
//! - `manifest`: the library's manifest reader, re-exported;
//! - `priorities`: the exit priorities a pod asks for, read apart from the agent;
//! - `verdict`: whether a pod's exits were ordered, judged from the node's exit times;
//! - `admission`: a pod through the webhook's own mutation, its patch applied;
//! - `agentlog`: what the agent's JSON log says about its allows;
//! - `clock`: the stamps' one clock;
//! - `skip`: the one rule for tests that need what a machine may lack;
//! - `demo`: `exitorder demo`: one pod run and deleted, a timeline and a verdict;
//! - `bench`: `exitorder bench`: how fast exits are ordered, and what it costs.

pub mod admission;
pub mod agentlog;
pub mod bench;
pub mod binaries;
pub mod clock;
pub mod demo;
pub mod fakeapi;
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
