//! Properties of the exit decision over random pods: priorities, states, restarts, native
//! sidecars, listing orders and times (proptest, thousands of cases each).
//!
//! - never an ordered allow while a lower-priority container may still run, unless the
//!   kubelet stops that one only after the waiting container;
//! - always an allow at or after the deadline;
//! - the verdict does not depend on the order the runtime lists containers in;
//! - a container never waits for one the kubelet stops after it;
//! - the node view ends in the same state whatever order the runtime's events and reads
//!   arrive in (an exit is never lost to a stale read);
//! - a container restarted before its pod began stopping is never taken as done while its
//!   newest attempt runs, whatever events come late or never, by every exit source.

use std::time::{Duration, Instant};

use exitorder::decide::stoporder::StopOrder;
use exitorder::decide::{
    decide, newest_attempts, Attempt, Deletion, PodFacts, Reason, RunState, Verdict,
};
use exitorder::pod::PodUid;
use exitorder::view::facts::unsettled_exits;
use exitorder::view::{Change, ContainerInfo, Listing, NodeView, SandboxInfo};
use proptest::prelude::*;

const NAMES: [&str; 6] = ["app", "worker", "proxy", "logs", "mesh", "agent"];

fn state() -> impl Strategy<Value = RunState> {
    prop_oneof![
        Just(RunState::Created),
        Just(RunState::Running),
        Just(RunState::Exited),
        Just(RunState::Unknown),
    ]
}

/// A pod: 1 to 6 containers, each with 1 to 3 attempts (the newest decides), a priority per
/// name, some of them native sidecars in some declaration order.
#[derive(Debug, Clone)]
struct Pod {
    attempts: Vec<Attempt>,
    native: Vec<String>,
    waiting: String,
    deadline_in_ms: u64,
    now_in_ms: u64,
}

fn pod() -> impl Strategy<Value = Pod> {
    (1..=NAMES.len())
        .prop_flat_map(|n| {
            (
                proptest::collection::vec((0u8..4, proptest::collection::vec(state(), 1..=3)), n),
                proptest::sample::subsequence((0..n).collect::<Vec<_>>(), 0..=n),
                any::<proptest::sample::Index>(),
                Just(n),
                0u64..10_000,
                0u64..12_000,
            )
        })
        .prop_flat_map(|(containers, native, waiting, n, deadline, now)| {
            let native_len = native.len();
            (
                Just(containers),
                Just(native).prop_shuffle(),
                Just(waiting.index(n)),
                Just(deadline),
                Just(now),
                Just(native_len),
            )
        })
        .prop_map(|(containers, native, waiting, deadline, now, _)| {
            let mut attempts = Vec::new();
            for (i, (priority, states)) in containers.iter().enumerate() {
                for (a, st) in states.iter().enumerate() {
                    // Older attempts have exited: the kubelet starts a new one after.
                    let state = if a + 1 < states.len() {
                        RunState::Exited
                    } else {
                        *st
                    };
                    attempts.push(Attempt {
                        name: NAMES[i].to_owned(),
                        attempt: a as u32,
                        created_at: (a as i64) * 1000 + i as i64,
                        state,
                        priority: *priority,
                    });
                }
            }
            Pod {
                attempts,
                native: native.iter().map(|i| NAMES[*i].to_owned()).collect(),
                waiting: NAMES[waiting].to_owned(),
                deadline_in_ms: deadline,
                now_in_ms: now,
            }
        })
}

fn facts(p: &Pod, start: Instant) -> PodFacts {
    PodFacts {
        attempts: p.attempts.clone(),
        unknown: Vec::new(),
        deletion: Deletion::Deleting,
        deadline: Some(start + Duration::from_millis(p.deadline_in_ms)),
        stop_order: StopOrder::new(p.native.clone()),
        endpoints: None,
    }
}

fn verdict(p: &Pod, attempts: Vec<Attempt>, start: Instant) -> Verdict {
    let mut f = facts(p, start);
    f.attempts = attempts;
    let v = decide(
        Some(&f),
        &p.waiting,
        start,
        start + Duration::from_millis(p.now_in_ms),
    );
    // Who blocks is a set: its listing order is the runtime's.
    match v {
        Verdict::Wait {
            mut blocked_by,
            until,
        } => {
            blocked_by.sort();
            Verdict::Wait { blocked_by, until }
        }
        allow => allow,
    }
}

