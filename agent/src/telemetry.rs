//! Process-level plumbing: log set-up and the shutdown signal.

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
        "" | "plain" => builder.try_init(),
        "json" => builder.json().try_init(),
        other => return Err(TelemetryError::Format(other.to_owned())),
    };
    res.map_err(|_| TelemetryError::AlreadySet)
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
    fn colours_only_at_a_terminal() {
        assert!(colours(true, None));
        assert!(colours(true, Some("")));
        assert!(!colours(true, Some("1")));
        assert!(!colours(false, None));
    }
}
