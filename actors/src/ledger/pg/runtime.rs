//! The PostgreSQL ledger's own runtimes (one for commits, one for large reads), each on a
//! thread of its own: the trait's callers wait on a channel for what it answers.

use std::future::Future;

use super::LedgerError;

/// The ledger's own runtime, driven on a thread of its own until the ledger is dropped.
pub(super) struct Runtime {
    pub(super) handle: tokio::runtime::Handle,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Runtime {
    /// A runtime driven on a thread named `name`, at a lowered priority when `background`
    /// (what it runs yields the CPU to routing and commits).
    pub(super) fn start(name: &str, background: bool) -> Result<Self, LedgerError> {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(|e| LedgerError::storage("starting the PostgreSQL ledger's runtime", e))?;
        let handle = rt.handle().clone();
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let thread = std::thread::Builder::new()
            .name(name.into())
            .spawn(move || {
                if background {
                    crate::parallel::lower_this_threads_priority();
                }
                let _ = rt.block_on(stopped);
            })
            .map_err(|e| LedgerError::storage(format!("starting the PostgreSQL ledger's thread {name}"), e))?;
        Ok(Runtime {
            handle,
            stop: Some(stop),
            thread: Some(thread),
        })
    }

    /// Runs `job` on the ledger's runtime and waits for its answer (from any thread but the
    /// runtime's own).
    pub(super) fn run<T: Send + 'static>(
        &self,
        job: impl Future<Output = Result<T, LedgerError>> + Send + 'static,
    ) -> Result<T, LedgerError> {
        run_on(&self.handle, job)
    }
}

/// Runs `job` on the runtime of `handle` and waits for its answer on a channel (from any thread
/// but that runtime's own: blocking inside it would stall it).
pub(super) fn run_on<T: Send + 'static>(
    handle: &tokio::runtime::Handle,
    job: impl Future<Output = Result<T, LedgerError>> + Send + 'static,
) -> Result<T, LedgerError> {
    let (tx, rx) = std::sync::mpsc::channel();
    handle.spawn(async move {
        let _ = tx.send(job.await);
    });
    rx.recv()
        .unwrap_or_else(|_| Err(LedgerError::storage_msg("the PostgreSQL ledger's runtime stopped")))
}

impl Drop for Runtime {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}
