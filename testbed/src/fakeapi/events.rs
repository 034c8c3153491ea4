//! Events in the fake API server: one store, served as core/v1 and as events.k8s.io/v1 as
//! the API server serves both from one storage (`pkg/apis/events/v1` conversion), with the
//! field selectors each allows. The kubelet's Events arrive through its recorder's pipeline
//! as client-go runs it (`tools/record/events_cache.go` `EventCorrelator`): aggregation of
//! similar Events, deduplication of identical ones into a count, and the spam filter.

use std::collections::{BTreeSet, HashMap};
use std::time::{Duration, SystemTime};

use crate::KubeletEvent;
use serde_json::{json, Value};

use super::select::{parse_selector, to_core, to_events_v1, Group};

/// `events_cache.go`: "more than 10 times in a 10 minute period, aggregate the event".
const AGGREGATE_MAX_EVENTS: usize = 10;
const AGGREGATE_INTERVAL: Duration = Duration::from_secs(600);
/// `events_cache.go` `defaultSpamBurst`, `defaultSpamQPS`: "allow a source to send 25 events
/// about an object but control the refill rate to 1 new event every 5 minutes".
const SPAM_BURST: f64 = 25.0;
const SPAM_QPS: f64 = 1.0 / 300.0;
/// `events_cache.go` `EventAggregatorByReasonMessageFunc`'s prefix.
const COMBINED: &str = "(combined from similar events): ";

/// The object an Event is about (core/v1 `ObjectReference`).
#[derive(Debug, Clone, Default)]
pub(super) struct Involved {
    pub kind: String,
    pub api_version: String,
    pub namespace: String,
    pub name: String,
    pub uid: String,
    pub resource_version: Option<String>,
}

/// An Event as the recorder builds it (`makeEvent`), before the correlator.
struct Draft {
    involved: Involved,
    field_path: Option<String>,
    reason: String,
    message: String,
    kind: String,
    component: String,
    host: String,
    /// `makeEvent` sets them; an aggregate Event has none.
    reporting: bool,
    first: SystemTime,
    last: SystemTime,
    count: i64,
    name: String,
}

impl Draft {
    /// `events_cache.go` `getEventKey`: identical Events.
    fn key(&self) -> String {
        [
            self.component.as_str(),
            &self.host,
            &self.involved.kind,
            &self.involved.namespace,
            &self.involved.name,
            self.field_path.as_deref().unwrap_or(""),
            &self.involved.uid,
            &self.involved.api_version,
            &self.kind,
            &self.reason,
            &self.message,
        ]
        .join("")
    }

    /// `EventAggregatorByReasonFunc`: similar Events (the message apart), and the message.
    fn aggregate_key(&self) -> String {
        let (controller, instance) = if self.reporting {
            (self.component.as_str(), self.host.as_str())
        } else {
            ("", "")
        };
        [
            self.component.as_str(),
            &self.host,
            &self.involved.kind,
            &self.involved.namespace,
            &self.involved.name,
            &self.involved.uid,
            &self.involved.api_version,
            &self.kind,
            &self.reason,
            controller,
            instance,
        ]
        .join("")
    }

    /// `getSpamKey`: one token bucket per source, object and event type (the type since
    /// client-go 1.32; before, Normal and Warning Events shared one), whatever the reason,
    /// message or field path.
    fn spam_key(&self) -> String {
        [
            self.component.as_str(),
            &self.host,
            &self.involved.kind,
            &self.involved.namespace,
            &self.involved.name,
            &self.involved.uid,
            &self.involved.api_version,
            &self.kind,
        ]
        .join("")
    }

    /// The core/v1 Event as the API server returns it.
    fn to_json(&self, uid: &str, rv: u64) -> Value {
        let mut involved = json!({
            "apiVersion": self.involved.api_version,
            "kind": self.involved.kind,
            "name": self.involved.name,
            "uid": self.involved.uid,
        });
        if !self.involved.namespace.is_empty() {
            involved["namespace"] = json!(self.involved.namespace);
        }
        if let Some(rv) = &self.involved.resource_version {
            involved["resourceVersion"] = json!(rv);
        }
        if let Some(fp) = &self.field_path {
            involved["fieldPath"] = json!(fp);
        }
        // `makeEvent`: an object without a namespace (a Node) has its Events in `default`.
        let namespace = if self.involved.namespace.is_empty() {
            "default"
        } else {
            self.involved.namespace.as_str()
        };
        let mut ev = json!({
            "apiVersion": "v1",
            "kind": "Event",
            "metadata": {
                "name": self.name,
                "namespace": namespace,
                "uid": uid,
                "resourceVersion": rv.to_string(),
                "creationTimestamp": rfc3339(SystemTime::now()),
            },
            "involvedObject": involved,
            "reason": self.reason,
            "message": self.message,
            "type": self.kind,
            "source": {"component": self.component, "host": self.host},
            "firstTimestamp": rfc3339(self.first),
            "lastTimestamp": rfc3339(self.last),
            "count": self.count,
            "eventTime": null,
        });
        if self.reporting {
            ev["reportingComponent"] = json!(self.component);
            ev["reportingInstance"] = json!(self.host);
        }
        ev
    }
}

