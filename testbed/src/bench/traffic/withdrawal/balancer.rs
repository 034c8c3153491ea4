//! The Service's consumer: haproxy on the host in front of the replicas, reprogrammed through
//! its runtime API a propagation lag after each change the EndpointSlice controller makes, as
//! kube-proxy, an ingress controller or a mesh's balancer follows the slices. A replica it
//! still routes to after the replica stopped accepting is a failed request: haproxy retries
//! nothing (`retries 0`), as a kube-proxy rule sends the connection where it points.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::{bail, Context};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::UnixStream;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tracing::Instrument;

use crate::clock::until;
use crate::fakeapi::FakeApi;
use crate::node::dirs::{make_temp_dir, DirGuard};

/// The backend's two servers: the replica that stays, the one deleted.
pub const STAYS: &str = "a";
pub const DELETED: &str = "b";

/// How often the consumer looks for the controller's changes: well under its lag's spread.
const LOOK_EVERY: Duration = Duration::from_millis(10);

/// The consumer's propagation lag: `base` ± `spread`, drawn evenly from a fixed seed, so two
/// runs draw the same lags in the same order.
#[derive(Debug, Clone, Copy)]
pub struct Lag {
    pub base: Duration,
    pub spread: Duration,
    state: u64,
}

impl Lag {
    pub fn new(base: Duration, spread: Duration) -> Lag {
        Lag {
            base,
            spread,
            state: 0x9E37_79B9_7F4A_7C15,
        }
    }

    /// The next lag (xorshift64: a spread, not a secret).
    pub fn next(&mut self) -> Duration {
        self.state ^= self.state << 13;
        self.state ^= self.state >> 7;
        self.state ^= self.state << 17;
        let spread = u64::try_from(self.spread.as_micros()).unwrap_or(u64::MAX);
        let width = spread.saturating_mul(2).saturating_add(1);
        let offset = self.state % width;
        (self.base + Duration::from_micros(offset)).saturating_sub(self.spread)
    }
}

/// What the consumer knows: which pod each server is, and whether it routes to it.
#[derive(Default)]
struct Routes {
    pods: BTreeMap<&'static str, String>,
    enabled: BTreeMap<&'static str, bool>,
}

/// haproxy, and the task reprogramming it.
pub struct Balancer {
    /// Where clients send their requests.
    pub port: u16,
    admin: PathBuf,
    routes: Arc<Mutex<Routes>>,
    stop: CancellationToken,
    _haproxy: tokio::process::Child,
    _dir: DirGuard,
}

impl Balancer {
    /// Starts haproxy with both servers out, and the consumer following `api`'s slices.
    pub async fn start(api: FakeApi, lag: Lag) -> anyhow::Result<Balancer> {
        let dir = DirGuard::new(make_temp_dir("eo-balancer").context("the balancer's directory")?);
        let port = crate::node::free_port()?;
        let admin = dir.path().join("admin.sock");
        let config = dir.path().join("haproxy.cfg");
        std::fs::write(&config, haproxy_config(port, &admin))
            .with_context(|| format!("{}", config.display()))?;
        let haproxy = tokio::process::Command::new(crate::node::HAPROXY)
            // Quiet: the servers' state changes are the benchmark's own doing.
            .args(["-db", "-q"])
            .arg("-f")
            .arg(&config)
            .stdout(std::process::Stdio::null())
            .kill_on_drop(true)
            .spawn()
            .context("starting haproxy (apt-get install -y haproxy)")?;
        let socket = admin.clone();
        until("haproxy's runtime API", Duration::from_secs(10), || {
            let socket = socket.clone();
            async move { UnixStream::connect(&socket).await.is_ok() }
        })
        .await?;
        let routes = Arc::new(Mutex::new(Routes::default()));
        let stop = CancellationToken::new();
        tokio::spawn(
            follow(api, lag, admin.clone(), Arc::clone(&routes), stop.clone())
                .instrument(tracing::info_span!("slice_consumer")),
        );
        Ok(Balancer {
            port,
            admin,
            routes,
            stop,
            _haproxy: haproxy,
            _dir: dir,
        })
    }

    /// `server` is now the pod `uid`, at `port`: out until the slices list it ready.
    pub async fn assign(&self, server: &'static str, uid: &str, port: u16) -> anyhow::Result<()> {
        command(&self.admin, &format!("set server web/{server} state maint")).await?;
        command(
            &self.admin,
            &format!("set server web/{server} addr 127.0.0.1 port {port}"),
        )
        .await?;
        let mut routes = lock(&self.routes);
        routes.pods.insert(server, uid.to_owned());
        routes.enabled.insert(server, false);
        Ok(())
    }

    /// Whether the consumer routes to `server`.
    pub fn routes_to(&self, server: &str) -> bool {
        lock(&self.routes).enabled.get(server) == Some(&true)
    }
}

