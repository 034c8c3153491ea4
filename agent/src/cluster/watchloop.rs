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

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;
    use tokio::sync::Notify;
    use tokio::time::Instant as Clock;

    /// When each failure came; after `rounds` of them, the run is told to stop.
    struct Tally {
        failures: Vec<Clock>,
        rounds: usize,
        done: Arc<Notify>,
    }

    impl Consumer<u32> for Tally {
        fn on_event(&mut self, ev: watcher::Event<u32>) -> bool {
            matches!(ev, watcher::Event::Apply(_))
        }
        fn on_error(&mut self, _: &watcher::Error) {
            self.failures.push(Clock::now());
            if self.failures.len() >= self.rounds {
                self.done.notify_one();
            }
        }
    }

    /// The gaps between failures when every watch yields `events` at once and then fails
    /// (time paused: the backoff's sleeps pass exactly).
    async fn gaps(events: Vec<watcher::Event<u32>>, rounds: usize) -> Vec<Duration> {
        let done = Arc::new(Notify::new());
        let mut tally = Tally {
            failures: Vec::new(),
            rounds,
            done: Arc::clone(&done),
        };
        let start = move || {
            let mut items: Vec<Result<watcher::Event<u32>, watcher::Error>> =
                events.iter().cloned().map(Ok).collect();
            items.push(Err(watcher::Error::NoResourceVersion));
            futures_util::stream::iter(items)
        };
        let backoff = Backoff::new(Duration::from_secs(1), Duration::from_secs(8));
        run(start, &mut tally, backoff, done.notified()).await;
        tally.failures.windows(2).map(|w| w[1] - w[0]).collect()
    }

    #[tokio::test(start_paused = true)]
    async fn a_listing_alone_does_not_reset_the_backoff() {
        let listing = vec![
            watcher::Event::Init,
            watcher::Event::InitApply(1),
            watcher::Event::InitDone,
        ];
        let s = Duration::from_secs;
        assert_eq!(gaps(listing, 6).await, [s(1), s(2), s(4), s(8), s(8)]);
    }

    #[tokio::test(start_paused = true)]
    async fn an_event_of_a_running_watch_resets_it() {
        let watching = vec![
            watcher::Event::Init,
            watcher::Event::InitDone,
            watcher::Event::Apply(2),
        ];
        let s = Duration::from_secs;
        assert_eq!(gaps(watching, 4).await, [s(1), s(1), s(1)]);
    }
}
