//! `drover service install | uninstall | status`: the home's daemon as a systemd user unit.

use std::path::PathBuf;

use anyhow::{bail, Result};
use clap::{Args, Subcommand};

use crate::Exit;

/// `drover service`.
#[derive(Args, Debug)]
pub struct ServiceArgs {
    #[command(subcommand)]
    pub command: ServiceCommand,
}

/// What to do with the home's user unit.
#[derive(Subcommand, Debug)]
pub enum ServiceCommand {
    /// Write and enable a systemd user unit that runs `drover daemon` for the home.
    Install,
    /// Stop, disable and remove the home's unit.
    Uninstall,
    /// Whether the home's unit is installed, enabled and running.
    Status,
}

/// `drover service`.
pub fn run(_home: PathBuf, _args: ServiceArgs) -> Result<Exit> {
    bail!("drover service is not built yet")
}
