//! Pages lent to firmware (MANAGE_PAGES). Pages come from 2 MiB blocks of
//! the DMA pool, 512 pages per block with a free list each, so that giving
//! and taking back thousands of pages stays cheap; a block returns to the
//! pool once all its pages are back.

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

    /// Takes `n` free pages (allocating blocks as needed) and returns their
    /// IOVAs, marked as given.
    /// If memory runs out, nothing is taken (blocks allocated so far stay
    /// for the next attempt).
    pub fn take_for_firmware(&mut self, pool: &Arc<DmaPool>, n: usize) -> Result<Vec<u64>, Error> {
        let mut free: usize = self.blocks.iter().map(|b| b.free.len()).sum();
        while free < n {
            let mem = pool.alloc(BLOCK_PAGES * PAGE)?;
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
                out.push(block.mem.iova_at(p as usize * PAGE));
            }
        }
        self.given += n;
        self.total_given += n as u64;
        Ok(out)
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
                    && (iova - b.mem.iova()) % PAGE as u64 == 0
            })
            .ok_or(UnknownPage(iova))?;
        let b = &mut self.blocks[i];
        let idx = ((iova - b.mem.iova()) / PAGE as u64) as u16;
        if b.free.contains(&idx) {
            return Err(UnknownPage(iova));
        }
        b.free.push(idx);
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
