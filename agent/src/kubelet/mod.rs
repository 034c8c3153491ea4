//! The agent's model of the kubelet: how it kills pods and containers, what it tells the API
//! server while it does, and the grace it gives. Every rule here mirrors upstream code, named
//! beside it (kubernetes/kubernetes `pkg/kubelet`, read at upstream commit `fbba6b47`; where
//! older kubelets differ, the difference is said). The agent's decisions use these rules, and
//! the test bed's kubelet plays the same texts and budgets (`testbed/src/kubelet/api.rs`,
//! `kills.rs`).
//!
//! The one fact everything else follows from: the kubelet keeps a pod `Running`, with no
//! `deletionTimestamp`, all through its own kills (node-pressure eviction, graceful node
//! shutdown, `activeDeadlineSeconds`, admission preemption): `status/status_manager.go`
//! `mergePodStatus` ("Delay transitioning a pod to a terminal status unless the pod is
//! actually terminal") withholds phase `Failed` and the `DisruptionTarget` condition while any
//! container could still run. The API pod's phase therefore never says that one container is
//! being restarted rather than the whole pod killed. Only the kubelet's own word for that one
//! container does ([`kills`]); without it, a preStop is taken for a pod kill and ordered.
//!
//! Parts:
//! - [`kills`]: the kinds of kill, and reading them from the kubelet's Events;
//! - [`grace`]: the grace period the kubelet gives a kill.

pub mod grace;
pub mod kills;
