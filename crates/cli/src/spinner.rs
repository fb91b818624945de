//! The spinner on stderr: any wait of `drover run` over 2 s says what it waits for (only when
//! stderr is a terminal; indicatif draws nothing otherwise).

use std::future::Future;
use std::io::IsTerminal;
use std::time::Duration;

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use tokio::time::Instant;

/// How long a wait is quiet before the spinner shows.
const SHOW_AFTER: Duration = Duration::from_secs(2);

/// A spinner that appears once a wait passes [`SHOW_AFTER`].
pub struct Spinner {
    enabled: bool,
    what: String,
    since: Instant,
    bar: Option<ProgressBar>,
}

impl Spinner {
    /// A hidden spinner; it never shows when stderr is not a terminal.
    pub fn new() -> Spinner {
        Spinner {
            enabled: std::io::stderr().is_terminal(),
            what: String::new(),
            since: Instant::now(),
            bar: None,
        }
    }

    /// What is waited for now.
    pub fn wait(&mut self, what: &str) {
        if self.what != what {
            self.what = what.to_string();
            if let Some(bar) = &self.bar {
                bar.set_message(self.what.clone());
            }
        }
    }

    /// Shows the spinner once the wait is long enough; call it a few times a second.
    pub fn tick(&mut self) {
        if !self.enabled || self.bar.is_some() || self.since.elapsed() < SHOW_AFTER {
            return;
        }
        let bar = ProgressBar::with_draw_target(None, ProgressDrawTarget::stderr());
        if let Ok(style) = ProgressStyle::with_template("{spinner} waiting for {msg} ({elapsed})") {
            bar.set_style(style);
        }
        bar.set_message(self.what.clone());
        bar.enable_steady_tick(Duration::from_millis(100));
        self.bar = Some(bar);
    }

    /// Hides the spinner (before other output) and starts a new wait.
    pub fn clear(&mut self) {
        if let Some(bar) = self.bar.take() {
            bar.finish_and_clear();
        }
        self.since = Instant::now();
    }

    /// Runs `f` with a spinner saying it waits for `what`.
    pub async fn during<T>(what: &str, f: impl Future<Output = T>) -> T {
        let mut spinner = Spinner::new();
        spinner.wait(what);
        tokio::pin!(f);
        let mut tick = tokio::time::interval(Duration::from_millis(200));
        loop {
            tokio::select! {
                v = &mut f => {
                    spinner.clear();
                    return v;
                }
                _ = tick.tick() => spinner.tick(),
            }
        }
    }
}

impl Drop for Spinner {
    fn drop(&mut self) {
        self.clear();
    }
}
