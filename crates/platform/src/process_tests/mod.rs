//! The platform's integration tests, one binary: the confinement steps and the namespace probe
//! on real processes. A test that must be alone in its process (it changes the working
//! directory) reruns itself in a child ([`drover_test_support::alone`]).

mod confine;
mod probe_cwd;
