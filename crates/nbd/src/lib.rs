//! The NBD protocol for weir, without any I/O.
//!
//! ```text
//!   bytes from client ──> handshake::Handshake ──> Negotiated
//!                         request::RequestHeader::decode ──> request::validate ──> Command
//!   Command results   ──> reply::{simple, offset_data_header, ...} ──> bytes to client
//! ```
//!
//! Nothing here touches a socket or a clock, so every malformed input can
//! be unit-tested (and fuzzed) as plain bytes.

pub mod consts;
pub mod errno;
pub mod handshake;
pub mod reply;
pub mod request;
mod wire;

pub use errno::Errno;
pub use handshake::{
    Access, BlockSize, ExportCatalog, ExportDetails, Handshake, HandshakeError, Negotiated,
    Progress, TlsMode,
};
pub use request::{BadRequestMagic, Command, RequestHeader, Session, Verdict};
