//! End-to-end test of `chorus bench takeover` through the real binary, at
//! tiny sizes: one row per state size and scenario, each takeover checked by
//! the command itself (the marker and a sample of the keys survive it).

mod support;

use serde_json::Value;
use tempfile::TempDir;

#[test]
fn bench_takeover_prints_one_row_per_size_and_scenario() {
    let dir = TempDir::new().unwrap();
    let output = support::chorus_command(dir.path())
        .args(["bench", "takeover", "--json", "--keys", "10,1500"])
        .args([
            "--runs",
            "1",
            "--lease-ttl-secs",
            "2",
            "--value-bytes",
            "20",
        ])
        .output()
        .expect("chorus runs");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "{stderr}");
    assert!(stderr.contains("loading 1500 keys"), "progress: {stderr}");
    let rows: Vec<Value> = String::from_utf8(output.stdout)
        .unwrap()
        .lines()
        .map(|line| serde_json::from_str(line).expect("a JSON row"))
        .collect();
    let cells: Vec<(u64, &str)> = rows
        .iter()
        .map(|row| {
            (
                row["keys"].as_u64().unwrap(),
                row["scenario"].as_str().unwrap(),
            )
        })
        .collect();
    assert_eq!(
        cells,
        [(10, "warm"), (10, "cold"), (1500, "warm"), (1500, "cold")]
    );
    for row in &rows {
        assert_eq!(row["runs"], 1, "{row}");
        let takeover = &row["takeover_ms"];
        assert!(takeover["min"].as_f64().unwrap() > 0.0, "{row}");
        assert_eq!(takeover["min"], takeover["max"], "one run: {row}");
        for phase in ["restore", "claim_head", "recover_log", "replay"] {
            assert!(
                row["phases_ms"][phase]["median"].is_number(),
                "{phase}: {row}"
            );
        }
        assert!(row["encode_ms"]["median"].as_f64().unwrap() >= 0.0, "{row}");
        if cfg!(target_os = "linux") {
            assert!(row["peak_rss_mib"]["max"].as_f64().unwrap() > 0.0, "{row}");
        }
    }
    // 1500 keys of 20-byte values: HEAD holds them all.
    assert!(
        rows[3]["snapshot_bytes"].as_u64().unwrap() > 1500 * 20,
        "{:?}",
        rows[3]
    );
}
