//! A background writer: workers hand finished buffers to one writer thread through a bounded
//! queue, so computing the next unit overlaps the kernel's copy into the page cache and any
//! write-back throttling. Buffers are recycled, so memory stays bounded by the queue depth.

use super::ShardFiles;
use crate::failure::{classified, ErrorCode};
use anyhow::{anyhow, Result};
use std::sync::mpsc::{sync_channel, SyncSender};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;

/// Buffers waiting to be written, at most.
const DEPTH: usize = 8;
/// Free buffers kept for reuse, at most.
const POOL: usize = 2 * DEPTH;

struct Job {
    shard: usize,
    offset: u64,
    bytes: Vec<u8>,
}

pub struct WriteQueue {
    tx: Option<SyncSender<Job>>,
    writer: Option<JoinHandle<Result<ShardFiles>>>,
    pool: Arc<Mutex<Vec<Vec<u8>>>>,
}

impl WriteQueue {
    pub fn start(files: ShardFiles) -> WriteQueue {
        let (tx, rx) = sync_channel::<Job>(DEPTH);
        let pool: Arc<Mutex<Vec<Vec<u8>>>> = Arc::default();
        let returned = Arc::clone(&pool);
        let writer = std::thread::spawn(move || -> Result<ShardFiles> {
            for job in rx {
                // On an error the receiver is dropped with it, so senders fail fast.
                files.write_at(job.shard, job.offset, &job.bytes)?;
                let mut pool = returned.lock().unwrap();
                if pool.len() < POOL {
                    pool.push(job.bytes);
                }
            }
            Ok(files)
        });
        WriteQueue { tx: Some(tx), writer: Some(writer), pool }
    }

    /// An empty buffer, recycled when one is free.
    pub fn buffer(&self) -> Vec<u8> {
        let mut b = self.pool.lock().unwrap().pop().unwrap_or_default();
        b.clear();
        b
    }

    /// Queues `bytes` for writing at `offset` of shard `shard`; blocks while the queue is full.
    pub fn write(&self, shard: usize, offset: u64, bytes: Vec<u8>) -> Result<()> {
        let tx = self.tx.as_ref().expect("queue open until finish");
        tx.send(Job { shard, offset, bytes }).map_err(|_| anyhow!("the output writer stopped"))
    }

    /// Waits for every queued write, then flushes the files. Reports the writer's own error
    /// (rather than "stopped") when it failed.
    pub fn finish(mut self) -> Result<()> {
        self.close()?.finish()
    }

    fn close(&mut self) -> Result<ShardFiles> {
        drop(self.tx.take());
        // A panic is a defect of this tool, not of what it read or wrote: class `failed`.
        let joined = self.writer.take().expect("closed once").join();
        joined.map_err(|_| classified(anyhow!("the output writer panicked"), ErrorCode::Failed))?
    }
}

impl Drop for WriteQueue {
    fn drop(&mut self) {
        if self.writer.is_some() {
            let _ = self.close();
        }
    }
}
