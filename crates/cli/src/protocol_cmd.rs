//! `drover protocol`: the client protocol as files (SPEC section 2). `schema` writes the JSON
//! Schema bundle that [`drover_protocol::schema`] derives from the wire types.

use std::io::Write;
use std::path::PathBuf;

use clap::{Args, Subcommand};
use drover_protocol::schema;

use crate::Exit;

/// `drover protocol ...`.
#[derive(Args)]
pub struct ProtocolArgs {
    #[command(subcommand)]
    command: ProtocolCommand,
}

#[derive(Subcommand)]
enum ProtocolCommand {
    /// Print the JSON Schema of every request, result, event and error, or write it to
    /// DIR/drover-protocol.schema.json.
    Schema {
        /// The directory to write to (created if missing); without it, print to stdout.
        #[arg(long, value_name = "DIR")]
        out: Option<PathBuf>,
    },
}

/// Runs `drover protocol`.
pub fn run(args: ProtocolArgs) -> Exit {
    match args.command {
        ProtocolCommand::Schema { out: None } => {
            match std::io::stdout().write_all(schema::render().as_bytes()) {
                Ok(()) => Exit::Ok,
                Err(e) => {
                    eprintln!("drover: cannot write the schema to stdout: {e}");
                    Exit::Failed
                }
            }
        }
        ProtocolCommand::Schema { out: Some(dir) } => {
            let path = dir.join(schema::FILE_NAME);
            let written = std::fs::create_dir_all(&dir)
                .and_then(|()| std::fs::write(&path, schema::render()));
            match written {
                Ok(()) => {
                    println!("{}", path.display());
                    Exit::Ok
                }
                Err(e) => {
                    eprintln!("drover: cannot write {}: {e}", path.display());
                    Exit::Failed
                }
            }
        }
    }
}