impl Drop for Balancer {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

fn lock(routes: &Mutex<Routes>) -> std::sync::MutexGuard<'_, Routes> {
    routes
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

fn haproxy_config(port: u16, admin: &Path) -> String {
    format!(
        "global\n  maxconn 4096\n  stats socket {admin} mode 600 level admin\n\
         defaults\n  mode http\n  retries 0\n  timeout connect 1s\n  timeout client 5s\n  timeout server 5s\n\
         frontend web\n  bind 127.0.0.1:{port}\n  default_backend web\n\
         backend web\n  balance roundrobin\n  server {STAYS} 127.0.0.1:1 disabled\n  server {DELETED} 127.0.0.1:1 disabled\n",
        admin = admin.display()
    )
}

/// How long one runtime API command may take: haproxy answers in microseconds.
const COMMAND_TIMEOUT: Duration = Duration::from_secs(5);

/// One runtime API command; its answer, or an error when haproxy refused it or did not answer
/// in time.
async fn command(admin: &Path, line: &str) -> anyhow::Result<String> {
    let ask = async {
        let mut socket = UnixStream::connect(admin)
            .await
            .with_context(|| format!("haproxy's runtime API at {}", admin.display()))?;
        socket.write_all(format!("{line}\n").as_bytes()).await?;
        let mut answer = String::new();
        socket.read_to_string(&mut answer).await?;
        anyhow::Ok(answer)
    };
    let answer = tokio::time::timeout(COMMAND_TIMEOUT, ask)
        .await
        .map_err(|_| {
            anyhow::anyhow!("haproxy did not answer `{line}` within {COMMAND_TIMEOUT:?}")
        })??;
    let refused = ["No such", "Unknown", "Permission", "Require", "Invalid"];
    if refused.iter().any(|r| answer.trim_start().starts_with(r)) {
        bail!("haproxy refused `{line}`: {}", answer.trim());
    }
    Ok(answer)
}

/// Follows the controller's changes: each a lag after it is seen, the server of its pod goes
/// in when its endpoint is ready, out otherwise.
async fn follow(
    api: FakeApi,
    mut lag: Lag,
    admin: PathBuf,
    routes: Arc<Mutex<Routes>>,
    stop: CancellationToken,
) {
    let mut seen = 0;
    let mut due: Vec<(Instant, String, bool)> = Vec::new();
    let mut tick = tokio::time::interval(LOOK_EVERY);
    loop {
        tokio::select! {
            () = stop.cancelled() => return,
            _ = tick.tick() => {}
        }
        let changes = api.slice_changes();
        for c in changes.iter().skip(seen) {
            // From the change's own time, not from when this loop got to see it: a late look
            // (a busy machine) does not make the consumer slower than its lag.
            let seen_after = std::time::SystemTime::now()
                .duration_since(c.at)
                .unwrap_or_default();
            let at = Instant::now() + lag.next().saturating_sub(seen_after);
            due.push((at, c.pod_uid.clone(), c.ready == Some(true)));
        }
        seen = changes.len();
        let now = Instant::now();
        let (ready, later): (Vec<_>, Vec<_>) = due.drain(..).partition(|(at, _, _)| *at <= now);
        due = later;
        for (_, uid, up) in ready {
            let server = lock(&routes)
                .pods
                .iter()
                .find(|(_, pod)| **pod == uid)
                .map(|(server, _)| *server);
            let Some(server) = server else { continue };
            let state = if up { "ready" } else { "maint" };
            match command(&admin, &format!("set server web/{server} state {state}")).await {
                Ok(_) => {
                    lock(&routes).enabled.insert(server, up);
                }
                Err(e) => tracing::warn!(error = %e, "reprogramming haproxy"),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_lags_spread_evenly_around_their_base_and_repeat() {
        let mut lag = Lag::new(Duration::from_millis(1000), Duration::from_millis(200));
        let draws: Vec<Duration> = (0..1000).map(|_| lag.next()).collect();
        assert!(draws
            .iter()
            .all(|d| (Duration::from_millis(800)..=Duration::from_millis(1200)).contains(d)));
        let low = draws.iter().filter(|d| d.as_millis() < 900).count();
        let high = draws.iter().filter(|d| d.as_millis() >= 1100).count();
        assert!(
            (150..350).contains(&low) && (150..350).contains(&high),
            "{low} {high}"
        );
        let mut again = Lag::new(Duration::from_millis(1000), Duration::from_millis(200));
        assert_eq!(again.next(), draws[0]);
    }

    #[test]
    fn haproxy_retries_nothing_and_starts_with_both_servers_out() {
        let cfg = haproxy_config(8080, Path::new("/run/x/admin.sock"));
        assert!(cfg.contains("retries 0"));
        assert!(cfg.contains("bind 127.0.0.1:8080"));
        assert!(cfg.contains("stats socket /run/x/admin.sock mode 600 level admin"));
        assert_eq!(cfg.matches(" disabled\n").count(), 2);
    }
}
