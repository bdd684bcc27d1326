//! Where the test services are: the library's test helpers, shared so both
//! crates follow the same rules (skip outside CI, fail loudly under CI).

#[path = "../../../chorus/tests/support/mod.rs"]
mod shared;

pub use shared::*;
