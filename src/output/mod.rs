//! Writing the output safely: a staging directory renamed into place only when complete, and
//! shard files preallocated then filled by positioned writes.

mod files;
mod queue;
mod staging;

pub use files::ShardFiles;
pub use queue::WriteQueue;
pub use staging::{install_signal_cleanup, Staging};
