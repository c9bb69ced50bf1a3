//! How many threads a piece of work is worth: a read of many rows (the sled ledger's scan of a
//! session's children, the decoding of the rows a PostgreSQL read received) or a plan over
//! them (recovery) is split over the cores when it is large, and runs on the calling thread
//! when it is not.

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
