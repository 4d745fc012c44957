//! Metrics as the pools report them (`Sample`s, gathered at scrape time
//! from the counters the data path keeps anyway) and their encoding in the
//! Prometheus/OpenMetrics text format by prometheus-client: one family per
//! name with its HELP and TYPE, counters ending in `_total`, times in
//! seconds, histograms with `_sum` and `_count`.

use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::metrics::MetricType;

/// The content type `encode`'s output is served with.
pub const CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";
/// The content type of `to_prometheus_text`'s output.
pub const PROMETHEUS_TEXT_CONTENT_TYPE: &str = "text/plain; version=0.0.4; charset=utf-8";

/// Every family weir reports: name (without `_total` for counters) and
/// help, in the order they are written. The type comes from the samples.
const FAMILIES: &[(&str, &str)] = &[
    ("weir_pool_state", "1 for the pool's current state (ONLINE, DEGRADED, UNAVAIL: not opened, not served), 0 for the others."),
    ("weir_pool_repairs", "Blocks rewritten on a copy because it failed or returned bad data."),
    ("weir_member_state", "1 for the member's current state (ONLINE, RESILVERING, FAULTED, OFFLINE), 0 for the others."),
    ("weir_member_reads", "Client reads the mirror sent to this member."),
    ("weir_member_read_errors", "Reads from this member that failed."),
    ("weir_member_write_errors", "Writes to this member that failed."),
    ("weir_member_checksum_errors", "Blocks this member returned that failed their checksum."),
    ("weir_member_repaired_blocks", "Blocks rewritten on this member from a good copy."),
    ("weir_member_read_share", "This member's share of its mirror's reads, since the pool opened."),
    ("weir_member_read_service_seconds", "The read selector's service-time estimate for this member (kind=run: reads continuing the last; other: the rest)."),
    ("weir_member_read_passed_over", "1 while the selector avoids this member after a checksum failure."),
    ("weir_device_ops", "I/Os completed by the device queue, by class."),
    ("weir_device_bytes", "Bytes moved by completed I/Os, by class."),
    ("weir_device_errors", "I/Os that failed, by class."),
    ("weir_device_pieces", "Device operations sent for I/Os split into pieces, by class."),
    ("weir_device_in_flight", "I/Os submitted and not yet completed, by class."),
    ("weir_device_floor_share", "Adaptive mode: the share of the device's time a background class is guaranteed beside client I/O."),
    ("weir_device_latency_seconds", "Submission to completion of device I/Os, queueing included, by class."),
    ("weir_volume_cache_dirty_bytes", "Bytes written to the volume's write-back cache and not yet to its devices."),
    ("weir_volume_failed", "1 once a write-back to the volume failed: every later write and FLUSH fails."),
    ("weir_cache_dirty_bytes", "Memory held by all write-back caches, write-back copies included."),
    ("weir_cache_dirty_limit_bytes", "The dirty-memory budget all write-back caches share."),
    ("weir_cache_waiting_writes", "Client writes waiting, unanswered, for room in the dirty-memory budget."),
    ("weir_volume_readahead_hits", "Client reads answered from read-ahead data, or from a read-ahead in flight."),
    ("weir_volume_readahead_misses", "Client reads of a volume with readahead that went to its devices."),
    ("weir_volume_readahead_bytes", "Bytes read ahead."),
    ("weir_volume_readahead_wasted_bytes", "Bytes read ahead and dropped unread (evicted, overwritten, or landed after a write)."),
    ("weir_readahead_held_bytes", "Read-ahead data held by all volumes."),
    ("weir_readahead_limit_bytes", "The bound on read-ahead data all volumes share."),
];

/// The name of every family weir reports.
pub fn family_names() -> impl Iterator<Item = &'static str> {
    FAMILIES.iter().map(|(name, _)| *name)
}

/// What a volume's readahead reports to metrics.
pub trait ReadaheadReport: Send + Sync {
    /// (hits, misses, bytes read ahead, bytes wasted).
    fn counts(&self) -> (u64, u64, u64, u64);
    /// Server-wide: (bytes held, bound).
    fn held_bytes(&self) -> (u64, u64);
}

