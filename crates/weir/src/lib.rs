//! weir: a user-space block storage server exporting volumes over NBD.
//!
//! The data path, top to bottom (each a module):
//!
//! ```text
//!   server/   connections, handshake, per-connection in-flight budget
//!   volume/   byte-granular requests -> aligned block ops (read-modify-write)
//!   pool/     layout of volumes on devices (today: one whole device)
//!   sched/    one queue per device; every I/O carries its class
//!   device/   io_uring on files and block devices (O_DIRECT), memory,
//!             timing models of HDD / SSD / NVMe (device/model)
//! ```
//!
//! Beside the data path: `sim/` runs the same device models in virtual
//! time, and `bench/` drives workloads at a model (`--sim`) or at a real
//! NBD server, for `weir bench`.
//!
//! The NBD wire protocol lives in the `weir-nbd` crate and stops at `server`.

pub mod admin;
pub mod bench;
pub mod cli;
pub mod config;
pub mod device;
pub mod join;
pub mod metrics;
pub mod pool;
pub mod rng;
pub mod sched;
pub mod server;
pub mod sim;
pub mod stats;
pub mod units;
pub mod volume;
pub mod workload;
