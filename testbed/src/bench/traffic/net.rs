//! The host's side of the traffic benchmark: the service the app calls out to, the sink the
//! log shipper forwards to, and the clients that send requests through the pod's proxy.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::{TcpListener, TcpStream};
use tokio_util::sync::CancellationToken;
use tracing::Instrument;

/// What one request may take, connection included, before it counts as failed: the app
/// answers in well under a millisecond, so a slow answer is a lost one.
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(3);

/// Serves until `stop`, answering every connection with `answer` from `handle`.
fn spawn_server<F, Fut>(
    listener: TcpListener,
    stop: CancellationToken,
    name: &'static str,
    handle: F,
) where
    F: Fn(TcpStream) -> Fut + Send + 'static,
    Fut: std::future::Future<Output = ()> + Send + 'static,
{
    tokio::spawn(
        async move {
            loop {
                tokio::select! {
                    () = stop.cancelled() => return,
                    accepted = listener.accept() => {
                        if let Ok((tcp, _)) = accepted {
                            tokio::spawn(handle(tcp));
                        }
                    }
                }
            }
        }
        .instrument(tracing::info_span!("traffic_server", role = name)),
    );
}

/// The service outside the mesh the app calls through its proxy: 200 to every request.
pub async fn upstream(stop: CancellationToken) -> std::io::Result<u16> {
    let listener = TcpListener::bind("127.0.0.1:0").await?;
    let port = listener.local_addr()?.port();
    spawn_server(listener, stop, "upstream", |mut tcp| async move {
        let mut head = Vec::new();
        let mut buf = [0u8; 1024];
        // The request's head only: what a client sends past it is not waited for.
        while !head.windows(4).any(|w| w == b"\r\n\r\n") && head.len() < 16 * 1024 {
            match tokio::time::timeout(REQUEST_TIMEOUT, tcp.read(&mut buf)).await {
                Ok(Ok(n)) if n > 0 => head.extend_from_slice(&buf[..n]),
                _ => return,
            }
        }
        let _ = tcp
            .write_all(b"HTTP/1.0 200 OK\r\nContent-Length: 3\r\nConnection: close\r\n\r\nok\n")
            .await;
        let _ = tcp.shutdown().await;
    });
    Ok(port)
}

/// The log sink the shipper forwards to: every line received, from any connection.
#[derive(Debug, Clone, Default)]
pub struct Sink {
    lines: Arc<Mutex<Vec<String>>>,
}

impl Sink {
    /// Listens until `stop`; the port to forward to.
    pub async fn start(&self, stop: CancellationToken) -> std::io::Result<u16> {
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let port = listener.local_addr()?.port();
        let lines = Arc::clone(&self.lines);
        spawn_server(listener, stop, "log_sink", move |tcp| {
            let lines = Arc::clone(&lines);
            async move {
                let mut reader = BufReader::new(tcp).lines();
                while let Ok(Some(line)) = reader.next_line().await {
                    let line = line.trim().to_owned();
                    match lines.lock() {
                        Ok(mut l) => l.push(line),
                        Err(poisoned) => poisoned.into_inner().push(line),
                    }
                }
            }
        });
        Ok(port)
    }

    /// The lines received that begin with `pod`'s name.
    pub fn lines_of(&self, pod: &str) -> Vec<String> {
        let prefix = format!("{pod} ");
        let lines = match self.lines.lock() {
            Ok(l) => l,
            Err(poisoned) => poisoned.into_inner(),
        };
        lines
            .iter()
            .filter(|l| l.starts_with(&prefix))
            .cloned()
            .collect()
    }
}

/// Whether a GET of `/` on `port` is answered 200 within [`REQUEST_TIMEOUT`].
pub async fn get_ok(port: u16) -> bool {
    let ask = async {
        let mut tcp = TcpStream::connect(("127.0.0.1", port)).await?;
        tcp.write_all(b"GET / HTTP/1.0\r\nHost: app\r\n\r\n")
            .await?;
        let mut answer = Vec::new();
        tcp.read_to_end(&mut answer).await?;
        Ok::<_, std::io::Error>(answer)
    };
    match tokio::time::timeout(REQUEST_TIMEOUT, ask).await {
        Ok(Ok(answer)) => {
            answer.starts_with(b"HTTP/1.0 200") || answer.starts_with(b"HTTP/1.1 200")
        }
        _ => false,
    }
}

/// Requests sent and how many of them failed.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Load {
    pub sent: usize,
    pub failed: usize,
}

/// Sends `rate` requests a second to `port` for `span`, each on a connection of its own (a
/// client still routed to the pod while its endpoint is being removed), and counts those
/// not answered 200.
pub async fn load(port: u16, rate: u32, span: Duration) -> Load {
    load_until(port, rate, tokio::time::sleep(span)).await
}

/// Sends `rate` requests a second to `port`, each on a connection of its own, until `stop`
/// completes; counts those not answered 200 once every request sent has its answer.
pub async fn load_until(port: u16, rate: u32, stop: impl std::future::Future<Output = ()>) -> Load {
    let every = Duration::from_secs(1) / rate.max(1);
    let mut tick = tokio::time::interval(every);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Burst);
    let mut requests = tokio::task::JoinSet::new();
    tokio::pin!(stop);
    loop {
        tokio::select! {
            biased;
            () = &mut stop => break,
            _ = tick.tick() => {
                requests.spawn(get_ok(port).instrument(tracing::info_span!("traffic_request")));
            }
        }
    }
    let mut out = Load::default();
    while let Some(res) = requests.join_next().await {
        out.sent += 1;
        if !matches!(res, Ok(true)) {
            out.failed += 1;
        }
    }
    out
}
