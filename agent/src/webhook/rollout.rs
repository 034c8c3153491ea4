//! Whether every node runs the current agent: the agents' DaemonSet's rollout, as the webhook
//! sees it, and what that makes of an injected sidecar's presence wait.
//!
//! An injected sidecar proceeds after a short presence wait (1 s) where no agent ever said it
//! serves its directory: a node without exitorder costs a pod next to nothing. But a release
//! before the presence file serves a directory without saying so, and an upgrade rolls the
//! DaemonSet out node by node (hours at `maxUnavailable: 1` on a large cluster) while the
//! upgraded webhook's pods reach every node at once: on a node still running the earlier agent,
//! a new pod's sidecar would take it for none and leave early. Only the webhook can know (a
//! pod-local pod sees nothing of its node), so while the DaemonSet is not rolled out, or its
//! state is not known, the webhook injects no presence wait (`EXITORDER_PRESENCE=0`: wait for
//! the agent's answer until the entrypoint's own timeout, as releases before it did); once
//! every node runs the current agent (which marks every directory it serves, pods admitted
//! meanwhile included), it injects nothing and the entrypoint's 1 s applies. A pod admitted
//! mid-rollout, on a node where no agent runs at all, waits out its timeout. The pod-local exit
//! volume is a tmpfs only once settled too ([`exits_in_memory`]).
//!
//! Cost to the API server: one watch of one DaemonSet (by name) per webhook replica, served
//! from the watch cache, an event per change of the DaemonSet's status during a rollout.

use std::future::Future;
use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::apps::v1::DaemonSet;
use kube::runtime::watcher;
use kube::{Api, Client};
use tracing::{info, warn};

use crate::backoff::Backoff;
use crate::cluster::watchloop;

/// What the webhook knows of the agents.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Agents {
    /// No rollout in progress: every node the DaemonSet covers runs its current agent (or
    /// there is no DaemonSet at all: no node runs an agent).
    Settled,
    /// The DaemonSet's current template has not reached every node yet.
    RollingOut,
    /// Not read yet, or cannot be read (RBAC, the API server away).
    Unknown,
}

impl Agents {
    pub fn as_str(self) -> &'static str {
        match self {
            Agents::Settled => "settled",
            Agents::RollingOut => "rolling_out",
            Agents::Unknown => "unknown",
        }
    }

    fn to_u8(self) -> u8 {
        match self {
            Agents::Settled => 0,
            Agents::RollingOut => 1,
            Agents::Unknown => 2,
        }
    }

    fn from_u8(v: u8) -> Agents {
        match v {
            0 => Agents::Settled,
            1 => Agents::RollingOut,
            _ => Agents::Unknown,
        }
    }
}

/// A DaemonSet's rollout as `kubectl rollout status` judges it (kubectl
/// `polymorphichelpers/rollout_status.go` `DaemonSetStatusViewer`): rolled out once the
/// controller observed the current generation and every scheduled pod is updated and
/// available.
pub fn state_of(ds: &DaemonSet) -> Agents {
    let Some(status) = ds.status.as_ref() else {
        return Agents::RollingOut;
    };
    let generation = ds.metadata.generation.unwrap_or(0);
    let observed = status.observed_generation.unwrap_or(0);
    let desired = status.desired_number_scheduled;
    let updated = status.updated_number_scheduled.unwrap_or(0);
    let available = status.number_available.unwrap_or(0);
    if observed < generation || updated < desired || available < desired {
        Agents::RollingOut
    } else {
        Agents::Settled
    }
}

/// The presence wait an injected sidecar gets: the one the webhook was told (`--agent-presence`)
/// if any; else, when it follows the agents' DaemonSet, none (wait for the agent's answer)
/// until every node runs the current agent, and the entrypoint's default after.
pub fn presence(told: Option<Duration>, agents: Option<Agents>) -> Option<Duration> {
    told.or(match agents {
        None | Some(Agents::Settled) => None,
        Some(Agents::RollingOut | Agents::Unknown) => Some(Duration::ZERO),
    })
}

