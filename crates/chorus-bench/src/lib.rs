//! Side-by-side benchmarks of Chorus against the alternatives a user would
//! otherwise pick (SlateDB, a naive one-object-per-record log) and against
//! the physical floor of the stores themselves, on the same
//! latency-injecting in-memory stores, in one process and one run.
//!
//! Kept out of the `chorus` binary so that SlateDB stays out of the product.
//! The protocol decisions (schedules, percentiles, the quorum floor, cost
//! arithmetic, the sustain criterion) are small pure functions in their own
//! modules; [`compare`] wires them to the systems.

pub mod compare;
pub mod cost;
pub mod driver;
pub mod etcd_plot;
pub mod floor;
pub mod heap;
pub mod models;
pub mod plan;
pub mod plot;
pub mod report;
pub mod schedule;
pub mod stats;
pub mod store;
pub mod systems;
pub mod usage;
pub mod verdict;
