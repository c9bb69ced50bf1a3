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

/// `items` in `parts` shares of consecutive items, of about equal `weight` each, each handed to
/// `share` on a thread of its own but the first (handed to it on this thread, as is a share no
/// thread could be made for); what each gave, in the shares' order. A panic in a share is
/// raised again here.
pub(crate) fn in_shares<T: Send, S: Send>(
    items: Vec<T>,
    parts: usize,
    weight: impl Fn(&T) -> usize,
    share: impl Fn(Vec<T>) -> S + Sync,
) -> Vec<S> {
    let parts = parts.clamp(1, items.len().max(1));
    if parts == 1 {
        return vec![share(items)];
    }
    let total: usize = items.iter().map(&weight).sum();
    let mut shares: Vec<Vec<T>> = (0..parts).map(|_| Vec::new()).collect();
    let mut seen = 0;
    for item in items {
        let at = (seen * parts / total.max(1)).min(parts - 1);
        seen += weight(&item);
        shares[at].push(item);
    }
    let mut shares = shares.into_iter();
    let first = shares.next().unwrap_or_default();
    let share = &share;
    std::thread::scope(|scope| {
        let others: Vec<_> = shares
            .map(|items| {
                if crate::failpoints::fires("share_thread_refused") {
                    return Err(items);
                }
                let (tx, rx) = std::sync::mpsc::channel();
                let spawned = std::thread::Builder::new()
                    .name("brood-share".into())
                    .spawn_scoped(scope, move || {
                        let items = rx.recv().unwrap_or_default();
                        share(items)
                    });
                match spawned {
                    Ok(t) => {
                        let _ = tx.send(items);
                        Ok(t)
                    }
                    Err(_) => Err(items),
                }
            })
            .collect();
        let mut out = Vec::with_capacity(others.len() + 1);
        out.push(share(first));
        for other in others {
            out.push(match other {
                Ok(t) => t.join().unwrap_or_else(|panic| std::panic::resume_unwind(panic)),
                Err(items) => share(items),
            });
        }
        out
    })
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

#[cfg(test)]
mod tests {
    use super::in_shares;

    #[test]
    fn shares_give_back_every_item_once_in_order_however_many_there_are() {
        let items: Vec<u32> = (0..100).collect();
        for parts in [0, 1, 2, 3, 7, 100, 1000] {
            let shares = in_shares(items.clone(), parts, |&i| 1 + (i as usize % 5), |share| share);
            assert!(shares.len() <= parts.max(1), "{parts}: {} shares", shares.len());
            assert_eq!(shares.concat(), items, "{parts} parts");
        }
        assert_eq!(in_shares(Vec::<u32>::new(), 4, |_| 1, |s| s.len()), vec![0]);
    }

    #[test]
    fn shares_of_about_equal_weight_run_on_threads_of_their_own() {
        // One heavy item and many light ones: the heavy one is a share alone.
        let mut items = vec![1_000usize];
        items.extend(std::iter::repeat_n(1, 1_000));
        let shares = in_shares(items, 2, |&w| w, |share| (share.len(), std::thread::current().id()));
        assert_eq!(shares.iter().map(|s| s.0).collect::<Vec<_>>(), vec![1, 1_000]);
        assert_eq!(
            shares[0].1,
            std::thread::current().id(),
            "the first share is this thread's"
        );
        assert_ne!(shares[1].1, shares[0].1, "the second has a thread of its own");
        // No thread to be had for the others: every share is handed over on this thread, the same.
        #[cfg(feature = "failpoints")]
        {
            crate::failpoints::arm("share_thread_refused", u64::MAX);
            let here: Vec<u32> = (0..100).collect();
            let shares = in_shares(here.clone(), 4, |_| 1, |share| (share, std::thread::current().id()));
            crate::failpoints::arm("share_thread_refused", 0);
            assert_eq!(shares.len(), 4);
            assert!(shares.iter().all(|s| s.1 == std::thread::current().id()));
            assert_eq!(shares.into_iter().flat_map(|s| s.0).collect::<Vec<_>>(), here);
        }
    }

    #[test]
    fn a_share_that_panics_panics_the_caller() {
        let caught = std::panic::catch_unwind(|| {
            in_shares(
                (0..10).collect::<Vec<u32>>(),
                2,
                |_| 1,
                |share| {
                    assert!(!share.contains(&9), "the last share fails");
                    share.len()
                },
            )
        });
        assert!(caught.is_err());
    }
}
