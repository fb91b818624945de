//! `drover completions SHELL` and `drover man [--out DIR]` (SPEC section 8): shell completion
//! scripts ([`clap_complete`]) and manual pages ([`clap_mangen`]), both generated from the
//! command line definition itself, so they never fall behind it.

use std::io::Write;
use std::path::Path;

use clap_complete::Shell;

use crate::Exit;

/// Prints the completion script of `shell` for `cmd` (the whole `drover` command line).
pub fn completions(mut cmd: clap::Command, shell: Shell) -> Exit {
    let name = cmd.get_name().to_string();
    let mut out = Vec::new();
    clap_complete::generate(shell, &mut cmd, name, &mut out);
    write_stdout(&out, "the completion script")
}

/// Writes `drover.1` and one `drover-<subcommand>.1` per visible subcommand (and theirs) into
/// `out`, creating it; without `out`, prints `drover.1` to stdout.
pub fn man(cmd: clap::Command, out: Option<&Path>) -> Exit {
    let Some(dir) = out else {
        let mut page = Vec::new();
        if let Err(e) = clap_mangen::Man::new(cmd).render(&mut page) {
            eprintln!("drover: cannot render the manual page: {e}");
            return Exit::Failed;
        }
        return write_stdout(&page, "the manual page");
    };
    match std::fs::create_dir_all(dir).and_then(|()| clap_mangen::generate_to(cmd, dir)) {
        Ok(()) => {
            println!("{}", dir.display());
            Exit::Ok
        }
        Err(e) => {
            eprintln!(
                "drover: cannot write manual pages to {}: {e}",
                dir.display()
            );
            Exit::Failed
        }
    }
}

fn write_stdout(bytes: &[u8], what: &str) -> Exit {
    let mut stdout = std::io::stdout().lock();
    match stdout.write_all(bytes).and_then(|()| stdout.flush()) {
        Ok(()) => Exit::Ok,
        Err(e) => {
            eprintln!("drover: cannot write {what} to stdout: {e}");
            Exit::Failed
        }
    }
}
