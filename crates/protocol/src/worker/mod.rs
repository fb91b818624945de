//! Owner <-> worker frames (SPEC section 4).
//!
//! One JSON object per line on the worker's stdin/stdout, at most [`MAX_FRAME_BYTES`] per line.
//! Every frame has a `type` tag. The owner speaks first with [`OwnerFrame::Bootstrap`] (the
//! head: scope, policy and a part count), then the [`BootstrapBody`] (history and input): as
//! one [`OwnerFrame::BootstrapBody`] frame when it fits in one, else in that many
//! [`OwnerFrame::BootstrapPart`] frames whose texts, joined, are its JSON, so a history of any
//! length reaches the worker in bounded frames ([`Bootstrap::into_frames`], read back with
//! [`BodyFrame`] and [`Bootstrap::assemble`]).
//!
//! - [`frames`]: the frames each side sends, the execution's scope, the line bound.
//! - [`bootstrap`]: the bootstrap's head and body, cut into frames and put together.
//! - [`frozen_policy`]: the session's frozen policy the bootstrap carries.
//! - [`external_agent`]: the external agent a session's turns run through ACP.
//! - [`persist`]: the `persist` frame, its operations and their payloads.
//! - [`processes`]: background processes as the worker reports them.
//! - [`template`]: the owner's messages with its worker template.
//!
//! Reading the lines is not here (no IO in this crate): `drover_platform::frame_lines` reads
//! one bounded line, which both ends parse with these types.

pub mod bootstrap;
pub mod external_agent;
pub mod fork_template;
pub mod frames;
pub mod frozen_policy;
pub mod persist;
pub mod processes;

pub use bootstrap::*;
pub use external_agent::*;
pub use fork_template as template;
pub use frames::*;
pub use frozen_policy::*;
pub use persist::*;
pub use processes::*;
