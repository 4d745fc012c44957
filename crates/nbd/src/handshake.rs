//! Fixed-newstyle handshake as a sans-IO state machine.
//!
//! ```text
//!   new() ──> greeting queued in output
//!     │  receive(bytes) ... take_output() ... receive(bytes) ...
//!     ▼
//!   client flags (4 bytes) ──> options loop ──┬─> Done(Negotiated)   GO / EXPORT_NAME
//!                        ▲                    ├─> StartTls           STARTTLS acknowledged
//!                        └── tls_started() ───┘
//!                                             ├─> Aborted            ABORT
//!                                             └─> Err(HandshakeError) disconnect, log why
//! ```
//!
//! TLS follows the spec's two server modes: with [`TlsMode::Require`]
//! (FORCEDTLS) every option before STARTTLS but ABORT is refused with
//! `NBD_REP_ERR_TLS_REQD`; with [`TlsMode::On`] (SELECTIVETLS) only exports
//! the catalog marks [`Access::TlsRequired`] are. Once TLS starts, options
//! negotiated in plaintext are forgotten: a man in the middle could have
//! sent them.
//!
//! The machine never blocks and never reads a clock: the driver feeds it
//! whatever bytes arrived and writes out whatever it produced. Option
//! payloads are bounded (`OPTION_DATA_BYTES_MAX`); a longer option is
//! skipped as it streams in and answered with `NBD_REP_ERR_TOO_BIG`.

use crate::consts::*;
use crate::wire::{put_u16, put_u32, put_u64, Cursor};

/// Longest option payload weir buffers. Export names and metadata queries
/// are at most a few KiB each; anything longer is refused.
pub const OPTION_DATA_BYTES_MAX: u32 = 64 * 1024;
/// Options accepted in one handshake before the client is considered abusive.
pub const OPTIONS_MAX: u32 = 4096;
/// Longest string the protocol permits (names, descriptions, queries).
const STRING_BYTES_MAX: usize = 4096;

/// Block size constraints sent in `NBD_INFO_BLOCK_SIZE`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BlockSize {
    pub minimum: u32,
    pub preferred: u32,
    pub maximum: u32,
}

/// Whether this client may use an export, as the server's policy decides.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Access {
    Granted,
    /// Only over TLS, and this connection has not started it.
    TlsRequired,
    /// Never for this client; the reason is sent with `NBD_REP_ERR_POLICY`.
    Refused(String),
}

/// What the server says about one export.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ExportDetails {
    /// Canonical name (the default export "" resolves to a real name).
    pub name: String,
    pub description: String,
    pub size_bytes: u64,
    pub transmission_flags: u16,
    pub block_size: BlockSize,
    pub access: Access,
}

/// What the server offers for NBD_OPT_STARTTLS.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum TlsMode {
    /// STARTTLS is refused with `NBD_REP_ERR_UNSUP`.
    #[default]
    Off,
    /// TLS is offered; exports the catalog marks TLS-only require it.
    On,
    /// Nothing but STARTTLS and ABORT is answered before TLS starts.
    Require,
}

/// The server's exports, as the handshake sees them.
pub trait ExportCatalog {
    /// Look an export up by the name the client sent ("" is the default).
    fn export(&self, name: &str) -> Option<ExportDetails>;
    /// `(name, description)` of every export, for `NBD_OPT_LIST` (the
    /// handshake leaves out those this client may not use).
    fn list(&self) -> Vec<(String, String)>;
}

/// The outcome of a successful handshake.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Negotiated {
    pub export: ExportDetails,
    pub structured_replies: bool,
    pub base_allocation: bool,
    /// Bytes received after the final option: the start of transmission.
    pub leftover: Vec<u8>,
}

/// Where the handshake stands after consuming input.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Progress {
    NeedMore,
    Done(Negotiated),
    /// The client sent `NBD_OPT_ABORT`; flush output, then close.
    Aborted,
    /// STARTTLS was acknowledged: flush output, run the TLS handshake,
    /// call [`Handshake::tls_started`], and go on feeding what TLS decrypts.
    StartTls,
}

