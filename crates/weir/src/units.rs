//! Byte sizes as people write them: `4096`, `512K`, `1.5G`, `2GiB`.

/// Parse a size with an optional suffix. Suffixes are binary whether or not
/// they say so (K = KiB = 1024), as in qemu-img, fio and nbdkit; fractions
/// are allowed and must come to a whole number of bytes.
pub fn parse_bytes(text: &str) -> Result<u64, String> {
    parse_size::Config::new()
        .with_binary()
        .parse_size(text.trim())
        .map_err(|err| format!("invalid size {text:?}: {err} (use e.g. 4096, 512K, 1.5G)"))
}

/// A size for people to read: `512 B`, `4.0 KiB`, `1.5 GiB`.
pub fn format_bytes(bytes: u64) -> String {
    const UNITS: [&str; 5] = ["KiB", "MiB", "GiB", "TiB", "PiB"];
    if bytes < 1024 {
        return format!("{bytes} B");
    }
    let mut value = bytes as f64 / 1024.0;
    let mut unit = 0;
    while value >= 1024.0 && unit + 1 < UNITS.len() {
        value /= 1024.0;
        unit += 1;
    }
    format!("{value:.1} {}", UNITS[unit])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_format_in_binary_units() {
        assert_eq!(format_bytes(512), "512 B");
        assert_eq!(format_bytes(4096), "4.0 KiB");
        assert_eq!(format_bytes(3 << 29), "1.5 GiB");
    }

    #[test]
    fn sizes_parse_with_binary_suffixes() {
        assert_eq!(parse_bytes("4096"), Ok(4096));
        assert_eq!(parse_bytes("512K"), Ok(512 << 10));
        assert_eq!(parse_bytes("2G"), Ok(2 << 30));
        assert_eq!(parse_bytes("1GiB"), Ok(1 << 30));
        assert_eq!(parse_bytes("3mb"), Ok(3 << 20));
        assert_eq!(parse_bytes("1.5G"), Ok(3 << 29));
        assert_eq!(parse_bytes(" 64 M "), Ok(64 << 20));
        assert!(parse_bytes("12Q").is_err());
        assert!(parse_bytes("").is_err());
        assert!(parse_bytes("-1G").is_err());
        assert!(parse_bytes("99999999999T").is_err());
    }
}
