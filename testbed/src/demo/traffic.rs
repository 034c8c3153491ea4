//! `--traffic`: what clients keep through a pod's deletion, without exitorder and with it: the
//! traffic benchmark's pod (an app behind a real proxy and log shipper), then one replica of
//! two behind a Service, its endpoints withdrawn by the EndpointSlice controller and followed
//! by haproxy.

use crate::bench::traffic::withdrawal::{self, App, Wait, WithdrawalCase, WithdrawalSettings};
use crate::bench::traffic::{self, Strategy, TrafficSettings};
use crate::binaries::Binaries;
use crate::node::Node;

/// Each deleted once without the agent's order and once with it, a line each.
pub(super) async fn traffic(
    node: &Node,
    bin: &Binaries,
    out: &mut dyn FnMut(&str),
) -> anyhow::Result<()> {
    out(
        "An app behind a real proxy (haproxy) and log shipper (rsyslog), deleted while \
         clients send it 50 requests/s:",
    );
    let settings = TrafficSettings {
        deletions: 1,
        ..TrafficSettings::default()
    };
    traffic::prepare(node)?;
    for (strategy, label) in [
        (Strategy::None, "without exitorder"),
        (Strategy::Exitorder, "with exitorder"),
    ] {
        let row = traffic::run_strategy(node, bin, strategy, &settings).await?;
        out(&format!("  {label:<18} {}", row.counts.sentence()));
    }
    let settings = WithdrawalSettings {
        deletions: 1,
        ..WithdrawalSettings::default()
    };
    out(&format!(
        "One replica of two behind a Service, deleted while clients send {} requests/s through \
         haproxy, which follows the EndpointSlices {} ms late; the app stops accepting on TERM:",
        settings.rate, settings.consumer_lag_ms
    ));
    let lag = withdrawal::CONTROLLER_LAG_MS;
    let cases = [
        WithdrawalCase::new(Wait::Nothing, App::StopsOnTerm, lag),
        WithdrawalCase::new(Wait::Endpoints, App::StopsOnTerm, lag),
    ];
    let section = withdrawal::measure(node, bin, &cases, &settings, &mut |_| {}).await?;
    for (row, label) in section
        .rows
        .iter()
        .zip(["without exitorder", "with exitorder.io/wait-for-endpoints"])
    {
        out(&format!(
            "  {label:<36} {} of {} requests failed, the pod gone {:.1} s after its deletion",
            row.requests_failed,
            row.requests,
            row.pod_gone_p50_ms / 1000.0
        ));
    }
    Ok(())
}
