//! A run's progress bar on the terminal.

use std::io::IsTerminal;
use std::time::Duration;

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};

/// Progress of a run on the terminal: one bar per phase (raw echo, each
/// point) on stderr, removed before the phase's result is printed; nothing
/// at all when stderr is not a terminal.
#[derive(Debug)]
pub struct Progress {
    visible: bool,
    bar: std::cell::RefCell<Option<ProgressBar>>,
    /// Tenths of a second shown last (the bar redraws only when it moves).
    shown: std::cell::Cell<u64>,
}

impl Progress {
    /// Bars on stderr if stderr is a terminal, otherwise none.
    pub fn new() -> Progress {
        Progress {
            visible: std::io::stderr().is_terminal(),
            bar: std::cell::RefCell::new(None),
            shown: std::cell::Cell::new(u64::MAX),
        }
    }

    /// A progress that never draws.
    pub fn hidden() -> Progress {
        Progress {
            visible: false,
            ..Progress::new()
        }
    }

    /// Starts a phase of `total` wall time.
    pub fn phase(&self, name: &str, total: Duration) {
        self.clear();
        if !self.visible {
            return;
        }
        let bar = ProgressBar::with_draw_target(
            Some(total.as_millis().max(1) as u64),
            ProgressDrawTarget::stderr(),
        );
        if let Ok(style) = ProgressStyle::with_template("{prefix:>10} [{bar:30}] {msg}") {
            bar.set_style(style.progress_chars("=> "));
        }
        bar.set_prefix(name.to_string());
        self.shown.set(u64::MAX);
        *self.bar.borrow_mut() = Some(bar);
    }

    /// `done` of the phase has passed. Cheap when nothing is drawn: the
    /// measurement loop calls it often.
    #[inline]
    pub fn tick(&self, done: Duration) {
        if !self.visible {
            return;
        }
        let tenths = done.as_millis() as u64 / 100;
        if tenths != self.shown.get() {
            self.shown.set(tenths);
            if let Some(bar) = self.bar.borrow().as_ref() {
                bar.set_position(done.as_millis() as u64);
                bar.set_message(format!("{:.1} s", done.as_secs_f64()));
            }
        }
    }

    /// Removes the phase's bar (before printing its result).
    pub fn clear(&self) {
        if let Some(bar) = self.bar.borrow_mut().take() {
            bar.finish_and_clear();
        }
    }

    /// Runs `f` with any bar out of the way, so printed lines do not mix
    /// with it.
    pub fn suspend<R>(&self, f: impl FnOnce() -> R) -> R {
        match self.bar.borrow().as_ref() {
            Some(bar) => bar.suspend(f),
            None => f(),
        }
    }
}

impl Default for Progress {
    fn default() -> Self {
        Progress::new()
    }
}
