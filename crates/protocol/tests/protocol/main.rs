//! The protocol's integration tests, one binary: every wire type round-trips, the checked-in
//! schema is what the types say, and today's wire (the fixtures under `tests/fixtures`)
//! parses and serialises back byte for byte.

mod roundtrip;
mod schema;
mod wire_fixtures;
