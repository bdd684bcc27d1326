//! JSON Lines on standard output: one object per line, flushed per line, so a
//! consumer sees each line as soon as it is decided.

use std::io::{self, Write};

use serde::Serialize;

use crate::CommandError;

/// Standard output as a stream of JSON lines.
#[derive(Debug)]
pub struct JsonLines {
    out: io::Stdout,
}

impl JsonLines {
    /// JSON lines on standard output.
    pub fn stdout() -> JsonLines {
        JsonLines { out: io::stdout() }
    }

    /// Writes `value` as one line and flushes it.
    pub fn write(&mut self, value: &impl Serialize) -> io::Result<()> {
        let mut line = serde_json::to_vec(value).map_err(io::Error::other)?;
        line.push(b'\n');
        let mut out = self.out.lock();
        out.write_all(&line)?;
        out.flush()
    }
}

/// The command error for a failed write to standard output. A broken pipe is
/// passed through as it is, so that `main` treats it as success (the reader
/// went away, as with `chorus log read | head`).
pub fn output_error(error: io::Error) -> CommandError {
    if error.kind() == io::ErrorKind::BrokenPipe {
        Box::new(error)
    } else {
        format!("cannot write to standard output: {error}").into()
    }
}
