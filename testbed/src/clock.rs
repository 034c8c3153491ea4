//! The test bed's one clock for stamps: Unix ns, comparable with the runtime's times and the
//! agent's log; and the one wait on a condition, always with a deadline.

use std::time::{Duration, Instant, SystemTime};

/// Now, Unix ns.
pub fn now_ns() -> i64 {
    SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_nanos()).unwrap_or(i64::MAX))
}

/// Polls `check` until it holds; an error naming `what` after `within`.
pub async fn until<F, Fut>(what: &str, within: Duration, mut check: F) -> anyhow::Result<()>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let deadline = Instant::now() + within;
    loop {
        if check().await {
            return Ok(());
        }
        if Instant::now() >= deadline {
            anyhow::bail!("{what}: not within {within:?}");
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}