proptest! {
    // No regression files: the cases are drawn afresh on every run, thousands each.
    #![proptest_config(ProptestConfig {
        cases: 4096,
        failure_persistence: None,
        ..ProptestConfig::default()
    })]

    #[test]
    fn never_ordered_while_a_lower_priority_container_may_run(p in pod()) {
        let start = Instant::now();
        let f = facts(&p, start);
        let now = start + Duration::from_millis(p.now_in_ms);
        if let Verdict::Allow(Reason::Ordered) = decide(Some(&f), &p.waiting, start, now) {
            let newest = newest_attempts(&f.attempts);
            let me = newest.iter().find(|a| a.name == p.waiting).expect("the waiting container");
            for o in &newest {
                let may_run = matches!(o.state, RunState::Running | RunState::Unknown);
                prop_assert!(
                    !(o.priority < me.priority && may_run)
                        || f.stop_order.stops_after(&me.name, &o.name),
                    "{} allowed while {} (priority {} < {}) may run: {:?}",
                    me.name, o.name, o.priority, me.priority, p
                );
            }
        }
    }

    #[test]
    fn always_allowed_at_or_after_the_deadline(p in pod()) {
        let start = Instant::now();
        let f = facts(&p, start);
        let deadline = start + Duration::from_millis(p.deadline_in_ms);
        for now in [deadline, deadline + Duration::from_millis(p.now_in_ms)] {
            prop_assert!(
                matches!(decide(Some(&f), &p.waiting, start, now), Verdict::Allow(_)),
                "held at or after the deadline: {:?}", p
            );
        }
    }

    #[test]
    fn the_listing_order_does_not_matter(p in pod(), seed in any::<u64>()) {
        let mut shuffled = p.attempts.clone();
        // A deterministic shuffle from the seed: a rotation and a reversal.
        let k = (seed as usize) % shuffled.len().max(1);
        shuffled.rotate_left(k);
        if seed & 1 == 1 {
            shuffled.reverse();
        }
        let start = Instant::now();
        prop_assert_eq!(verdict(&p, p.attempts.clone(), start), verdict(&p, shuffled, start));
    }

    #[test]
    fn never_waits_for_a_container_the_kubelet_stops_later(p in pod()) {
        let order = StopOrder::new(p.native.clone());
        if let Verdict::Wait { blocked_by, .. } = verdict(&p, p.attempts.clone(), Instant::now()) {
            for b in &blocked_by {
                prop_assert!(
                    !order.stops_after(&p.waiting, b),
                    "{} waits for {}, which the kubelet stops after it: {:?}",
                    p.waiting, b, p
                );
            }
        }
    }

    #[test]
    fn priorities_the_webhook_admits_never_ask_for_such_a_wait(p in pod()) {
        // What the webhook checks (no contradiction) is exactly what the agent would
        // otherwise have to leave out.
        let order = StopOrder::new(p.native.clone());
        let newest = newest_attempts(&p.attempts);
        let prios: Vec<(&str, u8)> = newest.iter().map(|a| (a.name.as_str(), a.priority)).collect();
        let contradictions = order.contradictions(&prios);
        for a in &newest {
            for b in &newest {
                let would_wait = b.priority < a.priority;
                let forbidden = would_wait && order.stops_after(&a.name, &b.name);
                prop_assert_eq!(
                    forbidden,
                    contradictions.contains(&(a.name.as_str(), b.name.as_str())),
                    "{} / {}: {:?}", &a.name, &b.name, &p
                );
            }
        }
    }

    #[test]
    fn the_view_does_not_depend_on_the_order_events_arrive(
        lives in proptest::collection::vec((any::<bool>(), 0u8..3), 1..=NAMES.len()),
        keys in proptest::collection::vec(any::<u32>(), 3 * NAMES.len()),
    ) {
        // Each container starts, maybe exits, and is described once, by a read that saw it
        // at some point of its life (created, running, exited) but may be answered after
        // later events. Events of one container keep their order (its start before its
        // exit); everything else interleaves at random.
        const UID: &str = "0b7c6f9e-2d4b-4c53-9a0e-1f2e3d4c5b6a";
        let mut items: Vec<(u32, usize, u8)> = Vec::new();
        for (i, (exits, _)) in lives.iter().enumerate() {
            let steps = if *exits { 3 } else { 2 };
            for step in 0..steps {
                items.push((keys[3 * i + usize::from(step)], i, step));
            }
        }
        items.sort_by_key(|(key, i, step)| (*key, *i, *step));
        // Per container, its lifecycle events (start, exit) go to its slots in order; the
        // read (step 0 in the list above) takes its own slot.
        let mut next_event = vec![0u8; lives.len()];
        let mut view = NodeView::new();
        let now = Instant::now();
        for (_, i, step) in &items {
            let (exits, read_at) = lives[*i];
            let id = format!("c{i}");
            let change = if *step == 0 {
                let seen = read_at.min(if exits { 2 } else { 1 });
                let state = [RunState::Created, RunState::Running, RunState::Exited][usize::from(seen)];
                Change::Described {
                    info: ContainerInfo {
                        id,
                        pod_uid: uid(UID),
                        name: NAMES[*i].to_owned(),
                        attempt: 0,
                        created_at: 1,
                        state,
                        grace: None,
                        marks: false,
                    },
                    env: Ok(None),
                }
            } else {
                let e = next_event[*i];
                next_event[*i] += 1;
                if e == 0 { Change::Started { id } } else { Change::Exited { id } }
            };
            view.apply(change, now);
        }
        let pod = view.pod(&uid(UID));
        prop_assert!(pod.is_some(), "the pod is in the view");
        let Some(pod) = pod else { return Ok(()) };
        for (i, (exits, _)) in lives.iter().enumerate() {
            let c = pod.containers.get(&format!("c{i}"));
            prop_assert!(c.is_some(), "container {} in the view", i);
            let Some(c) = c else { return Ok(()) };
            let want = if *exits { RunState::Exited } else { RunState::Running };
            prop_assert_eq!(c.info.state, want, "container {}: {:?}", i, items);
            prop_assert_eq!(c.exit_seen.is_some(), *exits, "container {}: {:?}", i, items);
        }
    }

    #[test]
    fn a_restart_seen_late_never_lets_the_sidecar_out_early(r in restarts()) {
        let start = Instant::now();
        let at = |ms: u64| start + Duration::from_millis(ms);
        let mut deliveries = r.deliveries();
        deliveries.sort_by_key(|(t, order, _)| (*t, *order));
        let mut view = NodeView::new();
        let mut pending = deliveries.into_iter().peekable();
        // Decisions are made when the exit file is seen and after every change since.
        let mut moments: Vec<u64> = vec![r.stopping];
        moments.extend(r.deliveries().iter().map(|(t, _, _)| *t).filter(|t| *t >= r.stopping));
        moments.sort_unstable();
        for now in moments {
            while let Some((t, _, _)) = pending.peek() {
                if *t > now {
                    break;
                }
                if let Some((t, _, change)) = pending.next() {
                    view.apply(change.into_change(&r, start), at(t));
                }
            }
            let Some(pod) = view.pod(&uid(RESTART_UID)) else { continue };
            let newest = pod
                .containers
                .values()
                .filter(|c| c.info.name == "app")
                .max_by_key(|c| (c.info.attempt, c.info.created_at));
            let Some(app) = newest else { continue };
            let done = app.info.state == RunState::Exited
                && unsettled_exits(pod, at(r.stopping), &["proxy"]).is_empty()
                && !view.undescribed_seen_by(at(r.stopping));
            if done {
                let last = r.attempts.last().and_then(|a| a.1);
                prop_assert!(
                    last.is_some_and(|e| e <= now),
                    "at {} ms the app was taken as done, but its attempt {} runs: {:?}",
                    now, r.attempts.len() - 1, r
                );
            }
        }
    }
}

