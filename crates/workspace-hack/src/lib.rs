//! No code. This crate's dependencies ask for the features the workspace's
//! dev-dependencies turn on in crates the product also uses, so that
//! `cargo build --workspace` and `cargo test` resolve one feature set and a
//! clean build compiles each of those crates (and everything above them)
//! once; see `Cargo.toml`.
