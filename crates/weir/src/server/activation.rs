//! Socket activation: listening sockets handed over by a service manager
//! (systemd's `LISTEN_FDS`, for this process's `LISTEN_PID`). They take
//! the place of `listen` and `socket`; weir neither binds its own nor
//! removes an inherited socket file.

use std::net::TcpListener;
use std::os::fd::{FromRawFd, RawFd};
use std::os::unix::net::UnixListener;

use anyhow::bail;

use super::Listeners;

impl Listeners {
    /// The sockets the service manager passed, or None if it passed none.
    pub fn inherited() -> anyhow::Result<Option<Listeners>> {
        let fds: Vec<RawFd> = match sd_notify::listen_fds() {
            Ok(fds) => fds.collect(),
            Err(err) => bail!("LISTEN_FDS is set but unusable: {err}"),
        };
        if fds.is_empty() {
            return Ok(None);
        }
        let mut listeners = Listeners {
            tcp: Vec::new(),
            unix: Vec::new(),
        };
        for fd in fds {
            if socket_option(fd, libc::SO_TYPE)? != libc::SOCK_STREAM
                || socket_option(fd, libc::SO_ACCEPTCONN)? == 0
            {
                bail!("descriptor {fd} from the service manager is not a listening stream socket");
            }
            match socket_option(fd, libc::SO_DOMAIN)? {
                libc::AF_INET | libc::AF_INET6 => {
                    // SAFETY: a listening socket the service manager passed
                    // to this process, owned from here on.
                    let listener = unsafe { TcpListener::from_raw_fd(fd) };
                    listener.set_nonblocking(true)?;
                    listeners.tcp.push(listener);
                }
                libc::AF_UNIX => {
                    // SAFETY: as above.
                    let listener = unsafe { UnixListener::from_raw_fd(fd) };
                    listener.set_nonblocking(true)?;
                    let path = listener
                        .local_addr()?
                        .as_pathname()
                        .map(|p| p.to_path_buf())
                        .unwrap_or_default();
                    listeners.unix.push((listener, path, false));
                }
                family => bail!("descriptor {fd} from the service manager is of address family {family}, not TCP or Unix"),
            }
        }
        Ok(Some(listeners))
    }
}

fn socket_option(fd: RawFd, option: libc::c_int) -> anyhow::Result<libc::c_int> {
    let mut value: libc::c_int = 0;
    let mut length = std::mem::size_of::<libc::c_int>() as libc::socklen_t;
    // SAFETY: getsockopt into an int of the size given.
    let rc = unsafe {
        libc::getsockopt(
            fd,
            libc::SOL_SOCKET,
            option,
            (&mut value as *mut libc::c_int).cast(),
            &mut length,
        )
    };
    if rc != 0 {
        bail!(
            "descriptor {fd} from the service manager: {}",
            std::io::Error::last_os_error()
        );
    }
    Ok(value)
}