const RESTART_UID: &str = "5d1c3b2a-9e8f-4a7b-8c6d-0e1f2a3b4c5d";

/// Which source tells the agent of exits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Source {
    /// The runtime's events, and reads of containers they name.
    Events,
    /// The same, and the kernel's word on each described attempt's exit.
    Kernel,
    /// Listings only.
    Poll,
}

/// An app restarted before its pod began stopping (at `stopping`), and how what the runtime
/// and the kernel say of it reaches the agent: late, or never. Times in ms.
#[derive(Debug, Clone)]
struct Restarts {
    /// Each attempt's creation and exit (the last may run on).
    attempts: Vec<(u64, Option<u64>)>,
    stopping: u64,
    source: Source,
    /// Per attempt: the delays of its start event, of the read it causes, of its exit
    /// event and of the kernel's word (`None`: never comes).
    delays: Vec<[Option<u64>; 4]>,
    /// Listings: when asked, and how long the answer takes.
    listings: Vec<(u64, u64)>,
}

/// The least time from an attempt's exit to its successor's creation: the runtime tells the
/// kubelet, which syncs the pod and creates the container. The kernel's word on an exit is
/// late by less (its waiting thread wakes at once).
const RESTART_MIN_MS: u64 = 20;

/// What reaches the view.
#[derive(Debug, Clone)]
enum Told {
    Started(usize),
    Described(usize, u64),
    Exited(usize),
    ProcessGone(usize, u64),
    Listed(u64),
}

