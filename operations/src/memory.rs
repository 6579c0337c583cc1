//! Memory budget check: a runner's buffers are bounded in bytes by its
//! config; at start it compares that bound with the memory the machine (or
//! its cgroup) really has, and warns with the numbers and the settings to
//! lower, so an out-of-memory kill is explained before it happens.

/// The allocator of every Tributary process: jemalloc, as vector uses.
///
/// A runner allocates a few small values per row on one thread and frees
/// them on another (a snapshot reader's rows, encoded on the runner's loop;
/// a sink's decoded rows, applied in their own task). glibc's malloc spent
/// a third of the sink loop's CPU on that (`malloc_consolidate`,
/// `unlink_chunk`, `_int_free`) in a 1M-row snapshot; jemalloc's
/// per-thread caches do it for a fraction. librdkafka's own C allocations
/// stay with glibc's malloc ([`tune_allocator`]).
#[global_allocator]
static ALLOCATOR: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

/// jemalloc's options (`malloc_conf`), read at its first allocation; the
/// `MALLOC_CONF` variable of jemalloc's docs is spelled `_RJEM_MALLOC_CONF`
/// for this build and overrides them.
#[used]
#[export_name = "_rjem_malloc_conf"]
static MALLOC_CONF: ConfText = ConfText(JEMALLOC_OPTIONS.as_ptr());

/// The text of [`MALLOC_CONF`]: freed pages go back to the system after
/// 1 s instead of jemalloc's 10 s, so that the peak RSS follows the buffers
/// the config bounds, not a snapshot's churn.
pub const JEMALLOC_OPTIONS: &std::ffi::CStr = c"dirty_decay_ms:1000,muzzy_decay_ms:0";

/// A C string pointer in a static (`const char *malloc_conf`).
#[repr(transparent)]
struct ConfText(*const std::ffi::c_char);

// SAFETY: the pointer is to a `'static` constant that nothing writes.
unsafe impl Sync for ConfText {}

/// Allocations from this size on get their own mapping from glibc's malloc,
/// returned to the system when freed. Since the Rust side moved to jemalloc
/// ([`ALLOCATOR`]) this concerns librdkafka's C buffers only: a produce
/// request of up to `batch.size` (1 MB), its compressed copy, fetched
/// record batches. Fixed, because glibc's adaptive threshold lets freed
/// arena space pile up (measured when glibc still served every allocation:
/// peak RSS 83 MiB with its defaults, 65 MiB with a fixed 128 KiB). But at
/// 128 KiB every produce request was a fresh mapping, faulted in page by
/// page: 1M-row PostgreSQL snapshots end to end, 138-142k page faults in
/// the source runner (its librdkafka thread 1.3-1.6 s of CPU) against
/// 26k (1.0-1.1 s) at 8 MiB, for 50.2 against 51.4-53.2 MiB peak RSS; the
/// sink runner 75k against 47-54k faults, 107-108 against 107-111 MiB.
pub const MMAP_THRESHOLD_BYTES: i32 = 8 * 1024 * 1024;

/// Free space at the top of a malloc heap beyond this is given back at once
/// (glibc's default grows with the mmap threshold, up to 64 MiB). As large
/// as [`MMAP_THRESHOLD_BYTES`]: a request buffer freed at the top of the heap
/// is then kept for the next one instead of being given back and faulted in
/// again.
pub const TRIM_THRESHOLD_BYTES: i32 = 8 * 1024 * 1024;

/// Sets [`MMAP_THRESHOLD_BYTES`] and [`TRIM_THRESHOLD_BYTES`] in glibc's
/// malloc, unless the operator set them (`MALLOC_MMAP_THRESHOLD_`,
/// `MALLOC_TRIM_THRESHOLD_`). Elsewhere (musl, other systems) nothing
/// changes. Call once at start, before other threads exist.
pub fn tune_allocator() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    {
        if std::env::var_os("MALLOC_MMAP_THRESHOLD_").is_none() {
            // SAFETY: mallopt only sets a malloc parameter; it is called
            // before any other thread of the process exists.
            unsafe { libc::mallopt(libc::M_MMAP_THRESHOLD, MMAP_THRESHOLD_BYTES) };
        }
        if std::env::var_os("MALLOC_TRIM_THRESHOLD_").is_none() {
            // SAFETY: as above.
            unsafe { libc::mallopt(libc::M_TRIM_THRESHOLD, TRIM_THRESHOLD_BYTES) };
        }
    }
}