/// Reasons to hard-disconnect during the handshake.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum HandshakeError {
    UnknownClientFlags(u32),
    BadOptionMagic(u64),
    UnknownExport(String),
    ExportNameTooLong(u32),
    /// An option announcing more data than any option needs: refused with
    /// `NBD_REP_ERR_TOO_BIG`, then the connection closes rather than read
    /// what may be gigabytes.
    OptionTooLarge {
        option: u32,
        length: u32,
    },
    TooManyOptions,
    AlreadyFinished,
    /// NBD_OPT_EXPORT_NAME (which cannot be refused with a reply) for an
    /// export this client may not use, or before TLS where TLS is required.
    ExportNameRefused(String),
    /// Bytes after STARTTLS that came before the TLS handshake: a client
    /// waits for the reply, so these were injected in plaintext.
    DataAfterStartTls(usize),
}

impl std::fmt::Display for HandshakeError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            HandshakeError::UnknownClientFlags(flags) => {
                write!(f, "client sent unknown flags {flags:#x}")
            }
            HandshakeError::BadOptionMagic(magic) => write!(f, "bad option magic {magic:#018x}"),
            HandshakeError::UnknownExport(name) => {
                write!(f, "NBD_OPT_EXPORT_NAME for unknown export {name:?}")
            }
            HandshakeError::ExportNameTooLong(len) => {
                write!(f, "NBD_OPT_EXPORT_NAME of {len} bytes")
            }
            HandshakeError::OptionTooLarge { option, length } => write!(
                f,
                "option {option} announces {length} bytes, more than {OPTION_DATA_BYTES_MAX}"
            ),
            HandshakeError::TooManyOptions => write!(f, "more than {OPTIONS_MAX} options"),
            HandshakeError::AlreadyFinished => write!(f, "input after the handshake finished"),
            HandshakeError::ExportNameRefused(why) => {
                write!(f, "NBD_OPT_EXPORT_NAME refused: {why}")
            }
            HandshakeError::DataAfterStartTls(bytes) => {
                write!(f, "{bytes} plaintext bytes after NBD_OPT_STARTTLS")
            }
        }
    }
}

impl std::error::Error for HandshakeError {}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum State {
    ClientFlags,
    OptionHeader,
    OptionData { option: u32, length: u32 },
    Finished,
}

/// Metadata contexts selected by `NBD_OPT_SET_META_CONTEXT`, for one export.
#[derive(Clone, Debug, Default)]
struct MetaSelection {
    export: Option<String>,
    base_allocation: bool,
}

pub struct Handshake {
    state: State,
    input: Vec<u8>,
    output: Vec<u8>,
    no_zeroes: bool,
    structured_replies: bool,
    meta: MetaSelection,
    options_seen: u32,
    tls_mode: TlsMode,
    tls_active: bool,
    /// Why exports were refused to this client, for the server's log.
    refusals: Vec<String>,
}

impl Default for Handshake {
    fn default() -> Self {
        Self::new()
    }
}

impl Handshake {
    /// Start a handshake without TLS; the greeting is already queued.
    pub fn new() -> Self {
        Self::with_tls(TlsMode::Off)
    }

    /// Start a handshake offering TLS as `tls_mode` says.
    pub fn with_tls(tls_mode: TlsMode) -> Self {
        let mut output = Vec::with_capacity(256);
        put_u64(&mut output, NBDMAGIC);
        put_u64(&mut output, IHAVEOPT);
        put_u16(&mut output, FLAG_FIXED_NEWSTYLE | FLAG_NO_ZEROES);
        Handshake {
            state: State::ClientFlags,
            input: Vec::new(),
            output,
            no_zeroes: false,
            structured_replies: false,
            meta: MetaSelection::default(),
            options_seen: 0,
            tls_mode,
            tls_active: false,
            refusals: Vec::new(),
        }
    }

    /// The TLS handshake that followed [`Progress::StartTls`] succeeded:
    /// what was negotiated in plaintext is forgotten.
    pub fn tls_started(&mut self) {
        self.tls_active = true;
        self.structured_replies = false;
        self.meta = MetaSelection::default();
    }

    pub fn tls_active(&self) -> bool {
        self.tls_active
    }

    /// Refusals sent since the last call (export and reason), to log.
    pub fn take_refusals(&mut self) -> Vec<String> {
        std::mem::take(&mut self.refusals)
    }

    /// Bytes to send to the client now.
    pub fn take_output(&mut self) -> Vec<u8> {
        std::mem::take(&mut self.output)
    }

