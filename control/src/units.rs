//! Units shared by every crate that talks about bandwidth and chunk sizes, so that one
//! conversion exists for each: rates are Mbit/s (10⁶ bit/s, as `iperf` and the ECHO-2 paper
//! count) on every command line and config key, bytes/s inside; chunk sizes are KiB (1024
//! bytes) on every command line and config key, bytes inside.

/// Bytes per second of a rate in Mbit/s.
pub fn mbps_to_bytes_per_s(mbps: f64) -> f64 {
    mbps * 1e6 / 8.0
}

/// Bytes in `kib` KiB (the unit of `--chunk-kb` and `broadcast.chunk_size_kib`).
pub fn kib_to_bytes(kib: u64) -> u64 {
    kib * 1024
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn conversions() {
        assert_eq!(mbps_to_bytes_per_s(8.0), 1e6);
        assert_eq!(mbps_to_bytes_per_s(100.0), 12.5e6);
        assert_eq!(kib_to_bytes(1024), 1 << 20);
    }
}
