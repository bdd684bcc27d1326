//! A deterministic simulator for the Chorus replicated log.
//!
//! One *run* is a pure function of its seed: a cluster of in-memory replicas
//! and an in-memory register behind the product's fault-injecting wrappers,
//! driven by a seeded schedule of appends, crashes, recoveries, reads and
//! faults on a current-thread tokio runtime whose clock is paused (virtual
//! time). Checkers that are separate from the system under test look at the
//! raw stores, the raw register and everything the application was told after
//! every step. See `docs/testing.md` for the fault model and the checkers.
#![warn(missing_docs)]

mod actions;
pub mod actors;
pub mod check;
pub mod control;
mod executor;
pub mod faults;
pub mod lease;
pub mod model;
pub mod params;
pub mod runner;
pub mod runtime;
pub mod sim;
pub mod trace;
pub mod world;

pub use runner::{BatchSummary, SeedResult, check_seed, replay_command, run_batch, run_once};
pub use sim::{Failure, RunReport, SimOptions, Stats};
