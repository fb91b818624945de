//! What the three area binaries of the `drover` tests share (each includes this file as
//! `crate::common`): where Cargo built the binary under test.

use std::path::Path;

/// The `drover` binary of this build, which every end-to-end test starts.
pub fn bin() -> &'static Path {
    Path::new(env!("CARGO_BIN_EXE_drover"))
}