    /// Feed received bytes; answers are queued in the output.
    pub fn receive(
        &mut self,
        bytes: &[u8],
        catalog: &dyn ExportCatalog,
    ) -> Result<Progress, HandshakeError> {
        if self.state == State::Finished {
            return Err(HandshakeError::AlreadyFinished);
        }
        self.input.extend_from_slice(bytes);
        let mut consumed = 0;
        let progress = loop {
            let available = &self.input[consumed..];
            match self.state {
                State::Finished => unreachable!("finished states return"),
                State::ClientFlags => {
                    let Some(flags) = Cursor::new(available).u32() else {
                        break Ok(Progress::NeedMore);
                    };
                    consumed += 4;
                    if flags & !(FLAG_C_FIXED_NEWSTYLE | FLAG_C_NO_ZEROES) != 0 {
                        break Err(HandshakeError::UnknownClientFlags(flags));
                    }
                    self.no_zeroes = flags & FLAG_C_NO_ZEROES != 0;
                    self.state = State::OptionHeader;
                }
                State::OptionHeader => {
                    let mut cursor = Cursor::new(available);
                    let (Some(magic), Some(option), Some(length)) =
                        (cursor.u64(), cursor.u32(), cursor.u32())
                    else {
                        break Ok(Progress::NeedMore);
                    };
                    consumed += OPTION_HEADER_BYTES;
                    if magic != IHAVEOPT {
                        break Err(HandshakeError::BadOptionMagic(magic));
                    }
                    self.options_seen += 1;
                    if self.options_seen > OPTIONS_MAX {
                        break Err(HandshakeError::TooManyOptions);
                    }
                    if length > OPTION_DATA_BYTES_MAX {
                        if option == OPT_EXPORT_NAME {
                            break Err(HandshakeError::ExportNameTooLong(length));
                        }
                        self.reply_error(option, REP_ERR_TOO_BIG, "option payload too large");
                        break Err(HandshakeError::OptionTooLarge { option, length });
                    }
                    self.state = State::OptionData { option, length };
                }
                State::OptionData { option, length } => {
                    if available.len() < length as usize {
                        break Ok(Progress::NeedMore);
                    }
                    let data = available[..length as usize].to_vec();
                    consumed += length as usize;
                    self.state = State::OptionHeader;
                    match self.handle_option(option, &data, catalog) {
                        Ok(Progress::NeedMore) => {}
                        Ok(Progress::Done(mut negotiated)) => {
                            negotiated.leftover = self.input[consumed..].to_vec();
                            break Ok(Progress::Done(negotiated));
                        }
                        Ok(Progress::StartTls) if consumed < self.input.len() => {
                            break Err(HandshakeError::DataAfterStartTls(
                                self.input.len() - consumed,
                            ));
                        }
                        other => break other,
                    }
                }
            }
        };
        self.input.drain(..consumed.min(self.input.len()));
        if !matches!(progress, Ok(Progress::NeedMore | Progress::StartTls)) {
            self.state = State::Finished;
            self.input.clear();
        }
        progress
    }

    fn handle_option(
        &mut self,
        option: u32,
        data: &[u8],
        catalog: &dyn ExportCatalog,
    ) -> Result<Progress, HandshakeError> {
        if self.tls_mode == TlsMode::Require && !self.tls_active {
            match option {
                OPT_STARTTLS | OPT_ABORT => {}
                OPT_EXPORT_NAME => {
                    return Err(HandshakeError::ExportNameRefused(
                        "this server requires TLS".into(),
                    ))
                }
                _ => {
                    if matches!(option, OPT_INFO | OPT_GO) {
                        self.refusals
                            .push("an export before TLS: TLS is required".into());
                    }
                    self.reply_error(option, REP_ERR_TLS_REQD, "this server requires TLS");
                    return Ok(Progress::NeedMore);
                }
            }
        }
        match option {
            OPT_EXPORT_NAME => self.export_name(data, catalog),
            OPT_ABORT => {
                self.reply(option, REP_ACK, &[]);
                Ok(Progress::Aborted)
            }
            OPT_LIST => {
                if data.is_empty() {
                    // Exports this client may not use now are left out,
                    // as the spec allows for TLS-only ones before TLS.
                    let usable = |name: &str| {
                        catalog
                            .export(name)
                            .is_some_and(|export| self.refusal(&export).is_none())
                    };
                    let listed: Vec<_> = catalog
                        .list()
                        .into_iter()
                        .filter(|(name, _)| usable(name))
                        .collect();
                    for (name, description) in listed {
                        let mut payload = Vec::with_capacity(4 + name.len() + description.len());
                        put_u32(&mut payload, name.len() as u32);
                        payload.extend_from_slice(name.as_bytes());
                        payload.extend_from_slice(description.as_bytes());
                        self.reply(option, REP_SERVER, &payload);
                    }
                    self.reply(option, REP_ACK, &[]);
                } else {
                    self.reply_error(option, REP_ERR_INVALID, "NBD_OPT_LIST takes no data");
                }
                Ok(Progress::NeedMore)
            }
            OPT_STRUCTURED_REPLY => {
                if data.is_empty() {
                    self.structured_replies = true;
                    self.reply(option, REP_ACK, &[]);
                } else {
                    self.reply_error(
                        option,
                        REP_ERR_INVALID,
                        "NBD_OPT_STRUCTURED_REPLY takes no data",
                    );
                }
                Ok(Progress::NeedMore)
            }
            OPT_INFO | OPT_GO => Ok(self.info_or_go(option, data, catalog)),
            OPT_LIST_META_CONTEXT | OPT_SET_META_CONTEXT => {
                self.meta_context(option, data, catalog);
                Ok(Progress::NeedMore)
            }
            OPT_STARTTLS => Ok(self.start_tls(data)),
            _ => {
                self.reply_error(option, REP_ERR_UNSUP, "unknown option");
                Ok(Progress::NeedMore)
            }
        }
    }

