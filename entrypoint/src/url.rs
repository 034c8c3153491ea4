//! The URLs `wait --http-get`, `shutdown --post` and `await --http-get` take.
//!
//! Deliberately narrow: `http://` only, to a loopback address of the pod
//! itself (`127.0.0.0/8`, `localhost`, `[::1]`), with an optional port and a
//! path with a query. The endpoints this reaches are the pod's own (a mesh
//! proxy's admin port, a sidecar's readiness or shutdown handler); anything
//! else is refused before any connection is attempted, with a message that
//! names the problem. Names are never resolved: `localhost` means
//! `127.0.0.1`.

use alloc::format;
use alloc::string::String;
use core::ffi::CStr;
use core::fmt;

use crate::sys::IpAddr;

/// Longer than any health or shutdown URL; bounds the request line.
const MAX_URL: usize = 2048;

/// A checked `http://` URL to a loopback address.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Url {
    /// As given, for messages (printable ASCII only, see [`parse`]).
    text: String,
    addr: IpAddr,
    port: u16,
    /// `Host` header value: the authority as given.
    authority: String,
    /// Request target: path and query, starting with `/`.
    target: String,
}

impl Url {
    pub fn addr(&self) -> IpAddr {
        self.addr
    }

    pub fn port(&self) -> u16 {
        self.port
    }

    /// The `Host` header's value.
    pub fn authority(&self) -> &str {
        &self.authority
    }

    /// The request target: path and query (the fragment is not sent).
    pub fn target(&self) -> &str {
        &self.target
    }
}

impl fmt::Display for Url {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.text)
    }
}

/// Why a URL was refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InvalidUrl {
    /// The URL, lossy and escaped for showing.
    url: String,
    problem: String,
}

impl fmt::Display for InvalidUrl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "invalid URL {:?}: {}", self.url, self.problem)
    }
}

impl core::error::Error for InvalidUrl {}

/// Parses and checks a URL (see the module's documentation).
pub fn parse(url: &CStr) -> Result<Url, InvalidUrl> {
    let bytes = url.to_bytes();
    let invalid = |problem: String| InvalidUrl {
        url: shown(bytes),
        problem,
    };
    if bytes.len() > MAX_URL {
        return Err(invalid(format!("longer than {MAX_URL} bytes")));
    }
    if let Some(&bad) = bytes.iter().find(|&&b| !b.is_ascii_graphic()) {
        let what = if bad == b' ' {
            "a space (percent-encode it as %20)"
        } else if bad.is_ascii() {
            "a control character"
        } else {
            "a non-ASCII character (percent-encode it)"
        };
        return Err(invalid(format!("contains {what}")));
    }
    // Printable ASCII, so this cannot fail.
    let text = core::str::from_utf8(bytes).map_err(|_| invalid(String::from("not UTF-8")))?;
    parse_text(text).map_err(invalid)
}

fn parse_text(text: &str) -> Result<Url, String> {
    let Some((scheme, rest)) = text.split_once("://") else {
        return Err(String::from(
            "expected http://HOST[:PORT][/PATH], e.g. http://127.0.0.1:4191/shutdown",
        ));
    };
    if scheme.eq_ignore_ascii_case("https") {
        return Err(String::from(
            "https is not supported (only plain http:// to a loopback address)",
        ));
    }
    if !scheme.eq_ignore_ascii_case("http") {
        return Err(format!("scheme {scheme:?} is not supported (only http://)"));
    }
    // The fragment is never sent.
    let rest = rest.split_once('#').map_or(rest, |(before, _)| before);
    let end = rest.find(['/', '?']).unwrap_or(rest.len());
    let (authority, target) = rest.split_at(end);
    if authority.contains('@') {
        return Err(String::from("user information (user@) is not supported"));
    }
    let (addr, port) = parse_authority(authority)?;
    let target = if target.starts_with('/') {
        String::from(target)
    } else {
        // Empty, or a query straight after the authority.
        format!("/{target}")
    };
    Ok(Url {
        text: String::from(text),
        addr,
        port,
        authority: String::from(authority),
        target,
    })
}

fn parse_authority(authority: &str) -> Result<(IpAddr, u16), String> {
    let (host, port) = if let Some(bracketed) = authority.strip_prefix('[') {
        let Some((inside, after)) = bracketed.split_once(']') else {
            return Err(String::from("missing ] after the IPv6 address"));
        };
        let port = match after {
            "" => None,
            _ => match after.strip_prefix(':') {
                Some(port) => Some(port),
                None => return Err(format!("unexpected {after:?} after ]")),
            },
        };
        if inside != "::1" {
            return Err(not_loopback(&format!("[{inside}]")));
        }
        (None, port)
    } else {
        if authority.matches(':').count() > 1 {
            return Err(String::from(
                "an IPv6 address needs brackets, as in http://[::1]:8080/",
            ));
        }
        let (host, port) = match authority.split_once(':') {
            Some((host, port)) => (host, Some(port)),
            None => (authority, None),
        };
        (Some(host), port)
    };
    let addr = match host {
        None => IpAddr::V6(LOOPBACK_V6),
        Some("") => return Err(String::from("missing host")),
        Some(host) if host.eq_ignore_ascii_case("localhost") => IpAddr::V4([127, 0, 0, 1]),
        Some(host) => match ipv4(host) {
            Some(octets @ [127, ..]) => IpAddr::V4(octets),
            _ => return Err(not_loopback(host)),
        },
    };
    let port = match port {
        None => 80,
        Some("") => return Err(String::from("empty port after :")),
        Some(port) => parse_port(port).ok_or_else(|| format!("invalid port {port:?}"))?,
    };
    Ok((addr, port))
}

const LOOPBACK_V6: [u8; 16] = [0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1];

