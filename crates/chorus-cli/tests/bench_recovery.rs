//! End-to-end test of `chorus bench recovery` through the real binary, on a
//! tiny configuration: the rows it prints describe the logs it built, and
//! every log read back whole (the command checks the reader's and the
//! replay's byte counts itself).

mod support;

use serde_json::Value;
use tempfile::TempDir;

#[test]
fn bench_recovery_prints_one_row_per_cell_with_its_repetitions() {
    let dir = TempDir::new().unwrap();
    let output = support::chorus_command(dir.path())
        .args(["bench", "recovery", "--json", "--latency-ms", "1"])
        .args(["--record-bytes", "1024", "--repetitions", "2"])
        .args([
            "--sealed",
            "3,1",
            "--active",
            "0,20KiB",
            "--segment",
            "8KiB",
        ])
        .args(["--replay-segments", "0"])
        .output()
        .expect("chorus runs");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "{stderr}");
    assert!(stderr.contains("cell 4/4"), "progress on stderr: {stderr}");
    let rows: Vec<Value> = String::from_utf8(output.stdout)
        .unwrap()
        .lines()
        .map(|line| serde_json::from_str(line).expect("a JSON row"))
        .collect();
    let cells: Vec<(u64, u64)> = rows
        .iter()
        .map(|row| {
            (
                row["sealed_segments"].as_u64().unwrap(),
                row["active_bytes"].as_u64().unwrap(),
            )
        })
        .collect();
    assert_eq!(
        cells,
        [(1, 0), (3, 0), (1, 20 * 1024), (3, 20 * 1024)],
        "{rows:?}"
    );
    // 8 KiB segments hold 8 framed 1 KiB records; 20 KiB active is 20 records.
    let log_bytes: Vec<u64> = rows
        .iter()
        .map(|row| row["log_bytes"].as_u64().unwrap())
        .collect();
    assert_eq!(log_bytes, [8 * 1024, 24 * 1024, 28 * 1024, 44 * 1024]);
    for row in &rows {
        assert_eq!(row["repetitions"], 2, "{row}");
        assert_eq!(row["segment_bytes"], 8 * 1024, "{row}");
        for metric in [
            "open_ms",
            "recovery_ms",
            "reader_open_ms",
            "replay_mb_per_s",
        ] {
            let spread = &row[metric];
            let (min, median, max) = (
                spread["min"].as_f64().unwrap(),
                spread["median"].as_f64().unwrap(),
                spread["max"].as_f64().unwrap(),
            );
            assert!(
                0.0 < min && min <= median && median <= max,
                "{metric}: {row}"
            );
        }
        // Every open waits on the injected latency at least once.
        assert!(row["open_ms"]["min"].as_f64().unwrap() >= 1.0, "{row}");
    }
    // Each active size's first cell (fewest sealed) is its own baseline.
    for first in [&rows[0], &rows[2]] {
        assert_eq!(first["open_vs_fewest_sealed"]["min"], 1.0, "{first}");
        assert_eq!(first["open_vs_fewest_sealed"]["median"], 1.0, "{first}");
    }
    assert!(rows[1]["open_vs_fewest_sealed"]["min"].as_f64().unwrap() > 0.0);
}
