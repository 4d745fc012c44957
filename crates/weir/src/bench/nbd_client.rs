//! A minimal blocking NBD client for `weir bench --uri`: fixed newstyle
//! handshake with NBD_OPT_GO, simple replies only.

use std::io::{self, Read, Write};
use std::net::TcpStream;
use std::os::unix::net::UnixStream;

use anyhow::{bail, Context};
use weir_nbd::consts::*;

/// `nbd://HOST[:PORT]/EXPORT` or `nbd+unix:///EXPORT?socket=PATH`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Address {
    Tcp { host_port: String, export: String },
    Unix { path: String, export: String },
}

impl Address {
    pub fn parse(uri: &str) -> anyhow::Result<Address> {
        if let Some(rest) = uri.strip_prefix("nbd+unix://") {
            let (export, query) = rest
                .split_once('?')
                .with_context(|| format!("{uri}: want nbd+unix:///EXPORT?socket=PATH"))?;
            let path = query
                .split('&')
                .find_map(|kv| kv.strip_prefix("socket="))
                .with_context(|| format!("{uri}: no socket= in the query"))?;
            return Ok(Address::Unix {
                path: path.into(),
                export: export.trim_start_matches('/').into(),
            });
        }
        if let Some(rest) = uri.strip_prefix("nbd://") {
            let (host, export) = rest.split_once('/').unwrap_or((rest, ""));
            if host.is_empty() {
                bail!("{uri}: no host");
            }
            let host_port = if host
                .rsplit_once(':')
                .is_some_and(|(_, p)| p.parse::<u16>().is_ok())
                && !host.ends_with(']')
            {
                host.to_string()
            } else {
                format!("{host}:10809")
            };
            return Ok(Address::Tcp {
                host_port,
                export: export.into(),
            });
        }
        bail!("{uri}: not an nbd:// or nbd+unix:// URI")
    }
}

pub enum Socket {
    Tcp(TcpStream),
    Unix(UnixStream),
}

impl Socket {
    pub fn try_clone(&self) -> io::Result<Socket> {
        Ok(match self {
            Socket::Tcp(s) => Socket::Tcp(s.try_clone()?),
            Socket::Unix(s) => Socket::Unix(s.try_clone()?),
        })
    }

    pub fn shutdown(&self) {
        let _ = match self {
            Socket::Tcp(s) => s.shutdown(std::net::Shutdown::Both),
            Socket::Unix(s) => s.shutdown(std::net::Shutdown::Both),
        };
    }
}

impl Read for Socket {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        match self {
            Socket::Tcp(s) => s.read(buf),
            Socket::Unix(s) => s.read(buf),
        }
    }
}

