//! JSON Lines on standard output: one object per line, flushed per line, so a
//! consumer sees each line as soon as it is decided.

use std::io::{self, Write};

use serde::Serialize;

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
