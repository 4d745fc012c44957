//! Real-time targets: `weir serve` started by the bench itself, on Unix
//! sockets in a temporary directory. A device runs as a raw export; a
//! mirror runs as a pool of two device models with a filled volume, and its
//! scrub is the pool's own, started and measured through the admin
//! endpoint. The pools' member files go in memory (`/dev/shm`) when it has
//! room, or where `--pool-dir` says (`PoolRoot`).

mod fill;
mod probes;
mod process;

use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context};

use super::report::Run;
use super::scenarios::{SlowCopy, Targets};
use super::Target;
use crate::admin::client::AdminClient;
use crate::pool::geometry::CHUNK_BYTES;
use crate::pool::mirror::select::ReadPolicy;
use crate::sched::Mode;
use crate::sim::StreamResult;
use fill::fill;
pub use probes::pool_reads;
use probes::{ScrubMeter, ShareSampler};
use process::{stop, wait_for_server, weir, weir_cli};

/// The volume a served mirror exports, filled before the first run so the
/// scrub has data to read (it skips chunks never written).
const VOLUME_BYTES: u64 = 2 << 30;

struct Server {
    key: String,
    child: Child,
    uri: String,
    data_dir: Option<PathBuf>,
    /// When a run last asked for it, on the `ServedTargets::uses` count.
    last_used: u64,
}

/// `weir serve` started per device (or mirror), torn down on drop.
pub struct ServedTargets {
    /// Sockets.
    dir: process::Dir,
    /// The pools' data directories, member files included.
    pools: process::Dir,
    servers: Vec<Server>,
    /// Servers started so far: names their sockets and pool directories.
    started: usize,
    /// Requests for a target so far: the clock of `Server::last_used`.
    uses: u64,
}

/// Pools served at once. Starting another stops the one used least
/// lately and deletes its files, so the pools' room is bounded: the
/// scenarios use their pools one after another (the scheduler its HDD,
/// SSD and NVMe mirrors; mirror-reads refills one pool once).
const POOLS_LIVE_MAX: usize = 2;
/// Room the member files of a pool of `copies` take: a copy of the filled
/// volume each, and a quarter of one more for the pool's own metadata and
/// slack.
const fn pool_room_bytes(copies: u64) -> u64 {
    copies * VOLUME_BYTES + VOLUME_BYTES / 4
}
/// The memory-backed filesystem the pools go on by default.
const MEMORY_DIR: &str = "/dev/shm";
/// Memory left for everything else when the pools are in memory.
const MEMORY_MARGIN_BYTES: u64 = 2 << 30;

/// Where the pools' member files go. By default in memory, so that the
/// devices' timing is the models' alone: files on a disk make both copies
/// of a mirror share that one disk. On a 2-CPU VM measured, the disk (1.26 GB/s
/// at 1 MiB QD8) held the lone NVMe model to 1033 MB/s (3200 modelled),
/// and its I/O scheduler held reads for up to its 500 ms deadline: NVMe +
/// SSD sequential reads reached 0.77x the two devices' sum in real time,
/// against 0.88-0.96x with the files in memory (docs/mirror-reads.md).
pub struct PoolRoot {
    pub path: PathBuf,
    pub why: String,
}

impl PoolRoot {
    /// `explicit` (from `--pool-dir`), else memory if it has room for the
    /// pools served at once, else the temporary directory.
    pub fn choose(explicit: Option<PathBuf>) -> PoolRoot {
        if let Some(path) = explicit {
            return PoolRoot {
                path,
                why: "--pool-dir".into(),
            };
        }
        let needed = POOLS_LIVE_MAX as u64 * pool_room_bytes(2);
        // The filesystem's own limit, and the memory behind it.
        let room = available_bytes(Path::new(MEMORY_DIR))
            .unwrap_or(0)
            .min(memory_available_bytes().saturating_sub(MEMORY_MARGIN_BYTES));
        if room >= needed {
            return PoolRoot {
                path: MEMORY_DIR.into(),
                why: format!("in memory: {} GiB of room", room >> 30),
            };
        }
        PoolRoot {
            path: std::env::temp_dir(),
            why: format!(
                "{MEMORY_DIR} has room for {} GiB and the pools need {} GiB, so they go on \
                 disk, where both copies of a mirror share that disk",
                room >> 30,
                needed >> 30
            ),
        }
    }
}

