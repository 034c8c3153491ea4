//! One way to keep a kube watch running, for every watch the agent holds (its node's pods,
//! its own DaemonSet): restarted with a backoff when it fails, stopped by a shutdown.

use std::future::Future;
use std::time::{Duration, Instant};

use futures_util::{Stream, StreamExt};
use kube::runtime::watcher;

use crate::backoff::Backoff;

/// A stream that stayed up this long after its listing was healthy: the next failure
/// starts the backoff over.
pub const STABLE: Duration = Duration::from_secs(30);

/// What a watch's events are for.
pub trait Consumer<K> {
    /// Applies one event; true when it proves the watch healthy. Only an event of a running
    /// watch does: a list that succeeds before a watch that fails (RBAC without `watch`, a
    /// proxy that breaks streaming) must not reset the backoff, or every node would list
    /// twice a second.
    fn on_event(&mut self, ev: watcher::Event<K>) -> bool;
    /// The stream failed with `error` (after its retries inside kube's watcher).
    fn on_error(&mut self, error: &watcher::Error);
}

/// Runs the watches `start` makes, one after the other, feeding `consumer`, until `shutdown`.
pub async fn run<K, S>(
    mut start: impl FnMut() -> S,
    consumer: &mut impl Consumer<K>,
    mut backoff: Backoff,
    shutdown: impl Future<Output = ()>,
) where
    S: Stream<Item = Result<watcher::Event<K>, watcher::Error>>,
{
    tokio::pin!(shutdown);
    loop {
        let stream = start();
        tokio::pin!(stream);
        let mut listed_at = None;
        let failed = loop {
            tokio::select! {
                () = &mut shutdown => return,
                item = stream.next() => match item {
                    Some(Ok(ev)) => {
                        if matches!(ev, watcher::Event::InitDone) {
                            listed_at = Some(Instant::now());
                        }
                        if consumer.on_event(ev) {
                            backoff.reset();
                        }
                    }
                    Some(Err(e)) => break Some(e),
                    None => break None,
                }
            }
        };
        if listed_at.is_some_and(|t: Instant| t.elapsed() >= STABLE) {
            backoff.reset();
        }
        if let Some(e) = failed {
            consumer.on_error(&e);
        }
        tokio::select! {
            () = &mut shutdown => return,
            () = tokio::time::sleep(backoff.next_delay()) => {}
        }
    }
}