/// `metav1.Time` as the API server stores it: RFC 3339, whole seconds.
pub(super) fn rfc3339(t: SystemTime) -> String {
    let secs = t
        .duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_secs()).unwrap_or(i64::MAX));
    k8s_openapi::jiff::Timestamp::from_second(secs)
        .map(|t| t.to_string())
        .unwrap_or_default()
}

fn unix_nanos(t: SystemTime) -> u128 {
    t.duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos())
}

struct Observation {
    name: String,
    count: i64,
    first: SystemTime,
}

struct Bucket {
    tokens: f64,
    at: SystemTime,
}

/// client-go's `EventCorrelator`, for one recorder (the kubelet's).
#[derive(Default)]
struct Correlator {
    /// Similar Events: the distinct messages seen, and when the last came.
    similar: HashMap<String, (BTreeSet<String>, SystemTime)>,
    /// `eventLogger`: the last observation of each Event (or aggregate) key.
    observed: HashMap<String, Observation>,
    spam: HashMap<String, Bucket>,
}

impl Correlator {
    /// `EventCorrelate`: the Event to write (a new one, or one to count again under an
    /// existing name), or `None` when the spam filter drops it. A new Event's name is
    /// `makeEvent`'s, the object's name and the time in ns, the next ns when `taken`.
    fn correlate(&mut self, mut d: Draft, taken: impl Fn(&str) -> bool) -> Option<Draft> {
        let now = d.last;
        let fresh_name = |object: &str| {
            let mut ns = unix_nanos(now);
            while taken(&format!("{object}.{ns:x}")) {
                ns += 1;
            }
            format!("{object}.{ns:x}")
        };
        // EventAggregate.
        let aggregate_key = d.aggregate_key();
        let record = self
            .similar
            .entry(aggregate_key.clone())
            .or_insert_with(|| (BTreeSet::new(), now));
        if now.duration_since(record.1).unwrap_or(Duration::ZERO) > AGGREGATE_INTERVAL {
            record.0.clear();
        }
        record.0.insert(d.message.clone());
        record.1 = now;
        let key = if record.0.len() < AGGREGATE_MAX_EVENTS {
            d.key()
        } else {
            // "do not grow our local key set any larger than max".
            if let Some(any) = record.0.iter().next().cloned() {
                record.0.remove(&any);
            }
            d = Draft {
                name: fresh_name(&d.involved.name),
                message: format!("{COMBINED}{}", d.message),
                reporting: false,
                count: 1,
                first: now,
                ..d
            };
            aggregate_key
        };
        // eventObserve: an Event seen before is counted again under its first name.
        match self.observed.get_mut(&key) {
            Some(o) => {
                o.count += 1;
                d.count = o.count;
                d.first = o.first;
                d.name = o.name.clone();
            }
            None => {
                if d.name.is_empty() {
                    d.name = fresh_name(&d.involved.name);
                }
                self.observed.insert(
                    key,
                    Observation {
                        name: d.name.clone(),
                        count: d.count,
                        first: d.first,
                    },
                );
            }
        }
        // The spam filter, on every Event, counted ones too.
        let bucket = self.spam.entry(d.spam_key()).or_insert(Bucket {
            tokens: SPAM_BURST,
            at: now,
        });
        let waited = now.duration_since(bucket.at).unwrap_or(Duration::ZERO);
        bucket.tokens = (bucket.tokens + waited.as_secs_f64() * SPAM_QPS).min(SPAM_BURST);
        bucket.at = now;
        if bucket.tokens < 1.0 {
            return None;
        }
        bucket.tokens -= 1.0;
        Some(d)
    }
}

/// Where an Event came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Origin {
    /// The test bed's kubelet, through [`crate::ApiSink`].
    Kubelet,
    /// POSTed to events.k8s.io/v1 (the agent's own).
    Posted,
}

/// Every Event, as core/v1 JSON, in creation order.
#[derive(Default)]
pub(super) struct EventStore {
    items: Vec<(Origin, Value)>,
    correlator: Correlator,
    next_uid: u64,
}

