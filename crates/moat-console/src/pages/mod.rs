//! The console's pages, one module each.

pub mod apis;
pub mod config;
pub mod events;
pub mod exclude;
pub mod overview;
pub mod policy;
pub mod tls;
