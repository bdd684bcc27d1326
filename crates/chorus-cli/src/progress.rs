//! Progress of long operations on stderr: a bar on a terminal, plain lines
//! otherwise (so logs and CI output stay readable).

use std::io::IsTerminal;
use std::sync::Mutex;

use chorus::log::maintenance::Progress;
use indicatif::{ProgressBar, ProgressStyle};

/// Draws library progress for the terminal or as plain lines.
#[derive(Debug)]
pub struct CliProgress {
    terminal: bool,
    state: Mutex<Option<Phase>>,
}

#[derive(Debug)]
struct Phase {
    name: String,
    total: u64,
    done: u64,
    bar: Option<ProgressBar>,
}

impl CliProgress {
    /// Progress on stderr, as a bar if stderr is a terminal.
    pub fn stderr() -> CliProgress {
        CliProgress {
            terminal: std::io::stderr().is_terminal(),
            state: Mutex::new(None),
        }
    }
}

impl Progress for CliProgress {
    fn begin(&self, phase: &str, total: u64) {
        let bar = self.terminal.then(|| {
            let bar = ProgressBar::new(total);
            let style = ProgressStyle::with_template("{msg:32} [{bar:30}] {pos}/{len} {elapsed}")
                .expect("template is valid")
                .progress_chars("=> ");
            bar.set_style(style);
            bar.set_message(phase.to_owned());
            bar
        });
        if bar.is_none() {
            eprintln!("{phase}: 0/{total}");
        }
        *self.state.lock().expect("progress poisoned") = Some(Phase {
            name: phase.to_owned(),
            total,
            done: 0,
            bar,
        });
    }

    fn advance(&self, units: u64) {
        if let Some(phase) = self.state.lock().expect("progress poisoned").as_mut() {
            phase.done += units;
            if let Some(bar) = &phase.bar {
                bar.inc(units);
            }
        }
    }

    fn end(&self) {
        if let Some(phase) = self.state.lock().expect("progress poisoned").take() {
            match phase.bar {
                Some(bar) => bar.finish(),
                None => eprintln!("{}: {}/{} done", phase.name, phase.done, phase.total),
            }
        }
    }
}