impl Told {
    fn into_change(self, r: &Restarts, start: Instant) -> Change {
        let at = |ms: u64| start + Duration::from_millis(ms);
        match self {
            Told::Started(i) => Change::Started { id: app_id(i) },
            Told::Exited(i) => Change::Exited { id: app_id(i) },
            Told::ProcessGone(i, ms) => Change::ProcessGone {
                id: app_id(i),
                at: at(ms),
            },
            Told::Described(i, ms) => Change::Described {
                info: r.app_at(i, ms),
                env: Ok(None),
            },
            Told::Listed(ms) => {
                let mut containers: Vec<ContainerInfo> = (0..r.attempts.len())
                    .filter(|i| r.attempts[*i].0 <= ms)
                    .map(|i| r.app_at(i, ms))
                    .collect();
                containers.push(ContainerInfo {
                    id: "proxy-0".into(),
                    pod_uid: uid(RESTART_UID),
                    name: "proxy".into(),
                    attempt: 0,
                    created_at: 0,
                    state: RunState::Running,
                    grace: None,
                    marks: false,
                });
                Change::Listed(Listing {
                    asked_at_ns: ns(ms),
                    asked: Some(at(ms)),
                    sandboxes: vec![SandboxInfo {
                        id: "sandbox".into(),
                        pod_uid: uid(RESTART_UID),
                        namespace: String::new(),
                        name: String::new(),
                        annotations: Default::default(),
                        created_at: 0,
                    }],
                    containers,
                })
            }
        }
    }
}

fn uid(s: &str) -> PodUid {
    PodUid::parse(s).expect("a pod uid")
}

fn app_id(i: usize) -> String {
    format!("app-{i}")
}

fn ns(ms: u64) -> i64 {
    i64::try_from(ms).unwrap_or(i64::MAX / 2) * 1_000_000
}

impl Restarts {
    /// Attempt `i` as the runtime describes it at `ms`.
    fn app_at(&self, i: usize, ms: u64) -> ContainerInfo {
        let (created, exit) = self.attempts[i];
        ContainerInfo {
            id: app_id(i),
            pod_uid: uid(RESTART_UID),
            name: "app".into(),
            attempt: u32::try_from(i).unwrap_or(u32::MAX),
            created_at: ns(created),
            state: if exit.is_some_and(|e| e <= ms) {
                RunState::Exited
            } else {
                RunState::Running
            },
            grace: None,
            marks: false,
        }
    }

    /// Everything that reaches the view: (when, a tie-breaker keeping each attempt's own
    /// order, what).
    fn deliveries(&self) -> Vec<(u64, u64, Told)> {
        let mut out = Vec::new();
        for (ms, late) in &self.listings {
            out.push((ms + late, 0, Told::Listed(*ms)));
        }
        if self.source == Source::Poll {
            return out;
        }
        for (i, ((created, exit), d)) in self.attempts.iter().zip(&self.delays).enumerate() {
            let [start, read, exited, kernel] = *d;
            let seq = 1 + 10 * u64::try_from(i).unwrap_or(0);
            // The first event the agent gets of an attempt makes it read the attempt.
            let first = [
                start.map(|s| created + s),
                exit.zip(exited).map(|(e, x)| e + x),
            ]
            .into_iter()
            .flatten()
            .min();
            if let Some(s) = start {
                out.push((created + s, seq, Told::Started(i)));
            }
            if let (Some(first), Some(read)) = (first, read) {
                out.push((first + read, seq + 1, Told::Described(i, first + read)));
            }
            if let (Some(e), Some(x)) = (exit, exited) {
                out.push((e + x, seq + 2, Told::Exited(i)));
            }
            if let (Some(e), Some(k), Source::Kernel) = (exit, kernel, self.source) {
                // Stamped as the kernel's thread woke, applied when the loop gets to it.
                out.push((e + k, seq + 3, Told::ProcessGone(i, *e)));
            }
        }
        out
    }
}

fn restarts() -> impl Strategy<Value = Restarts> {
    let delay = prop_oneof![1 => Just(None), 6 => (0u64..300).prop_map(Some)];
    (
        proptest::collection::vec((1u64..60, RESTART_MIN_MS..80), 1..=4),
        prop_oneof![Just(None), (1u64..400).prop_map(Some)],
        1u64..200,
        prop_oneof![
            Just(Source::Events),
            Just(Source::Kernel),
            Just(Source::Poll)
        ],
        proptest::collection::vec([delay.clone(), delay.clone(), delay.clone(), delay], 4),
        proptest::collection::vec((0u64..900, 0u64..60), 0..4),
    )
        .prop_map(
            |(lives, last_run, stop_after, source, delays, mut listings)| {
                let mut attempts = Vec::new();
                let mut t = 10;
                for (i, (run, gap)) in lives.iter().enumerate() {
                    let last = i + 1 == lives.len();
                    let exit = if last {
                        last_run.map(|r| t + r)
                    } else {
                        Some(t + run)
                    };
                    attempts.push((t, exit));
                    t += run + gap;
                }
                // The pod begins stopping once its last attempt was created: the kubelet
                // starts nothing after.
                let stopping = attempts.last().map_or(0, |a| a.0) + stop_after;
                // The agent's first listing, asked as it starts.
                listings.push((0, 1));
                Restarts {
                    attempts,
                    stopping,
                    source,
                    delays,
                    listings,
                }
            },
        )
}
