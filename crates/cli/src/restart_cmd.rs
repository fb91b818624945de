//! `drover restart`: the binary on disk becomes the home's next owner and adopts the running
//! turns (SPEC section 9, daemon handoff).

use std::path::PathBuf;

use anyhow::{bail, Result};
use clap::Args;

use crate::Exit;

/// `drover restart`.
#[derive(Args, Debug, Default)]
pub struct RestartArgs {
    /// Stop admitting, let running turns finish, then hand over (for a next build whose
    /// worker protocol differs).
    #[arg(long)]
    pub drain: bool,
    /// With `--drain`: give up (and keep the old owner serving) after this many seconds.
    #[arg(long, value_name = "S", requires = "drain")]
    pub timeout: Option<u64>,
}

/// `drover restart`.
pub async fn restart(_home: PathBuf, _args: RestartArgs) -> Result<Exit> {
    bail!("drover restart is not built yet")
}
