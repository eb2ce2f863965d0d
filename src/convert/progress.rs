//! Progress on stderr while shards are written.

/// A bar of `total` bytes on stderr when `enabled` and stderr is a terminal; hidden otherwise.
pub fn progress_bar(enabled: bool, total: u64) -> indicatif::ProgressBar {
    use std::io::IsTerminal;
    if !enabled || !std::io::stderr().is_terminal() {
        return indicatif::ProgressBar::hidden();
    }
    let bar = indicatif::ProgressBar::new(total);
    bar.set_style(
        indicatif::ProgressStyle::with_template(
            "{bar:40} {decimal_bytes}/{decimal_total_bytes} {decimal_bytes_per_sec} ETA {eta}",
        )
        .expect("a valid template"),
    );
    bar
}
