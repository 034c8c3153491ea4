//! One way to serve HTTP/1 for the agent's endpoint (`/metrics`, `/healthz`, `/readyz`, on the
//! node's network) and the webhook (TLS): an accept loop with limits that no client can use
//! up, and connections that end in bounded time.
//!
//! - At most `max_connections` open, and `max_per_peer` from one address. A new connection
//!   past either is still served: one of the peer holding the most (past `max_per_peer`, of
//!   its own peer) is closed to make room, its oldest that is not answering a request, else
//!   its oldest. A client holding thousands of idle or slow sockets only ever displaces its
//!   own, so a Prometheus scrape, a kubelet probe or the API server's review gets through.
//! - A request head must be whole within `header_timeout`. hyper starts that timer whenever
//!   it waits for a head: on a new connection before its first byte, and on a keep-alive
//!   connection from the end of each answer, so a silent socket, a slow-loris head and an idle
//!   keep-alive connection all end within it (`every_wait_for_a_head_is_bounded` holds hyper
//!   to it). Heads are at most `max_header_bytes` (431 past it).
//! - A connection lives at most `max_lifetime`: a client that asks again and again on one
//!   connection, or never reads its answers, is told to stop as at shutdown.
//! - A connection told to stop (too old, or the server stopping) finishes the request in
//!   flight within `drain`, then closes; an evicted one is closed at once.
//!
//! Parts:
//! - [`metrics`]: the agent's `/metrics`, `/healthz`, `/readyz`.
//! - [`openmetrics`]: the one encoder of both servers' metrics.

pub mod metrics;
pub mod openmetrics;

use std::collections::HashMap;
use std::future::Future;
use std::net::{IpAddr, SocketAddr};
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Weak};
use std::time::Duration;

use hyper::body::{Body, Incoming};
use hyper::service::Service;
use hyper::{Request, Response};
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::{TcpListener, TcpSocket, TcpStream};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tracing::{debug, Instrument};

use crate::stats::ConnStats;

/// What a server allows its clients.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    pub max_connections: usize,
    pub max_per_peer: usize,
    pub header_timeout: Duration,
    pub max_lifetime: Duration,
    pub max_header_bytes: usize,
    /// How long a connection told to stop may finish its request.
    pub drain: Duration,
}

impl Limits {
    /// The agent's endpoint: a scraper and a prober or two per node.
    pub const METRICS: Limits = Limits {
        max_connections: 256,
        max_per_peer: 64,
        header_timeout: Duration::from_secs(5),
        max_lifetime: Duration::from_secs(60),
        max_header_bytes: 16 * 1024,
        drain: Duration::from_secs(1),
    };

    /// The webhook: every API server instance keeps a few connections.
    pub const WEBHOOK: Limits = Limits {
        max_connections: 1024,
        max_per_peer: 256,
        header_timeout: Duration::from_secs(5),
        max_lifetime: Duration::from_secs(120),
        max_header_bytes: 64 * 1024,
        drain: Duration::from_secs(6),
    };
}

/// What a connection's handler gets besides its socket.
pub struct Conn {
    /// Cancelled when the connection must end: past its lifetime, or the server stopping.
    pub stop: CancellationToken,
    /// Set while a request is being answered.
    busy: Arc<AtomicBool>,
}

struct Slot {
    peer: IpAddr,
    /// Closes the connection at once: it is evicted.
    evict: CancellationToken,
    /// Gone when the connection's task ended.
    alive: Weak<()>,
    busy: Arc<AtomicBool>,
}

/// The open connections, oldest first, and how many each peer holds. Each accept walks the
/// table once (about 20 µs for 1,024 connections in a debug build), never once per connection:
/// the accept loop must outpace a flood that reconnects as soon as it is closed.
#[derive(Default)]
struct Table {
    slots: Vec<Slot>,
    per_peer: HashMap<IpAddr, usize>,
}

fn forget(per_peer: &mut HashMap<IpAddr, usize>, peer: IpAddr) {
    if let Some(n) = per_peer.get_mut(&peer) {
        *n = n.saturating_sub(1);
        if *n == 0 {
            per_peer.remove(&peer);
        }
    }
}

impl Table {
    fn add(&mut self, slot: Slot) {
        let n = self.per_peer.entry(slot.peer).or_insert(0);
        *n = n.saturating_add(1);
        self.slots.push(slot);
    }

