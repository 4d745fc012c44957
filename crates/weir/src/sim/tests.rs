use super::*;
use crate::bench::report::Stream;
use crate::device::model::NANOS_PER_SEC;

fn spec(text: &str) -> ModelSpec {
    ModelSpec::parse(text).unwrap()
}

fn jobs(texts: &[&str]) -> Vec<JobSpec> {
    texts.iter().map(|t| JobSpec::parse(t).unwrap()).collect()
}

fn run_json(seed: u64) -> String {
    let results = Simulation::new(
        &spec("hdd,size=64G"),
        &jobs(&["name=r,rw=randread,bs=4k,qd=4", "name=s,rw=read,bs=1m,qd=2"]),
        2 * NANOS_PER_SEC,
        seed,
    )
    .unwrap()
    .run();
    let streams: Vec<Stream> = results.iter().map(Stream::from_result).collect();
    serde_json::to_string(&streams).unwrap()
}

#[test]
fn same_seed_same_output_byte_for_byte() {
    assert_eq!(run_json(7), run_json(7));
    assert_ne!(run_json(7), run_json(8));
}

#[test]
fn a_closed_loop_job_keeps_its_depth_and_rates_add_up() {
    // NVMe at QD1 is latency-bound: IOPS x mean latency is about one.
    let results = Simulation::new(
        &spec("nvme,size=64G"),
        &jobs(&["name=r,rw=randread,bs=4k,qd=1"]),
        NANOS_PER_SEC,
        1,
    )
    .unwrap()
    .run();
    let r = &results[0];
    let mean_s = r.latency.summary_us().mean / 1e6;
    let busy = r.ops as f64 * mean_s;
    assert!(
        (0.97..=1.0).contains(&busy),
        "QD1 keeps the device busy all the time: {busy}"
    );
}

#[test]
fn an_open_loop_job_arrives_at_its_rate() {
    let results = Simulation::new(
        &spec("nvme,size=64G"),
        &jobs(&["name=r,rw=randread,bs=4k,qd=8,rate=2000/s"]),
        5 * NANOS_PER_SEC,
        3,
    )
    .unwrap()
    .run();
    let iops = results[0].ops as f64 / 5.0;
    assert!((1900.0..=2100.0).contains(&iops), "{iops} IOPS");
}

#[test]
fn jobs_start_and_stop_on_time_and_bad_ranges_fail() {
    let results = Simulation::new(
        &spec("ssd,size=64G,bad=0..64G"),
        &jobs(&[
            "name=late,rw=randread,bs=4k,qd=1,start=0.5,stop=0.7",
            "name=w,rw=randwrite,bs=4k,qd=1",
        ]),
        NANOS_PER_SEC,
        1,
    )
    .unwrap()
    .run();
    assert_eq!(results[0].ops, 0, "every read hits the bad range");
    assert!(results[0].errors > 100, "{} errors", results[0].errors);
    assert_eq!(results[0].active_ns, NANOS_PER_SEC / 5);
    assert!(
        results[1].ops > 1000 && results[1].errors == 0,
        "writes still work"
    );
}

#[test]
fn think_time_spaces_a_closed_loop() {
    let results = Simulation::new(
        &spec("nvme,size=64G"),
        &jobs(&["name=r,rw=randread,bs=4k,qd=1,think=1ms"]),
        NANOS_PER_SEC,
        1,
    )
    .unwrap()
    .run();
    // Each cycle is one ~73 us read plus 1 ms of thinking.
    let ops = results[0].ops;
    assert!((900..=940).contains(&ops), "{ops} ops");
}

/// 4 KiB random reads at QD32 for one second on an NVMe + SSD mirror:
/// (MB/s, each device's share of the reads).
fn mirror_reads(policy: ReadPolicy) -> (f64, Vec<f64>) {
    let run = Simulation::new_pool(
        &[spec("nvme,size=64G"), spec("ssd,size=64G")],
        Mode::Fifo,
        &jobs(&["name=r,rw=randread,bs=4k,qd=32"]),
        NANOS_PER_SEC,
        1,
    )
    .unwrap()
    .with_read_policy(policy)
    .run_mirror();
    let (results, shares) = (run.streams, run.read_shares);
    (results[0].bytes as f64 / 1e6, shares)
}

