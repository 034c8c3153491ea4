//! A minimal HTTP/1.1 client: one request per connection, to the pod's own
//! loopback (see [`crate::url`]), reading no more than the status line.
//!
//! Non-blocking sockets and poll(2) against a single deadline for the whole
//! exchange, so neither a server that accepts and never answers nor one that
//! answers a byte at a time can hold the caller past it. The connect has a
//! shorter limit of its own. At most [`MAX_STATUS_LINE`] bytes are read;
//! headers and body are never looked at, and the connection is closed
//! (`Connection: close`) as soon as the status line is in.

use alloc::format;
use alloc::string::String;
use core::fmt;
use core::time::Duration;

use crate::sys::{self, Fd, Instant, OsError};
use crate::url::Url;

/// How much of the answer is read, at most, looking for the status line.
pub const MAX_STATUS_LINE: usize = 8 * 1024;
/// Limit of the TCP connect on its own: on loopback a connect is answered
/// at once unless the listener's backlog is full, and then the kernel
/// retries its SYN after 1 s, then 3 s.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
/// Sent as `User-Agent`.
const USER_AGENT: &str = concat!("exitorder-entrypoint/", env!("CARGO_PKG_VERSION"));
/// Longest reason phrase kept for messages.
const MAX_REASON: usize = 80;

/// The request's method.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Method {
    Get,
    /// With an empty body (`Content-Length: 0`).
    Post,
}

impl Method {
    pub fn as_str(self) -> &'static str {
        match self {
            Method::Get => "GET",
            Method::Post => "POST",
        }
    }
}

/// The server's status line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Status {
    pub code: u16,
    /// The reason phrase, printable ASCII only, possibly cut short.
    pub reason: String,
}

impl Status {
    pub fn is_success(&self) -> bool {
        (200..300).contains(&self.code)
    }

    pub fn is_redirect(&self) -> bool {
        (300..400).contains(&self.code)
    }
}

impl fmt::Display for Status {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.reason.is_empty() {
            write!(f, "{}", self.code)
        } else {
            write!(f, "{} {}", self.code, self.reason)
        }
    }
}

/// Why no status line was had.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum HttpError {
    /// No socket could be made (descriptors exhausted, no IPv6).
    Socket(OsError),
    /// The connection was refused, or failed otherwise before the request
    /// was sent.
    Connect(OsError),
    /// The connection did not come up within the connect limit.
    ConnectTimeout(Duration),
    /// Sending the request or reading the answer failed.
    Io(OsError),
    /// The deadline passed after connecting, before the whole status line
    /// was in.
    TimedOut,
    /// The server closed the connection before a whole status line.
    Closed { received: usize },
    /// No line end within the first [`MAX_STATUS_LINE`] bytes.
    StatusLineTooLong,
    /// The first line is not `HTTP/1.x NNN ...` (shown escaped, cut short).
    Malformed(String),
}

impl HttpError {
    /// Whether nothing is listening (yet): the connection was refused or not
    /// answered. The request never reached a server, so sending it again
    /// cannot do anything twice.
    pub fn not_listening(&self) -> bool {
        matches!(
            self,
            HttpError::Connect(OsError(libc::ECONNREFUSED)) | HttpError::ConnectTimeout(_)
        )
    }
}

impl fmt::Display for HttpError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            HttpError::Socket(err) => write!(f, "cannot create a socket: {err}"),
            HttpError::Connect(err) => write!(f, "cannot connect: {err}"),
            HttpError::ConnectTimeout(limit) => write!(
                f,
                "cannot connect: no answer to the connection within {}",
                crate::duration::show(*limit)
            ),
            HttpError::Io(err) => write!(f, "connection failed: {err}"),
            HttpError::TimedOut => f.write_str("timed out waiting for the answer"),
            HttpError::Closed { received: 0 } => {
                f.write_str("the server closed the connection without answering")
            }
            HttpError::Closed { received } => write!(
                f,
                "the server closed the connection after {received} bytes, \
                 before the end of the status line"
            ),
            HttpError::StatusLineTooLong => write!(
                f,
                "no status line in the first {MAX_STATUS_LINE} bytes of the answer"
            ),
            HttpError::Malformed(line) => write!(f, "not an HTTP answer: {line:?}"),
        }
    }
}