    fn forget_ended(&mut self) {
        let per_peer = &mut self.per_peer;
        self.slots.retain(|s| {
            let alive = s.alive.strong_count() > 0;
            if !alive {
                forget(per_peer, s.peer);
            }
            alive
        });
    }

    fn count(&self, peer: IpAddr) -> usize {
        self.per_peer.get(&peer).copied().unwrap_or(0)
    }

    /// Closes a connection of `peer`: its oldest not answering a request (waiting for a head,
    /// slow or silent), else its oldest.
    fn evict_from(&mut self, peer: IpAddr) -> bool {
        let waiting = self
            .slots
            .iter()
            .position(|s| s.peer == peer && !s.busy.load(Ordering::Relaxed));
        let Some(i) = waiting.or_else(|| self.slots.iter().position(|s| s.peer == peer)) else {
            return false;
        };
        let slot = self.slots.remove(i);
        slot.evict.cancel();
        forget(&mut self.per_peer, slot.peer);
        true
    }

    /// Makes room for one more connection from `peer`; whether one was closed for it.
    fn make_room(&mut self, peer: IpAddr, limits: &Limits) -> bool {
        self.forget_ended();
        if self.count(peer) >= limits.max_per_peer.max(1) {
            return self.evict_from(peer);
        }
        if self.slots.len() < limits.max_connections.max(1) {
            return false;
        }
        // The peer holding the most; of equals, the one holding the oldest connection.
        let most = self.per_peer.values().copied().max().unwrap_or(0);
        let heaviest = self
            .slots
            .iter()
            .map(|s| s.peer)
            .find(|p| self.count(*p) == most);
        heaviest.is_some_and(|p| self.evict_from(p))
    }
}

/// The accept queue asked for; the kernel caps it at `net.core.somaxconn` (4096 by default).
const BACKLOG: u32 = 4096;

/// Binds `addr` with a long accept queue. A flood that reconnects as soon as it is closed
/// keeps the queue full whenever it holds more connections than the server and its queue
/// together; a new client's SYN is then dropped and sent again only a second later, past a
/// kubelet probe's default timeout. The queue is only sockets in the kernel: a long one costs
/// nothing until used, and makes the flood that fills it four times larger than with the
/// usual 1,024.
pub fn bind(addr: SocketAddr) -> std::io::Result<TcpListener> {
    let socket = if addr.is_ipv4() {
        TcpSocket::new_v4()?
    } else {
        TcpSocket::new_v6()?
    };
    // As std and tokio do: a restarted agent binds its port while the old one's connections
    // are in TIME_WAIT.
    socket.set_reuseaddr(true)?;
    socket.bind(addr)?;
    socket.listen(BACKLOG)
}

/// Accepts connections on `listener` until `stop`, handing each to `handle` with its [`Conn`]
/// (which says when it must end); then lets them finish within their drain.
pub async fn accept_loop<F, Fut>(
    listener: TcpListener,
    limits: Limits,
    stats: Arc<ConnStats>,
    stop: CancellationToken,
    handle: F,
) where
    F: Fn(TcpStream, SocketAddr, Conn) -> Fut,
    Fut: Future<Output = ()> + Send + 'static,
{
    let tracker = TaskTracker::new();
    let mut table = Table::default();
    loop {
        let (tcp, peer) = tokio::select! {
            () = stop.cancelled() => break,
            accepted = listener.accept() => match accepted {
                Ok(c) => c,
                Err(e) => {
                    // Out of descriptors, most likely: the connections that end make room.
                    debug!(error = %e, "accept failed");
                    tokio::time::sleep(Duration::from_millis(10)).await;
                    continue;
                }
            },
        };
        if table.make_room(peer.ip(), &limits) {
            stats.evicted.fetch_add(1, Ordering::Relaxed);
        }
        let alive = Arc::new(());
        let conn_stop = stop.child_token();
        let evict = CancellationToken::new();
        let busy = Arc::new(AtomicBool::new(false));
        table.add(Slot {
            peer: peer.ip(),
            evict: evict.clone(),
            alive: Arc::downgrade(&alive),
            busy: Arc::clone(&busy),
        });
        stats.open.fetch_add(1, Ordering::Relaxed);
        let served = handle(
            tcp,
            peer,
            Conn {
                stop: conn_stop.clone(),
                busy,
            },
        );
        let (stats, lifetime) = (Arc::clone(&stats), limits.max_lifetime);
        tracker.spawn(
            async move {
                let _alive = alive;
                // Past its lifetime a connection is told to stop like an evicted one.
                let expire = {
                    let conn_stop = conn_stop.clone();
                    async move {
                        tokio::time::sleep(lifetime).await;
                        conn_stop.cancel();
                        std::future::pending::<()>().await;
                    }
                };
                // An evicted connection is closed, not drained: it belongs to the peer that
                // holds the most, whose requests are the flood.
                tokio::select! {
                    () = served => {}
                    () = expire => {}
                    () = evict.cancelled() => {}
                }
                stats.open.fetch_sub(1, Ordering::Relaxed);
            }
            .instrument(tracing::debug_span!("connection", %peer)),
        );
        // The connections just accepted read their heads before the next accept may displace
        // them: against a flood that reconnects as fast as it is closed, a scrape's connection
        // is answering (and passed over) as soon as its head has arrived.
        tokio::task::yield_now().await;
    }
    tracker.close();
    tracker.wait().await;
}

