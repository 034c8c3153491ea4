//! The exit handshake's files on the node: the share the agent watches and answers in, the
//! waits found in it, and what guards it from the pods that write it.
//!
//! Parts:
//! - [`share`]: the share's layout, read and written without following a link;
//! - [`waits`]: the pending waits, and what is known of each pod's kill;
//! - [`sync`]: the waits kept current through inotify, rescans and polls;
//! - [`marks`]: when each container last said it is being stopped;
//! - [`watch`]: inotify on the share, one directory level at a time, each watch on the
//!   directory opened and checked;
//! - [`fsqueue`]: the file events between the watcher and the loop, coalesced per pod;
//! - [`budget`]: what one pod's exit directories may cost in events and watches;
//! - [`bindir`]: the read-only directory the entrypoint is installed in;
//! - [`elf`]: the installed entrypoint checked to be a static executable for this node;
//! - [`hostpath`]: host paths as the kernel resolves them;
//! - [`breach`]: whose exit directories a container can write in, as mounted.

pub mod bindir;
pub mod breach;
pub mod budget;
pub mod elf;
pub mod fsqueue;
pub mod hostpath;
pub mod marks;
pub mod share;
pub mod sync;
pub mod waits;
pub mod watch;

/// What reading the share counts: kept by the agent's `Stats` (its metrics), told through this
/// so that the share's code needs nothing of the metrics.
pub trait ShareTally: Send + Sync {
    /// An operation on the share failed (not a rejected entry).
    fn share_error(&self);
    /// An entry of the share was refused, and why.
    fn share_rejected(&self, why: share::Rejection);
    /// An `exit` appeared again after being withdrawn.
    fn exit_churn(&self);
    /// A sidecar withdrew its wait.
    fn wait_withdrawn(&self);
    /// How many waits are pending now.
    fn set_pending(&self, n: usize);
}
