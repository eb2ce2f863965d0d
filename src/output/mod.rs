//! Writing the output safely: a staging directory renamed into place only when complete, and
//! shard files preallocated then filled by positioned writes.

mod files;
mod staging;

pub use files::ShardFiles;
pub use staging::{install_signal_cleanup, Staging};