fn not_loopback(host: &str) -> String {
    format!(
        "host {host} is not a loopback address \
         (only 127.x.y.z, localhost and [::1]; names are not resolved)"
    )
}

/// A dotted-quad IPv4 address, strictly: four decimal parts, no leading
/// zeros (which inet_aton would read as octal).
fn ipv4(host: &str) -> Option<[u8; 4]> {
    let mut octets = [0u8; 4];
    let mut parts = host.split('.');
    for octet in &mut octets {
        let part = parts.next()?;
        let leading_zero = part.len() > 1 && part.starts_with('0');
        if part.is_empty() || part.len() > 3 || leading_zero {
            return None;
        }
        if !part.bytes().all(|b| b.is_ascii_digit()) {
            return None;
        }
        *octet = part.parse().ok()?;
    }
    parts.next().is_none().then_some(octets)
}

fn parse_port(port: &str) -> Option<u16> {
    if port.is_empty() || port.len() > 5 || !port.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    port.parse().ok().filter(|&port| port != 0)
}

/// Bytes from the command line for a message: lossy, at most 200 bytes.
fn shown(bytes: &[u8]) -> String {
    let cut = bytes.get(..200).unwrap_or(bytes);
    let mut text = String::from_utf8_lossy(cut).into_owned();
    if cut.len() < bytes.len() {
        text.push_str("...");
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;
    use alloc::ffi::CString;
    use alloc::string::ToString;

    fn ok(text: &str) -> Url {
        let c = CString::new(text).expect("no NUL");
        parse(&c).unwrap_or_else(|err| panic!("{text:?}: {err}"))
    }

    fn err(text: &[u8]) -> String {
        let c = CString::new(text).expect("no NUL");
        match parse(&c) {
            Ok(url) => panic!("{:?} should be refused, parsed as {url:?}", shown(text)),
            Err(err) => err.to_string(),
        }
    }

    #[test]
    fn loopback_urls() {
        let url = ok("http://127.0.0.1:4191/shutdown");
        assert_eq!(url.addr(), IpAddr::V4([127, 0, 0, 1]));
        assert_eq!(url.port(), 4191);
        assert_eq!(url.authority(), "127.0.0.1:4191");
        assert_eq!(url.target(), "/shutdown");
        assert_eq!(url.to_string(), "http://127.0.0.1:4191/shutdown");

        let url = ok("http://127.1.2.3");
        assert_eq!(url.addr(), IpAddr::V4([127, 1, 2, 3]));
        assert_eq!(url.port(), 80);
        assert_eq!(url.target(), "/");

        let url = ok("HTTP://LocalHost:8080?ready=1#frag");
        assert_eq!(url.addr(), IpAddr::V4([127, 0, 0, 1]));
        assert_eq!(url.port(), 8080);
        assert_eq!(url.target(), "/?ready=1");
        assert_eq!(url.authority(), "LocalHost:8080");

        let url = ok("http://[::1]:15020/quitquitquit?x=%20y");
        assert_eq!(url.addr(), IpAddr::V6(LOOPBACK_V6));
        assert_eq!(url.port(), 15020);
        assert_eq!(url.authority(), "[::1]:15020");
        assert_eq!(url.target(), "/quitquitquit?x=%20y");

        assert_eq!(ok("http://[::1]/").port(), 80);
        assert_eq!(ok("http://127.0.0.1:65535/").port(), 65535);
        assert_eq!(ok("http://127.255.255.254:1/a/b").target(), "/a/b");
    }

    #[test]
    fn other_hosts_are_refused() {
        for host in [
            "10.0.0.1",
            "0.0.0.0",
            "128.0.0.1",
            "example.com",
            "localhost.",
            "localhost.example.com",
            "127.0.0.1.nip.io",
            "127.0.0.01",
            "127.0.0",
            "127.0.0.1.",
            "127.0.0.256",
            "0x7f.0.0.1",
            "2130706433",
            "[::2]",
            "[::ffff:127.0.0.1]",
            "[fe80::1]",
        ] {
            let message = err(format!("http://{host}:80/").as_bytes());
            assert!(message.contains("not a loopback address"), "{message}");
        }
    }

    #[test]
    fn malformed_urls_name_the_problem() {
        for (text, needle) in [
            (&b"127.0.0.1:80/"[..], "expected http://"),
            (b"", "expected http://"),
            (b"https://127.0.0.1/", "https is not supported"),
            (b"ftp://127.0.0.1/", "scheme \"ftp\""),
            (b"http://", "missing host"),
            (b"http:///path", "missing host"),
            (b"http://:80/", "missing host"),
            (b"http://user@127.0.0.1/", "user information"),
            (b"http://127.0.0.1:/", "empty port"),
            (b"http://127.0.0.1:0/", "invalid port \"0\""),
            (b"http://127.0.0.1:65536/", "invalid port"),
            (b"http://127.0.0.1:+80/", "invalid port"),
            (b"http://127.0.0.1:80:81/", "needs brackets"),
            (b"http://::1/", "needs brackets"),
            (b"http://[::1/", "missing ]"),
            (b"http://[::1]x/", "after ]"),
            (b"http://127.0.0.1/a b", "a space"),
            (b"http://127.0.0.1/a\tb", "a control character"),
            (b"http://127.0.0.1/a\r\nX: y", "a control character"),
            (b"http://127.0.0.1/\xc3\xa9", "non-ASCII"),
        ] {
            let message = err(text);
            assert!(
                message.contains(needle),
                "{:?}: {message:?} lacks {needle:?}",
                shown(text)
            );
        }
        let long = format!("http://127.0.0.1/{}", "a".repeat(MAX_URL));
        let message = err(long.as_bytes());
        assert!(message.contains("longer than"), "{message}");
        assert!(message.len() < 400, "{message}");
    }
}
