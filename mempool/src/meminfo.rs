//! Reading hugepage availability from `/proc/meminfo`.
//!
//! Used only on the slow path, to turn a failed hugepage reservation into an
//! error that says how many pages were needed, how many are free and the
//! command that reserves more.

use std::fs;

/// Hugepage counters of the default hugepage size, as `/proc/meminfo` reports them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct HugepageInfo {
    /// `HugePages_Total`: pages in the pool.
    pub total: u64,
    /// `HugePages_Free`: pages not yet faulted in by anyone.
    pub free: u64,
    /// `HugePages_Rsvd`: free pages already promised to existing mappings.
    pub reserved: u64,
    /// `Hugepagesize` in bytes (2 MiB on x86-64 unless the kernel says otherwise).
    pub page_size_bytes: u64,
}

impl HugepageInfo {
    /// Pages a new mapping can still obtain: free minus already reserved.
    pub fn available(&self) -> u64 {
        self.free.saturating_sub(self.reserved)
    }

    /// Parses the text of `/proc/meminfo`. Missing keys read as zero.
    pub fn parse(text: &str) -> Self {
        let mut info = HugepageInfo::default();
        for line in text.lines() {
            let mut parts = line.split_whitespace();
            let (Some(key), Some(value)) = (parts.next(), parts.next()) else {
                continue;
            };
            let Ok(value) = value.parse::<u64>() else {
                continue;
            };
            match key {
                "HugePages_Total:" => info.total = value,
                "HugePages_Free:" => info.free = value,
                "HugePages_Rsvd:" => info.reserved = value,
                // Reported in kB.
                "Hugepagesize:" => info.page_size_bytes = value * 1024,
                _ => {}
            }
        }
        info
    }

    /// Reads and parses `/proc/meminfo`; `None` if it cannot be read.
    pub fn read() -> Option<Self> {
        fs::read_to_string("/proc/meminfo")
            .ok()
            .map(|t| Self::parse(&t))
    }
}

/// Memory this process has locked, bytes (`VmLck` of `/proc/self/status`).
pub fn locked_bytes() -> Option<u64> {
    parse_vm_lck(&fs::read_to_string("/proc/self/status").ok()?)
}

fn parse_vm_lck(status: &str) -> Option<u64> {
    let kib = status.lines().find_map(|l| l.strip_prefix("VmLck:"))?;
    let kib = kib.trim().strip_suffix("kB")?.trim().parse::<u64>().ok()?;
    Some(kib * 1024)
}

/// The shell command that grows the 2 MiB hugepage pool so that `needed`
/// more pages can be had, given the current counters.
pub fn reserve_command(info: &HugepageInfo, needed: u64) -> String {
    let target = info.total + needed.saturating_sub(info.available());
    format!("echo {target} | sudo tee /proc/sys/vm/nr_hugepages")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn vm_lck_is_read_in_bytes() {
        assert_eq!(
            parse_vm_lck("VmPeak:\t  100 kB\nVmLck:\t    8192 kB\n"),
            Some(8 << 20)
        );
        assert_eq!(parse_vm_lck("VmPeak: 1 kB\n"), None);
    }

    const SAMPLE: &str = "MemTotal:       24576000 kB\n\
        AnonHugePages:         0 kB\n\
        HugePages_Total:     512\n\
        HugePages_Free:      100\n\
        HugePages_Rsvd:       20\n\
        HugePages_Surp:        0\n\
        Hugepagesize:       2048 kB\n";

    #[test]
    fn parses_counters() {
        let info = HugepageInfo::parse(SAMPLE);
        assert_eq!(info.total, 512);
        assert_eq!(info.free, 100);
        assert_eq!(info.reserved, 20);
        assert_eq!(info.available(), 80);
        assert_eq!(info.page_size_bytes, 2 << 20);
    }

    #[test]
    fn garbage_reads_as_zero() {
        let info = HugepageInfo::parse("HugePages_Total: lots\nnonsense\n\n:");
        assert_eq!(info, HugepageInfo::default());
    }

    #[test]
    fn reserve_command_adds_the_shortfall() {
        let info = HugepageInfo::parse(SAMPLE);
        // 80 available, 200 needed: grow the pool by 120.
        assert_eq!(
            reserve_command(&info, 200),
            "echo 632 | sudo tee /proc/sys/vm/nr_hugepages"
        );
    }
}
