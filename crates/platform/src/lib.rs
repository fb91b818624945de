//! Platform code: process groups, signals, `PR_SET_PDEATHSIG`, pidfd and `/proc` reads (SPEC
//! sections 4, 6 and 7: workers die with their owner, tool groups are killed whole, timers and
//! background processes are told apart from recycled pids).
//!
//! This is the only crate of drover that signals processes, reads `/proc` or holds an `unsafe`
//! block; everything else goes through the small interface below (STYLE: platform code is
//! isolated). It is Linux-only, like drover. Every function is re-exported at the crate root
//! (`drover_platform::signal_group`), whichever module owns it.
//!
//! - `signals`: [`signal_group`] and [`signal_process`] send a signal, refusing pids 0 and 1;
//!   a target already gone is not an error.
//! - `proc_facts`: what the kernel says about a process: [`is_alive`], [`is_stopped`],
//!   [`is_unexeced_zombie`], [`is_forked_not_execed`], [`parent_pid`], [`parent_of`], [`process_start_time`] (SPEC
//!   section 7: a timer is identified by pid and start time) and [`boot_ticks_now`].
//! - `groups`: [`spawn_in_new_group`] starts a child as the leader of its own process group,
//!   with `PR_SET_PDEATHSIG(SIGKILL)` so it dies with the process that spawned it
//!   ([`prepare_new_group`] for a command spawned elsewhere); [`kill_group`] stops a group:
//!   SIGTERM, a grace period, then SIGKILL; [`spawn_detached`] starts a process in its own
//!   session that outlives its caller (the job heartbeat timer, the `terminal` tool's
//!   background processes); [`new_session`] and [`kill_session_groups`]: a worker leads a
//!   session of its own, so the owner kills the tool groups a killed worker left;
//!   [`exit_code`] of a finished child.
//! - `foreground`: [`ForegroundGroups`] is the process-wide set of running foreground groups,
//!   which the worker kills at once when its owner is gone (SPEC section 4).
//! - `known_process`: [`process_matches`] and [`signal_process_if_same`] check and signal a
//!   process by pid *and* start time, so a recycled pid is never signalled;
//!   [`kill_group_if_same`] stops a background process's whole group only while its leader
//!   still matches pid and start time; [`kill_group_remainder`] kills what a dead leader left
//!   in its group (a killed runner's job command).
//! - `fds`: [`combined_output_pipe`] makes one pipe for a child's stdout and stderr, so they
//!   interleave; [`pass_fd`] hands a child a descriptor at a fixed number, and
//!   [`take_inherited_fd`] takes it in the child; [`tcp_segments_received`] reads a socket's
//!   `TCP_INFO` count of segments (tests that check messages leave in one write).
//! - `process_settings`: what a process sets on itself: [`set_parent_death_signal`] and
//!   [`clear_parent_death_signal`] (the worker, which clears it when handed to the next owner),
//!   [`ignore_file_size_signal`] (the daemon), [`default_pipe_signal`] (a command
//!   piped into `head`), [`set_non_dumpable`] (the owner and the worker), [`set_thread_name`];
//!   [`limit_malloc_arenas`] caps glibc's malloc arenas (the owner, at its start) and
//!   [`release_free_memory`] trims them (the worker template, before it forks; the owner,
//!   after a burst of connections).
//! - `process_title`: [`set_process_title`] writes what `ps` and `/proc/<pid>/cmdline` show
//!   for this process over its argument strings (SPEC section 9, "Process titles");
//!   [`command_line`] reads a process's, without its trailing NULs.
//! - `flock_holder`: [`flock_holder`] names the process holding a `flock(2)` lock (the owner's
//!   home lock).
//! - [`confine`]: what the kernel offers for confining tool processes ([`confine::probe`]),
//!   and the plan a tool process applies before exec: a user and mount namespace hiding the
//!   drover homes and the browsers' profiles, a network namespace of its own with
//!   `network = false`, Landlock's write rules and its signal and abstract-socket scopes, no
//!   capabilities; [`confine::account_home`].
//! - [`limits`]: the owner raises its open-files limit to the hard one at start.
//! - [`fork`]: a single-threaded template forks workers as its parent's children
//!   ([`fork::fork_sibling`]), held by pidfd ([`fork::ProcessHandle`]); descriptors passed over
//!   a socket pair ([`fork::FdChannel`]).
//! - [`frame_lines`]: reads one bounded `\n`-terminated line of the owner <-> worker pipe over
//!   tokio's `AsyncBufRead`, skipping an oversize line instead of ending the conversation.
//! - [`file_open`]: the file tools open a path without following `/proc` magic links and tell what
//!   they opened by `fstat` of the descriptor ([`file_open::open_for_reading`]); [`OPEN_NO_FOLLOW`].
//!
//! Layers: `signals`, `proc_facts`, `fds`, `flock_holder`, `confine`, `frame_lines`, `limits`
//! and `file_open` (leaves) < `process_settings` and `process_title` (they read `proc_facts`)
//! < `fork` (it reads both) and `foreground` (it signals groups) < `groups` < `known_process`.

// The one crate allowed `unsafe`: each block in its modules states its invariant.
#![allow(unsafe_code)]

pub mod confine;
mod fds;
pub mod file_open;
mod flock_holder;
mod foreground;
pub mod fork;
pub mod frame_lines;
mod groups;
mod known_process;
pub mod limits;
mod proc_facts;
mod process_settings;
#[cfg(test)]
mod process_tests;
mod process_title;
mod signals;

pub use fds::{combined_output_pipe, pass_fd, take_inherited_fd, tcp_segments_received};
pub use file_open::OPEN_NO_FOLLOW;
pub use flock_holder::flock_holder;
pub use foreground::{ForegroundGroup, ForegroundGroups};
pub use groups::{
    exit_code, kill_group, kill_session_groups, new_session, prepare_new_group, spawn_detached,
    spawn_in_new_group,
};
pub use known_process::{
    kill_group_if_same, kill_group_remainder, process_matches, signal_process_if_same,
};
pub use nix::sys::signal::Signal;
pub use proc_facts::{
    boot_ticks_now, is_alive, is_forked_not_execed, is_stopped, is_unexeced_zombie, parent_of,
    parent_pid, process_start_time,
};
pub use process_settings::{
    clear_parent_death_signal, default_pipe_signal, ignore_file_size_signal, limit_malloc_arenas,
    release_free_memory, set_non_dumpable, set_parent_death_signal, set_thread_name,
};
pub use process_title::{command_line, set_process_title};
pub use signals::{signal_group, signal_process};