/// `MemAvailable` of /proc/meminfo, or 0 when it cannot be read.
fn memory_available_bytes() -> u64 {
    std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|text| {
            let line = text.lines().find(|l| l.starts_with("MemAvailable:"))?;
            let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
            Some(kib << 10)
        })
        .unwrap_or(0)
}

/// Bytes an unprivileged writer may still put on the filesystem holding
/// `path`, or None when it cannot be asked.
fn available_bytes(path: &Path) -> Option<u64> {
    use std::os::unix::ffi::OsStrExt;
    let name = std::ffi::CString::new(path.as_os_str().as_bytes()).ok()?;
    // SAFETY: `name` is a NUL-terminated path and `stats` a plain struct
    // that statvfs fills in; all zeroes is a valid value of it.
    let mut stats: libc::statvfs = unsafe { std::mem::zeroed() };
    if unsafe { libc::statvfs(name.as_ptr(), &mut stats) } != 0 {
        return None;
    }
    Some(stats.f_bavail as u64 * stats.f_frsize as u64)
}

impl ServedTargets {
    pub fn new(root: &PoolRoot) -> anyhow::Result<ServedTargets> {
        eprintln!(
            "pool member files in {} ({})",
            root.path.display(),
            root.why
        );
        process::remove_stale(&root.path);
        process::remove_stale(&std::env::temp_dir());
        Ok(ServedTargets {
            dir: process::Dir::new_in(&std::env::temp_dir(), "sockets")
                .context("cannot create a socket directory")?,
            pools: process::Dir::new_in(&root.path, "pools").with_context(|| {
                format!("cannot create a pool directory in {}", root.path.display())
            })?,
            servers: Vec::new(),
            started: 0,
            uses: 0,
        })
    }

