//! Links the `drover` binary as a position-dependent executable (`-no-pie`).
//!
//! Every turn starts a worker process and every command a client process, so the cost of one
//! `exec` is paid again and again. A position-independent `drover` carries about 51,000 relative
//! relocations that the dynamic loader applies at each start, copying every page of
//! `.data.rel.ro` it touches (about 240 more page faults). Linked at a fixed address, the loader
//! has nothing to relocate: `drover --version` takes 1.0 ms of CPU instead of 2.5 ms, and a warm
//! turn about 1 ms less (docs/decisions/turn-position-dependent-binary.md). The code is still
//! compiled position-independent, so only the link changes; shared libraries, the heap and the
//! stack are still placed at random.
fn main() {
    // Only the binaries: `-no-pie` would break the link of a shared object, and the test
    // binaries gain nothing from it.
    println!("cargo:rustc-link-arg-bins=-no-pie");
    println!("cargo:rerun-if-changed=build.rs");
}
