//! owner
