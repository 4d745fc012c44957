//! Subcommands that administer pools, volumes and scrubs, offline or
//! through a running server's admin endpoint.

pub mod pool;
