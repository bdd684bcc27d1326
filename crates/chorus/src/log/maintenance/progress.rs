//! Progress reporting for long maintenance runs (the CLI draws bars from it).

/// Receives progress of a long operation. Implementations must be cheap.
pub trait Progress: Send + Sync {
    /// A phase begins with `total` units of work.
    fn begin(&self, phase: &str, total: u64);
    /// `units` more units are done.
    fn advance(&self, units: u64);
    /// The phase ended.
    fn end(&self);
}

/// Ignores progress.
#[derive(Debug, Clone, Copy, Default)]
pub struct NoProgress;

impl Progress for NoProgress {
    fn begin(&self, _phase: &str, _total: u64) {}
    fn advance(&self, _units: u64) {}
    fn end(&self) {}
}
