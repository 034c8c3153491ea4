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
//! being restarted rather than the whole pod killed. What the node itself sees does
//! ([`evidence`]: a pod kill runs every container's preStop at once, a restart only one's);
//! the kubelet's Events are at most a hint ([`kills`]); without either, a preStop is taken for
//! a pod kill and ordered.
//!
//! Parts:
//! - [`evidence`]: a pod kill or one container's, from the containers' marks on the node;
//! - [`kills`]: the kinds of kill, and the kubelet's word on them in its Events;
//! - [`grace`]: the grace period the kubelet gives a kill.

pub mod evidence;
pub mod grace;
pub mod kills;
