//! The platform on real processes, as unit tests: the confinement steps (each test runs a
//! command under a plan) and the namespace probe. A test that changes a process-wide setting
//! (the working directory, dumpability) reruns itself alone in a child
//! ([`drover_test_support::alone`]), apart from the other unit tests.

mod confine;
mod probe_cwd;
