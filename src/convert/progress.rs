//! Progress on stderr while shards are written: a bar on a terminal; in a log (a CI job, stderr
//! redirected) a plain line at every 10% and at least every 10 s, so a batch job shows life.

use crate::text::human_bytes;
use indicatif::{ProgressBar, ProgressStyle};
use std::io::{IsTerminal, Write};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// The longest a log stays silent.
const LOG_EVERY: Duration = Duration::from_secs(10);

pub enum Progress {
    Bar(ProgressBar),
    Log(Log),
    Silent,
}

pub struct Log {
    total: u64,
    done: AtomicU64,
    started: Instant,
    /// The last tenth reported and when the last line was printed.
    last: Mutex<(u64, Instant)>,
}

impl Progress {
    /// Progress over `total` bytes: nothing unless `enabled`, nor when there is nothing to write
    /// (an empty `--part`), which would report 0% and an infinite ETA.
    pub fn new(enabled: bool, total: u64) -> Progress {
        if !enabled || total == 0 {
            return Progress::Silent;
        }
        if !std::io::stderr().is_terminal() {
            let now = Instant::now();
            return Progress::Log(Log { total, done: AtomicU64::new(0), started: now, last: Mutex::new((0, now)) });
        }
        let bar = ProgressBar::new(total);
        bar.set_style(
            ProgressStyle::with_template(
                "{bar:40} {decimal_bytes}/{decimal_total_bytes} {decimal_bytes_per_sec} ETA {eta}",
            )
            .expect("a valid template"),
        );
        Progress::Bar(bar)
    }

    /// `n` more bytes are written.
    pub fn inc(&self, n: u64) {
        match self {
            Progress::Bar(bar) => bar.inc(n),
            Progress::Log(log) => log.inc(n),
            Progress::Silent => {}
        }
    }

    pub fn finish(&self) {
        match self {
            Progress::Bar(bar) => bar.finish_and_clear(),
            Progress::Log(log) => log.line(log.total, Instant::now()),
            Progress::Silent => {}
        }
    }
}

impl Log {
    fn inc(&self, n: u64) {
        let done = self.done.fetch_add(n, Ordering::Relaxed) + n;
        let tenth = done.saturating_mul(10) / self.total.max(1);
        let Ok(mut last) = self.last.try_lock() else { return };
        let now = Instant::now();
        if tenth <= last.0 && now.duration_since(last.1) < LOG_EVERY {
            return;
        }
        *last = (tenth.max(last.0), now);
        self.line(done, now);
    }

    fn line(&self, done: u64, now: Instant) {
        let elapsed = now.duration_since(self.started).as_secs_f64().max(1e-9);
        let rate = done as f64 / elapsed;
        let eta = if rate > 0.0 { self.total.saturating_sub(done) as f64 / rate } else { f64::INFINITY };
        let _ = writeln!(
            std::io::stderr(),
            "escha-convert: {:>3}% written ({} of {}, {}/s, ETA {:.0} s)",
            done.saturating_mul(100) / self.total.max(1),
            human_bytes(done),
            human_bytes(self.total),
            human_bytes(rate as u64),
            eta
        );
    }
}
