//! The worker's journal and outbox.
