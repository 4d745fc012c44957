//! `weir pool list`: one line per registered pool, its size, the space its
//! volumes reserve, and its health, as `zpool list` shows them.

use std::fmt::Write as _;
use std::path::Path;

use super::import::import_registered;
use super::volumes::{read_table, stripe};
use crate::units::format_bytes;

pub struct Row {
    pub name: String,
    /// None for a pool that cannot be opened.
    pub size_bytes: Option<u64>,
    pub allocated_bytes: Option<u64>,
    pub health: String,
}

pub fn render(rows: &[Row]) -> String {
    let mut out = format!(
        "{:<24} {:>10} {:>10} {:>10} {:>5}  HEALTH\n",
        "NAME", "SIZE", "ALLOC", "FREE", "CAP"
    );
    for row in rows {
        let shown = |bytes: Option<u64>| bytes.map_or_else(|| "-".to_string(), format_bytes);
        let free = row
            .size_bytes
            .zip(row.allocated_bytes)
            .map(|(size, used)| size.saturating_sub(used));
        let cap = row
            .size_bytes
            .zip(row.allocated_bytes)
            .filter(|(size, _)| *size > 0)
            .map_or_else(
                || "-".to_string(),
                |(size, used)| format!("{}%", used * 100 / size),
            );
        let _ = writeln!(
            out,
            "{:<24} {:>10} {:>10} {:>10} {:>5}  {}",
            row.name,
            shown(row.size_bytes),
            shown(row.allocated_bytes),
            shown(free),
            cap,
            row.health
        );
    }
    out
}

/// The rows of every registered pool, read from its devices (no server).
pub fn offline(data_dir: &Path) -> anyhow::Result<String> {
    super::data_dir::check_exists(data_dir)?;
    let mut rows = Vec::new();
    for name in super::registry::registered_pools(data_dir)? {
        let found = import_registered(&name, data_dir, false).and_then(|pool| {
            let size = stripe(&pool)?.logical_bytes();
            let table = read_table(&pool)?;
            let chunks: u64 = table.volumes.iter().map(|v| v.chunks).sum();
            Ok((size, chunks * super::geometry::CHUNK_BYTES, pool.state()))
        });
        rows.push(match found {
            Ok((size, allocated, state)) => Row {
                name,
                size_bytes: Some(size),
                allocated_bytes: Some(allocated),
                health: state.to_string(),
            },
            Err(err) => {
                tracing::warn!(pool = name, "pool UNAVAIL: {err:#}");
                Row {
                    name,
                    size_bytes: None,
                    allocated_bytes: None,
                    health: "UNAVAIL".into(),
                }
            }
        });
    }
    rows.sort_by(|a, b| a.name.cmp(&b.name));
    Ok(render(&rows))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rows_show_free_space_and_a_pool_that_cannot_open() {
        let out = render(&[
            Row {
                name: "tank".into(),
                size_bytes: Some(4 << 30),
                allocated_bytes: Some(1 << 30),
                health: "ONLINE".into(),
            },
            Row {
                name: "gone".into(),
                size_bytes: None,
                allocated_bytes: None,
                health: "UNAVAIL".into(),
            },
        ]);
        let lines: Vec<&str> = out.lines().collect();
        assert!(lines[0].starts_with("NAME"));
        let tank: Vec<&str> = lines[1].split_whitespace().collect();
        assert_eq!(tank[0], "tank");
        assert_eq!(tank.last(), Some(&"ONLINE"));
        assert!(lines[1].contains("25%"), "{}", lines[1]);
        let gone: Vec<&str> = lines[2].split_whitespace().collect();
        assert_eq!(gone, ["gone", "-", "-", "-", "-", "UNAVAIL"]);
    }
}
