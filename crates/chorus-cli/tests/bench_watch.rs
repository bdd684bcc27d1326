//! End-to-end test of `chorus bench watch` through the real binary, on a
//! tiny load: one JSON row per target, every acknowledged put delivered to
//! every watcher.

mod support;

use serde_json::Value;
use tempfile::TempDir;

#[test]
fn bench_watch_delivers_every_event_to_every_watcher_and_prints_one_row_per_target() {
    let dir = TempDir::new().unwrap();
    let output = support::chorus_command(dir.path())
        .args(["bench", "watch", "--json", "--latency-ms", "1"])
        .args(["--watchers", "3", "--rate", "100", "--seconds", "1"])
        .args(["--put-connections", "2"])
        .output()
        .expect("chorus runs");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "{stderr}");
    assert!(stderr.contains("opening 3 watchers"), "progress: {stderr}");
    let rows: Vec<Value> = String::from_utf8(output.stdout)
        .unwrap()
        .lines()
        .map(|line| serde_json::from_str(line).expect("a JSON row"))
        .collect();
    let systems: Vec<&str> = rows.iter().map(|r| r["system"].as_str().unwrap()).collect();
    assert_eq!(systems, ["chorus-3-1ms", "chorus-3-local"], "{rows:?}");
    for row in &rows {
        assert_eq!(row["workload"], "watch", "{row}");
        assert_eq!(row["clients"], 3, "{row}");
        assert_eq!(row["errors"], 0, "{row}");
        assert_eq!(row["missing"], 0, "{row}");
        // 100 puts, each delivered to 3 watchers.
        assert_eq!(row["deliveries"], 300, "{row}");
        let (p50, p99, max) = (
            row["p50_ms"].as_f64().unwrap(),
            row["p99_ms"].as_f64().unwrap(),
            row["max_ms"].as_f64().unwrap(),
        );
        assert!(0.0 <= p50 && p50 <= p99 && p99 <= max, "{row}");
        assert!(row["put_p50_ms"].as_f64().unwrap() > 0.0, "{row}");
    }
}
