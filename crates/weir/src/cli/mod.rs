//! The `weir` command line: its commands, the pool/volume/scrub commands
//! (offline, or through a running server's admin endpoint), and the
//! reference generated from it.

pub mod bench;
pub mod pool;
mod progress;
pub mod reference;

use clap::{Parser, Subcommand};

use crate::config::ServeArgs;

#[derive(Parser)]
#[command(
    name = "weir",
    version,
    about = "A user-space block storage server that exports volumes over NBD"
)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Subcommand)]
pub enum Command {
    /// Serve exports and pool volumes over NBD (with nothing configured: a mirrored demo volume).
    Serve(ServeArgs),
    /// Pools of mirrored, checksummed devices: create, status, replace.
    #[command(subcommand)]
    Pool(crate::cli::pool::PoolCommand),
    /// Volumes in pools: create, list, delete, resize, set properties (on the running server or offline).
    #[command(subcommand)]
    Volume(crate::cli::pool::VolumeCommand),
    /// Verify every copy of a pool's data and repair bad copies: start, pause, resume, stop, status.
    #[command(subcommand)]
    Scrub(crate::cli::pool::ScrubCommand),
    /// The running server's device queues per pool member and class (-w: latency histograms).
    Iostat(crate::admin::iostat::IostatArgs),
    /// Workloads and scenarios against device models (virtual time) or NBD servers.
    #[command(subcommand)]
    Bench(bench::BenchCommand),
    /// Write this command line's reference: Markdown for docs/configuration.md, or man pages.
    #[command(hide = true)]
    Reference(reference::ReferenceArgs),
}

/// A clap parser for a closed set of names, so that the policies and modes
/// of the sans-IO cores it yields need not know about clap.
pub fn one_of<T: Copy + Send + Sync + 'static>(
    all: &'static [T],
    name: fn(T) -> &'static str,
) -> impl clap::builder::TypedValueParser<Value = T> {
    use clap::builder::TypedValueParser;
    clap::builder::PossibleValuesParser::new(all.iter().map(|v| name(*v))).map(move |text| {
        *all.iter()
            .find(|v| name(**v) == text)
            .expect("clap accepted only these names")
    })
}
