//! Lifecycle hooks and probes run the kubelet's way: exec through the runtime (ExecSync), HTTP
//! and TCP from the node to the pod's address, sleep in the kubelet itself.

use std::time::Duration;

use bytes::Bytes;
use exitorder::cri::runtime_service_client::RuntimeServiceClient;
use exitorder::cri::ExecSyncRequest;
use http_body_util::{BodyExt, Empty};
use hyper_util::rt::TokioIo;
use tonic::transport::Channel;

use super::plan::Handler;

/// The longest timeout handed to the runtime: containerd turns seconds into Go's int64
/// nanoseconds, where anything past 292 years wraps to a time already gone, and a pod's grace
/// period may be any int64. A century stands for "never".
pub(crate) const MAX_RUNTIME_SECONDS: i64 = 100 * 365 * 24 * 3600;

/// Where a handler runs.
pub struct Target<'a> {
    pub client: RuntimeServiceClient<Channel>,
    pub container_id: &'a str,
    /// The pod's address (the node's, for host-network pods): where HTTP and TCP go when the
    /// handler names no host.
    pub pod_ip: &'a str,
}

/// How much of a handler's output is kept for the timeline.
const DETAIL_LIMIT: usize = 300;

fn clip(s: &str) -> String {
    // One line in the timeline, however many the hook printed.
    let joined = s
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .collect::<Vec<_>>()
        .join(" | ");
    let s = joined.as_str();
    if s.len() <= DETAIL_LIMIT {
        return s.to_owned();
    }
    let mut end = DETAIL_LIMIT;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}...", &s[..end])
}

/// Runs `h`; `Ok` with what it said, `Err` with why it failed. `timeout` bounds it (`None`:
/// no bound, as the kubelet runs postStart).
pub async fn run(h: &Handler, t: &Target<'_>, timeout: Option<Duration>) -> Result<String, String> {
    match h {
        Handler::Exec(cmd) => exec(t, cmd, timeout).await,
        Handler::HttpGet {
            host,
            port,
            path,
            headers,
        } => {
            let host = host.as_deref().unwrap_or(t.pod_ip);
            let fut = http_get(host, *port, path, headers);
            let code = match timeout {
                Some(d) => tokio::time::timeout(d, fut).await.map_err(|_| {
                    format!("GET http://{host}:{port}{path}: no answer within {d:?}")
                })?,
                None => fut.await,
            }?;
            if (200..400).contains(&code) {
                Ok(format!("HTTP {code}"))
            } else {
                Err(format!("GET http://{host}:{port}{path}: HTTP {code}"))
            }
        }
        Handler::TcpSocket { host, port } => {
            let host = host.as_deref().unwrap_or(t.pod_ip);
            let fut = tokio::net::TcpStream::connect((host, *port));
            let res = tokio::time::timeout(timeout.unwrap_or(Duration::from_secs(1)), fut).await;
            match res {
                Ok(Ok(_)) => Ok(String::new()),
                Ok(Err(e)) => Err(format!("TCP {host}:{port}: {e}")),
                Err(_) => Err(format!("TCP {host}:{port}: no answer")),
            }
        }
        Handler::Sleep(s) => {
            let want = Duration::from_secs(u64::try_from(*s).unwrap_or(0));
            tokio::time::sleep(timeout.map_or(want, |t| t.min(want))).await;
            Ok(String::new())
        }
    }
}

async fn exec(t: &Target<'_>, cmd: &[String], timeout: Option<Duration>) -> Result<String, String> {
    let max = MAX_RUNTIME_SECONDS.unsigned_abs();
    let secs = timeout.map_or(0, |d| i64::try_from(d.as_secs().clamp(1, max)).unwrap_or(1));
    let mut req = tonic::Request::new(ExecSyncRequest {
        container_id: t.container_id.to_owned(),
        cmd: cmd.to_vec(),
        timeout: secs,
    });
    if let Some(d) = timeout {
        // The runtime enforces the timeout; the call's own deadline only guards a runtime
        // that does not answer.
        req.set_timeout(d.min(Duration::from_secs(max)) + Duration::from_secs(10));
    }
    let mut client = t.client.clone();
    match client.exec_sync(req).await {
        Ok(resp) => {
            let r = resp.into_inner();
            let out = format!(
                "{}{}",
                String::from_utf8_lossy(&r.stdout),
                String::from_utf8_lossy(&r.stderr)
            );
            if r.exit_code == 0 {
                Ok(clip(&out))
            } else {
                Err(clip(&format!("exit code {}: {out}", r.exit_code)))
            }
        }
        Err(s) => Err(clip(&format!("ExecSync: {}", s.message()))),
    }
}

/// One HTTP/1.1 GET; the response's status code.
pub async fn http_get(
    host: &str,
    port: u16,
    path: &str,
    headers: &[(String, String)],
) -> Result<u16, String> {
    let what = || format!("GET http://{host}:{port}{path}");
    let stream = tokio::net::TcpStream::connect((host, port))
        .await
        .map_err(|e| format!("{}: {e}", what()))?;
    let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .map_err(|e| format!("{}: {e}", what()))?;
    let conn = tokio::spawn(conn);
    let mut req = hyper::Request::get(path).header(hyper::header::HOST, format!("{host}:{port}"));
    // The kubelet's probes say who they are; servers sometimes answer them differently.
    req = req.header(hyper::header::USER_AGENT, "kube-probe/1.33");
    for (k, v) in headers {
        req = req.header(k.as_str(), v.as_str());
    }
    let req = req
        .body(Empty::<Bytes>::new())
        .map_err(|e| format!("{}: {e}", what()))?;
    let resp = sender
        .send_request(req)
        .await
        .map_err(|e| format!("{}: {e}", what()))?;
    let code = resp.status().as_u16();
    // Read the body so the connection ends cleanly; its content does not matter.
    let _ = resp.into_body().collect().await;
    conn.abort();
    Ok(code)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn http_get_reports_the_status_and_refusals() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        tokio::spawn(async move {
            use tokio::io::{AsyncReadExt, AsyncWriteExt};
            for status in ["200 OK", "503 Service Unavailable"] {
                let (mut s, _) = listener.accept().await.unwrap();
                let mut buf = [0u8; 1024];
                let n = s.read(&mut buf).await.unwrap();
                let req = String::from_utf8_lossy(&buf[..n]).to_string();
                assert!(req.starts_with("GET /readyz HTTP/1.1"), "{req}");
                assert!(req.contains("x-probe: yes"), "{req}");
                let body = format!("HTTP/1.1 {status}\r\ncontent-length: 2\r\n\r\nok");
                s.write_all(body.as_bytes()).await.unwrap();
            }
        });
        let h = [("x-probe".to_owned(), "yes".to_owned())];
        assert_eq!(http_get("127.0.0.1", port, "/readyz", &h).await, Ok(200));
        assert_eq!(http_get("127.0.0.1", port, "/readyz", &h).await, Ok(503));
        let closed = {
            let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
            l.local_addr().unwrap().port()
        };
        assert!(http_get("127.0.0.1", closed, "/", &[]).await.is_err());
    }

    #[test]
    fn details_are_clipped_on_a_char_boundary() {
        let long = "é".repeat(400);
        let c = clip(&long);
        assert!(c.ends_with("...") && c.len() <= DETAIL_LIMIT + 3);
    }
}
