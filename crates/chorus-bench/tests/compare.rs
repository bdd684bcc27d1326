//! `chorus-bench compare` end to end through the real binary, on a tiny
//! configuration: one rate, short cells, 2 ms stores.

use std::collections::BTreeSet;
use std::path::Path;
use std::process::Command;

use chorus::register::DEFAULT_WINDOW;
use chorus_bench::systems::SystemKind;
use serde_json::Value;

#[test]
fn every_system_produces_rows_floors_and_headlines_and_the_saved_rows_plot() {
    let dir = tempfile::tempdir().unwrap();
    let saved = dir.path().join("compare.jsonl");
    let output = Command::new(env!("CARGO_BIN_EXE_chorus-bench"))
        .arg("compare")
        .arg("--save")
        .arg(&saved)
        .args([
            "--json",
            "--rates",
            "250",
            "--cell-ms",
            "200",
            "--latency-ms",
            "2",
            "--scenarios",
            "fixed,one-slow",
            "--drain-ms",
            "3000",
            "--warm-heap-mib",
            "64",
        ])
        .output()
        .expect("chorus-bench runs");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "{stderr}");
    // Every system at fixed latency, three in the one-slow scenario.
    let groups = SystemKind::ALL.len() + 3;
    assert!(
        stderr.contains(&format!("[1/{groups}] fixed chorus-1 at 250 records/s")),
        "{stderr}"
    );
    assert!(stderr.contains("warming 64 MiB of heap"), "{stderr}");
    let stdout = String::from_utf8(output.stdout).unwrap();
    assert_eq!(
        std::fs::read_to_string(&saved).unwrap(),
        stdout,
        "--save holds exactly the rows printed"
    );
    let rows: Vec<Value> = stdout
        .lines()
        .map(|line| serde_json::from_str(line).expect("each line is JSON"))
        .collect();
    let of_kind =
        |kind: &str| -> Vec<&Value> { rows.iter().filter(|r| r["kind"] == kind).collect() };

    let config = of_kind("config");
    assert_eq!(config.len(), 1);
    assert_eq!(config[0]["slo_p99_ms"], 6);
    // The row reports the Chorus settings the cells ran with: the defaults.
    assert_eq!(config[0]["chorus_window"], DEFAULT_WINDOW);
    assert_eq!(config[0]["chorus_pace_fragments"], true);
    assert_eq!(config[0]["warm_heap_mib"], 64);

    let cells = of_kind("cell");
    let systems = |scenario: &str| -> BTreeSet<String> {
        cells
            .iter()
            .filter(|c| c["scenario"] == scenario)
            .map(|c| c["system"].as_str().unwrap().to_owned())
            .collect()
    };
    let all = SystemKind::ALL.iter().map(|system| system.name()).collect();
    assert_eq!(systems("fixed"), all);
    assert_eq!(
        systems("one-slow"),
        ["chorus-3", "chorus-5", "naive-3"].map(String::from).into()
    );
    for cell in &cells {
        assert_eq!(cell["records"], 50, "{cell}");
        assert_eq!(cell["acked"], 50, "{cell}");
        assert_eq!(cell["failed"], 0, "{cell}");
        assert!(cell["p50_ms"].as_f64().unwrap() >= 2.0, "{cell}");
        assert!(
            cell["requests"]["put_class"].as_u64().unwrap() > 0,
            "{cell}"
        );
        assert!(
            cell["usd_per_gb_s3_standard"].as_f64().unwrap() > 0.0,
            "{cell}"
        );
        assert!(cell["cpu_us_per_record"].as_f64().unwrap() > 0.0, "{cell}");
    }

    let floors: BTreeSet<_> = of_kind("floor")
        .iter()
        .map(|f| {
            (
                f["scenario"].to_string(),
                f["stores"].as_u64(),
                f["quorum"].as_u64(),
            )
        })
        .collect();
    assert_eq!(floors.len(), 5, "fixed: 1/1, 2/3, 3/5; one-slow: 2/3, 3/5");
    assert_eq!(of_kind("headline").len(), groups);

    plots_are_drawn_from(&saved, dir.path());
}

