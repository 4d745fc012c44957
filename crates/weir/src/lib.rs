//! weir: a user-space block storage server exporting volumes over NBD.
//!
//! The data path, top to bottom (each a module; none imports one above it):
//!
//! ```text
//!   server/   listeners, connections, in-flight budget, reply outbox
//!   volume/   byte-granular requests -> aligned block ops (read-modify-write)
//!   pool/     a whole device, or a pool of mirrored, checksummed devices
//!   sched/    one queue per device; every I/O carries its class
//!   device/   io_uring on files and block devices (O_DIRECT), memory,
//!             timing models of HDD / SSD / NVMe (device/model)
//! ```
//!
//! Beside the data path: `serve/` assembles a running server (pools,
//! exports and the caches in front of them), `admin/` serves its pools
//! over HTTP, `cli/` is the command line, `sim/` runs the same queues and device
//! models in virtual time, and `bench/` drives workloads at them or at a
//! real NBD server. `metrics`, `stats`, `workload`, `rng`, `units`,
//! `spin_slots` and `range_lock` are leaves any layer may use.
//!
//! The NBD wire protocol lives in the `weir-nbd` crate and stops at `server`.

pub mod admin;
pub mod bench;
pub mod cache;
pub mod cli;
pub mod config;
pub mod device;
#[cfg(feature = "fuzzing")]
pub mod fuzzing;
pub mod join;
pub mod metrics;
pub mod pool;
pub mod range_lock;
pub mod readahead;
pub mod rng;
pub mod sched;
pub mod serve;
pub mod server;
pub mod sim;
pub mod spin_slots;
pub mod stats;
pub mod units;
pub mod volume;
pub mod workload;