impl core::error::Error for HttpError {}

/// Sends `method url` and returns the status line of the answer, all
/// before `deadline`.
pub fn request(method: Method, url: &Url, deadline: Instant) -> Result<Status, HttpError> {
    let socket = connect(url, deadline)?;
    let request = format!(
        "{method} {target} HTTP/1.1\r\n\
         Host: {host}\r\n\
         User-Agent: {USER_AGENT}\r\n\
         Accept: */*\r\n\
         {length}\
         Connection: close\r\n\
         \r\n",
        method = method.as_str(),
        target = url.target(),
        host = url.authority(),
        length = match method {
            Method::Post => "Content-Length: 0\r\n",
            Method::Get => "",
        },
    );
    send_all(&socket, request.as_bytes(), deadline)?;
    read_status(&socket, deadline)
}

fn connect(url: &Url, deadline: Instant) -> Result<Fd, HttpError> {
    let socket = sys::tcp_socket(url.addr()).map_err(HttpError::Socket)?;
    if sys::connect_start(&socket, url.addr(), url.port()).map_err(HttpError::Connect)? {
        return Ok(socket);
    }
    let limit = CONNECT_TIMEOUT.min(deadline.saturating_duration_since(Instant::now()));
    let connect_deadline = Instant::now().saturating_add(limit);
    loop {
        let Some(left) = time_left(connect_deadline) else {
            return Err(HttpError::ConnectTimeout(limit));
        };
        match sys::poll([(&socket, sys::WRITABLE)], left) {
            Ok([0]) | Err(OsError(libc::EINTR)) => continue,
            Ok(_) => break,
            Err(err) => return Err(HttpError::Connect(err)),
        }
    }
    match sys::socket_error(&socket) {
        Ok(None) => Ok(socket),
        Ok(Some(err)) | Err(err) => Err(HttpError::Connect(err)),
    }
}

fn send_all(socket: &Fd, mut bytes: &[u8], deadline: Instant) -> Result<(), HttpError> {
    while !bytes.is_empty() {
        match sys::send(socket, bytes) {
            Ok(sent) => bytes = bytes.get(sent..).unwrap_or_default(),
            Err(OsError(libc::EAGAIN | libc::EINTR)) => wait_for(socket, sys::WRITABLE, deadline)?,
            Err(err) => return Err(HttpError::Io(err)),
        }
    }
    Ok(())
}

fn read_status(socket: &Fd, deadline: Instant) -> Result<Status, HttpError> {
    let mut buffer = [0u8; MAX_STATUS_LINE];
    let mut len = 0;
    loop {
        if let Some(end) = buffer[..len].iter().position(|&b| b == b'\n') {
            return parse_status_line(&buffer[..end]);
        }
        if len == buffer.len() {
            return Err(HttpError::StatusLineTooLong);
        }
        match sys::read(socket, &mut buffer[len..]) {
            Ok(0) => return Err(HttpError::Closed { received: len }),
            Ok(read) => len += read,
            Err(OsError(libc::EAGAIN | libc::EINTR)) => wait_for(socket, sys::READABLE, deadline)?,
            Err(err) => return Err(HttpError::Io(err)),
        }
    }
}

/// Waits until `socket` is ready for `interest`, or fails at the deadline.
fn wait_for(socket: &Fd, interest: libc::c_short, deadline: Instant) -> Result<(), HttpError> {
    loop {
        let left = time_left(deadline).ok_or(HttpError::TimedOut)?;
        match sys::poll([(socket, interest)], left) {
            Ok([0]) | Err(OsError(libc::EINTR)) => continue,
            // Readable, writable, or an error the next call reports.
            Ok(_) => return Ok(()),
            Err(err) => return Err(HttpError::Io(err)),
        }
    }
}

