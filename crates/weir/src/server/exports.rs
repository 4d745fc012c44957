//! The server's exports, what each advertises to clients, and the TLS
//! they are offered over. Exports come and go while the server runs (pool
//! volumes created and destroyed through the admin endpoint): a removed
//! export takes no new clients and closes its open connections once their
//! replies are out.

use std::collections::HashMap;
use std::net::Shutdown;
use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::{Condvar, Mutex, RwLock};

use weir_nbd::consts::*;
use weir_nbd::{Access, BlockSize, ExportCatalog, ExportDetails};

use super::access::{Client, Policy};
use super::shared_budget::SharedBudget;
use super::stream::Stream;
use super::tls::Tls;
use super::CLOSE_WAIT;
use crate::volume::Volume;

pub struct Export {
    pub name: String,
    pub description: String,
    pub volume: Arc<Volume>,
    pub policy: Policy,
    connections: Mutex<Connections>,
    ended: Condvar,
}

/// The connections serving an export, by id, for closing them.
#[derive(Default)]
struct Connections {
    retired: bool,
    open: HashMap<u64, Stream>,
}

impl Export {
    pub fn new(name: &str, description: &str, volume: Volume, policy: Policy) -> Export {
        Export {
            name: name.into(),
            description: description.into(),
            volume: Arc::new(volume),
            policy,
            connections: Mutex::default(),
            ended: Condvar::new(),
        }
    }

    /// Count connection `id` as this export's, with a handle on its
    /// socket; false once the export is removed (the client is refused).
    pub fn attach(&self, id: u64, stream: Stream) -> bool {
        let mut connections = self.connections.lock();
        if connections.retired {
            return false;
        }
        connections.open.insert(id, stream);
        true
    }

    pub fn detach(&self, id: u64) {
        self.connections.lock().open.remove(&id);
        self.ended.notify_all();
    }

    /// Take no new connections and end the open ones as a server shutdown
    /// does: their read side is closed, so each finishes the requests it
    /// has and ends; a client that does not take its replies within
    /// `grace` has its socket closed. True if all ended.
    pub fn retire(&self, grace: Duration) -> bool {
        let mut connections = self.connections.lock();
        connections.retired = true;
        for stream in connections.open.values() {
            stream.shutdown(Shutdown::Read);
        }
        let all_ended = |connections: &mut parking_lot::MutexGuard<'_, Connections>,
                         limit: Duration| {
            let deadline = Instant::now() + limit;
            while !connections.open.is_empty() {
                if self.ended.wait_until(connections, deadline).timed_out() {
                    return connections.open.is_empty();
                }
            }
            true
        };
        if all_ended(&mut connections, grace) {
            return true;
        }
        tracing::warn!(
            export = self.name,
            "{} connection(s) not finished after {grace:?}: closing them",
            connections.open.len()
        );
        for stream in connections.open.values() {
            stream.shutdown(Shutdown::Both);
        }
        all_ended(&mut connections, CLOSE_WAIT)
    }

    pub fn connection_count(&self) -> usize {
        self.connections.lock().open.len()
    }
}

pub struct Exports {
    exports: RwLock<Vec<Arc<Export>>>,
    payload_bytes_max: u32,
    tls: Option<Tls>,
    in_flight: Option<Arc<SharedBudget>>,
}

/// Alignment clients should prefer; smaller requests cost read-modify-write.
const PREFERRED_BLOCK_BYTES: u32 = 4096;

impl Exports {
    /// The first is the default export (""), while it lasts.
    pub fn new(exports: Vec<Export>, payload_bytes_max: u32) -> Exports {
        Exports {
            exports: RwLock::new(exports.into_iter().map(Arc::new).collect()),
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

    pub fn all(&self) -> Vec<Arc<Export>> {
        self.exports.read().clone()
    }

    pub fn find(&self, name: &str) -> Option<Arc<Export>> {
        let exports = self.exports.read();
        if name.is_empty() {
            return exports.first().cloned();
        }
        exports.iter().find(|e| e.name == name).cloned()
    }

    /// Serve `export` from now on; its name must be new.
    pub fn add(&self, export: Export) -> anyhow::Result<()> {
        let mut exports = self.exports.write();
        if exports.iter().any(|e| e.name == export.name) {
            anyhow::bail!("an export named {:?} is already served", export.name);
        }
        exports.push(Arc::new(export));
        Ok(())
    }

    /// Stop offering `name` to new clients; the caller retires it.
    pub fn remove(&self, name: &str) -> Option<Arc<Export>> {
        let mut exports = self.exports.write();
        let index = exports.iter().position(|e| e.name == name)?;
        Some(exports.remove(index))
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
        let mut details = self.exports.details(&export);
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
