//! Pods run on a [`Node`] the way the kubelet runs them: one, or many with bounded set-up.

use std::sync::Arc;
use std::time::Duration;

use serde_json::Value;

use super::worker::start;
use super::{RunOptions, RunningPod};
use crate::node::{Node, TestbedError};

impl Node {
    /// Runs a Pod (as written: the JSON of its YAML) the way the kubelet does.
    pub async fn run_pod(
        &self,
        pod: &Value,
        opts: &RunOptions,
    ) -> Result<RunningPod, TestbedError> {
        start(self.shared(), pod, opts).await
    }

    /// Runs many pods, at most `concurrency` being set up at once: the runtime does much of
    /// the work one pod at a time anyway, and hundreds of unbounded set-ups only push each
    /// other into timeouts. A pod counts as set up once its containers have started. One
    /// result per pod, in order. Once a pod fails to start, the pods not yet begun are not
    /// tried ([`TestbedError::NotStarted`]): a node that is full would fail each of them the
    /// same way, slowly.
    pub async fn run_pods(
        &self,
        pods: Vec<Value>,
        opts: &RunOptions,
        concurrency: usize,
        started_within: Duration,
    ) -> Vec<Result<RunningPod, TestbedError>> {
        use tracing::Instrument;
        let count = pods.len();
        let permits = Arc::new(tokio::sync::Semaphore::new(concurrency.max(1)));
        let failed = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let mut tasks = tokio::task::JoinSet::new();
        for (i, pod) in pods.into_iter().enumerate() {
            let shared = self.shared();
            let permits = Arc::clone(&permits);
            let failed = Arc::clone(&failed);
            let opts = opts.clone();
            let name = pod
                .pointer("/metadata/name")
                .and_then(Value::as_str)
                .unwrap_or("?")
                .to_owned();
            let span = tracing::info_span!("run_pod", pod = %name);
            tasks.spawn(
                async move {
                    // The semaphore is never closed; a permit error would only mean "go on".
                    let _permit = permits.acquire_owned().await;
                    if failed.load(std::sync::atomic::Ordering::Relaxed) {
                        return (i, Err(TestbedError::NotStarted { pod: name }));
                    }
                    let res = match start(shared, &pod, &opts).await {
                        Ok(p) => p.wait_started(started_within).await.map(|_| p),
                        Err(e) => Err(e),
                    };
                    if res.is_err() {
                        failed.store(true, std::sync::atomic::Ordering::Relaxed);
                    }
                    (i, res)
                }
                .instrument(span),
            );
        }
        let mut out: Vec<Option<Result<RunningPod, TestbedError>>> =
            (0..count).map(|_| None).collect();
        while let Some(joined) = tasks.join_next().await {
            if let Ok((i, res)) = joined {
                if let Some(slot) = out.get_mut(i) {
                    *slot = Some(res);
                }
            }
        }
        out.into_iter()
            .map(|r| {
                r.unwrap_or_else(|| Err(TestbedError::Task("a pod set-up task panicked".into())))
            })
            .collect()
    }
}
