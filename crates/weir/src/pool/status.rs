//! `weir pool status` without a server: every registered pool imported
//! from its devices and shown as `zpool status` does.

use std::fmt::Write as _;
use std::path::Path;

use anyhow::bail;

use super::data_dir::try_lock_data_dir;
use super::import::{import_entry, Imported, MemberState};
use super::registry::{RegisteredPool, Registry};

/// `weir pool status`: every registered pool, or one, imported and shown.
/// Label copies are repaired only if no server holds the directory.
pub fn status(name: Option<&str>, data_dir: &Path) -> anyhow::Result<String> {
    let lock = try_lock_data_dir(data_dir)?;
    let repair = lock.is_some();
    let registry = Registry::load(data_dir)?;
    let pools: Vec<&RegisteredPool> = registry
        .pool
        .iter()
        .filter(|p| name.is_none_or(|n| p.name == n))
        .collect();
    if pools.is_empty() {
        match name {
            Some(name) => bail!(
                "no pool named {name:?} in {}",
                super::registry::path_in(data_dir).display()
            ),
            None => return Ok("no pools\n".into()),
        }
    }
    let mut out = String::new();
    for pool in pools {
        match import_entry(pool, repair) {
            Ok(imported) => render(&mut out, &imported),
            Err(err) => out.push_str(&unavailable_text(&pool.name, &format!("{err:#}"))),
        }
    }
    Ok(out)
}

/// The status of a registered pool that cannot be opened.
pub fn unavailable_text(pool: &str, why: &str) -> String {
    format!(
        "  pool: {pool}\n state: UNAVAIL\nstatus: the pool cannot be opened: {why}\naction: make its devices available (or import it again) and restart weir; the other pools are served\n"
    )
}

/// The pool's state as `weir_pool_state`: 1 for the current state.
pub fn state_samples(pool: &str, state: &str, out: &mut Vec<crate::metrics::Sample>) {
    for name in ["ONLINE", "DEGRADED", "UNAVAIL"] {
        out.push(crate::metrics::Sample::gauge(
            "weir_pool_state",
            vec![("pool", pool.to_string()), ("state", name.to_string())],
            f64::from(u8::from(name == state)),
        ));
    }
}

fn render(out: &mut String, pool: &Imported) {
    let label = &pool.label;
    let _ = writeln!(out, "  pool: {}", label.pool_name);
    let _ = writeln!(out, "    id: {:032x}", label.pool_id);
    let _ = writeln!(out, " state: {}", pool.state());
    let _ = writeln!(out, " sched: {}", pool.sched.name());
    let _ = writeln!(out, " reads: {}", pool.read_policy.name());
    let resilvering = pool
        .members
        .iter()
        .flatten()
        .any(|m| m.1 == MemberState::Resilvering);
    if let Some((status, action)) =
        super::advice::advice(&label.pool_name, pool.state(), resilvering, 0, None)
    {
        let _ = writeln!(out, "status: {status}");
        let _ = writeln!(out, "action: {action}");
    }
    for why in &pool.refused {
        let _ = writeln!(out, "  note: not a member: {why}");
    }
    for text in &pool.repaired_labels {
        let _ = writeln!(
            out,
            "  note: rewrote a stale or damaged label copy on {text}"
        );
    }
    let _ = writeln!(out, "config:\n\n\t{:<40} STATE", "NAME");
    let _ = writeln!(out, "\t{:<40} {}", label.pool_name, pool.state());
    let copies = label.layout.groups[0].len();
    for (index, group) in pool.members.iter().enumerate() {
        let indent = if copies > 1 {
            let online = group.iter().any(|m| m.1 == MemberState::Online);
            let all = group.iter().all(|m| m.1 == MemberState::Online);
            let state = if all {
                "ONLINE"
            } else if online {
                "DEGRADED"
            } else {
                "UNAVAIL"
            };
            let _ = writeln!(out, "\t  {:<38} {state}", format!("mirror-{index}"));
            "    "
        } else {
            "  "
        };
        for (member, (text, state)) in group.iter().enumerate() {
            let shown = text.clone().unwrap_or_else(|| {
                format!("(missing: {:032x})", label.layout.groups[index][member])
            });
            let width = 40 - indent.len();
            let _ = writeln!(out, "\t{indent}{shown:<width$} {}", state.name());
        }
    }
    out.push('\n');
}
