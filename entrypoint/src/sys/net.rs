//! Non-blocking TCP sockets, enough for one HTTP request.

use core::ffi::c_int;

use super::{check, Fd, OsError};

/// An IP address to connect to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum IpAddr {
    V4([u8; 4]),
    V6([u8; 16]),
}

/// A new non-blocking TCP socket for `addr`'s family.
pub fn tcp_socket(addr: IpAddr) -> Result<Fd, OsError> {
    let family = match addr {
        IpAddr::V4(_) => libc::AF_INET,
        IpAddr::V6(_) => libc::AF_INET6,
    };
    let kind = libc::SOCK_STREAM | libc::SOCK_NONBLOCK | libc::SOCK_CLOEXEC;
    // SAFETY: plain system call; the new descriptor is owned by nobody else.
    check(unsafe { libc::socket(family, kind, 0) }).map(Fd)
}

/// Starts connecting a socket from [`tcp_socket`] to `addr:port`: `true`
/// when it is connected already; if not, it is once [`poll`] reports it
/// [`WRITABLE`] and [`socket_error`] says `None`.
pub fn connect_start(socket: &Fd, addr: IpAddr, port: u16) -> Result<bool, OsError> {
    let result = match addr {
        IpAddr::V4(octets) => {
            let sockaddr = libc::sockaddr_in {
                sin_family: libc::AF_INET as libc::sa_family_t,
                sin_port: port.to_be(),
                sin_addr: libc::in_addr {
                    s_addr: u32::from_ne_bytes(octets),
                },
                sin_zero: [0; 8],
            };
            connect(socket, &sockaddr)
        }
        IpAddr::V6(octets) => {
            let sockaddr = libc::sockaddr_in6 {
                sin6_family: libc::AF_INET6 as libc::sa_family_t,
                sin6_port: port.to_be(),
                sin6_flowinfo: 0,
                sin6_addr: libc::in6_addr { s6_addr: octets },
                sin6_scope_id: 0,
            };
            connect(socket, &sockaddr)
        }
    };
    match result {
        Ok(()) => Ok(true),
        // EINTR: the connection goes on in the background, as EINPROGRESS.
        Err(OsError(libc::EINPROGRESS | libc::EINTR)) => Ok(false),
        Err(err) => Err(err),
    }
}

/// connect(2) to a `sockaddr_in` or `sockaddr_in6`.
fn connect<T: SockAddr>(socket: &Fd, sockaddr: &T) -> Result<(), OsError> {
    let len =
        libc::socklen_t::try_from(core::mem::size_of::<T>()).map_err(|_| OsError(libc::EINVAL))?;
    // SAFETY: sockaddr is a complete sockaddr_in/sockaddr_in6 (SockAddr is
    // implemented for those only), whose family field matches its type, and
    // len is its size.
    check(unsafe { libc::connect(socket.raw(), (sockaddr as *const T).cast(), len) }).map(drop)
}

/// The socket address structures [`connect`] may be given.
trait SockAddr {}
impl SockAddr for libc::sockaddr_in {}
impl SockAddr for libc::sockaddr_in6 {}

/// The pending error of a socket (`SO_ERROR`), which also clears it: for a
/// non-blocking connect, `None` once it succeeded.
pub fn socket_error(socket: &Fd) -> Result<Option<OsError>, OsError> {
    let mut error: c_int = 0;
    let mut len = libc::socklen_t::try_from(core::mem::size_of::<c_int>())
        .map_err(|_| OsError(libc::EINVAL))?;
    // SAFETY: getsockopt writes at most len bytes into error, an int we own,
    // and updates len.
    check(unsafe {
        libc::getsockopt(
            socket.raw(),
            libc::SOL_SOCKET,
            libc::SO_ERROR,
            (&mut error as *mut c_int).cast(),
            &mut len,
        )
    })?;
    Ok((error != 0).then_some(OsError(error)))
}

/// send(2) without SIGPIPE; returns how much was sent.
pub fn send(socket: &Fd, bytes: &[u8]) -> Result<usize, OsError> {
    // SAFETY: the kernel reads at most bytes.len() bytes from the slice.
    let sent = unsafe {
        libc::send(
            socket.raw(),
            bytes.as_ptr().cast(),
            bytes.len(),
            libc::MSG_NOSIGNAL,
        )
    };
    usize::try_from(sent).map_err(|_| OsError::last())
}