impl EventStore {
    fn uid(&mut self) -> String {
        self.next_uid += 1;
        format!("00000000-0000-4000-8000-{:012x}", self.next_uid)
    }

    /// An Event the kubelet of `node` recorded about `involved`, through its recorder.
    /// `rv` is the server's resourceVersion counter.
    pub(super) fn record_kubelet(
        &mut self,
        rv: &mut u64,
        node: &str,
        involved: Involved,
        ev: &KubeletEvent,
    ) {
        let draft = Draft {
            involved,
            field_path: ev.field_path.clone(),
            reason: ev.reason.clone(),
            message: ev.message.clone(),
            kind: ev.kind.as_str().to_owned(),
            component: "kubelet".to_owned(),
            host: node.to_owned(),
            reporting: true,
            first: ev.at,
            last: ev.at,
            count: 1,
            // Named when it is new (Correlator::correlate).
            name: String::new(),
        };
        let items = &self.items;
        let taken = |name: &str| items.iter().any(|(_, e)| e["metadata"]["name"] == name);
        let Some(d) = self.correlator.correlate(draft, taken) else {
            return;
        };
        *rv += 1;
        // recordEvent: a PATCH of the count, last time and message; a CREATE when there is
        // none yet (or it is gone).
        if let Some(i) = self.find(&d.name) {
            let (_, stored) = &mut self.items[i];
            stored["count"] = json!(d.count);
            stored["lastTimestamp"] = json!(rfc3339(d.last));
            stored["message"] = json!(d.message);
            stored["metadata"]["resourceVersion"] = json!(rv.to_string());
            return;
        }
        let uid = self.uid();
        let value = d.to_json(&uid, *rv);
        self.items.push((Origin::Kubelet, value));
    }

    /// An events.k8s.io/v1 Event POSTed to `namespace`, kept as core/v1.
    pub(super) fn record_posted(&mut self, rv: &mut u64, namespace: &str, posted: &Value) {
        *rv += 1;
        let mut core = to_core(posted);
        let uid = self.uid();
        let meta = &mut core["metadata"];
        if meta["namespace"].as_str().is_none_or(str::is_empty) {
            meta["namespace"] = json!(namespace);
        }
        if meta["name"].as_str().is_none_or(str::is_empty) {
            let prefix = meta["generateName"].as_str().unwrap_or("event.").to_owned();
            meta["name"] = json!(format!("{prefix}{}", &uid[uid.len() - 5..]));
        }
        meta["uid"] = json!(uid);
        meta["resourceVersion"] = json!(rv.to_string());
        meta["creationTimestamp"] = json!(rfc3339(SystemTime::now()));
        self.items.push((Origin::Posted, core));
    }

    fn find(&self, name: &str) -> Option<usize> {
        self.items
            .iter()
            .position(|(_, e)| e["metadata"]["name"] == name)
    }

    /// The kubelet's Events (core/v1 JSON), in creation order.
    pub(super) fn kubelet(&self) -> Vec<Value> {
        self.items
            .iter()
            .filter(|(o, _)| *o == Origin::Kubelet)
            .map(|(_, e)| e.clone())
            .collect()
    }