impl Write for Socket {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        match self {
            Socket::Tcp(s) => s.write(buf),
            Socket::Unix(s) => s.write(buf),
        }
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

/// A connected, negotiated client.
pub struct Connection {
    pub socket: Socket,
    pub size_bytes: u64,
    pub transmission_flags: u16,
}

fn read_u16(r: &mut impl Read) -> io::Result<u16> {
    let mut b = [0u8; 2];
    r.read_exact(&mut b)?;
    Ok(u16::from_be_bytes(b))
}

fn read_u32(r: &mut impl Read) -> io::Result<u32> {
    let mut b = [0u8; 4];
    r.read_exact(&mut b)?;
    Ok(u32::from_be_bytes(b))
}

fn read_u64(r: &mut impl Read) -> io::Result<u64> {
    let mut b = [0u8; 8];
    r.read_exact(&mut b)?;
    Ok(u64::from_be_bytes(b))
}

pub fn connect(uri: &str) -> anyhow::Result<Connection> {
    let address = Address::parse(uri)?;
    let (mut socket, export) = match &address {
        Address::Tcp { host_port, export } => {
            let stream = TcpStream::connect(host_port)
                .with_context(|| format!("cannot connect to {host_port}"))?;
            stream.set_nodelay(true)?;
            (Socket::Tcp(stream), export.clone())
        }
        Address::Unix { path, export } => (
            Socket::Unix(
                UnixStream::connect(path).with_context(|| format!("cannot connect to {path}"))?,
            ),
            export.clone(),
        ),
    };
    if read_u64(&mut socket)? != NBDMAGIC || read_u64(&mut socket)? != IHAVEOPT {
        bail!("{uri}: not a newstyle NBD server");
    }
    let server_flags = read_u16(&mut socket)?;
    if server_flags & FLAG_FIXED_NEWSTYLE == 0 {
        bail!("{uri}: server lacks fixed newstyle negotiation");
    }
    let no_zeroes = server_flags & FLAG_NO_ZEROES != 0;
    let client_flags = FLAG_C_FIXED_NEWSTYLE | if no_zeroes { FLAG_C_NO_ZEROES } else { 0 };
    let mut hello = client_flags.to_be_bytes().to_vec();
    hello.extend_from_slice(&IHAVEOPT.to_be_bytes());
    hello.extend_from_slice(&OPT_GO.to_be_bytes());
    hello.extend_from_slice(&(4 + export.len() as u32 + 2).to_be_bytes());
    hello.extend_from_slice(&(export.len() as u32).to_be_bytes());
    hello.extend_from_slice(export.as_bytes());
    hello.extend_from_slice(&0u16.to_be_bytes());
    socket.write_all(&hello)?;
    let mut size_and_flags = None;
    loop {
        if read_u64(&mut socket)? != OPTION_REPLY_MAGIC {
            bail!("{uri}: bad option reply magic");
        }
        let _option = read_u32(&mut socket)?;
        let kind = read_u32(&mut socket)?;
        let length = read_u32(&mut socket)?;
        if length > 1 << 20 {
            bail!("{uri}: option reply of {length} bytes");
        }
        let mut data = vec![0u8; length as usize];
        socket.read_exact(&mut data)?;
        match kind {
            REP_ACK => break,
            REP_INFO
                if data.len() >= 12 && u16::from_be_bytes([data[0], data[1]]) == INFO_EXPORT =>
            {
                let size = u64::from_be_bytes(data[2..10].try_into().expect("8 bytes"));
                let flags = u16::from_be_bytes([data[10], data[11]]);
                size_and_flags = Some((size, flags));
            }
            REP_INFO => {}
            kind if kind & (1 << 31) != 0 => {
                bail!(
                    "{uri}: server refused export {export:?}: {}",
                    String::from_utf8_lossy(&data)
                )
            }
            other => bail!("{uri}: unexpected option reply {other}"),
        }
    }
    let (size_bytes, transmission_flags) =
        size_and_flags.with_context(|| format!("{uri}: server sent no export info"))?;
    Ok(Connection {
        socket,
        size_bytes,
        transmission_flags,
    })
}

/// One request header (and nothing else).
pub fn request_header(kind: u16, handle: u64, offset: u64, length: u32) -> [u8; 28] {
    let mut h = [0u8; 28];
    h[0..4].copy_from_slice(&REQUEST_MAGIC.to_be_bytes());
    h[6..8].copy_from_slice(&kind.to_be_bytes());
    h[8..16].copy_from_slice(&handle.to_be_bytes());
    h[16..24].copy_from_slice(&offset.to_be_bytes());
    h[24..28].copy_from_slice(&length.to_be_bytes());
    h
}

/// Read one simple reply header: (error, handle).
pub fn read_reply(socket: &mut Socket) -> io::Result<(u32, u64)> {
    let mut h = [0u8; 16];
    socket.read_exact(&mut h)?;
    let magic = u32::from_be_bytes(h[0..4].try_into().expect("4 bytes"));
    if magic != SIMPLE_REPLY_MAGIC {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            format!("unexpected reply magic {magic:#x}"),
        ));
    }
    let error = u32::from_be_bytes(h[4..8].try_into().expect("4 bytes"));
    let handle = u64::from_be_bytes(h[8..16].try_into().expect("8 bytes"));
    Ok((error, handle))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn uris_parse() {
        assert_eq!(
            Address::parse("nbd://127.0.0.1:10810/bench").unwrap(),
            Address::Tcp {
                host_port: "127.0.0.1:10810".into(),
                export: "bench".into()
            }
        );
        assert_eq!(
            Address::parse("nbd://localhost/").unwrap(),
            Address::Tcp {
                host_port: "localhost:10809".into(),
                export: "".into()
            }
        );
        assert_eq!(
            Address::parse("nbd+unix:///disk?socket=/tmp/w.sock").unwrap(),
            Address::Unix {
                path: "/tmp/w.sock".into(),
                export: "disk".into()
            }
        );
        assert!(Address::parse("http://x").is_err());
        assert!(Address::parse("nbd+unix:///disk").is_err());
    }
}
