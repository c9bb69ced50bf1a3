//! The unsynced bytes of one file: a page overlay over the file's durable copy.
//!
//! This module owns the arithmetic of a file's two views — the durable one (the backing file,
//! what survives a power cut) and the visible one (what reads show, as a page cache would) —
//! and nothing else: it does not know about directories, handles or FUSE. Written pages live in
//! memory until [`Overlay::sync`] writes them to the backing file; [`Overlay::forget`] drops
//! them, which is what a power cut does to a file.

use std::collections::BTreeMap;
use std::fs::File;
use std::io;
use std::os::unix::fs::FileExt;

/// The overlay's page size.
pub(crate) const PAGE: u64 = 4096;

/// The visible state of one file on top of its durable copy.
///
/// Invariants: `valid <= durable_len`, `valid <= size`, and every byte of a page at or past
/// `size` is zero, so a file that grows again reads zeros there.
#[derive(Debug)]
pub(crate) struct Overlay {
    /// The visible length.
    size: u64,
    /// The length of the backing file (the durable length).
    durable_len: u64,
    /// How many leading bytes of the backing file are still part of the visible file; a
    /// truncation hides the rest until the next sync (they read as zeros if the file grows).
    valid: u64,
    /// Written pages by index, each `PAGE` bytes.
    pages: BTreeMap<u64, Box<[u8]>>,
}

impl Overlay {
    /// A clean overlay over a backing file of `durable_len` bytes.
    pub(crate) fn new(durable_len: u64) -> Self {
        Overlay {
            size: durable_len,
            durable_len,
            valid: durable_len,
            pages: BTreeMap::new(),
        }
    }

    /// The visible length.
    pub(crate) fn size(&self) -> u64 {
        self.size
    }

    /// Whether anything visible is not durable yet.
    pub(crate) fn is_dirty(&self) -> bool {
        !self.pages.is_empty() || self.size != self.durable_len || self.valid != self.durable_len
    }

    /// Reads up to `len` bytes at `offset` of the visible file (fewer at its end).
    pub(crate) fn read(&self, backing: &File, offset: u64, len: u64) -> io::Result<Vec<u8>> {
        let end = offset.saturating_add(len).min(self.size);
        if offset >= end {
            return Ok(Vec::new());
        }
        let mut out = vec![0u8; usize_of(end - offset)?];
        let mut at = offset;
        while at < end {
            let index = at / PAGE;
            let page_start = index * PAGE;
            let upto = (page_start + PAGE).min(end);
            let dst = &mut out[usize_of(at - offset)?..usize_of(upto - offset)?];
            match self.pages.get(&index) {
                Some(page) => dst.copy_from_slice(&page[usize_of(at - page_start)?..usize_of(upto - page_start)?]),
                None => self.read_durable(backing, at, dst)?,
            }
            at = upto;
        }
        Ok(out)
    }

