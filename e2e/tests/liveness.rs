//! `/healthz` means the decision loop goes round: the real agent, its loop wedged by a fault
//! hook (as a loop stuck on a hung file system would be) while its HTTP endpoint still
//! answers, fails its liveness probe, and passes it again once the loop moves.
//!
//! Needs root and `containerd runc busybox-static`; without them the test prints
//! "SKIPPED: <reason>" and passes, except in CI (`CI` set), where it is mandatory.

use std::time::Duration;

use exitorder_e2e::support::{self, agent_bin, http_get, metrics_addr, until, Bed};
use exitorder_testbed::AgentOptions;

#[tokio::test]
async fn a_wedged_decision_loop_fails_healthz_while_http_still_answers() {
    let Some(node) = support::node_or_skip().await else {
        return;
    };
    let dir = tempfile::tempdir().expect("tempdir");
    let wedge = dir.path().join("wedge");
    let mut opts = AgentOptions::new(agent_bin(), &node, support::static_entrypoint());
    opts.env = vec![(
        exitorder::faults::WEDGE_FILE.to_owned(),
        wedge.display().to_string(),
    )];
    let bed = Bed::with_agent(node, opts).await;
    let addr = metrics_addr(&bed.agent).await;
    assert_eq!(http_get(&addr, "/healthz").await.0, 200);

    std::fs::write(&wedge, "").expect("wedge");
    bed.agent
        .wait_for("the loop wedged", Duration::from_secs(10), |l| {
            l.says(
                "fault hook: the decision loop is wedged while this file exists",
                &[],
            )
        })
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    // Failed once the loop has been silent for 10 s; the endpoint answers all along.
    until("/healthz failing", Duration::from_secs(40), || {
        let addr = addr.clone();
        async move { http_get(&addr, "/healthz").await.0 == 503 }
    })
    .await;
    let (status, body) = http_get(&addr, "/healthz").await;
    assert_eq!(status, 503);
    assert!(body.contains("decision loop has not gone round"), "{body}");
    // The endpoint is served apart from the loop's runtime: the metrics still tell.
    let (status, body) = http_get(&addr, "/metrics").await;
    assert_eq!(status, 200, "{body}");
    assert!(body.contains("exitorder_ready"), "{body}");
    std::fs::remove_file(&wedge).expect("unwedge");
    until("/healthz passing again", Duration::from_secs(20), || {
        let addr = addr.clone();
        async move { http_get(&addr, "/healthz").await.0 == 200 }
    })
    .await;
    bed.finish().await;
}
