//! The loop's side of the container runtime: the client, the reader task's two ends, the exit
//! source's signals, and what the loop believes of the runtime's health and of the stream it
//! hears exits on.

use tokio::sync::mpsc;
use tokio::task::JoinHandle;
use tracing::{error, info, warn, Instrument};

use crate::cri::VersionResponse;
use crate::runtime::reader::{self, Read, Reader, ReaderTask, Reply};
use crate::runtime::source::{self, SourceChoice, SourceKind, SourceSignal};
use crate::runtime::{Runtime, RuntimeError};
use crate::stats::Stats;

pub(super) struct RuntimeLink {
    pub(super) runtime: Runtime,
    reader: Reader,
    pub(super) replies: mpsc::UnboundedReceiver<Reply>,
    reader_task: Option<ReaderTask>,
    pub(super) signals: mpsc::UnboundedReceiver<SourceSignal>,
    signal_tx: mpsc::UnboundedSender<SourceSignal>,
    /// The event stream in use, while it is connected; `None` means polling.
    live_source: Option<SourceKind>,
    /// Whether the runtime answered its last call.
    ok: bool,
    /// A listing was asked after a reconnect: its answer is logged, as the proof that what
    /// happened while the runtime or its stream was gone was caught up on.
    relist_pending: bool,
    connected_once: bool,
}

/// The tasks [`RuntimeLink::spawn`] started, stopped with the loop.
pub(super) struct LinkTasks {
    reader: Option<JoinHandle<()>>,
    source: JoinHandle<()>,
}

impl LinkTasks {
    pub(super) fn abort(self) {
        self.source.abort();
        if let Some(t) = self.reader {
            t.abort();
        }
    }
}

impl RuntimeLink {
    /// A client of the runtime at `socket` (connected lazily) and the reader task, not run yet.
    pub(super) fn connect(socket: &std::path::Path) -> Result<Self, RuntimeError> {
        let runtime = Runtime::connect(socket)?;
        let (reader, replies, reader_task) = reader::start(runtime.clone());
        let (signal_tx, signals) = mpsc::unbounded_channel();
        Ok(RuntimeLink {
            runtime,
            reader,
            replies,
            reader_task: Some(reader_task),
            signals,
            signal_tx,
            live_source: None,
            ok: true,
            relist_pending: false,
            connected_once: false,
        })
    }

    pub(super) fn ask(&self, read: Read) {
        self.reader.ask(read);
    }

    /// Whether the runtime answered its last call.
    pub(super) fn ok(&self) -> bool {
        self.ok
    }

    /// Whether exits are found by polling (no event stream connected).
    pub(super) fn polling(&self) -> bool {
        self.live_source.is_none()
    }

    /// Asks the runtime's version, logging what answered; `None` when it does not answer yet.
    pub(super) async fn hello(&mut self, stats: &Stats) -> Option<VersionResponse> {
        match self.runtime.version().await {
            Ok(v) => {
                stats.set_runtime_ok(true);
                info!(
                    runtime = %v.runtime_name,
                    version = %v.runtime_version,
                    api = %v.runtime_api_version,
                    "runtime connected"
                );
                Some(v)
            }
            Err(e) => {
                self.ok = false;
                stats.runtime_error(e.kind());
                warn!(error = %e, "runtime not reachable yet; deciding from what the share shows until it is");
                None
            }
        }
    }

    /// Starts the reader and the exit source (`choice`, told the runtime's `version`).
    pub(super) fn spawn(
        &mut self,
        choice: SourceChoice,
        version: Option<VersionResponse>,
    ) -> LinkTasks {
        let reader = self
            .reader_task
            .take()
            .map(|t| tokio::spawn(t.run().instrument(tracing::info_span!("runtime_reader"))));
        let source = tokio::spawn(
            source::run(
                self.runtime.channel(),
                choice,
                version,
                self.signal_tx.clone(),
            )
            .instrument(tracing::info_span!("exit_source")),
        );
        LinkTasks { reader, source }
    }

    /// The exit source `kind` connected (`up`) or went down; either way what happened
    /// meanwhile is listed.
    pub(super) fn source(&mut self, kind: SourceKind, up: bool, stats: &Stats) {
        if up {
            info!(source = kind.as_str(), "exit source connected");
            self.live_source = Some(kind);
            stats.set_event_source(kind.as_str());
            // The first connection is no reconnect: the start's own listing is not news.
            self.relist_pending |= self.connected_once;
            self.connected_once = true;
        } else {
            if self.live_source.take().is_some() {
                info!(
                    source = kind.as_str(),
                    "exit source down; polling while exits are pending"
                );
            }
            stats.set_event_source(SourceKind::Poll.as_str());
        }
        self.ask(Read::List);
    }

    /// The reader's judgement of the runtime's health; a runtime back is listed again.
    pub(super) fn health(&mut self, ok: bool, stats: &Stats) {
        if ok != self.ok {
            if ok {
                info!("runtime answers again");
                self.ask(Read::List);
                self.relist_pending = true;
            } else {
                error!("runtime not answering; only deadlines release waits until it does");
            }
        }
        self.ok = ok;
        stats.set_runtime_ok(ok);
    }

    /// A listing came back: the runtime answers. Whether it was the listing after a
    /// reconnect, which the caller logs.
    pub(super) fn listed(&mut self, stats: &Stats) -> bool {
        self.ok = true;
        stats.set_runtime_ok(true);
        std::mem::take(&mut self.relist_pending)
    }
}
