//! The `weir pool` and `weir volume` command lines (offline: they work on
//! the devices directly).

use std::path::PathBuf;

use clap::{Args, Subcommand};

use super::{admin, scrub, volumes};

#[derive(Subcommand)]
pub enum PoolCommand {
    /// Label devices as a new pool: `weir pool create tank mirror A B [mirror C D]`, or single devices.
    Create(CreateArgs),
    /// Import each registered pool (or one) from its devices and show its state.
    Status(StatusArgs),
}

#[derive(Args)]
pub struct CreateArgs {
    /// The pool's name.
    name: String,
    /// `mirror DEV DEV... [mirror DEV DEV...]`, or `DEV...` for single devices.
    #[arg(required = true, num_args = 1..)]
    layout: Vec<String>,
    /// Take devices that carry another pool's label.
    #[arg(long)]
    force: bool,
    /// Where the pool registry (pools.toml) lives.
    #[arg(long, default_value = "./weir-data")]
    data_dir: PathBuf,
}

#[derive(Args)]
pub struct StatusArgs {
    name: Option<String>,
    #[arg(long, default_value = "./weir-data")]
    data_dir: PathBuf,
}

pub fn main(command: PoolCommand) -> anyhow::Result<()> {
    match command {
        PoolCommand::Create(args) => {
            admin::create(&args.name, &args.layout, args.force, &args.data_dir)?;
            print!("{}", admin::status(Some(&args.name), &args.data_dir)?);
            Ok(())
        }
        PoolCommand::Status(args) => {
            print!("{}", admin::status(args.name.as_deref(), &args.data_dir)?);
            Ok(())
        }
    }
}

#[derive(Subcommand)]
pub enum VolumeCommand {
    /// Reserve space for a volume: `weir volume create tank/db --size 10G`.
    Create(VolumeCreateArgs),
    /// Every volume of every registered pool (or of one).
    List(VolumeListArgs),
    /// Remove a volume and free its space.
    Delete(VolumeDeleteArgs),
}

#[derive(Args)]
pub struct VolumeCreateArgs {
    /// POOL/NAME
    name: String,
    #[arg(long, value_parser = crate::units::parse_bytes)]
    size: u64,
    /// 4K to 128K, a power of two.
    #[arg(long, default_value = "4K", value_parser = crate::units::parse_bytes)]
    block_size: u64,
    #[arg(long, default_value = "./weir-data")]
    data_dir: PathBuf,
}

#[derive(Args)]
pub struct VolumeListArgs {
    pool: Option<String>,
    #[arg(long, default_value = "./weir-data")]
    data_dir: PathBuf,
}

#[derive(Args)]
pub struct VolumeDeleteArgs {
    /// POOL/NAME
    name: String,
    #[arg(long, default_value = "./weir-data")]
    data_dir: PathBuf,
}

pub fn volume_main(command: VolumeCommand) -> anyhow::Result<()> {
    match command {
        VolumeCommand::Create(args) => {
            let block = u32::try_from(args.block_size).unwrap_or(u32::MAX);
            volumes::create(&args.name, args.size, block, &args.data_dir)?;
            print!(
                "{}",
                volumes::list(args.name.split('/').next(), &args.data_dir)?
            );
        }
        VolumeCommand::List(args) => {
            print!("{}", volumes::list(args.pool.as_deref(), &args.data_dir)?)
        }
        VolumeCommand::Delete(args) => volumes::delete(&args.name, &args.data_dir)?,
    }
    Ok(())
}

#[derive(Subcommand)]
pub enum ScrubCommand {
    /// Scrub a pool to the end (offline, in the foreground; resumes an interrupted one).
    Start(ScrubArgs),
    /// The last scrub's result, or its progress if it was interrupted.
    Status(ScrubArgs),
}

#[derive(Args)]
pub struct ScrubArgs {
    pool: String,
    /// Accepted for compatibility: an offline scrub always runs to the end.
    #[arg(long)]
    wait: bool,
    #[arg(long, default_value = "./weir-data")]
    data_dir: PathBuf,
}

pub fn scrub_main(command: ScrubCommand) -> anyhow::Result<()> {
    match command {
        ScrubCommand::Start(args) => {
            let result = scrub::start(&args.pool, &args.data_dir)?;
            println!("{}", scrub::describe(&args.pool, &result));
            if result.unrecoverable > 0 {
                anyhow::bail!("{} blocks have no good copy left", result.unrecoverable);
            }
        }
        ScrubCommand::Status(args) => println!("{}", scrub::status(&args.pool, &args.data_dir)?),
    }
    Ok(())
}
