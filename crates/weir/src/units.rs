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

#[cfg(test)]
mod tests {
    use super::*;

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
