//! Object-store requests per MB written and what they cost at published S3
//! prices.
//!
//! Units: MB is 10^6 bytes (as in the MB/s columns); GB is 2^30 bytes, as
//! AWS bills it.

use serde::Serialize;

/// Bytes in a billed GB.
const GB: f64 = (1u64 << 30) as f64;

/// Requests one system made, by S3 price class, and the bytes it uploaded.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct RequestCounts {
    /// PUT, COPY, POST and LIST requests (each multipart step is one).
    pub put_class: u64,
    /// GET and HEAD requests.
    pub get_class: u64,
    /// DELETE requests (free on S3).
    pub deletes: u64,
    /// Bytes carried by PUT requests.
    pub bytes_put: u64,
}

impl RequestCounts {
    /// What was counted after `earlier`, a snapshot of the same counters.
    pub fn since(&self, earlier: &RequestCounts) -> RequestCounts {
        RequestCounts {
            put_class: self.put_class - earlier.put_class,
            get_class: self.get_class - earlier.get_class,
            deletes: self.deletes - earlier.deletes,
            bytes_put: self.bytes_put - earlier.bytes_put,
        }
    }

    /// Every request, whatever its class.
    pub fn total(&self) -> u64 {
        self.put_class + self.get_class + self.deletes
    }
}

/// Request prices of one S3 storage class, in USD per 1,000 requests.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Prices {
    /// PUT, COPY, POST, LIST.
    pub put_per_1000: f64,
    /// GET, HEAD and other reads.
    pub get_per_1000: f64,
}

/// When the prices below were looked up.
pub const PRICES_CHECKED: &str = "2026-12-02";

/// S3 Standard, US East (N. Virginia): $0.005 per 1,000 PUT/COPY/POST/LIST
/// and $0.0004 per 1,000 GET/SELECT requests, as listed under "Requests &
/// data retrievals" on <https://aws.amazon.com/s3/pricing/> (checked
/// [`PRICES_CHECKED`]; unchanged for years).
pub const S3_STANDARD: Prices = Prices {
    put_per_1000: 0.005,
    get_per_1000: 0.0004,
};

/// S3 Express One Zone, US East (N. Virginia): $0.00113 per 1,000 PUT and
/// $0.00003 per 1,000 GET requests, the prices since AWS's April 2025
/// reduction, as used in the worked examples of the S3 Express One Zone
/// section of <https://aws.amazon.com/s3/faqs/> (checked [`PRICES_CHECKED`]).
pub const S3_EXPRESS_ONE_ZONE: Prices = Prices {
    put_per_1000: 0.00113,
    get_per_1000: 0.00003,
};

/// S3 Express One Zone's extra charge per GB uploaded, USD, from the same
/// FAQ examples (which apply it to every byte; some third-party summaries say
/// only the part of a request above 512 KB is charged, so this is an upper
/// bound). Unlike request prices it scales with bytes uploaded, so a system
/// that writes each byte several times pays it several times.
pub const S3_EXPRESS_UPLOAD_PER_GB: f64 = 0.0032;

/// Requests per MB of records written.
pub fn requests_per_mb(counts: &RequestCounts, written_bytes: u64) -> f64 {
    per_byte(counts.total() as f64, written_bytes) * 1e6
}

/// Request cost in USD per GB of records written at `prices`.
pub fn request_usd_per_gb(counts: &RequestCounts, written_bytes: u64, prices: &Prices) -> f64 {
    let usd = counts.put_class as f64 * prices.put_per_1000 / 1000.0
        + counts.get_class as f64 * prices.get_per_1000 / 1000.0;
    per_byte(usd, written_bytes) * GB
}

/// Bytes uploaded per byte of records written (replication, sealing,
/// compaction and framing all raise it).
pub fn upload_amplification(counts: &RequestCounts, written_bytes: u64) -> f64 {
    per_byte(counts.bytes_put as f64, written_bytes)
}

/// `amount / written_bytes`, or 0 when nothing was written.
fn per_byte(amount: f64, written_bytes: u64) -> f64 {
    if written_bytes == 0 {
        0.0
    } else {
        amount / written_bytes as f64
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const GIB: u64 = 1 << 30;

    #[test]
    fn one_put_per_4_kib_record_costs_what_s3_lists() {
        // 262,144 records of 4 KiB make a GB: 262,144 PUTs at $0.005/1,000.
        let counts = RequestCounts {
            put_class: 262_144,
            bytes_put: GIB,
            ..RequestCounts::default()
        };
        let standard = request_usd_per_gb(&counts, GIB, &S3_STANDARD);
        assert!((standard - 1.31072).abs() < 1e-9, "{standard}");
        let express = request_usd_per_gb(&counts, GIB, &S3_EXPRESS_ONE_ZONE);
        assert!((express - 0.29622272).abs() < 1e-9, "{express}");
        assert!((requests_per_mb(&counts, GIB) - 244.140625).abs() < 1e-9);
        assert_eq!(upload_amplification(&counts, GIB), 1.0);
    }

    #[test]
    fn reads_are_cheaper_than_writes_and_deletes_are_free() {
        let reads = RequestCounts {
            get_class: 1000,
            ..RequestCounts::default()
        };
        let deletes = RequestCounts {
            deletes: 1000,
            ..RequestCounts::default()
        };
        assert!((request_usd_per_gb(&reads, GIB, &S3_STANDARD) - 0.0004).abs() < 1e-12);
        assert_eq!(request_usd_per_gb(&deletes, GIB, &S3_STANDARD), 0.0);
        assert_eq!(requests_per_mb(&deletes, 1_000_000), 1000.0);
    }

    #[test]
    fn nothing_written_costs_nothing_per_byte() {
        let counts = RequestCounts {
            put_class: 3,
            ..RequestCounts::default()
        };
        assert_eq!(requests_per_mb(&counts, 0), 0.0);
        assert_eq!(request_usd_per_gb(&counts, 0, &S3_STANDARD), 0.0);
    }

    #[test]
    fn counts_since_a_snapshot_subtract_field_by_field() {
        let earlier = RequestCounts {
            put_class: 1,
            get_class: 2,
            deletes: 3,
            bytes_put: 4,
        };
        let later = RequestCounts {
            put_class: 11,
            get_class: 12,
            deletes: 13,
            bytes_put: 14,
        };
        let delta = later.since(&earlier);
        assert_eq!(delta.total(), 30);
        assert_eq!(delta.bytes_put, 10);
    }
}