/// What a volume's write-back cache reports to status and metrics. The
/// cache implements it; the pool service shows it beside its pools.
pub trait CacheReport: Send + Sync {
    fn dirty_bytes(&self) -> u64;
    fn failed(&self) -> bool;
    /// Server-wide: (memory held, budget).
    fn budget_bytes(&self) -> (u64, u64);
    /// Server-wide: client writes waiting, unanswered, for room in the budget.
    fn budget_waiting_writes(&self) -> usize;
}

#[derive(Clone, Debug, PartialEq)]
pub enum SampleValue {
    Counter(u64),
    Gauge(f64),
    /// Per-bucket counts (not cumulative) by upper bound, and the sum.
    Histogram {
        buckets: Vec<(f64, u64)>,
        sum: f64,
    },
}

#[derive(Clone, Debug, PartialEq)]
pub struct Sample {
    pub family: &'static str,
    pub labels: Vec<(&'static str, String)>,
    pub value: SampleValue,
}

impl Sample {
    pub fn counter(
        family: &'static str,
        labels: Vec<(&'static str, String)>,
        value: u64,
    ) -> Sample {
        Sample {
            family,
            labels,
            value: SampleValue::Counter(value),
        }
    }

    pub fn gauge(family: &'static str, labels: Vec<(&'static str, String)>, value: f64) -> Sample {
        Sample {
            family,
            labels,
            value: SampleValue::Gauge(value),
        }
    }
}

/// The text of every sample, grouped into families.
pub fn encode(samples: &[Sample]) -> String {
    let mut out = String::new();
    // Writing into a String cannot fail.
    prometheus_client::encoding::text::encode_registry(&mut out, &registry_of(samples))
        .and_then(|()| prometheus_client::encoding::text::encode_eof(&mut out))
        .expect("encoding into a String");
    out
}

/// OpenMetrics text as the older Prometheus text format (0.0.4), for
/// clients that do not ask for OpenMetrics (curl, `promtool check
/// metrics`): a counter's HELP and TYPE name its samples (`X_total`, not
/// the family `X`), and there is no `# EOF`. Everything else reads the
/// same in both. prometheus-client writes only OpenMetrics.
pub fn to_prometheus_text(openmetrics: &str) -> String {
    let counters: Vec<&str> = openmetrics
        .lines()
        .filter_map(|line| line.strip_prefix("# TYPE "))
        .filter_map(|rest| rest.strip_suffix(" counter"))
        .collect();
    let mut out = String::with_capacity(openmetrics.len());
    for line in openmetrics.lines() {
        if line == "# EOF" {
            continue;
        }
        let renamed = ["# HELP ", "# TYPE "].iter().find_map(|prefix| {
            let rest = line.strip_prefix(prefix)?;
            let (name, tail) = rest.split_once(' ').unwrap_or((rest, ""));
            counters
                .contains(&name)
                .then(|| format!("{prefix}{name}_total {tail}"))
        });
        out.push_str(renamed.as_deref().unwrap_or(line));
        out.push('\n');
    }
    out
}

fn registry_of(samples: &[Sample]) -> prometheus_client::registry::Registry {
    let mut registry = prometheus_client::registry::Registry::default();
    registry.register_collector(Box::new(Snapshot(samples.to_vec())));
    registry
}

/// The samples of one scrape, as a collector for prometheus-client.
#[derive(Debug)]
struct Snapshot(Vec<Sample>);

impl prometheus_client::collector::Collector for Snapshot {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        // Described families first, in their order; a family missing from
        // the list is still written (with no help) rather than dropped.
        let mut names: Vec<&str> = FAMILIES.iter().map(|f| f.0).collect();
        for sample in &self.0 {
            if !names.contains(&sample.family) {
                names.push(sample.family);
            }
        }
        for family in names {
            let members: Vec<&Sample> = self.0.iter().filter(|s| s.family == family).collect();
            let Some(first) = members.first() else {
                continue;
            };
            let kind = match first.value {
                SampleValue::Counter(_) => MetricType::Counter,
                SampleValue::Gauge(_) => MetricType::Gauge,
                SampleValue::Histogram { .. } => MetricType::Histogram,
            };
            let help = FAMILIES.iter().find(|f| f.0 == family).map_or("", |f| f.1);
            let mut family_encoder = encoder.encode_descriptor(family, help, None, kind)?;
            for sample in members {
                let labels: Vec<(&str, &str)> = sample
                    .labels
                    .iter()
                    .map(|(k, v)| (*k, v.as_str()))
                    .collect();
                let metric = family_encoder.encode_family(&labels)?;
                match &sample.value {
                    SampleValue::Counter(v) => ConstCounter::new(*v).encode(metric)?,
                    SampleValue::Gauge(v) => ConstGauge::new(*v).encode(metric)?,
                    SampleValue::Histogram { buckets, sum } => {
                        let mut buckets = buckets.clone();
                        let count = buckets.iter().map(|b| b.1).sum();
                        buckets.push((f64::INFINITY, 0));
                        let mut metric = metric;
                        metric.encode_histogram::<prometheus_client::encoding::NoLabelSet>(
                            *sum, count, &buckets, None,
                        )?
                    }
                }
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn families_are_grouped_and_typed() {
        let labels = |m: &str| vec![("pool", "tank".to_string()), ("member", m.to_string())];
        let samples = vec![
            Sample::counter("weir_member_reads", labels("0"), 5),
            Sample::gauge("weir_member_read_share", labels("0"), 0.5),
            Sample::counter("weir_member_reads", labels("1"), 7),
            Sample {
                family: "weir_device_latency_seconds",
                labels: labels("0"),
                value: SampleValue::Histogram {
                    buckets: vec![(0.000002, 3), (0.000004, 1)],
                    sum: 0.00001,
                },
            },
        ];
        let text = encode(&samples);
        assert!(
            text.contains("# TYPE weir_member_reads counter\n"),
            "{text}"
        );
        assert!(text.contains("# HELP weir_member_reads "), "{text}");
        let reads = text
            .find("weir_member_reads_total{pool=\"tank\",member=\"0\"} 5")
            .unwrap();
        let reads1 = text
            .find("weir_member_reads_total{pool=\"tank\",member=\"1\"} 7")
            .unwrap();
        let share = text.find("weir_member_read_share{").unwrap();
        assert!(
            reads < reads1 && reads1 < share,
            "one run per family: {text}"
        );
        assert!(
            text.contains("weir_device_latency_seconds_count{pool=\"tank\",member=\"0\"} 4"),
            "{text}"
        );
        assert!(
            text.contains("weir_device_latency_seconds_sum{pool=\"tank\",member=\"0\"} 0.00001"),
            "{text}"
        );
        assert!(
            text.contains("_bucket{le=\"+Inf\",pool=\"tank\",member=\"0\"} 4"),
            "{text}"
        );
        assert!(text.ends_with("# EOF\n"), "{text}");
        let unlisted = encode(&[Sample::gauge("weir_not_described", labels("0"), 1.0)]);
        assert!(
            unlisted.contains("# TYPE weir_not_described gauge"),
            "{unlisted}"
        );
    }

    #[test]
    fn the_older_text_format_names_counter_samples_and_has_no_eof() {
        let samples = vec![
            Sample::counter("weir_member_reads", vec![], 5),
            Sample::gauge("weir_member_read_share", vec![], 0.5),
        ];
        let text = to_prometheus_text(&encode(&samples));
        assert!(
            text.contains("# TYPE weir_member_reads_total counter\n"),
            "{text}"
        );
        assert!(
            text.contains("# HELP weir_member_reads_total Client reads"),
            "{text}"
        );
        assert!(text.contains("\nweir_member_reads_total 5\n"), "{text}");
        assert!(
            text.contains("# TYPE weir_member_read_share gauge\n"),
            "{text}"
        );
        assert!(!text.contains("# EOF"), "{text}");
    }
}