    fn serve(
        &mut self,
        key: &str,
        args: &[String],
        data_dir: Option<PathBuf>,
    ) -> anyhow::Result<&Server> {
        let socket = self.dir.path().join(format!("{}.sock", self.started));
        self.started += 1;
        let mut command = Command::new(weir()?);
        // SAFETY: prctl is async-signal-safe and touches no memory of ours.
        // The server goes when the bench does, even when the bench is
        // killed and its destructors never run.
        unsafe {
            command.pre_exec(|| {
                if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGTERM) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }
        let child = command
            .args([
                "serve",
                "--listen",
                "none",
                "--log-level",
                "warn",
                "--socket",
            ])
            .arg(&socket)
            .args(args)
            .stdout(Stdio::null())
            .spawn()
            .context("cannot start weir serve")?;
        let export = if data_dir.is_some() {
            "bench/vol"
        } else {
            "bench"
        };
        let uri = format!("nbd+unix:///{export}?socket={}", socket.display());
        self.uses += 1;
        self.servers.push(Server {
            key: key.into(),
            child,
            uri: uri.clone(),
            data_dir,
            last_used: self.uses,
        });
        wait_for_server(&uri, &socket)?;
        Ok(self.servers.last().expect("just pushed"))
    }

    /// A pool `bench` of two `device` models stored in sparse files, with
    /// a volume `bench/vol` written full, served with a private admin port.
    fn serve_mirror(&mut self, device: &str) -> anyhow::Result<&Server> {
        self.serve_pool(&format!("mirror {device}"), &[device, device])
    }

    /// A pool `bench` of `devices` (models, each stored in a sparse file
    /// and with a fault control file; two or more: a mirror), with a volume
    /// `bench/vol` written full, served with a private admin port.
    fn serve_pool(&mut self, key: &str, devices: &[&str]) -> anyhow::Result<&Server> {
        while self.servers.iter().filter(|s| s.data_dir.is_some()).count() >= POOLS_LIVE_MAX {
            self.stop_least_used_pool();
        }
        let data_dir = self.pools.path().join(format!("pool{}", self.started));
        std::fs::create_dir_all(&data_dir)?;
        let room = pool_room_bytes(devices.len() as u64);
        if let Some(free) = available_bytes(&data_dir).filter(|&free| free < room) {
            bail!(
                "{} has {} MiB free; the pool '{key}' needs {} MiB (choose another with --pool-dir)",
                self.pools.path().display(),
                free >> 20,
                room >> 20
            );
        }
        let data = data_dir.to_str().context("temporary path is not UTF-8")?;
        let mut members = Vec::new();
        for (copy, device) in devices.iter().enumerate() {
            let size = crate::device::model::ModelSpec::parse(
                device.strip_prefix("model:").unwrap_or(device),
            )
            .map_err(anyhow::Error::msg)?
            .size_bytes;
            let path = data_dir.join(format!("{copy}.img"));
            std::fs::File::create(&path)?.set_len(size)?;
            let control = control_file(&data_dir, copy);
            std::fs::File::create(&control)?;
            members.push(format!(
                "{device},store=file:{},control={}",
                path.display(),
                control.display()
            ));
        }
        let mut create = vec!["pool", "create", "bench"];
        if devices.len() > 1 {
            create.push("mirror");
        }
        create.extend(members.iter().map(String::as_str));
        create.extend(["--data-dir", data]);
        weir_cli(&create)?;
        let size = VOLUME_BYTES.to_string();
        weir_cli(&[
            "volume",
            "create",
            "bench/vol",
            "--size",
            &size,
            "--data-dir",
            data,
        ])?;
        let args: Vec<String> = ["--data-dir", data, "--admin", "127.0.0.1:0"]
            .iter()
            .map(|s| s.to_string())
            .collect();
        self.serve(key, &args, Some(data_dir.clone()))?;
        let uri = self.servers.last().expect("just served").uri.clone();
        eprintln!("filling {} MiB of {key} ...", VOLUME_BYTES >> 20);
        fill(&uri)?;
        Ok(self.servers.last().expect("just served"))
    }

    /// The served pool of `devices`, started on first use.
    fn pool_server(&mut self, devices: &[&str]) -> anyhow::Result<&Server> {
        let key = format!("pool {}", devices.join(" "));
        match self.servers.iter().position(|s| s.key == key) {
            Some(i) => Ok(self.touch(i)),
            None => self.serve_pool(&key, devices),
        }
    }

    /// Server `index`, noted as used now.
    fn touch(&mut self, index: usize) -> &Server {
        self.uses += 1;
        let server = &mut self.servers[index];
        server.last_used = self.uses;
        server
    }

    /// Stops the pool server used least lately and deletes its files.
    fn stop_least_used_pool(&mut self) {
        let Some(index) = (0..self.servers.len())
            .filter(|&i| self.servers[i].data_dir.is_some())
            .min_by_key(|&i| self.servers[i].last_used)
        else {
            return;
        };
        let mut server = self.servers.remove(index);
        eprintln!("stopping {} to make room for the next pool", server.key);
        stop(&mut server.child);
        if let Some(dir) = &server.data_dir {
            let _ = std::fs::remove_dir_all(dir);
        }
    }
}

/// The fault control file of member `copy` of a served pool.
fn control_file(data_dir: &Path, copy: usize) -> PathBuf {
    data_dir.join(format!("{copy}.faults"))
}

impl Targets for ServedTargets {
    fn target(&mut self, device: &str) -> anyhow::Result<Target> {
        let server = match self.servers.iter().position(|s| s.key == device) {
            Some(i) => self.touch(i),
            None => self.serve(
                device,
                &["--export".into(), format!("bench={device}")],
                None,
            )?,
        };
        Ok(Target::Nbd {
            uri: server.uri.clone(),
            device: Some(device.into()),
        })
    }

    fn pool_of(
        &mut self,
        devices: &[&str],
        policy: Option<ReadPolicy>,
    ) -> anyhow::Result<Option<Target>> {
        let server = self.pool_server(devices)?;
        let data_dir = server.data_dir.clone().expect("a pool has a data dir");
        if let Some(policy) = policy {
            AdminClient::for_data_dir(&data_dir)?.call(
                "POST",
                "/v1/read-policy",
                &[("pool", "bench"), ("policy", policy.name())],
            )?;
        }
        Ok(Some(Target::ServedPool {
            uri: server.uri.clone(),
            data_dir,
            pool: "bench".into(),
            mode: Mode::default(),
            device: server.key.clone(),
        }))
    }

