//! How many threads a piece of work is worth: a read of many rows (the sled ledger's scan of a
//! session's children, the decoding of the rows a PostgreSQL read received) or a plan over
//! them (recovery) is split over the cores when it is large, and runs on the calling thread
//! when it is not. Background work (an owner's rebuild, the PostgreSQL ledger's large reads)
//! runs at a lowered priority, so routing and commits go first when they meet.

/// How many threads a read or a plan of `rows` rows in `pieces` independent pieces is worth:
/// one per core (at most [`PARALLEL_MAX`]), each with [`PARALLEL_ROWS`] rows at least.
pub(crate) fn threads_for(rows: usize, pieces: usize) -> usize {
    std::thread::available_parallelism()
        .map_or(1, |n| n.get())
        .min(PARALLEL_MAX)
        .min(rows / PARALLEL_ROWS)
        .min(pieces)
        .max(1)
}

/// The most threads a read or a plan uses at once.
const PARALLEL_MAX: usize = 4;
/// The fewest rows worth a thread of their own.
const PARALLEL_ROWS: usize = 20_000;

/// Lowers the calling thread's scheduling priority by [`LOWERED_BY`] nice steps (at most to 19):
/// background work yields the CPU to routing, whatever priority the process was started at (a
/// process started at nice 15 keeps its routing at 15 and its background work at 19, never
/// above). Linux applies `setpriority` to the one thread named by its id; elsewhere, or if
/// refused, the thread keeps its priority.
pub(crate) fn lower_this_threads_priority() {
    #[cfg(target_os = "linux")]
    {
        // SAFETY: gettid has no arguments and cannot fail; getpriority and setpriority only
        // read their arguments; errno is this thread's own. -1 is a nice value as well as
        // getpriority's error, so errno is cleared first and read after.
        let refused = unsafe {
            let tid = libc::syscall(libc::SYS_gettid) as libc::id_t;
            *libc::__errno_location() = 0;
            let now = libc::getpriority(libc::PRIO_PROCESS, tid);
            (now == -1 && *libc::__errno_location() != 0)
                || libc::setpriority(libc::PRIO_PROCESS, tid, now.saturating_add(LOWERED_BY).min(19)) != 0
        };
        if refused {
            tracing::debug!("could not lower a background thread's priority");
        }
    }
}

/// How many nice steps background work runs below the thread that starts it.
const LOWERED_BY: i32 = 10;
