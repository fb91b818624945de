//! The checked-in schema bundle (`schema/drover-protocol.schema.json`) is what the types
//! generate now.

// Test helpers: clippy.toml's allow-unwrap-in-tests covers only #[test] functions.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::PathBuf;

use drover_protocol::schema;

fn checked_in() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../schema")
        .join(schema::FILE_NAME)
}

#[test]
fn the_checked_in_schema_is_current() {
    let path = checked_in();
    let on_disk = std::fs::read_to_string(&path).unwrap_or_default();
    assert!(
        on_disk == schema::render(),
        "{} is stale or missing: regenerate it with \
         `cargo run -p drover -- protocol schema --out schema` and commit the result",
        path.display()
    );
}
