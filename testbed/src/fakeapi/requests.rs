//! The requests the fake API server answers: their queries decoded, and what each asks for,
//! counted so a test can say how many reads the agent made.

use hyper::Method;

/// What a request asked for, to count.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum RequestKind {
    PodList,
    PodWatch,
    PodGet,
    /// A core/v1 Event LIST.
    EventList,
    /// An events.k8s.io/v1 Event LIST.
    EventListV1,
    EventCreate,
    NodeGet,
    NodeList,
    /// An EndpointSlice LIST, and a WATCH.
    SliceList,
    SliceWatch,
    /// Anything else (answered 404).
    Other,
}

/// A request's query, its values decoded (`application/x-www-form-urlencoded`, as kube-rs
/// writes it).
pub(crate) struct Query(Vec<(String, String)>);

impl Query {
    pub(crate) fn parse(query: &str) -> Query {
        Query(
            query
                .split('&')
                .filter(|kv| !kv.is_empty())
                .map(|kv| match kv.split_once('=') {
                    Some((k, v)) => (decode(k), decode(v)),
                    None => (decode(kv), String::new()),
                })
                .collect(),
        )
    }

    pub(crate) fn get(&self, key: &str) -> Option<&str> {
        self.0
            .iter()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v.as_str())
    }
}

/// Percent-decoding, `+` as a space; a `%` not followed by two hex digits is kept as is.
fn decode(s: &str) -> String {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'+' => out.push(b' '),
            b'%' => {
                let hex = bytes
                    .get(i + 1..i + 3)
                    .and_then(|h| std::str::from_utf8(h).ok())
                    .and_then(|h| u8::from_str_radix(h, 16).ok());
                match hex {
                    Some(b) => {
                        out.push(b);
                        i += 2;
                    }
                    None => out.push(b'%'),
                }
            }
            b => out.push(b),
        }
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// What `method path?q` asks for.
pub(super) fn classify(method: &Method, path: &str, q: &Query) -> RequestKind {
    let watch = q.get("watch") == Some("true");
    let events = |p: &str| p.ends_with("/events");
    match *method {
        Method::GET if path == "/api/v1/pods" && watch => RequestKind::PodWatch,
        Method::GET if path == "/api/v1/pods" => RequestKind::PodList,
        Method::GET if path.starts_with("/api/v1/namespaces/") && path.contains("/pods/") => {
            RequestKind::PodGet
        }
        Method::GET if path.ends_with("/endpointslices") && watch => RequestKind::SliceWatch,
        Method::GET if path.ends_with("/endpointslices") => RequestKind::SliceList,
        Method::GET if watch => RequestKind::Other,
        Method::GET if path.starts_with("/api/v1/") && events(path) => RequestKind::EventList,
        Method::GET if path.starts_with("/apis/events.k8s.io/v1/") && events(path) => {
            RequestKind::EventListV1
        }
        Method::GET if path.starts_with("/api/v1/nodes/") => RequestKind::NodeGet,
        Method::GET if path == "/api/v1/nodes" => RequestKind::NodeList,
        Method::POST if path.starts_with("/apis/events.k8s.io/v1/") && events(path) => {
            RequestKind::EventCreate
        }
        _ => RequestKind::Other,
    }
}