/// `plot` draws every chart from the saved run (and a recovery run), each
/// an SVG naming what it shows.
fn plots_are_drawn_from(saved: &Path, dir: &Path) {
    let recovery = dir.join("recovery.jsonl");
    let rows: String = [(1, 0), (100, 0), (1, 1 << 20), (100, 1 << 20)]
        .iter()
        .map(|(sealed, active)| {
            format!(
                "{{\"sealed_segments\":{sealed},\"segment_bytes\":1048576,\"active_bytes\":{active},\
                 \"open_ms\":{{\"min\":240.0,\"median\":250.0,\"max\":260.0}}}}\n"
            )
        })
        .collect();
    std::fs::write(&recovery, rows).unwrap();
    let out = dir.join("plots");
    let output = Command::new(env!("CARGO_BIN_EXE_chorus-bench"))
        .arg("plot")
        .arg("--compare")
        .arg(saved)
        .arg("--recovery")
        .arg(&recovery)
        .arg("--out")
        .arg(&out)
        .output()
        .expect("chorus-bench runs");
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    for (file, must_name) in [
        ("latency.svg", "chorus-3"),
        ("sustained.svg", "slatedb-1ms"),
        ("cost.svg", "naive-3"),
        ("recovery.svg", "active 1 MiB"),
    ] {
        let svg = std::fs::read_to_string(out.join(file)).unwrap();
        assert!(svg.starts_with("<svg"), "{file}");
        assert!(svg.contains(must_name), "{file} names {must_name}");
    }

    let missing = Command::new(env!("CARGO_BIN_EXE_chorus-bench"))
        .args(["plot", "--compare", "/nonexistent.jsonl", "--out"])
        .arg(&out)
        .output()
        .unwrap();
    assert!(!missing.status.success());
    assert!(String::from_utf8_lossy(&missing.stderr).contains("/nonexistent.jsonl"));
}

/// `--virtual-time` runs chorus-N and naive-N on a paused clock, leaves
/// SlateDB out with a note, says so in the config row, and a second run
/// with the same seed prints the same latencies: 20 virtual seconds of
/// cells in a fraction of that.
#[test]
fn on_virtual_time_a_run_leaves_slatedb_out_and_repeats_for_its_seed() {
    let run = || {
        let output = Command::new(env!("CARGO_BIN_EXE_chorus-bench"))
            .arg("compare")
            .args([
                "--virtual-time",
                "--json",
                "--rates",
                "500",
                "--cell-ms",
                "10000",
                "--latency-ms",
                "100",
                "--scenarios",
                "log-normal",
                "--systems",
                "chorus-3,naive-3,slatedb-10ms",
                "--warm-heap-mib",
                "0",
            ])
            .output()
            .expect("chorus-bench runs");
        let stderr = String::from_utf8_lossy(&output.stderr).into_owned();
        assert!(output.status.success(), "{stderr}");
        assert!(
            stderr.contains("--virtual-time: SlateDB's systems left out"),
            "{stderr}"
        );
        let rows: Vec<Value> = String::from_utf8(output.stdout)
            .unwrap()
            .lines()
            .map(|line| serde_json::from_str(line).expect("each line is JSON"))
            .collect();
        assert_eq!(rows[0]["kind"], "config");
        assert_eq!(rows[0]["virtual_time"], true);
        let cells: Vec<(String, f64, f64, u64)> = rows
            .iter()
            .filter(|row| row["kind"] == "cell")
            .map(|row| {
                (
                    row["system"].as_str().unwrap().to_owned(),
                    row["p50_ms"].as_f64().unwrap(),
                    row["p99_ms"].as_f64().unwrap(),
                    row["acked"].as_u64().unwrap(),
                )
            })
            .collect();
        let systems: Vec<&str> = cells.iter().map(|cell| cell.0.as_str()).collect();
        assert_eq!(systems, ["chorus-3", "naive-3"]);
        for (system, p50, p99, acked) in &cells {
            assert_eq!(*acked, 5000, "{system}");
            // A quorum of 100 ms median stores, in virtual milliseconds.
            assert!(
                *p50 >= 50.0 && *p99 > *p50,
                "{system}: p50 {p50}, p99 {p99}"
            );
        }
        cells
    };
    assert_eq!(run(), run(), "the same seed, the same latencies");
}
