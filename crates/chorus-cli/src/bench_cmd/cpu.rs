//! CPU time of processes, from Linux's `/proc/<pid>/stat`, for the
//! benchmarks that report CPU per request (of the load generator and of the
//! system under test, which runs in processes of its own).

/// Linux's clock tick of `/proc/<pid>/stat`'s CPU times (USER_HZ).
pub(super) const TICKS_PER_SECOND: f64 = 100.0;

/// User plus system CPU ticks of `/proc/<pid>/stat` (`pid` may be `self`;
/// 0 when unreadable: the process is gone, or this is not Linux).
pub(super) fn cpu_ticks(pid: &str) -> f64 {
    let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
        return 0.0;
    };
    // The fields after the command (which may hold spaces) start at the
    // state, field 3; utime and stime are fields 14 and 15.
    let Some((_, fields)) = stat.rsplit_once(')') else {
        return 0.0;
    };
    let fields: Vec<&str> = fields.split_whitespace().collect();
    let field = |n: usize| {
        fields
            .get(n - 3)
            .and_then(|f| f.parse::<f64>().ok())
            .unwrap_or(0.0)
    };
    field(14) + field(15)
}

/// Microseconds of CPU per request: `ticks` spent over `requests`.
pub(super) fn micros_per_request(ticks: f64, requests: u64) -> f64 {
    if requests == 0 {
        0.0
    } else {
        ticks / TICKS_PER_SECOND * 1e6 / requests as f64
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn this_process_has_spent_cpu() {
        let mut spin = 0_u64;
        for n in 0..50_000_000_u64 {
            spin = spin.wrapping_add(n * n);
        }
        std::hint::black_box(spin);
        assert!(cpu_ticks("self") > 0.0);
        assert_eq!(cpu_ticks("0"), 0.0);
    }

    #[test]
    fn ticks_per_request_in_microseconds() {
        assert_eq!(micros_per_request(100.0, 1_000_000), 1.0);
        assert_eq!(micros_per_request(5.0, 0), 0.0);
    }
}
