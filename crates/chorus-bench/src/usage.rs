//! Process resource usage: CPU time (getrusage) and resident memory (`VmRSS`
//! and its peak `VmHWM`, which Linux lets a process reset through
//! `clear_refs`, so each cell reports its own peak).

use std::time::Duration;

/// CPU time (user + system) the whole process has used so far.
pub fn cpu_time() -> Duration {
    // SAFETY: getrusage only writes the struct we pass; all-zero bytes are a
    // valid `rusage`.
    let usage = unsafe {
        let mut usage: libc::rusage = std::mem::zeroed();
        libc::getrusage(libc::RUSAGE_SELF, &mut usage);
        usage
    };
    let time = |t: libc::timeval| {
        Duration::from_secs(t.tv_sec as u64) + Duration::from_micros(t.tv_usec as u64)
    };
    time(usage.ru_utime) + time(usage.ru_stime)
}

/// Starts a new peak-RSS window. Returns false where the kernel does not
/// allow it (not Linux, or an old kernel): peaks then cover the whole run.
pub fn reset_peak_rss() -> bool {
    std::fs::write("/proc/self/clear_refs", "5").is_ok()
}

/// The peak resident set since the last reset, in bytes, if known.
pub fn peak_rss_bytes() -> Option<u64> {
    status_field("VmHWM")
}

/// The resident set now, in bytes, if known.
pub fn rss_bytes() -> Option<u64> {
    status_field("VmRSS")
}

fn status_field(field: &str) -> Option<u64> {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|status| parse_kib_field(&status, field))
}

/// The value of a `<field>: <n> kB` line of a `/proc/<pid>/status` text, in bytes.
fn parse_kib_field(status: &str, field: &str) -> Option<u64> {
    let line = status
        .lines()
        .find(|line| line.split(':').next() == Some(field))?;
    let kib: u64 = line[field.len() + 1..]
        .trim()
        .strip_suffix("kB")?
        .trim()
        .parse()
        .ok()?;
    Some(kib * 1024)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_the_high_water_mark_line() {
        let status =
            "Name:\tchorus-bench\nVmPeak:\t  200 kB\nVmHWM:\t   13664 kB\nVmRSS:\t 100 kB\n";
        assert_eq!(parse_kib_field(status, "VmHWM"), Some(13664 * 1024));
        assert_eq!(parse_kib_field(status, "VmRSS"), Some(100 * 1024));
        assert_eq!(parse_kib_field(status, "VmSwap"), None);
        assert_eq!(parse_kib_field("VmHWM:\t lots\n", "VmHWM"), None);
    }

    #[test]
    fn cpu_time_advances_with_work() {
        let before = cpu_time();
        let mut x = 0u64;
        for i in 0..20_000_000u64 {
            x = std::hint::black_box(x.wrapping_mul(31).wrapping_add(i));
        }
        assert!(cpu_time() > before, "{x}");
    }

    #[test]
    #[cfg(target_os = "linux")]
    fn the_peak_can_be_reset_and_read() {
        assert!(reset_peak_rss());
        let now = rss_bytes().unwrap();
        assert!(peak_rss_bytes().is_some_and(|peak| peak > 0 && peak + (1 << 20) >= now));
    }
}
