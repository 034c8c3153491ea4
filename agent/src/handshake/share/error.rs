//! What can go wrong in the share, and what the agent refused to touch there.

use std::fmt;
use std::io;
use std::path::PathBuf;

#[derive(Debug, thiserror::Error)]
pub enum ShareError {
    #[error("{op} {path}: {source}")]
    Io {
        op: &'static str,
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("{kind} name {name:?} is not valid")]
    BadName { kind: &'static str, name: String },
    #[error("{path} is not a regular file")]
    NotAFile { path: PathBuf },
    #[error(
        "{path} is a link (symbolic, or a file with other hard links): links are never followed"
    )]
    Link { path: PathBuf },
    #[error("{path} is not a directory")]
    NotADirectory { path: PathBuf },
}

impl From<crate::pod::BadPodUid> for ShareError {
    fn from(e: crate::pod::BadPodUid) -> Self {
        ShareError::BadName {
            kind: "pod uid",
            name: e.0,
        }
    }
}

/// Why a share entry was refused: what the agent counts, by kind. A closed set, never built
/// from what a pod wrote.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Rejection {
    /// A symbolic link where a directory or the exit file should be, or an exit file with
    /// other hard links.
    Link,
    /// An exit file that is no regular file: a FIFO, a socket, a device, a directory.
    NotAFile,
    /// A pod or container entry that is no directory.
    NotADirectory,
    /// A name that is no pod UID or DNS-1123 container name.
    BadName,
    /// An exit file that says neither `wait` nor `allow`.
    UnexpectedContent,
}

impl Rejection {
    pub const ALL: [Rejection; 5] = [
        Rejection::Link,
        Rejection::NotAFile,
        Rejection::NotADirectory,
        Rejection::BadName,
        Rejection::UnexpectedContent,
    ];

    /// The metric label.
    pub fn as_str(self) -> &'static str {
        match self {
            Rejection::Link => "link",
            Rejection::NotAFile => "not_a_file",
            Rejection::NotADirectory => "not_a_directory",
            Rejection::BadName => "bad_name",
            Rejection::UnexpectedContent => "unexpected_content",
        }
    }
}

impl fmt::Display for Rejection {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl ShareError {
    pub(crate) fn io(
        op: &'static str,
        path: impl Into<PathBuf>,
        source: impl Into<io::Error>,
    ) -> Self {
        ShareError::Io {
            op,
            path: path.into(),
            source: source.into(),
        }
    }

    /// True when the file or directory named is simply not there (a pod gone, a file removed).
    pub fn is_not_found(&self) -> bool {
        matches!(self, ShareError::Io { source, .. } if source.kind() == io::ErrorKind::NotFound)
    }

    /// What kind of refusal this is, when the entry itself is at fault (a link, a FIFO, a bad
    /// name); `None` for an I/O error that says nothing about the entry.
    pub fn rejection(&self) -> Option<Rejection> {
        match self {
            ShareError::BadName { .. } => Some(Rejection::BadName),
            ShareError::NotAFile { .. } => Some(Rejection::NotAFile),
            ShareError::Link { .. } => Some(Rejection::Link),
            ShareError::NotADirectory { .. } => Some(Rejection::NotADirectory),
            ShareError::Io { .. } => None,
        }
    }
}
