//! A flood of idle and slow-loris connections from one peer (127.0.0.2), kept up for as long
//! as it runs: each connection the server closes is opened again.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// Where the flood comes from: a loopback address of its own, as a pod has an IP of its own.
pub const FLOOD_PEER: [u8; 4] = [127, 0, 0, 2];

pub struct Flood {
    stop: Arc<AtomicBool>,
    opened: Arc<AtomicUsize>,
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

/// Raises this process's open-file limit to its hard limit: the flood and the server's side
/// of it are thousands of descriptors.
pub fn raise_nofile() {
    use rustix::process::{getrlimit, setrlimit, Resource};
    let mut limit = getrlimit(Resource::Nofile);
    limit.current = limit.maximum;
    let _ = setrlimit(Resource::Nofile, limit);
}

impl Flood {
    /// `count` connections to `target`, half idle, half sending a request head a byte at a
    /// time; `opened` counts every connection made.
    pub fn start(target: SocketAddr, count: usize) -> Flood {
        let stop = Arc::new(AtomicBool::new(false));
        let opened = Arc::new(AtomicUsize::new(0));
        let tasks = (0..count)
            .map(|i| {
                let (stop, opened) = (Arc::clone(&stop), Arc::clone(&opened));
                tokio::spawn(async move { hold(target, i % 2 == 1, &stop, &opened).await })
            })
            .collect();
        Flood {
            stop,
            opened,
            tasks,
        }
    }

    pub fn opened(&self) -> usize {
        self.opened.load(Ordering::Relaxed)
    }

    pub async fn stop(self) {
        self.stop.store(true, Ordering::Relaxed);
        for t in self.tasks {
            let _ = tokio::time::timeout(Duration::from_secs(5), t).await;
        }
    }
}

async fn hold(target: SocketAddr, slow: bool, stop: &AtomicBool, opened: &AtomicUsize) {
    let mut buf = [0u8; 512];
    while !stop.load(Ordering::Relaxed) {
        let socket = match tokio::net::TcpSocket::new_v4() {
            Ok(s) => s,
            Err(_) => {
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        let bound = socket.bind(SocketAddr::from((FLOOD_PEER, 0)));
        let Ok(mut s) = (match bound {
            Ok(()) => socket.connect(target).await,
            Err(e) => Err(e),
        }) else {
            tokio::time::sleep(Duration::from_millis(50)).await;
            continue;
        };
        opened.fetch_add(1, Ordering::Relaxed);
        if slow
            && s.write_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\nX-Slow: ")
                .await
                .is_err()
        {
            continue;
        }
        loop {
            tokio::select! {
                r = s.read(&mut buf) => match r {
                    // Closed by the server (or answered, for a TLS port): open another.
                    Ok(0) | Err(_) => break,
                    Ok(_) => {}
                },
                () = tokio::time::sleep(Duration::from_millis(250)) => {
                    if stop.load(Ordering::Relaxed) {
                        return;
                    }
                    if slow && s.write_all(b"a").await.is_err() {
                        break;
                    }
                }
            }
        }
    }
}
