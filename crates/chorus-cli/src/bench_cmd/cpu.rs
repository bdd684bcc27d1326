//! CPU time of processes, from Linux's `/proc/<pid>/stat`, for the
//! benchmarks that report CPU per request (of the load generator and of the
//! system under test, which runs in processes of its own).

/// Linux's clock tick of `/proc/<pid>/stat`'s CPU times (USER_HZ).
const TICKS_PER_SECOND: f64 = 100.0;

/// CPU ticks (see [`TICKS_PER_SECOND`]) of this process and of each of the
/// system's processes, at one moment.
#[derive(Debug, Clone)]
pub(super) struct Cpu {
    pub(super) own: f64,
    pub(super) server: Vec<(u32, f64)>,
}

/// CPU ticks spent over a cell or a row.
#[derive(Debug, Clone, Copy)]
pub(super) struct Spent {
    pub(super) own: f64,
    pub(super) server: f64,
}

impl Cpu {
    /// The ticks so far of this process and of `servers`.
    pub(super) fn now(servers: impl IntoIterator<Item = u32>) -> Cpu {
        Cpu {
            own: cpu_ticks("self"),
            server: servers
                .into_iter()
                .map(|pid| (pid, cpu_ticks(&pid.to_string())))
                .collect(),
        }
    }

    /// What was spent since `before`; a process gone since (killed) counts
    /// what it had spent by `last_seen`.
    pub(super) fn since(&self, before: &Cpu, last_seen: &Cpu) -> Spent {
        let server = before
            .server
            .iter()
            .map(|(pid, start)| {
                let now = [self, last_seen]
                    .iter()
                    .find_map(|cpu| cpu.server.iter().find(|(p, _)| p == pid))
                    .map_or(*start, |(_, ticks)| *ticks);
                now - start
            })
            .sum();
        Spent {
            own: self.own - before.own,
            server,
        }
    }
}

impl Spent {
    /// This process's CPU, in microseconds.
    pub(super) fn own_us(self) -> f64 {
        self.own / TICKS_PER_SECOND * 1e6
    }

    /// The system's processes' CPU, in microseconds.
    pub(super) fn server_us(self) -> f64 {
        self.server / TICKS_PER_SECOND * 1e6
    }

    /// Both, in microseconds.
    pub(super) fn total_us(self) -> f64 {
        self.own_us() + self.server_us()
    }
}

/// User plus system CPU ticks of `/proc/<pid>/stat` (`pid` may be `self`;
/// 0 when unreadable: the process is gone, or this is not Linux).
fn cpu_ticks(pid: &str) -> f64 {
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
    fn a_killed_members_cpu_counts_until_it_was_last_seen() {
        let before = Cpu {
            own: 10.0,
            server: vec![(1, 100.0), (2, 200.0)],
        };
        let last_seen = Cpu {
            own: 15.0,
            server: vec![(1, 130.0), (2, 210.0)],
        };
        // Member 1 was killed after `last_seen`.
        let after = Cpu {
            own: 20.0,
            server: vec![(2, 250.0)],
        };
        let spent = after.since(&before, &last_seen);
        assert_eq!((spent.own, spent.server), (10.0, 30.0 + 50.0));
        assert_eq!(spent.total_us(), 900_000.0);
    }
}
