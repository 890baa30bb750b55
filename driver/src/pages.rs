//! Pages lent to firmware (MANAGE_PAGES). Pages come from 2 MiB blocks of
//! the DMA pool, 512 pages per block with a free list each, so that giving
//! and taking back thousands of pages stays cheap; a block returns to the
//! pool once all its pages are back.
//!
//! Each page remembers the function it was given for (firmware names one
//! in QUERY_PAGES and in every page request: the own function, or on an
//! embedded-CPU function also the host PF), because it must be taken back
//! for that same function (Linux `pagealloc.c` keys its page tree by
//! function).

use std::collections::BTreeMap;
use std::sync::Arc;

use crate::dma::{DmaMem, DmaPool, PAGE};
use crate::error::Error;

const BLOCK_PAGES: usize = 512;

#[derive(Debug)]
struct Block {
    mem: DmaMem,
    free: Vec<u16>,
}

/// Bookkeeping of every page firmware holds.
#[derive(Debug, Default)]
pub struct FwPages {
    blocks: Vec<Block>,
    given: usize,
    /// The function each given page belongs to (`ec << 16 | function_id`).
    owner: BTreeMap<u64, u32>,
    /// Pages given over the device's life.
    pub total_given: u64,
    /// Pages taken back over the device's life.
    pub total_taken: u64,
}

/// A page address firmware returned that we never gave it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct UnknownPage(pub u64);

impl FwPages {
    /// Pages firmware holds now.
    pub fn given(&self) -> usize {
        self.given
    }

    /// Pages firmware holds now, per function (`ec << 16 | function_id`).
    pub fn by_function(&self) -> BTreeMap<u32, usize> {
        let mut m = BTreeMap::new();
        for f in self.owner.values() {
            *m.entry(*f).or_insert(0) += 1;
        }
        m
    }

    /// Takes `n` free pages (allocating blocks as needed) and returns their
    /// IOVAs, marked as given to function `func` (`ec << 16 | function_id`).
    /// If memory runs out, nothing is taken (blocks allocated so far stay
    /// for the next attempt).
    pub fn take_for_firmware(
        &mut self,
        pool: &Arc<DmaPool>,
        n: usize,
        func: u32,
    ) -> Result<Vec<u64>, Error> {
        let mut free: usize = self.blocks.iter().map(|b| b.free.len()).sum();
        while free < n {
            let mem = match pool.alloc(BLOCK_PAGES * PAGE) {
                Ok(m) => m,
                Err(e) => {
                    self.trim();
                    return Err(e);
                }
            };
            self.blocks.push(Block {
                mem,
                free: (0..BLOCK_PAGES as u16).rev().collect(),
            });
            free += BLOCK_PAGES;
        }
        let mut out = Vec::with_capacity(n);
        for block in self.blocks.iter_mut() {
            while out.len() < n {
                let Some(p) = block.free.pop() else { break };
                let iova = block.mem.iova_at(p as usize * PAGE);
                self.owner.insert(iova, func);
                out.push(iova);
            }
        }
        self.given += n;
        self.total_given += n as u64;
        Ok(out)
    }

    /// Gives every block none of whose pages firmware holds back to the pool.
    pub fn trim(&mut self) {
        self.blocks.retain(|b| b.free.len() < BLOCK_PAGES);
    }

    /// Undoes `take_for_firmware` for pages firmware did not accept.
    pub fn unwind(&mut self, pages: &[u64]) {
        for &p in pages {
            self.returned(p)
                .expect("unwinding pages we just handed out");
        }
        self.total_given -= pages.len() as u64;
        self.total_taken -= pages.len() as u64;
    }

    /// Firmware gave page `iova` back.
    pub fn returned(&mut self, iova: u64) -> Result<(), UnknownPage> {
        let i = self
            .blocks
            .iter()
            .position(|b| {
                iova >= b.mem.iova()
                    && iova < b.mem.iova() + b.mem.len() as u64
                    && (iova - b.mem.iova()).is_multiple_of(PAGE as u64)
            })
            .ok_or(UnknownPage(iova))?;
        let b = &mut self.blocks[i];
        let idx = ((iova - b.mem.iova()) / PAGE as u64) as u16;
        if b.free.contains(&idx) {
            return Err(UnknownPage(iova));
        }
        b.free.push(idx);
        self.owner.remove(&iova);
        self.given -= 1;
        self.total_taken += 1;
        if b.free.len() == BLOCK_PAGES {
            self.blocks.swap_remove(i);
        }
        Ok(())
    }

    /// Blocks currently allocated.
    pub fn blocks(&self) -> usize {
        self.blocks.len()
    }
}