/// What is left until `deadline`, `None` once it has come. At most an hour
/// at a time: a deadline too far away to add to a clock reading is re-read
/// rather than passed to the kernel.
fn time_left(deadline: Instant) -> Option<Duration> {
    let left = deadline.saturating_duration_since(Instant::now());
    (!left.is_zero()).then_some(left.min(Duration::from_secs(3600)))
}

/// `HTTP/1.x NNN[ reason]`, without the line end.
fn parse_status_line(line: &[u8]) -> Result<Status, HttpError> {
    let line = line.strip_suffix(b"\r").unwrap_or(line);
    let malformed = || {
        let cut = line.get(..MAX_REASON).unwrap_or(line);
        HttpError::Malformed(String::from_utf8_lossy(cut).into_owned())
    };
    let rest = line.strip_prefix(b"HTTP/1.").ok_or_else(malformed)?;
    let (minor, rest) = rest.split_first().ok_or_else(malformed)?;
    let rest = rest.strip_prefix(b" ").filter(|_| minor.is_ascii_digit());
    let rest = rest.ok_or_else(malformed)?;
    let (digits, reason) = rest.split_at_checked(3).ok_or_else(malformed)?;
    if !digits.iter().all(u8::is_ascii_digit)
        || !(reason.is_empty() || reason.first() == Some(&b' '))
    {
        return Err(malformed());
    }
    let code = digits
        .iter()
        .fold(0u16, |code, &digit| code * 10 + u16::from(digit - b'0'));
    if !(100..600).contains(&code) {
        return Err(malformed());
    }
    let reason: String = reason
        .iter()
        .skip(1)
        .take(MAX_REASON)
        .map(|&b| {
            if b.is_ascii_graphic() || b == b' ' {
                char::from(b)
            } else {
                '?'
            }
        })
        .collect();
    Ok(Status { code, reason })
}

#[cfg(test)]
mod tests {
    use super::*;
    use alloc::string::ToString;

    fn status(line: &[u8]) -> Result<Status, HttpError> {
        parse_status_line(line)
    }

    #[test]
    fn status_lines() {
        assert_eq!(
            status(b"HTTP/1.1 200 OK\r"),
            Ok(Status {
                code: 200,
                reason: "OK".into()
            })
        );
        let unavailable = status(b"HTTP/1.0 503 Service Unavailable").expect("valid");
        assert_eq!(unavailable.code, 503);
        assert_eq!(unavailable.to_string(), "503 Service Unavailable");
        assert_eq!(status(b"HTTP/1.1 204").expect("valid").to_string(), "204");
        assert_eq!(
            status(b"HTTP/1.1 418 I\x01m a teapot")
                .expect("valid")
                .reason,
            "I?m a teapot"
        );
        assert!(status(b"HTTP/1.1 202 Accepted")
            .expect("valid")
            .is_success());
        assert!(status(b"HTTP/1.1 302 Found").expect("valid").is_redirect());
    }

    #[test]
    fn malformed_status_lines() {
        for line in [
            &b""[..],
            b"HTTP/1.1",
            b"HTTP/1.1 ",
            b"HTTP/1.1 20",
            b"HTTP/1.1 2000",
            b"HTTP/1.1 20x OK",
            b"HTTP/1.1 099 Low",
            b"HTTP/1.1 600 High",
            b"HTTP/2 200",
            b"HTTP/1.x 200",
            b"SSH-2.0-OpenSSH_9.2",
            b"<html>",
        ] {
            assert!(
                matches!(status(line), Err(HttpError::Malformed(_))),
                "{:?}",
                String::from_utf8_lossy(line)
            );
        }
    }

    #[test]
    fn not_listening_is_refused_or_unanswered_connections_only() {
        assert!(HttpError::Connect(OsError(libc::ECONNREFUSED)).not_listening());
        assert!(HttpError::ConnectTimeout(CONNECT_TIMEOUT).not_listening());
        assert!(!HttpError::Connect(OsError(libc::EADDRNOTAVAIL)).not_listening());
        assert!(!HttpError::TimedOut.not_listening());
        assert!(!HttpError::Closed { received: 0 }.not_listening());
        assert!(!HttpError::Io(OsError(libc::ECONNRESET)).not_listening());
    }
}
