//! A client connection's byte stream: its socket, plain or under TLS.

use std::io::{self, IoSlice, Read, Write};
use std::net::Shutdown;
use std::os::fd::{AsRawFd, RawFd};
use std::time::Duration;

use super::socket::Socket;
use super::tls_stream::TlsStream;

pub enum Stream {
    Plain(Socket),
    Tls(Box<TlsStream>),
}

impl Stream {
    /// A plain TCP connection.
    pub fn tcp(socket: std::net::TcpStream) -> Stream {
        Stream::Plain(Socket::Tcp(socket))
    }

    fn socket(&self) -> &Socket {
        match self {
            Stream::Plain(s) => s,
            Stream::Tls(s) => s.socket(),
        }
    }

    pub fn try_clone(&self) -> io::Result<Stream> {
        Ok(match self {
            Stream::Plain(s) => Stream::Plain(s.try_clone()?),
            Stream::Tls(s) => Stream::Tls(Box::new(s.try_clone()?)),
        })
    }

    pub fn shutdown(&self, how: Shutdown) {
        self.socket().shutdown(how)
    }

    pub fn set_read_timeout(&self, timeout: Option<Duration>) -> io::Result<()> {
        self.socket().set_read_timeout(timeout)
    }

    pub fn set_write_timeout(&self, timeout: Option<Duration>) -> io::Result<()> {
        self.socket().set_write_timeout(timeout)
    }

    /// The peer's IP address, for a TCP connection.
    pub fn peer_ip(&self) -> Option<std::net::IpAddr> {
        self.socket().peer_ip()
    }

    pub fn peer(&self) -> String {
        self.socket().peer()
    }

    /// Whether a read returns without waiting for the socket (TLS holds
    /// decrypted bytes, or saw the client close).
    pub fn readable_now(&mut self) -> bool {
        match self {
            Stream::Tls(s) => s.readable_now(),
            Stream::Plain(_) => false,
        }
    }

    /// Whether bytes written are still held back from the socket.
    pub fn holds_unsent(&self) -> bool {
        match self {
            Stream::Tls(s) => s.holds_unsent(),
            Stream::Plain(_) => false,
        }
    }

    pub fn is_tls(&self) -> bool {
        matches!(self, Stream::Tls(_))
    }

    pub fn tls(&mut self) -> Option<&mut TlsStream> {
        match self {
            Stream::Tls(s) => Some(s),
            Stream::Plain(_) => None,
        }
    }
}

impl AsRawFd for Stream {
    fn as_raw_fd(&self) -> RawFd {
        self.socket().as_raw_fd()
    }
}

impl Read for Stream {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        match self {
            Stream::Plain(s) => s.read(buf),
            Stream::Tls(s) => s.read(buf),
        }
    }
}

impl Write for Stream {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        match self {
            Stream::Plain(s) => s.write(buf),
            Stream::Tls(s) => s.write(buf),
        }
    }

    fn write_vectored(&mut self, bufs: &[IoSlice<'_>]) -> io::Result<usize> {
        match self {
            Stream::Plain(s) => s.write_vectored(bufs),
            Stream::Tls(s) => s.write_vectored(bufs),
        }
    }

    /// Sends what TLS has sealed; a plain socket holds nothing back.
    fn flush(&mut self) -> io::Result<()> {
        match self {
            Stream::Plain(_) => Ok(()),
            Stream::Tls(s) => s.flush(),
        }
    }
}