/// Whether the containers sidecars wait for get `exitorder-entrypoint mark`: always where the
/// entrypoint comes from the project's image (pod-local), and in the host share's layout only
/// once every node runs the current agent, whose entrypoint the node's is (an earlier one
/// knows no `mark`, and the hook would fail, skipping the container's own preStop after it).
pub fn mark_containers(handshake: super::HandshakeVolume, agents: Option<Agents>) -> bool {
    match handshake {
        super::HandshakeVolume::EmptyDir => true,
        super::HandshakeVolume::HostPath => matches!(agents, None | Some(Agents::Settled)),
    }
}

/// Whether the pod-local exit directories' volume is a tmpfs (`medium: Memory`): once every
/// node runs the current agent. An agent of a release before it watches the directory the
/// kubelet makes and not the tmpfs the kubelet mounts over it a moment later, and would never
/// see the exits made there; a plain `emptyDir` is served by every release. (A pod admitted
/// as the agents settle and started on a node whose agent is downgraded meanwhile is the one
/// case left: its walk at the downgraded agent's start finds the tmpfs already mounted unless
/// the pod starts after that walk.)
pub fn exits_in_memory(agents: Option<Agents>) -> bool {
    matches!(agents, None | Some(Agents::Settled))
}

/// The settings a review is answered with while the agents are as `agents` say: the presence
/// wait (unless the webhook was told one), the containers' marks in the host share's layout,
/// and the exit volume's medium in the pod-local one follow the rollout.
pub fn following(settings: &super::Settings, agents: Agents) -> super::Settings {
    super::Settings {
        agent_presence: presence(settings.agent_presence, Some(agents)),
        mark_containers: mark_containers(settings.handshake_volume, Some(agents)),
        exits_in_memory: settings.exits_in_memory && exits_in_memory(Some(agents)),
        ..settings.clone()
    }
}

/// The webhook's handle on the agents' state.
#[derive(Debug, Clone)]
pub struct AgentsView(Arc<AtomicU8>);

impl AgentsView {
    /// A view that says `agents` (tests).
    pub fn fixed(agents: Agents) -> AgentsView {
        AgentsView(Arc::new(AtomicU8::new(agents.to_u8())))
    }

    pub fn get(&self) -> Agents {
        Agents::from_u8(self.0.load(Ordering::Acquire))
    }

    fn set(&self, agents: Agents) -> bool {
        self.0.swap(agents.to_u8(), Ordering::AcqRel) != agents.to_u8()
    }
}

/// The watch of the agents' DaemonSet `namespace/name`.
pub struct RolloutWatch {
    api: Api<DaemonSet>,
    name: String,
    shown: String,
    view: AgentsView,
}

/// A watch of the DaemonSet, and its view (unknown until the watch lists it).
pub fn rollout_watch(client: Client, namespace: &str, name: &str) -> (AgentsView, RolloutWatch) {
    let view = AgentsView::fixed(Agents::Unknown);
    (
        view.clone(),
        RolloutWatch {
            api: Api::namespaced(client, namespace),
            name: name.to_owned(),
            shown: format!("{namespace}/{name}"),
            view,
        },
    )
}

struct Watching<'a> {
    watch: &'a RolloutWatch,
    listed: bool,
}

impl Watching<'_> {
    fn say(&self, agents: Agents) {
        if self.watch.view.set(agents) {
            info!(event = "agents", daemonset = %self.watch.shown, state = agents.as_str(), presence_wait = presence(None, Some(agents)).is_none(), "the agents' rollout");
        }
    }
}

impl watchloop::Consumer<DaemonSet> for Watching<'_> {
    fn on_event(&mut self, ev: watcher::Event<DaemonSet>) -> bool {
        let running = matches!(ev, watcher::Event::Apply(_) | watcher::Event::Delete(_));
        match ev {
            watcher::Event::Init => self.listed = false,
            watcher::Event::InitApply(ds) | watcher::Event::Apply(ds) => {
                if ds.metadata.name.as_deref() == Some(self.watch.name.as_str()) {
                    self.listed = true;
                    self.say(state_of(&ds));
                }
            }
            // Gone (uninstalled, or not installed yet): no node runs an agent.
            watcher::Event::Delete(_) => self.say(Agents::Settled),
            watcher::Event::InitDone => {
                if !self.listed {
                    self.say(Agents::Settled);
                }
            }
        }
        running
    }

    fn on_error(&mut self, e: &watcher::Error) {
        warn!(daemonset = %self.watch.shown, error = %e, "the watch of the agents' DaemonSet failed; injected sidecars wait for an agent's answer until it is read again");
        self.say(Agents::Unknown);
    }
}

