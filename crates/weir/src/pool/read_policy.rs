//! The read policies a mirror can use, by name: what pools.toml, the CLI
//! and the admin endpoint store and accept. The selector (mirror/select.rs)
//! implements them.

/// How a mirror picks the copy that serves a read.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum ReadPolicy {
    /// By the requesting connection (btrfs's default): a baseline.
    Pid,
    /// In turn, each copy for a run of bytes (btrfs's newer policy): a baseline.
    RoundRobin,
    /// Fewest reads in flight, then nearest to the last read (md raid1): a baseline.
    LeastPending,
    /// weir's own: the copy predicted to answer first.
    #[default]
    Latency,
}

impl ReadPolicy {
    pub const ALL: [ReadPolicy; 4] = [
        ReadPolicy::Pid,
        ReadPolicy::RoundRobin,
        ReadPolicy::LeastPending,
        ReadPolicy::Latency,
    ];

    pub fn name(self) -> &'static str {
        match self {
            ReadPolicy::Pid => "pid",
            ReadPolicy::RoundRobin => "round-robin",
            ReadPolicy::LeastPending => "least-pending",
            ReadPolicy::Latency => "latency",
        }
    }

    /// Every policy's name, for error messages.
    pub fn names() -> String {
        ReadPolicy::ALL.map(ReadPolicy::name).join(", ")
    }

    pub fn parse(text: &str) -> Option<ReadPolicy> {
        ReadPolicy::ALL.into_iter().find(|p| p.name() == text)
    }
}

impl std::fmt::Display for ReadPolicy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}
