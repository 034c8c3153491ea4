//! The exit handshake's files on the node: the share the agent watches and answers in, the
//! waits found in it, and what guards it from the pods that write it.
//!
//! Parts:
//! - [`share`]: the share's layout, read and written without following a link;
//! - [`waits`]: the pending waits, found through inotify and rescans;
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
pub mod waits;
pub mod watch;
