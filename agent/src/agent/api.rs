//! The loop's side of the API server, when there is one: the pods as it tells them, their
//! changes as they come, and the sink of the Kubernetes Events the agent posts.

use std::collections::HashMap;

use tokio::sync::mpsc;

use crate::cluster::endpoints::Request;
use crate::decide::endpoints::{Untold, Withdrawal};
use crate::pod::PodUid;

use crate::cluster::nodewatch::NodeView;
use crate::cluster::podwatch::PodView;
use crate::cluster::recorder::EventSink;
use crate::cluster::Cluster;
use crate::cluster::PodSignal;

#[derive(Default)]
pub(super) struct ApiLink {
    /// The API server's view of this node's pods; `None` without an API server, or once its
    /// watch ended (the runtime's rules decide then).
    pub(super) pods: Option<PodView>,
    /// This node's Node as the API server holds it.
    pub(super) node: Option<NodeView>,
    signals: Option<mpsc::UnboundedReceiver<PodSignal>>,
    pub(super) events: Option<EventSink>,
    /// The decisions took the Node's word that the node shuts down (told once).
    pub(super) shutdown_applied: bool,
    /// Asks for a pod's endpoints to be followed.
    follow: Option<mpsc::UnboundedSender<Request>>,
    /// The pods whose endpoints are followed, each with what is known of them.
    pub(super) followed: HashMap<PodUid, Withdrawal>,
}

impl ApiLink {
    pub(super) fn attach(&mut self, cluster: Cluster) {
        self.pods = Some(cluster.view);
        self.node = Some(cluster.node);
        self.signals = Some(cluster.signals);
        self.events = Some(cluster.events);
        self.follow = Some(cluster.endpoints);
    }

    /// What is known of the endpoints of `uid`, a pod being deleted through the API whose
    /// apps wait for them: followed from the first ask until [`Self::stop_following`].
    pub(super) fn endpoints(&mut self, uid: &PodUid, namespace: &str) -> Withdrawal {
        if let Some(w) = self.followed.get(uid) {
            return *w;
        }
        let Some(tx) = &self.follow else {
            return Withdrawal::Untold(Untold::NoApi);
        };
        let asked = tx.send(Request::Follow {
            uid: uid.clone(),
            namespace: namespace.to_owned(),
        });
        if asked.is_err() {
            return Withdrawal::Untold(Untold::NoApi);
        }
        self.followed.insert(uid.clone(), Withdrawal::Listed);
        Withdrawal::Listed
    }

    /// What the follow of `uid` tells now; `false` when it is no longer followed.
    pub(super) fn endpoints_told(&mut self, uid: &PodUid, withdrawal: Withdrawal) -> bool {
        match self.followed.get_mut(uid) {
            Some(w) => {
                *w = withdrawal;
                true
            }
            None => false,
        }
    }

    /// Ends the follows of the pods `keep` says no longer wait.
    pub(super) fn stop_following(&mut self, keep: impl Fn(&PodUid) -> bool) {
        let Some(tx) = &self.follow else {
            self.followed.clear();
            return;
        };
        self.followed.retain(|uid, _| {
            let kept = keep(uid);
            if !kept {
                let _ = tx.send(Request::Stop(uid.clone()));
            }
            kept
        });
    }

    /// The next change the pod watch tells; `None` once the watch ended (at shutdown), and
    /// never without an API server.
    pub(super) async fn next(&mut self) -> Option<PodSignal> {
        match &mut self.signals {
            Some(rx) => rx.recv().await,
            None => std::future::pending().await,
        }
    }

    /// A change already queued, if any.
    pub(super) fn queued(&mut self) -> Option<PodSignal> {
        self.signals.as_mut().and_then(|rx| rx.try_recv().ok())
    }

    /// The watch ended: decide by the runtime's rules from now on.
    pub(super) fn watch_ended(&mut self) {
        self.signals = None;
        self.pods = None;
        self.node = None;
        self.follow = None;
        self.followed.clear();
    }

    /// What is known of this node's Node (nothing without an API server).
    pub(super) fn node(&self) -> crate::cluster::nodewatch::NodeFacts {
        self.node
            .as_ref()
            .map(|n| n.borrow().clone())
            .unwrap_or_default()
    }
}