    fn pool_volume_bytes(&self) -> u64 {
        VOLUME_BYTES
    }

    fn run_with_slow_copy(
        &mut self,
        label: &str,
        devices: &[&str],
        policy: ReadPolicy,
        jobs: &[crate::workload::JobSpec],
        slow: SlowCopy,
        seed: u64,
    ) -> anyhow::Result<Run> {
        let target = self
            .pool_of(devices, Some(policy))?
            .expect("served targets build pools");
        let Target::ServedPool { data_dir, .. } = &target else {
            unreachable!("pool_of serves pools")
        };
        let control = control_file(data_dir, slow.copy);
        let sampler = ShareSampler::start(data_dir)?;
        let started = Instant::now();
        let fault = std::thread::spawn(move || -> std::io::Result<()> {
            let at = |s: f64| started + Duration::from_secs_f64(s);
            std::thread::sleep(at(slow.from_s).saturating_duration_since(Instant::now()));
            std::fs::write(&control, format!("slow {}\n", slow.factor))?;
            std::thread::sleep(at(slow.until_s).saturating_duration_since(Instant::now()));
            std::fs::write(&control, "heal\n")
        });
        let mut run = super::run_jobs(label, &target, jobs, slow.run_s, seed)?;
        fault
            .join()
            .map_err(|_| anyhow::anyhow!("the fault timer panicked"))?
            .context("cannot write the fault control file")?;
        run.device_read_timeline = Some(sampler.finish()?);
        Ok(run)
    }

    fn mirror(&mut self, device: &str, mode: Mode) -> anyhow::Result<Option<Target>> {
        let key = format!("mirror {device}");
        let server = match self.servers.iter().position(|s| s.key == key) {
            Some(i) => self.touch(i),
            None => self.serve_mirror(device)?,
        };
        Ok(Some(Target::ServedPool {
            uri: server.uri.clone(),
            data_dir: server.data_dir.clone().expect("a mirror has a data dir"),
            pool: "bench".into(),
            mode,
            device: key,
        }))
    }
}

impl Drop for ServedTargets {
    fn drop(&mut self) {
        for server in &mut self.servers {
            stop(&mut server.child);
        }
    }
}

/// reported by the bytes it read (its latency is not seen from here).
/// Run `jobs` against a served pool in `mode`. A job named `scrub` is the
/// pool's own scrub rather than NBD reads: it runs for the whole run and is
/// reported by the bytes it read (its latency is not seen from here).
pub fn run_pool(
    uri: &str,
    data_dir: &Path,
    pool: &str,
    mode: Mode,
    jobs: &[crate::workload::JobSpec],
    duration: u64,
    seed: u64,
) -> anyhow::Result<Vec<StreamResult>> {
    let client = AdminClient::for_data_dir(data_dir)?;
    client.call(
        "POST",
        "/v1/sched",
        &[("pool", pool), ("mode", mode.name())],
    )?;
    let scrub = jobs.iter().find(|j| j.name == "scrub").cloned();
    let clients: Vec<_> = jobs.iter().filter(|j| j.name != "scrub").cloned().collect();
    let meter = match scrub {
        Some(_) => Some(ScrubMeter::start(data_dir, pool)?),
        None => None,
    };
    let started = Instant::now();
    let mut results = if clients.is_empty() {
        std::thread::sleep(Duration::from_nanos(duration));
        Vec::new()
    } else {
        super::real::run(uri, &clients, duration, seed)?
    };
    let active_ns = started.elapsed().as_nanos() as u64;
    if let (Some(meter), Some(job)) = (meter, scrub) {
        let bytes = meter.finish()?;
        results.push(StreamResult {
            job,
            // Device reads of one chunk copy each (chunks never written
            // are passed over without I/O, so they do not count).
            ops: bytes / CHUNK_BYTES,
            bytes,
            errors: 0,
            active_ns,
            latency: Default::default(),
            latency_over_time: Vec::new(),
        });
    }
    // Report streams in job order.
    let order = |name: &str| jobs.iter().position(|j| j.name == name);
    results.sort_by_key(|r| order(&r.job.name));
    Ok(results)
}
