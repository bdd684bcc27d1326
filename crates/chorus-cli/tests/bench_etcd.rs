//! End-to-end tests of `chorus bench etcd` through the real binary: the
//! quick put cells of Chorus at 10 ms, its range cells and its failover
//! (each Chorus a primary and a standby `chorus serve` process), and one
//! cell against a real three-member etcd (skipped outside CI when there is
//! no etcd; failing under CI).

mod support;

use serde_json::Value;
use tempfile::TempDir;

/// Runs `chorus bench etcd --json` with `flags` and returns its rows.
fn bench_rows(flags: &[&str]) -> Vec<Value> {
    let dir = TempDir::new().unwrap();
    let output = support::chorus_command(dir.path())
        .args(["bench", "etcd", "--json"])
        .args(flags)
        .output()
        .expect("chorus runs");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "{stderr}");
    String::from_utf8(output.stdout)
        .unwrap()
        .lines()
        .map(|line| serde_json::from_str(line).expect("a JSON row"))
        .collect()
}

/// Asserts the fields every row has, and that the cell did work.
fn assert_measured(row: &Value) {
    for field in [
        "system",
        "workload",
        "clients",
        "per_second",
        "p50_ms",
        "p99_ms",
    ] {
        assert!(row.get(field).is_some(), "{field} missing: {row}");
    }
    assert_eq!(row["errors"], 0, "{row}");
    assert!(row["per_second"].as_f64().unwrap() > 0.0, "{row}");
    let (p50, p99) = (
        row["p50_ms"].as_f64().unwrap(),
        row["p99_ms"].as_f64().unwrap(),
    );
    assert!(0.0 < p50 && p50 <= p99, "{row}");
    assert!(row["cpu_us_per_op"].as_f64().unwrap() > 0.0, "{row}");
    // Every system runs in processes of its own, whose CPU is counted.
    assert!(row["server_cpu_us_per_op"].as_f64().unwrap() > 0.0, "{row}");
}

/// Asserts a measured row of `workload` on `system`.
fn assert_cell(row: &Value, system: &str, workload: &str) {
    assert_eq!(row["system"], system, "{row}");
    assert_eq!(row["workload"], workload, "{row}");
    assert_measured(row);
}

#[test]
fn quick_puts_on_chorus_at_10ms_print_one_row_per_client_count() {
    let rows = bench_rows(&[
        "--quick",
        "--systems",
        "chorus-3-10ms",
        "--workloads",
        "put",
    ]);
    let clients: Vec<u64> = rows
        .iter()
        .map(|r| r["clients"].as_u64().unwrap())
        .collect();
    assert_eq!(clients, [1, 64, 1000], "{rows:?}");
    for row in &rows {
        assert_cell(row, "chorus-3-10ms", "put");
        // Every put waits for a quorum of replicas 10 ms away.
        assert!(row["p50_ms"].as_f64().unwrap() >= 10.0, "{row}");
    }
}

#[test]
fn a_real_etcd_cluster_is_started_measured_and_its_cpu_counted() {
    let Some(etcd) = support::etcd::etcd_binary() else {
        return;
    };
    let etcd = etcd.to_str().expect("a UTF-8 path").to_owned();
    let rows = bench_rows(&[
        "--seconds",
        "1",
        "--systems",
        "etcd-3",
        "--workloads",
        "range-serializable",
        "--etcd-binary",
        &etcd,
    ]);
    assert_ranges(&rows, "etcd-3", "range-serializable");
}

/// Asserts the two range cells of a workload: one key with 1,000 clients,
/// then a 1,000-key prefix with 64.
fn assert_ranges(rows: &[Value], system: &str, workload: &str) {
    let cells: Vec<(u64, u64)> = rows
        .iter()
        .map(|r| (r["keys"].as_u64().unwrap(), r["clients"].as_u64().unwrap()))
        .collect();
    assert_eq!(cells, [(1, 1000), (1000, 64)], "{rows:?}");
    for row in rows {
        assert_cell(row, system, workload);
    }
}

#[test]
fn linearizable_ranges_of_a_key_and_a_prefix_on_chorus_answer_every_key() {
    let rows = bench_rows(&[
        "--seconds",
        "1",
        "--systems",
        "chorus-3-local",
        "--workloads",
        "range-linearizable",
    ]);
    assert_ranges(&rows, "chorus-3-local", "range-linearizable");
}

#[test]
fn after_a_sigkill_of_the_primary_every_client_writes_again_through_the_standby() {
    let rows = bench_rows(&["--systems", "chorus-3-local", "--workloads", "failover"]);
    assert_eq!(rows.len(), 1, "{rows:?}");
    let row = &rows[0];
    assert_eq!(row["workload"], "failover", "{row}");
    assert_eq!(row["unresumed"], 0, "{row}");
    // The standby waits out the killed primary's lease (10 s from its
    // last renewal) before it takes writes.
    assert!(row["resume_ms"].as_f64().unwrap() > 0.0, "{row}");
}

#[test]
fn a_missing_etcd_binary_is_named() {
    let dir = TempDir::new().unwrap();
    let output = support::chorus_command(dir.path())
        .args(["bench", "etcd", "--quick", "--systems", "etcd-3"])
        .args(["--etcd-binary", "/nonexistent/etcd"])
        .output()
        .expect("chorus runs");
    assert!(!output.status.success());
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.contains("cannot run etcd (/nonexistent/etcd)"),
        "{stderr}"
    );
}

#[test]
fn a_service_running_elsewhere_is_driven_through_its_endpoint_with_its_cpu_counted() {
    let dir = TempDir::new().unwrap();
    let listen = format!("127.0.0.1:{}", support::etcd::free_port());
    let server = support::server::Launch::new(dir.path())
        .args(["--etcd-listen", &listen])
        .start("chorus");
    server.wait_for_role("primary");
    let rows = bench_rows(&[
        "--seconds",
        "1",
        "--endpoints",
        &format!("http://{listen}"),
        "--server-pid",
        &server.pid().to_string(),
        "--workloads",
        "range-serializable",
    ]);
    assert_ranges(&rows, "endpoints", "range-serializable");
}

#[test]
fn endpoints_refuse_the_failover_workload_by_name() {
    let dir = TempDir::new().unwrap();
    let output = support::chorus_command(dir.path())
        .args(["bench", "etcd", "--endpoints", "http://127.0.0.1:1"])
        .args(["--workloads", "put,failover"])
        .output()
        .expect("chorus runs");
    assert!(!output.status.success());
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("failover"), "{stderr}");
    assert!(
        output.stdout.is_empty(),
        "nothing measured before the refusal"
    );
}
