//! Writing the output safely: a staging directory renamed into place only when complete (OUT
//! locked meanwhile, and replaced only when it holds nothing but an earlier output), and shard
//! files preallocated then filled by positioned writes.

pub mod checksums;
pub mod file;
mod files;
mod inplace;
mod lock;
pub mod ours;
mod queue;
mod staging;
mod writable;

pub use files::ShardFiles;
pub use ours::{Marker, MARKER_FILE};
pub use queue::WriteQueue;
pub use staging::{Claim, Destination, Staging};