    fn start_tls(&mut self, data: &[u8]) -> Progress {
        if self.tls_mode == TlsMode::Off {
            self.reply_error(
                OPT_STARTTLS,
                REP_ERR_UNSUP,
                "TLS is not enabled on this server",
            );
        } else if self.tls_active {
            self.reply_error(OPT_STARTTLS, REP_ERR_INVALID, "TLS is already active");
        } else if !data.is_empty() {
            self.reply_error(
                OPT_STARTTLS,
                REP_ERR_INVALID,
                "NBD_OPT_STARTTLS takes no data",
            );
        } else {
            self.reply(OPT_STARTTLS, REP_ACK, &[]);
            return Progress::StartTls;
        }
        Progress::NeedMore
    }

    /// The export, if this client may use it now; else the refusal is
    /// queued for `option` and None returned.
    fn usable_export(
        &mut self,
        option: u32,
        name: &str,
        catalog: &dyn ExportCatalog,
    ) -> Option<ExportDetails> {
        let Some(export) = catalog.export(name) else {
            self.reply_error(option, REP_ERR_UNKNOWN, "no such export");
            return None;
        };
        match self.refusal(&export) {
            None => Some(export),
            Some((kind, why)) => {
                self.refusals
                    .push(format!("export {:?}: {why}", export.name));
                self.reply_error(option, kind, &why);
                None
            }
        }
    }

    /// Why this client may not use `export` now, as an error reply kind.
    fn refusal(&self, export: &ExportDetails) -> Option<(u32, String)> {
        match &export.access {
            Access::Granted => None,
            Access::TlsRequired if self.tls_active => None,
            Access::TlsRequired => Some((REP_ERR_TLS_REQD, "this export requires TLS".into())),
            Access::Refused(why) => Some((REP_ERR_POLICY, why.clone())),
        }
    }

    fn export_name(
        &mut self,
        data: &[u8],
        catalog: &dyn ExportCatalog,
    ) -> Result<Progress, HandshakeError> {
        let name = String::from_utf8_lossy(data).into_owned();
        let Some(export) = catalog.export(&name) else {
            return Err(HandshakeError::UnknownExport(name));
        };
        if let Some((_, why)) = self.refusal(&export) {
            return Err(HandshakeError::ExportNameRefused(format!(
                "{name:?}: {why}"
            )));
        }
        put_u64(&mut self.output, export.size_bytes);
        put_u16(&mut self.output, export.transmission_flags);
        if !self.no_zeroes {
            self.output.extend_from_slice(&[0u8; 124]);
        }
        Ok(Progress::Done(self.negotiated(export)))
    }

    fn negotiated(&self, export: ExportDetails) -> Negotiated {
        let base_allocation = self.structured_replies
            && self.meta.base_allocation
            && self.meta.export.as_deref() == Some(export.name.as_str());
        Negotiated {
            export,
            structured_replies: self.structured_replies,
            base_allocation,
            leftover: Vec::new(),
        }
    }