impl RolloutWatch {
    pub async fn run(self, shutdown: impl Future<Output = ()>) {
        let config = watcher::Config::default().fields(&format!("metadata.name={}", self.name));
        let api = self.api.clone();
        let start = move || watcher(api.clone(), config.clone());
        let backoff = Backoff::new(Duration::from_secs(1), Duration::from_secs(60));
        let mut watching = Watching {
            watch: &self,
            listed: false,
        };
        watchloop::run(start, &mut watching, backoff, shutdown).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn ds(generation: i64, observed: i64, desired: i32, updated: i32, available: i32) -> DaemonSet {
        serde_json::from_value(json!({
            "metadata": {"name": "exitorder", "generation": generation},
            "status": {
                "observedGeneration": observed,
                "desiredNumberScheduled": desired,
                "currentNumberScheduled": desired,
                "numberMisscheduled": 0,
                "numberReady": available,
                "updatedNumberScheduled": updated,
                "numberAvailable": available,
            },
        }))
        .unwrap()
    }

    #[test]
    fn a_rollout_as_kubectl_judges_it() {
        assert_eq!(state_of(&ds(3, 3, 5, 5, 5)), Agents::Settled);
        // The controller has not seen the new template yet.
        assert_eq!(state_of(&ds(4, 3, 5, 5, 5)), Agents::RollingOut);
        // Nodes still run the earlier agent.
        assert_eq!(state_of(&ds(4, 4, 5, 2, 5)), Agents::RollingOut);
        // Updated, not all available yet.
        assert_eq!(state_of(&ds(4, 4, 5, 5, 4)), Agents::RollingOut);
        // No node at all.
        assert_eq!(state_of(&ds(1, 1, 0, 0, 0)), Agents::Settled);
        let no_status: DaemonSet =
            serde_json::from_value(json!({"metadata": {"name": "exitorder"}})).unwrap();
        assert_eq!(state_of(&no_status), Agents::RollingOut);
    }

    #[test]
    fn marks_wait_for_the_nodes_entrypoint_in_the_host_share_layout() {
        use super::super::HandshakeVolume::{EmptyDir, HostPath};
        for a in [
            None,
            Some(Agents::Settled),
            Some(Agents::RollingOut),
            Some(Agents::Unknown),
        ] {
            assert!(mark_containers(EmptyDir, a), "{a:?}");
        }
        assert!(mark_containers(HostPath, None));
        assert!(mark_containers(HostPath, Some(Agents::Settled)));
        assert!(!mark_containers(HostPath, Some(Agents::RollingOut)));
        assert!(!mark_containers(HostPath, Some(Agents::Unknown)));
        assert!(exits_in_memory(None));
        assert!(exits_in_memory(Some(Agents::Settled)));
        assert!(!exits_in_memory(Some(Agents::RollingOut)));
        assert!(!exits_in_memory(Some(Agents::Unknown)));
    }

    #[test]
    fn the_presence_wait_follows_the_rollout() {
        let s = Duration::from_secs;
        assert_eq!(presence(None, None), None);
        assert_eq!(presence(None, Some(Agents::Settled)), None);
        assert_eq!(
            presence(None, Some(Agents::RollingOut)),
            Some(Duration::ZERO)
        );
        assert_eq!(presence(None, Some(Agents::Unknown)), Some(Duration::ZERO));
        // A value the operator set wins.
        assert_eq!(presence(Some(s(2)), Some(Agents::RollingOut)), Some(s(2)));
        assert_eq!(presence(Some(s(2)), Some(Agents::Settled)), Some(s(2)));
    }
}
