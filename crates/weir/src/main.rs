//! The `weir` command line.

use std::io::IsTerminal;

use clap::Parser;

use weir::cli::{Cli, Command};

fn main() {
    let cli = Cli::parse();
    if !matches!(cli.command, Command::Bench(_) | Command::Reference(_)) {
        owner_only_files();
    }
    let result = match cli.command {
        Command::Serve(args) => weir::serve::run(&args, init_logging),
        Command::Bench(command) => weir::cli::bench::main(command),
        Command::Pool(command) => {
            init_logging("warn");
            weir::cli::pool::main(command)
        }
        Command::Volume(command) => {
            init_logging("warn");
            weir::cli::pool::volume_main(command)
        }
        Command::Scrub(command) => {
            init_logging("warn");
            weir::cli::pool::scrub_main(command)
        }
        Command::Iostat(args) => {
            init_logging("warn");
            weir::admin::iostat::main(args)
        }
        Command::Reference(args) => weir::cli::reference::main(&args),
    };
    if let Err(err) = result {
        eprintln!("weir: error: {err:#}");
        std::process::exit(1);
    }
}

/// What weir creates for a volume's data (the data directory, member and
/// export files, pools.toml, admin.addr, the Unix socket) is its owner's
/// alone: mode 0600, directories 0700. Another local user who could read a
/// member file would read every volume on it. An operator who wants a
/// group to reach the socket changes its mode after start.
fn owner_only_files() {
    // SAFETY: umask only sets the process's file mode creation mask.
    unsafe {
        libc::umask(0o077);
    }
}

fn init_logging(level: &str) {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(level));
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(std::io::stderr().is_terminal())
        .with_writer(std::io::stderr)
        .init();
}
