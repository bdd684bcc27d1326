//! Standard output for a command's result. `print!` panics when stdout is
//! closed (`chorus lease status | head -1`); these return the error instead,
//! and `main` treats a broken pipe as success (the reader went away).

use std::fmt;
use std::io::{self, Write};

use serde::Serialize;

use crate::CommandError;

/// Like `print!`, returning a write error instead of panicking.
macro_rules! out {
    ($($arg:tt)*) => { $crate::output::write(format_args!($($arg)*), false) };
}

/// Like `println!`, returning a write error instead of panicking.
macro_rules! outln {
    ($($arg:tt)*) => { $crate::output::write(format_args!($($arg)*), true) };
}

pub(crate) use {out, outln};

/// Writes `args` (and a newline) to standard output and flushes it.
pub fn write(args: fmt::Arguments<'_>, newline: bool) -> Result<(), CommandError> {
    write_io(args, newline).map_err(output_error)
}

/// Writes `value` as one JSON line (JSON Lines) and flushes it, so that a
/// consumer sees each line as soon as it is decided.
pub fn json_line(value: &impl Serialize) -> io::Result<()> {
    let json = serde_json::to_string(value).map_err(io::Error::other)?;
    write_io(format_args!("{json}"), true)
}

fn write_io(args: fmt::Arguments<'_>, newline: bool) -> io::Result<()> {
    let mut out = io::stdout().lock();
    out.write_fmt(args)?;
    if newline {
        out.write_all(b"\n")?;
    }
    out.flush()
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