/// A budget above this share of the available memory is reported: the
/// process needs room beyond its buffers (allocator slack, TLS, librdkafka).
pub const BUDGET_WARN_SHARE: f64 = 0.5;

/// Bytes this process may use: the cgroup limit when there is one, else
/// the machine's available memory. `None` when neither can be read.
pub fn available_bytes() -> Option<u64> {
    let cgroup = std::fs::read_to_string("/sys/fs/cgroup/memory.max")
        .ok()
        .and_then(|s| s.trim().parse::<u64>().ok());
    let meminfo = std::fs::read_to_string("/proc/meminfo").ok().and_then(|s| {
        s.lines()
            .find_map(|l| l.strip_prefix("MemAvailable:"))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
            .map(|kb| kb * 1024)
    });
    match (cgroup, meminfo) {
        (Some(c), Some(m)) => Some(c.min(m)),
        (c, m) => c.or(m),
    }
}

/// The warning for a buffer budget of `budget` bytes against `available`
/// bytes, naming the settings that make up the budget; `None` when it fits.
pub fn budget_warning(budget: u64, available: u64, settings: &str) -> Option<String> {
    if (budget as f64) <= available as f64 * BUDGET_WARN_SHARE {
        return None;
    }
    Some(format!(
        "out-of-memory risk: buffers may hold {} MiB but only {} MiB are available; lower {settings}",
        budget / (1024 * 1024),
        available / (1024 * 1024)
    ))
}

/// Logs the budget at start, and a warning when it does not fit.
pub fn report_budget(budget: u64, settings: &str) {
    match available_bytes() {
        Some(available) => match budget_warning(budget, available, settings) {
            Some(w) => tracing::warn!(budget_bytes = budget, available_bytes = available, "{w}"),
            None => tracing::info!(budget_bytes = budget, available_bytes = available, "memory budget"),
        },
        None => tracing::info!(budget_bytes = budget, "memory budget (available memory unknown)"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_budget_above_half_the_memory_is_reported_with_the_settings() {
        let mib = 1024 * 1024;
        assert_eq!(budget_warning(100 * mib, 1000 * mib, "batch_max_bytes"), None);
        let w = budget_warning(600 * mib, 1000 * mib, "batch_max_bytes, max_buffered_bytes").expect("a warning");
        assert!(w.contains("600 MiB") && w.contains("1000 MiB") && w.contains("max_buffered_bytes"), "{w}");
    }

    #[test]
    fn jemalloc_allocates_with_our_options() {
        // Read from jemalloc itself: with another allocator, or without the
        // `malloc_conf` symbol it reads, these are absent or jemalloc's
        // defaults (10 s and 10 s).
        // SAFETY: both names are jemalloc's documented `ssize_t` options.
        let dirty: isize = unsafe { tikv_jemalloc_ctl::raw::read(b"opt.dirty_decay_ms\0") }.expect("jemalloc option");
        let muzzy: isize = unsafe { tikv_jemalloc_ctl::raw::read(b"opt.muzzy_decay_ms\0") }.expect("jemalloc option");
        let options = JEMALLOC_OPTIONS.to_str().expect("ASCII");
        assert!(options.contains(&format!("dirty_decay_ms:{dirty}")), "{options} vs {dirty}");
        assert!(options.contains(&format!("muzzy_decay_ms:{muzzy}")), "{options} vs {muzzy}");
        assert_eq!((dirty, muzzy), (1000, 0));
    }

    #[test]
    fn this_machine_reports_its_memory() {
        assert!(available_bytes().is_some_and(|b| b > 0));
    }
}
