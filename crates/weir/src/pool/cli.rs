//! The `weir pool` command line (offline: it works on the devices directly).

use std::path::PathBuf;

use clap::{Args, Subcommand};

use super::admin;

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
