//! What `weir pool status` tells an operator beside the table: a `status:`
//! line saying what is wrong and an `action:` line saying what to do, as
//! `zpool status` does. The same words online and offline.

/// (status, action) for a pool in `state`, or None when all is well.
/// `offline` names a member the operator took out of service.
pub fn advice(
    pool: &str,
    state: &str,
    resilvering: bool,
    errors: u64,
    offline: Option<&str>,
) -> Option<(String, String)> {
    if let Some(device) = offline {
        return Some((
            format!("{device} was taken offline: the pool runs without full redundancy"),
            format!("bring it back with weir pool online {pool} {device}"),
        ));
    }
    if resilvering {
        return Some((
            "a member is being resilvered: the pool regains full redundancy when it finishes"
                .into(),
            "wait for the resilver (the resilver: line shows its progress)".into(),
        ));
    }
    match state {
        "UNAVAIL" => Some((
            "a mirror has no complete copy in service: the pool cannot be served".into(),
            "bring the missing devices back and restart weir".into(),
        )),
        "DEGRADED" => Some((
            "one or more members are FAULTED or missing: the pool runs without full redundancy".into(),
            format!(
                "replace each FAULTED or UNAVAIL member: weir pool replace {pool} OLD NEW (a STALE member is rebuilt when the pool is served)"
            ),
        )),
        _ if errors > 0 => Some((
            "a member returned errors; each was corrected from another copy".into(),
            format!(
                "find the cause (cabling, a failing device), then weir pool clear {pool}; replace a member whose errors keep rising"
            ),
        )),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_healthy_pool_needs_no_advice_and_each_trouble_names_its_command() {
        assert_eq!(advice("tank", "ONLINE", false, 0, None), None);
        let (_, action) = advice("tank", "DEGRADED", false, 0, None).unwrap();
        assert!(action.contains("weir pool replace tank"), "{action}");
        let (_, action) = advice("tank", "ONLINE", false, 3, None).unwrap();
        assert!(action.contains("weir pool clear tank"), "{action}");
        let (status, _) = advice("tank", "DEGRADED", true, 0, None).unwrap();
        assert!(status.contains("resilvered"), "{status}");
        let (_, action) = advice("tank", "DEGRADED", false, 0, Some("/dev/sdb")).unwrap();
        assert_eq!(action, "bring it back with weir pool online tank /dev/sdb");
    }
}
