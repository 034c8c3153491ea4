//! Process-level plumbing: log set-up and the shutdown signal.

use tracing_subscriber::field::{MakeExt as _, RecordFields};
use tracing_subscriber::fmt::format::{debug_fn, Writer};
use tracing_subscriber::fmt::FormatFields;
use tracing_subscriber::EnvFilter;

#[derive(Debug, thiserror::Error)]
pub enum TelemetryError {
    #[error("EXITORDER_LOG: {0}")]
    Filter(String),
    #[error("EXITORDER_LOG_FORMAT must be plain or json, not {0:?}")]
    Format(String),
    #[error("a global logger is already set")]
    AlreadySet,
}

/// Logs to stderr, filtered by `EXITORDER_LOG` (default `info`), as `EXITORDER_LOG_FORMAT`
/// says (`plain`, the default, or `json` for log collectors).
pub fn init_logging() -> Result<(), TelemetryError> {
    let filter = match std::env::var("EXITORDER_LOG") {
        Ok(f) if !f.trim().is_empty() => {
            EnvFilter::try_new(f).map_err(|e| TelemetryError::Filter(e.to_string()))?
        }
        _ => EnvFilter::new("info"),
    };
    let format = std::env::var("EXITORDER_LOG_FORMAT").unwrap_or_default();
    use std::io::IsTerminal;
    let ansi = colours(
        std::io::stderr().is_terminal(),
        std::env::var("NO_COLOR").ok().as_deref(),
    );
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(ansi)
        .with_writer(std::io::stderr);
    let res = match format.as_str() {
        "" | "plain" => builder.fmt_fields(EscapedFields).try_init(),
        // JSON strings escape every control character already.
        "json" => builder.json().try_init(),
        other => return Err(TelemetryError::Format(other.to_owned())),
    };
    res.map_err(|_| TelemetryError::AlreadySet)
}

/// Field values as the plain format writes them, with every control character and every
/// invisible direction mark written as an escape. Names, annotations, file contents and
/// runtime answers are the pods' text: a `\n` in one must not forge a log line, an ESC must
/// not reach the terminal of whoever reads `kubectl logs`, and a right-to-left override must
/// not make a line read otherwise than it says. One formatter for every field, so no log call
/// can forget it.
pub struct EscapedFields;

impl<'w> FormatFields<'w> for EscapedFields {
    fn format_fields<R: RecordFields>(&self, writer: Writer<'w>, fields: R) -> std::fmt::Result {
        let fmt = debug_fn(
            |w: &mut Writer<'_>, field: &tracing::field::Field, value: &dyn std::fmt::Debug| {
                let raw = format!("{value:?}");
                let text = escape(&raw);
                if field.name() == "message" {
                    w.write_str(&text)
                } else {
                    write!(w, "{}={text}", field.name())
                }
            },
        )
        .delimited(" ");
        fmt.format_fields(writer, fields)
    }
}

/// Control characters and invisible format marks (bidirectional overrides, zero-width
/// characters) as Rust escapes; everything else as it is.
pub fn escape(text: &str) -> std::borrow::Cow<'_, str> {
    let hidden = |c: char| {
        c.is_control()
            || matches!(c, '\u{200b}'..='\u{200f}' | '\u{202a}'..='\u{202e}' | '\u{2066}'..='\u{2069}' | '\u{feff}')
    };
    if !text.chars().any(hidden) {
        return std::borrow::Cow::Borrowed(text);
    }
    let mut out = String::with_capacity(text.len().saturating_add(8));
    for c in text.chars() {
        if hidden(c) {
            out.extend(c.escape_default());
        } else {
            out.push(c);
        }
    }
    std::borrow::Cow::Owned(out)
}

/// Colour codes only for a person at a terminal: `kubectl logs` and log collectors read a
/// pipe, where they are noise. `NO_COLOR` (any non-empty value) turns them off everywhere.
pub fn colours(stderr_is_terminal: bool, no_color: Option<&str>) -> bool {
    stderr_is_terminal && no_color.is_none_or(str::is_empty)
}

/// Completes on SIGTERM (what the kubelet sends) or SIGINT.
pub async fn shutdown_signal() {
    use tokio::signal::unix::{signal, SignalKind};
    match (
        signal(SignalKind::terminate()),
        signal(SignalKind::interrupt()),
    ) {
        (Ok(mut term), Ok(mut int)) => {
            tokio::select! {
                _ = term.recv() => {}
                _ = int.recv() => {}
            }
        }
        // Without signal handlers, fall back to ctrl-c only.
        _ => {
            let _ = tokio::signal::ctrl_c().await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pod_text_cannot_forge_a_log_line() {
        use std::sync::{Arc, Mutex};
        #[derive(Clone, Default)]
        struct Buf(Arc<Mutex<Vec<u8>>>);
        impl std::io::Write for Buf {
            fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
                self.0.lock().unwrap().extend_from_slice(b);
                Ok(b.len())
            }
            fn flush(&mut self) -> std::io::Result<()> {
                Ok(())
            }
        }
        let buf = Buf::default();
        let out = buf.clone();
        let subscriber = tracing_subscriber::fmt()
            .with_ansi(false)
            .without_time()
            .fmt_fields(EscapedFields)
            .with_writer(move || out.clone())
            .finish();
        let name = "proxy\nINFO event=allowed pod=victim\x1b[2J\u{202e}";
        let content = String::from("wait\r\n");
        tracing::subscriber::with_default(subscriber, || {
            tracing::info!(container = %name, content = ?content, event = "held", "waiting {name}");
        });
        let text = String::from_utf8(buf.0.lock().unwrap().clone()).unwrap();
        assert_eq!(text.lines().count(), 1, "{text}");
        assert!(
            !text.contains('\x1b') && !text.contains('\u{202e}'),
            "{text}"
        );
        assert!(
            text.contains(r"container=proxy\nINFO event=allowed pod=victim\u{1b}[2J\u{202e}"),
            "{text}"
        );
        assert!(text.contains(r#"content="wait\r\n""#), "{text}");
        assert!(text.contains(r#"event="held""#), "{text}");
        assert!(text.contains(r"waiting proxy\nINFO"), "{text}");
        assert_eq!(escape("plain-name"), "plain-name");
    }

    #[test]
    fn colours_only_at_a_terminal() {
        assert!(colours(true, None));
        assert!(colours(true, Some("")));
        assert!(!colours(true, Some("1")));
        assert!(!colours(false, None));
    }
}