/// Marks its connection busy while a request is answered, for [`Table::evict_from`].
struct Marked<S> {
    inner: S,
    busy: Arc<AtomicBool>,
}

/// Clears the mark when the answer is ready, or dropped with its connection.
struct Answering(Arc<AtomicBool>);

impl Drop for Answering {
    fn drop(&mut self) {
        self.0.store(false, Ordering::Relaxed);
    }
}

type Answer<R, E> = Pin<Box<dyn Future<Output = Result<R, E>> + Send>>;

impl<S, B> Service<Request<Incoming>> for Marked<S>
where
    S: Service<Request<Incoming>, Response = Response<B>>,
    S::Future: Send + 'static,
    S::Error: Send,
    B: Send,
{
    type Response = Response<B>;
    type Error = S::Error;
    type Future = Answer<Response<B>, S::Error>;

    fn call(&self, req: Request<Incoming>) -> Self::Future {
        self.busy.store(true, Ordering::Relaxed);
        let answering = Answering(Arc::clone(&self.busy));
        let answer = self.inner.call(req);
        Box::pin(async move {
            let res = answer.await;
            drop(answering);
            res
        })
    }
}

/// Serves HTTP/1 on one connection with `limits`, until the client is done or `conn.stop`;
/// then the request in flight gets `limits.drain` to finish.
pub async fn http1<I, S, B>(io: I, svc: S, limits: &Limits, conn: Conn)
where
    I: AsyncRead + AsyncWrite + Unpin + Send + 'static,
    S: Service<Request<Incoming>, Response = Response<B>> + Send,
    S::Future: Send + 'static,
    S::Error: Into<Box<dyn std::error::Error + Send + Sync>> + Send,
    B: Body + Send + 'static,
    B::Data: Send,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    let Conn { stop, busy } = conn;
    let svc = Marked { inner: svc, busy };
    let conn = hyper::server::conn::http1::Builder::new()
        .timer(TokioTimer::new())
        .header_read_timeout(limits.header_timeout)
        .max_buf_size(limits.max_header_bytes.max(8192))
        .serve_connection(TokioIo::new(io), svc);
    tokio::pin!(conn);
    tokio::select! {
        res = conn.as_mut() => {
            if let Err(e) = res {
                debug!(error = %e, "connection ended");
            }
        }
        () = stop.cancelled() => {
            conn.as_mut().graceful_shutdown();
            if tokio::time::timeout(limits.drain, conn).await.is_err() {
                debug!("connection closed at the end of its drain");
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::convert::Infallible;

    use bytes::Bytes;
    use http_body_util::Full;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    fn slot(peer: [u8; 4]) -> (Slot, Arc<()>) {
        let alive = Arc::new(());
        let s = Slot {
            peer: IpAddr::from(peer),
            evict: CancellationToken::new(),
            alive: Arc::downgrade(&alive),
            busy: Arc::default(),
        };
        (s, alive)
    }

    #[test]
    fn a_flood_displaces_only_its_own() {
        let limits = Limits {
            max_connections: 4,
            max_per_peer: 3,
            ..Limits::METRICS
        };
        let mut t = Table::default();
        let mut keep = Vec::new();
        let (scraper, a) = slot([10, 0, 0, 1]);
        let scraper_stop = scraper.evict.clone();
        t.add(scraper);
        keep.push(a);
        for _ in 0..3 {
            assert!(!t.make_room(IpAddr::from([10, 0, 0, 9]), &limits));
            let (s, a) = slot([10, 0, 0, 9]);
            t.add(s);
            keep.push(a);
        }
        // The flooder is at its own limit and at the server's: it loses its oldest, the
        // scraper keeps its connection, and so does a newcomer.
        for _ in 0..10 {
            assert!(t.make_room(IpAddr::from([10, 0, 0, 9]), &limits));
            let (s, a) = slot([10, 0, 0, 9]);
            t.add(s);
            keep.push(a);
        }
        assert!(!scraper_stop.is_cancelled());
        assert!(t.make_room(IpAddr::from([10, 0, 0, 2]), &limits));
        assert!(!scraper_stop.is_cancelled());
        assert_eq!(t.count(IpAddr::from([10, 0, 0, 1])), 1);
        assert_eq!(t.count(IpAddr::from([10, 0, 0, 9])), 2);
    }

    #[test]
    fn many_peers_lose_their_oldest_first() {
        let limits = Limits {
            max_connections: 3,
            max_per_peer: 3,
            ..Limits::METRICS
        };
        let mut t = Table::default();
        let mut keep = Vec::new();
        let mut stops = Vec::new();
        for last in 1..=3 {
            let (s, a) = slot([10, 0, 0, last]);
            stops.push(s.evict.clone());
            t.add(s);
            keep.push(a);
        }
        // Every peer holds one: the oldest connection goes.
        assert!(t.make_room(IpAddr::from([10, 0, 0, 4]), &limits));
        let closed: Vec<bool> = stops.iter().map(CancellationToken::is_cancelled).collect();
        assert_eq!(closed, [true, false, false]);
        assert_eq!(t.per_peer.len(), 2);
    }

    #[test]
    fn a_request_in_flight_is_closed_last() {
        let limits = Limits {
            max_connections: 8,
            max_per_peer: 3,
            ..Limits::METRICS
        };
        let mut t = Table::default();
        let mut keep = Vec::new();
        let mut conns = Vec::new();
        for _ in 0..3 {
            let (s, a) = slot([10, 0, 0, 9]);
            conns.push((s.evict.clone(), Arc::clone(&s.busy)));
            t.add(s);
            keep.push(a);
        }
        let busy = |i: usize| conns.get(i).map(|(_, b)| Arc::clone(b)).expect("conn");
        let closed = |i: usize| conns.get(i).is_some_and(|(e, _)| e.is_cancelled());
        busy(0).store(true, Ordering::Relaxed);
        assert!(t.make_room(IpAddr::from([10, 0, 0, 9]), &limits));
        assert!(!closed(0) && closed(1) && !closed(2));
        busy(2).store(true, Ordering::Relaxed);
        let (s, a) = slot([10, 0, 0, 9]);
        let newest = s.evict.clone();
        t.add(s);
        keep.push(a);
        assert!(t.make_room(IpAddr::from([10, 0, 0, 9]), &limits));
        assert!(!closed(0) && !closed(2) && newest.is_cancelled());
        // All answering: the oldest goes after all.
        let two = Limits {
            max_per_peer: 2,
            ..limits
        };
        assert!(t.make_room(IpAddr::from([10, 0, 0, 9]), &two));
        assert!(closed(0) && !closed(2));
    }

    #[test]
    fn ended_connections_make_room() {
        let limits = Limits {
            max_connections: 2,
            ..Limits::METRICS
        };
        let mut t = Table::default();
        let (a, alive_a) = slot([10, 0, 0, 1]);
        let (b, _alive_b) = slot([10, 0, 0, 2]);
        t.add(a);
        t.add(b);
        drop(alive_a);
        assert!(!t.make_room(IpAddr::from([10, 0, 0, 3]), &limits));
        assert_eq!(t.slots.len(), 1);
        assert_eq!(t.count(IpAddr::from([10, 0, 0, 1])), 0);
    }

    /// The accept loop and `http1` on 127.0.0.1, answering `ok` to anything.
    async fn serving(limits: Limits) -> (SocketAddr, CancellationToken) {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = listener.local_addr().expect("addr");
        let stop = CancellationToken::new();
        let handle = move |tcp, _peer, conn| async move {
            let svc = hyper::service::service_fn(|_req: Request<Incoming>| async {
                Ok::<_, Infallible>(Response::new(Full::new(Bytes::from_static(b"ok\n"))))
            });
            http1(tcp, svc, &limits, conn).await;
        };
        tokio::spawn(accept_loop(
            listener,
            limits,
            Arc::default(),
            stop.clone(),
            handle,
        ));
        (addr, stop)
    }

    /// Reads until the server closes (or resets) the connection, sending `trickle` a byte at
    /// a time meanwhile; what was read.
    async fn until_closed(s: &mut TcpStream, trickle: bool) -> Vec<u8> {
        let mut out = Vec::new();
        let mut buf = [0u8; 1024];
        let read = async {
            loop {
                tokio::select! {
                    r = s.read(&mut buf) => match r {
                        Ok(0) | Err(_) => return,
                        Ok(n) => out.extend_from_slice(buf.get(..n).unwrap_or_default()),
                    },
                    () = tokio::time::sleep(Duration::from_millis(100)), if trickle => {
                        if s.write_all(b"a").await.is_err() {
                            return;
                        }
                    }
                }
            }
        };
        tokio::time::timeout(Duration::from_secs(60), read)
            .await
            .expect("closed by the server within 60 s");
        out
    }

    #[tokio::test]
    async fn every_wait_for_a_head_is_bounded() {
        // A lifetime far past the test: only the head timer can close these.
        let limits = Limits {
            header_timeout: Duration::from_millis(300),
            max_lifetime: Duration::from_secs(3600),
            ..Limits::METRICS
        };
        let (addr, stop) = serving(limits).await;
        let mut silent = TcpStream::connect(addr).await.expect("connect");
        let mut slow = TcpStream::connect(addr).await.expect("connect");
        slow.write_all(b"GET / HTTP/1.1\r\nHost: x\r\nX-Slow: ")
            .await
            .expect("write");
        let mut kept = TcpStream::connect(addr).await.expect("connect");
        kept.write_all(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
            .await
            .expect("write");
        let (silent, slow, kept) = tokio::join!(
            until_closed(&mut silent, false),
            until_closed(&mut slow, true),
            until_closed(&mut kept, false),
        );
        assert!(silent.is_empty());
        assert!(!String::from_utf8_lossy(&slow).contains("ok"));
        // Answered, then closed while idle on keep-alive.
        let kept = String::from_utf8_lossy(&kept);
        assert!(kept.starts_with("HTTP/1.1 200 OK"), "{kept}");
        assert!(kept.ends_with("ok\n"), "{kept}");
        stop.cancel();
    }

    #[tokio::test]
    async fn heads_are_bounded_and_connections_end() {
        let limits = Limits {
            max_lifetime: Duration::from_millis(300),
            ..Limits::METRICS
        };
        let (addr, stop) = serving(limits).await;
        let mut big = TcpStream::connect(addr).await.expect("connect");
        let mut head = b"GET / HTTP/1.1\r\nHost: x\r\nX-Big: ".to_vec();
        head.resize(limits.max_header_bytes.saturating_add(1024), b'a');
        head.extend_from_slice(b"\r\n\r\n");
        // The server may close before reading it all, and the reset that follows may beat
        // its 431 to the client.
        let _ = big.write_all(&head).await;
        let answer = until_closed(&mut big, false).await;
        let answer = String::from_utf8_lossy(&answer);
        assert!(
            answer.is_empty() || answer.starts_with("HTTP/1.1 431"),
            "{answer}"
        );
        // A client asking on one connection for ever is stopped at its lifetime.
        let mut busy = TcpStream::connect(addr).await.expect("connect");
        let asking = async {
            let mut buf = [0u8; 1024];
            loop {
                if busy
                    .write_all(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
                    .await
                    .is_err()
                {
                    return;
                }
                match busy.read(&mut buf).await {
                    Ok(0) | Err(_) => return,
                    Ok(_) => {}
                }
            }
        };
        tokio::time::timeout(Duration::from_secs(60), asking)
            .await
            .expect("closed at the end of its lifetime");
        stop.cancel();
    }
}
