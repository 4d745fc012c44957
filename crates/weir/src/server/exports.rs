//! The server's exports, what each advertises to clients, and the TLS
//! they are offered over.

use std::sync::Arc;

use weir_nbd::consts::*;
use weir_nbd::{Access, BlockSize, ExportCatalog, ExportDetails};

use super::access::{Client, Policy};
use super::shared_budget::SharedBudget;
use super::tls::Tls;
use crate::volume::Volume;

pub struct Export {
    pub name: String,
    pub description: String,
    pub volume: Arc<Volume>,
    pub policy: Policy,
}

pub struct Exports {
    exports: Vec<Export>,
    payload_bytes_max: u32,
    tls: Option<Tls>,
    in_flight: Option<Arc<SharedBudget>>,
}

/// Alignment clients should prefer; smaller requests cost read-modify-write.
const PREFERRED_BLOCK_BYTES: u32 = 4096;

impl Exports {
    /// `exports` must not be empty; the first is the default export ("").
    pub fn new(exports: Vec<Export>, payload_bytes_max: u32) -> Exports {
        assert!(!exports.is_empty(), "a server needs at least one export");
        Exports {
            exports,
            payload_bytes_max,
            tls: None,
            in_flight: None,
        }
    }

    /// Bound request and reply bytes in flight on all connections together
    /// (see `shared_budget`); at least four of the largest request.
    pub fn with_in_flight_max(mut self, bytes: u64) -> Exports {
        assert!(bytes >= 4 * u64::from(self.payload_bytes_max));
        let request_bytes_max = u64::from(self.payload_bytes_max);
        self.in_flight = Some(Arc::new(SharedBudget::new(bytes, request_bytes_max)));
        self
    }

    pub fn in_flight(&self) -> Option<&Arc<SharedBudget>> {
        self.in_flight.as_ref()
    }

    /// Offer TLS (STARTTLS) as `tls` says.
    pub fn with_tls(mut self, tls: Tls) -> Exports {
        self.tls = Some(tls);
        self
    }

    pub fn tls(&self) -> Option<&Tls> {
        self.tls.as_ref()
    }

    pub fn all(&self) -> &[Export] {
        &self.exports
    }

    pub fn find(&self, name: &str) -> Option<&Export> {
        if name.is_empty() {
            return self.exports.first();
        }
        self.exports.iter().find(|e| e.name == name)
    }

    pub fn payload_bytes_max(&self) -> u32 {
        self.payload_bytes_max
    }

    /// Transmission flags: only what this export really supports.
    /// CAN_MULTI_CONN holds because weir keeps no per-connection cache:
    /// every connection reaches the same device, and FLUSH flushes it.
    fn transmission_flags(export: &Export) -> u16 {
        let caps = export.volume.caps();
        let mut flags = FLAG_HAS_FLAGS | FLAG_SEND_FLUSH | FLAG_SEND_CACHE | FLAG_CAN_MULTI_CONN;
        if caps.read_only {
            flags |= FLAG_READ_ONLY;
        } else {
            flags |= FLAG_SEND_FUA | FLAG_SEND_TRIM | FLAG_SEND_WRITE_ZEROES | FLAG_SEND_FAST_ZERO;
        }
        if caps.rotational {
            flags |= FLAG_ROTATIONAL;
        }
        flags
    }

    /// `flags` for a client that gets the export read-only.
    pub fn read_only_flags(flags: u16) -> u16 {
        let writes = FLAG_SEND_FUA | FLAG_SEND_TRIM | FLAG_SEND_WRITE_ZEROES | FLAG_SEND_FAST_ZERO;
        (flags & !writes) | FLAG_READ_ONLY
    }

    /// What `export` advertises, before any client's access is decided.
    pub fn details(&self, export: &Export) -> ExportDetails {
        ExportDetails {
            name: export.name.clone(),
            description: export.description.clone(),
            size_bytes: export.volume.size_bytes(),
            transmission_flags: Self::transmission_flags(export),
            block_size: BlockSize {
                minimum: 1,
                preferred: PREFERRED_BLOCK_BYTES,
                maximum: self.payload_bytes_max,
            },
            access: Access::Granted,
        }
    }
}

/// The exports as one client sees them.
pub struct ClientView<'a> {
    pub exports: &'a Exports,
    pub client: &'a Client,
}

impl ExportCatalog for ClientView<'_> {
    fn export(&self, name: &str) -> Option<ExportDetails> {
        let export = self.exports.find(name)?;
        let mut details = self.exports.details(export);
        details.access = export.policy.access(self.client);
        if export.policy.read_only_for(self.client) {
            details.transmission_flags = Exports::read_only_flags(details.transmission_flags);
        }
        Some(details)
    }

    fn list(&self) -> Vec<(String, String)> {
        self.exports
            .all()
            .iter()
            .map(|e| (e.name.clone(), e.description.clone()))
            .collect()
    }
}