    fn info_or_go(&mut self, option: u32, data: &[u8], catalog: &dyn ExportCatalog) -> Progress {
        let mut cursor = Cursor::new(data);
        let parsed = cursor.string_u32().and_then(|name| {
            let count = cursor.u16()? as usize;
            let requests: Option<Vec<u16>> = (0..count).map(|_| cursor.u16()).collect();
            Some((name, requests?))
        });
        let Some((name, requests)) = parsed.filter(|_| cursor.remaining() == 0) else {
            self.reply_error(
                option,
                REP_ERR_INVALID,
                "option length does not match its contents",
            );
            return Progress::NeedMore;
        };
        let Ok(name) = std::str::from_utf8(name) else {
            self.reply_error(option, REP_ERR_INVALID, "export name is not UTF-8");
            return Progress::NeedMore;
        };
        let Some(export) = self.usable_export(option, name, catalog) else {
            return Progress::NeedMore;
        };
        for request in requests {
            let mut payload = Vec::new();
            put_u16(&mut payload, request);
            match request {
                INFO_NAME => payload.extend_from_slice(export.name.as_bytes()),
                INFO_DESCRIPTION if !export.description.is_empty() => {
                    payload.extend_from_slice(export.description.as_bytes())
                }
                INFO_BLOCK_SIZE => {
                    put_u32(&mut payload, export.block_size.minimum);
                    put_u32(&mut payload, export.block_size.preferred);
                    put_u32(&mut payload, export.block_size.maximum);
                }
                _ => continue, // unknown or empty: the spec lets the server skip it
            }
            self.reply(option, REP_INFO, &payload);
        }
        let mut payload = Vec::with_capacity(12);
        put_u16(&mut payload, INFO_EXPORT);
        put_u64(&mut payload, export.size_bytes);
        put_u16(&mut payload, export.transmission_flags);
        self.reply(option, REP_INFO, &payload);
        self.reply(option, REP_ACK, &[]);
        if option == OPT_GO {
            Progress::Done(self.negotiated(export))
        } else {
            Progress::NeedMore
        }
    }

    fn meta_context(&mut self, option: u32, data: &[u8], catalog: &dyn ExportCatalog) {
        let setting = option == OPT_SET_META_CONTEXT;
        if setting && !self.structured_replies {
            self.reply_error(
                option,
                REP_ERR_INVALID,
                "negotiate structured replies first",
            );
            return;
        }
        let mut cursor = Cursor::new(data);
        let parsed = cursor.string_u32().and_then(|name| {
            let count = cursor.u32()?;
            // Each query needs at least its 4-byte length, so a count larger
            // than the remaining bytes allow is a lie; don't loop on it.
            if count as usize > cursor.remaining() / 4 {
                return None;
            }
            let queries: Option<Vec<&[u8]>> = (0..count).map(|_| cursor.string_u32()).collect();
            Some((name, queries?))
        });
        let Some((name, queries)) = parsed.filter(|_| cursor.remaining() == 0) else {
            self.reply_error(
                option,
                REP_ERR_INVALID,
                "option length does not match its contents",
            );
            return;
        };
        if name.len() > STRING_BYTES_MAX || queries.iter().any(|q| q.len() > STRING_BYTES_MAX) {
            self.reply_error(option, REP_ERR_INVALID, "string longer than 4096 bytes");
            return;
        }
        let Ok(name) = std::str::from_utf8(name) else {
            self.reply_error(option, REP_ERR_INVALID, "export name is not UTF-8");
            return;
        };
        let Some(export) = self.usable_export(option, name, catalog) else {
            return;
        };
        let matches = |query: &[u8]| {
            query == BASE_ALLOCATION.as_bytes()
                || (!setting && (query == b"base:" || query == b"base"))
        };
        let selected = if queries.is_empty() {
            !setting
        } else {
            queries.iter().any(|q| matches(q))
        };
        if selected {
            let mut payload = Vec::new();
            put_u32(&mut payload, BASE_ALLOCATION_ID);
            payload.extend_from_slice(BASE_ALLOCATION.as_bytes());
            self.reply(option, REP_META_CONTEXT, &payload);
        }
        if setting {
            self.meta = MetaSelection {
                export: Some(export.name),
                base_allocation: selected,
            };
        }
        self.reply(option, REP_ACK, &[]);
    }

    fn reply(&mut self, option: u32, kind: u32, payload: &[u8]) {
        put_u64(&mut self.output, OPTION_REPLY_MAGIC);
        put_u32(&mut self.output, option);
        put_u32(&mut self.output, kind);
        put_u32(&mut self.output, payload.len() as u32);
        self.output.extend_from_slice(payload);
    }

    fn reply_error(&mut self, option: u32, kind: u32, message: &str) {
        self.reply(option, kind, message.as_bytes());
    }
}

#[cfg(test)]
mod fuzz;
#[cfg(test)]
mod tests;
#[cfg(test)]
mod tls_tests;