    /// A LIST: the Events of `namespace` (every namespace when `None`) that `selector` (the
    /// `fieldSelector` parameter, decoded) selects, in `group`'s shape, paged by `limit` and
    /// `continue` as the API server pages them. `Err` with the API server's message for a
    /// selector it refuses.
    pub(super) fn list(
        &self,
        group: Group,
        namespace: Option<&str>,
        query: &super::Query,
        rv: u64,
    ) -> Result<Value, String> {
        let terms = match query.get("fieldSelector") {
            Some(s) => parse_selector(s, group)?,
            None => Vec::new(),
        };
        let selected: Vec<&Value> = self
            .items
            .iter()
            .map(|(_, e)| e)
            .filter(|e| namespace.is_none_or(|ns| e["metadata"]["namespace"] == ns))
            .filter(|e| terms.iter().all(|t| t.matches(e)))
            .collect();
        let from: usize = query
            .get("continue")
            .and_then(|c| c.parse().ok())
            .unwrap_or(0);
        let limit: usize = query
            .get("limit")
            .and_then(|l| l.parse().ok())
            .filter(|l| *l > 0)
            .unwrap_or(usize::MAX);
        let page: Vec<Value> = selected
            .iter()
            .skip(from)
            .take(limit)
            .map(|e| {
                let mut e = match group {
                    Group::Core => (*e).clone(),
                    Group::EventsV1 => to_events_v1(e),
                };
                // A list's items carry no kind of their own.
                if let Some(o) = e.as_object_mut() {
                    o.remove("apiVersion");
                    o.remove("kind");
                }
                e
            })
            .collect();
        let mut metadata = json!({"resourceVersion": rv.to_string()});
        let next = from.saturating_add(page.len());
        if next < selected.len() {
            metadata["continue"] = json!(next.to_string());
            metadata["remainingItemCount"] = json!(selected.len() - next);
        }
        Ok(json!({
            "apiVersion": group.api_version(),
            "kind": "EventList",
            "metadata": metadata,
            "items": page,
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::EventType;

    fn pod() -> Involved {
        Involved {
            kind: "Pod".into(),
            api_version: "v1".into(),
            namespace: "default".into(),
            name: "web".into(),
            uid: "u-1".into(),
            resource_version: None,
        }
    }

    fn ev(reason: &str, message: &str, at: SystemTime) -> KubeletEvent {
        KubeletEvent {
            reason: reason.into(),
            kind: EventType::Normal,
            message: message.into(),
            field_path: Some("spec.containers{app}".into()),
            at,
        }
    }

    #[test]
    fn identical_events_are_counted_similar_ones_combined_and_spam_dropped() {
        let mut store = EventStore::default();
        let mut rv = 0;
        let t = SystemTime::now();
        store.record_kubelet(
            &mut rv,
            "n",
            pod(),
            &ev("Killing", "Stopping container app", t),
        );
        store.record_kubelet(
            &mut rv,
            "n",
            pod(),
            &ev("Killing", "Stopping container app", t),
        );
        let evs = store.kubelet();
        assert_eq!(evs.len(), 1);
        assert_eq!(evs[0]["count"], 2);
        assert!(evs[0]["metadata"]["name"]
            .as_str()
            .is_some_and(|n| n.starts_with("web.")));
        // Ten distinct messages of one reason: the tenth is combined.
        for i in 0..9 {
            store.record_kubelet(&mut rv, "n", pod(), &ev("Killing", &format!("m{i}"), t));
        }
        let evs = store.kubelet();
        let last = evs.last().expect("events");
        assert_eq!(last["message"], "(combined from similar events): m8");
        assert!(last.get("reportingComponent").is_none());
        // 11 sent so far; the bucket holds 25.
        for i in 0..20 {
            store.record_kubelet(&mut rv, "n", pod(), &ev("Other", &format!("x{i}"), t));
        }
        let total: i64 = store
            .kubelet()
            .iter()
            .map(|e| e["count"].as_i64().unwrap_or(0))
            .sum();
        assert_eq!(total, 25);
    }

    #[test]
    fn selectors_are_the_api_servers() {
        let mut store = EventStore::default();
        let mut rv = 0;
        let t = SystemTime::now();
        store.record_kubelet(
            &mut rv,
            "n",
            pod(),
            &ev("Killing", "Stopping container app", t),
        );
        let mut other = pod();
        other.uid = "u-2".into();
        store.record_kubelet(&mut rv, "n", other, &ev("Evicted", "low", t));
        let q = |s: &str| super::super::Query::parse(s);
        let list = store
            .list(
                Group::Core,
                Some("default"),
                &q("fieldSelector=involvedObject.uid%3Du-1"),
                rv,
            )
            .expect("a list");
        assert_eq!(list["items"].as_array().map(Vec::len), Some(1));
        assert_eq!(list["metadata"]["resourceVersion"], rv.to_string());
        let list = store
            .list(
                Group::Core,
                None,
                &q("fieldSelector=involvedObject.name%3Dweb%2Creason%21%3DKilling"),
                rv,
            )
            .expect("a list");
        assert_eq!(list["items"][0]["reason"], "Evicted");
        let v1 = store
            .list(
                Group::EventsV1,
                Some("default"),
                &q("fieldSelector=regarding.uid%3Du-1"),
                rv,
            )
            .expect("a list");
        assert_eq!(v1["items"][0]["note"], "Stopping container app");
        assert_eq!(
            v1["items"][0]["regarding"]["fieldPath"],
            "spec.containers{app}"
        );
        assert!(store
            .list(
                Group::EventsV1,
                None,
                &q("fieldSelector=involvedObject.uid%3Du-1"),
                rv
            )
            .is_err());
        let paged = store
            .list(Group::Core, None, &q("limit=1"), rv)
            .expect("a list");
        assert_eq!(paged["metadata"]["continue"], "1");
        let rest = store
            .list(Group::Core, None, &q("limit=1&continue=1"), rv)
            .expect("a list");
        assert!(rest["metadata"].get("continue").is_none());
        assert_eq!(rest["items"][0]["reason"], "Evicted");
    }
}
