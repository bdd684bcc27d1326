//! `chorus-bench compare` end to end through the real binary, on a tiny
//! configuration: one rate, short cells, 2 ms stores.

use std::collections::BTreeSet;
use std::process::Command;

use chorus_bench::systems::SystemKind;
use serde_json::Value;

#[test]
fn every_system_produces_rows_floors_and_headlines() {
    let output = Command::new(env!("CARGO_BIN_EXE_chorus-bench"))
        .args([
            "compare",
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
        ])
        .output()
        .expect("chorus-bench runs");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "{stderr}");
    assert!(
        stderr.contains("[1/11] fixed chorus-1 at 250 records/s"),
        "{stderr}"
    );
    let rows: Vec<Value> = String::from_utf8(output.stdout)
        .unwrap()
        .lines()
        .map(|line| serde_json::from_str(line).expect("each line is JSON"))
        .collect();
    let of_kind =
        |kind: &str| -> Vec<&Value> { rows.iter().filter(|r| r["kind"] == kind).collect() };

    let config = of_kind("config");
    assert_eq!(config.len(), 1);
    assert_eq!(config[0]["slo_p99_ms"], 6);

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
    assert_eq!(of_kind("headline").len(), 11);
}