    /// Writes `data` at `offset` into memory; the file grows if it ends past the visible end.
    pub(crate) fn write(&mut self, backing: &File, offset: u64, data: &[u8]) -> io::Result<()> {
        let end = offset
            .checked_add(data.len() as u64)
            .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidInput, "write past the largest offset"))?;
        let mut at = offset;
        while at < end {
            let index = at / PAGE;
            let page_start = index * PAGE;
            let upto = (page_start + PAGE).min(end);
            if !self.pages.contains_key(&index) {
                let mut page = vec![0u8; PAGE as usize].into_boxed_slice();
                self.read_durable(backing, page_start, &mut page)?;
                self.pages.insert(index, page);
            }
            if let Some(page) = self.pages.get_mut(&index) {
                page[usize_of(at - page_start)?..usize_of(upto - page_start)?]
                    .copy_from_slice(&data[usize_of(at - offset)?..usize_of(upto - offset)?]);
            }
            at = upto;
        }
        self.size = self.size.max(end);
        Ok(())
    }

    /// Sets the visible length (a truncation or an extension with zeros), in memory.
    pub(crate) fn set_len(&mut self, len: u64) {
        if len < self.size {
            let first_gone = len.div_ceil(PAGE);
            self.pages.retain(|&index, _| index < first_gone);
            if len % PAGE != 0 {
                if let Some(page) = self.pages.get_mut(&(len / PAGE)) {
                    page[(len % PAGE) as usize..].fill(0);
                }
            }
            self.valid = self.valid.min(len);
        }
        self.size = len;
    }

    /// Makes the visible file durable: writes the dirty pages to `backing`, sets its length,
    /// and fsyncs it (`fdatasync` when `data_only`).
    pub(crate) fn sync(&mut self, backing: &File, data_only: bool) -> io::Result<()> {
        if !self.is_dirty() {
            return Ok(());
        }
        if self.valid < self.durable_len {
            backing.set_len(self.valid)?;
        }
        for (&index, page) in &self.pages {
            let start = index * PAGE;
            if start >= self.size {
                continue;
            }
            let upto = (start + PAGE).min(self.size);
            backing.write_all_at(&page[..usize_of(upto - start)?], start)?;
        }
        backing.set_len(self.size)?;
        if data_only {
            backing.sync_data()?;
        } else {
            backing.sync_all()?;
        }
        self.durable_len = self.size;
        self.valid = self.size;
        self.pages.clear();
        Ok(())
    }

    /// Drops everything not synced: the file is its durable copy again (a power cut).
    pub(crate) fn forget(&mut self) {
        self.pages.clear();
        self.size = self.durable_len;
        self.valid = self.durable_len;
    }

    /// Fills `dst` with the durable bytes at `offset`, zeros past the still-valid prefix.
    fn read_durable(&self, backing: &File, offset: u64, dst: &mut [u8]) -> io::Result<()> {
        dst.fill(0);
        if offset >= self.valid {
            return Ok(());
        }
        let n = usize_of((self.valid - offset).min(dst.len() as u64))?;
        backing.read_exact_at(&mut dst[..n], offset)
    }
}

fn usize_of(n: u64) -> io::Result<usize> {
    usize::try_from(n).map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "offset does not fit in memory"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn backing(bytes: &[u8]) -> File {
        let f = tempfile::tempfile().expect("temp file");
        f.write_all_at(bytes, 0).expect("seed the backing file");
        f
    }

    #[test]
    fn a_write_is_visible_but_not_durable_until_sync() {
        let f = backing(b"hello");
        let mut o = Overlay::new(5);
        o.write(&f, 3, b"p me").expect("write");
        assert_eq!(o.read(&f, 0, 100).expect("read"), b"help me");
        let mut durable = vec![0u8; 5];
        f.read_exact_at(&mut durable, 0).expect("read backing");
        assert_eq!(durable, b"hello");
        o.sync(&f, true).expect("sync");
        assert_eq!(f.metadata().expect("stat").len(), 7);
        assert!(!o.is_dirty());
    }

    #[test]
    fn forget_restores_the_durable_copy() {
        let f = backing(b"abc");
        let mut o = Overlay::new(3);
        o.write(&f, 10_000, b"far").expect("write");
        o.set_len(1);
        o.forget();
        assert_eq!(o.read(&f, 0, 100).expect("read"), b"abc");
    }

    #[test]
    fn a_truncated_then_grown_file_reads_zeros_where_it_was_cut() {
        let f = backing(b"abcdefgh");
        let mut o = Overlay::new(8);
        o.write(&f, 0, b"A").expect("write");
        o.set_len(2);
        o.set_len(6);
        assert_eq!(o.read(&f, 0, 100).expect("read"), b"Ab\0\0\0\0");
        o.sync(&f, false).expect("sync");
        let mut durable = vec![0u8; 6];
        f.read_exact_at(&mut durable, 0).expect("read backing");
        assert_eq!(durable, b"Ab\0\0\0\0");
    }
}
