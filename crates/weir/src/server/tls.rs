//! TLS for NBD: certificates in the layout nbdkit and qemu use, the
//! rustls server configuration, and the handshake after STARTTLS.
//!
//! ```text
//!  DIR/ca-cert.pem      CA that signs client certificates (--tls-verify-peer)
//!  DIR/server-cert.pem  this server's certificate chain
//!  DIR/server-key.pem   its private key
//! ```

use std::io::{self, Read, Write};
use std::path::Path;
use std::sync::Arc;

use anyhow::Context;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::server::WebPkiClientVerifier;
use rustls::{RootCertStore, ServerConfig, ServerConnection};
use weir_nbd::TlsMode;

use super::stream::Stream;
use super::tls_stream::TlsStream;

/// The server's TLS settings, loaded once at start.
#[derive(Clone)]
pub struct Tls {
    pub mode: TlsMode,
    config: Arc<ServerConfig>,
}

impl Tls {
    /// Load `dir`'s certificates. With `verify_peer`, clients must present
    /// a certificate signed by `dir/ca-cert.pem`.
    pub fn load(mode: TlsMode, dir: &Path, verify_peer: bool) -> anyhow::Result<Tls> {
        let certs = read_certs(&dir.join("server-cert.pem"))?;
        let key_path = dir.join("server-key.pem");
        let key = PrivateKeyDer::from_pem_file(&key_path)
            .with_context(|| format!("cannot read a private key from {}", key_path.display()))?;
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let builder = ServerConfig::builder_with_provider(provider.clone())
            .with_safe_default_protocol_versions()
            .context("TLS protocol versions")?;
        let builder = if verify_peer {
            let ca_path = dir.join("ca-cert.pem");
            let mut roots = RootCertStore::empty();
            for cert in read_certs(&ca_path)? {
                roots
                    .add(cert)
                    .with_context(|| format!("{}: not a usable CA", ca_path.display()))?;
            }
            let verifier = WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider)
                .build()
                .context("client certificate verifier")?;
            builder.with_client_cert_verifier(verifier)
        } else {
            builder.with_no_client_auth()
        };
        let config = builder.with_single_cert(certs, key).with_context(|| {
            format!(
                "{} does not match {}",
                key_path.display(),
                dir.join("server-cert.pem").display()
            )
        })?;
        Ok(Tls {
            mode,
            config: Arc::new(config),
        })
    }

    /// Run the TLS handshake on `socket` (whose timeouts bound it) and
    /// return the encrypted stream.
    pub fn accept(&self, stream: Stream) -> io::Result<Stream> {
        let Stream::Plain(mut socket) = stream else {
            return Err(io::Error::other("TLS is already active"));
        };
        let mut session =
            ServerConnection::new(Arc::clone(&self.config)).map_err(io::Error::other)?;
        while session.is_handshaking() {
            let (read, written) = session.complete_io(&mut socket)?;
            if read == 0 && written == 0 && session.is_handshaking() {
                return Err(io::ErrorKind::UnexpectedEof.into());
            }
        }
        while session.wants_write() {
            session.write_tls(&mut socket)?;
        }
        socket.flush()?;
        Ok(Stream::Tls(Box::new(TlsStream::new(socket, session))))
    }
}

fn read_certs(path: &Path) -> anyhow::Result<Vec<CertificateDer<'static>>> {
    let mut text = Vec::new();
    std::fs::File::open(path)
        .and_then(|mut file| file.read_to_end(&mut text))
        .with_context(|| format!("cannot read {}", path.display()))?;
    let certs = CertificateDer::pem_slice_iter(&text)
        .collect::<Result<Vec<_>, _>>()
        .with_context(|| format!("{}: not PEM certificates", path.display()))?;
    if certs.is_empty() {
        anyhow::bail!("{}: no certificate in it", path.display());
    }
    Ok(certs)
}