#[test]
fn a_mirror_read_policy_places_reads_and_the_shares_count_them() {
    let (pid, shares) = mirror_reads(ReadPolicy::Pid);
    assert_eq!(shares, [1.0, 0.0], "pid: one requester, one copy");
    let (round_robin, shares) = mirror_reads(ReadPolicy::RoundRobin);
    assert!((shares[0] - 0.5).abs() < 0.05, "round-robin: {shares:?}");
    let (latency, shares) = mirror_reads(ReadPolicy::Latency);
    assert!(shares[0] > 0.6, "latency favours the NVMe copy: {shares:?}");
    assert!(
        latency > 1.5 * round_robin && latency >= 0.99 * pid,
        "latency {latency} MB/s, round-robin {round_robin}, pid {pid}"
    );
}

fn cached_run(
    devices: &[&str],
    throttle: WbThrottle,
    job_texts: &[&str],
    seconds: u64,
) -> MirrorRun {
    let specs: Vec<ModelSpec> = devices.iter().map(|d| spec(d)).collect();
    Simulation::new_pool(
        &specs,
        Mode::Fifo,
        &jobs(job_texts),
        seconds * NANOS_PER_SEC,
        5,
    )
    .unwrap()
    .with_cache(throttle, None)
    .run_mirror()
}

#[test]
fn cached_writes_are_answered_from_memory_and_every_byte_is_accounted_for() {
    // Random 4 KiB writes at QD1 to an HDD: write-through pays a seek each.
    let through = Simulation::new(
        &spec("hdd,size=64G"),
        &jobs(&["name=w,rw=randwrite,bs=4k,qd=1,size=64m"]),
        2 * NANOS_PER_SEC,
        5,
    )
    .unwrap()
    .run();
    let run = cached_run(
        &["hdd,size=64G"],
        WbThrottle::Adaptive,
        &["name=w,rw=randwrite,bs=4k,qd=1,size=64m"],
        2,
    );
    let cached = &run.streams[0];
    assert!(
        cached.ops > 3 * through[0].ops,
        "cached {} writes, write-through {}",
        cached.ops,
        through[0].ops
    );
    // Overwrites join in the cache, so the devices see no more than the
    // client sent; what did not reach them is still dirty.
    let cache = run.cache.expect("a cached run reports its cache");
    assert!(cache.written_back_bytes > 0);
    assert!(cache.written_back_bytes + cache.dirty_at_end_bytes <= cached.bytes);
}

#[test]
fn unthrottled_writeback_stalls_a_reader_and_the_throttles_hold_it_back() {
    let job_texts = [
        "name=r,rw=randread,bs=4k,qd=1",
        "name=w,rw=write,bs=1m,qd=8",
    ];
    let p99 = |run: &MirrorRun| run.streams[0].latency.quantile_ns(0.99);
    // Long enough for the dirty limit to grow from its initial 4 MiB to
    // a second of this drive's writes: the queue that stalls the reader
    // under no throttle is built from that much dirty data.
    let seconds = 30;
    let none = cached_run(&["ssd,size=64G"], WbThrottle::None, &job_texts, seconds);
    let wbt = cached_run(&["ssd,size=64G"], WbThrottle::Wbt, &job_texts, seconds);
    let adaptive = cached_run(&["ssd,size=64G"], WbThrottle::Adaptive, &job_texts, seconds);
    // wbt takes a few windows to scale its depth down from the start.
    assert!(
        p99(&none) > 3 * p99(&wbt) / 2 && p99(&none) > 4 * p99(&adaptive),
        "p99 none {} wbt {} adaptive {}",
        p99(&none),
        p99(&wbt),
        p99(&adaptive)
    );
    // Writeback still runs under every throttle.
    for run in [&none, &wbt, &adaptive] {
        assert!(run.cache.unwrap().written_back_bytes > 100 << 20);
    }
}
