//! The comparison rules, as a pure function over our tables and a header's
//! facts, so that a test can feed it a deliberately broken copy of a table.
//!
//! Rules (bits are counted MSB-first from the start of the structure):
//! * `mlx5_ifc.h` integer fields: the same offset and width, except that a
//!   header may have widened a field into the reserved bits in front of it
//!   (the PRM only grows). Such a field keeps its least significant bit, so
//!   we require the same *end* (offset + width) and our width <= theirs;
//!   with equal widths this is exactly "same offset".
//! * byte-layout structs (`device.h`, `mlx5dv.h`): offset and width equal.
//! * embedded layouts: same offset, our size <= the member's size (a union
//!   member is as large as its largest alternative).
//! * arrays: same offset, our element width <= theirs.
//! * layout sizes: ours <= theirs (headers may append fields).
//! * constants: equal values.

use mlx5::prm::{ConstDesc, Kind, LayoutInfo, Source};

use super::headers::Facts;

/// One disagreement.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Mismatch {
    /// Where.
    pub what: String,
    /// Why.
    pub why: String,
}

/// Counts of what was compared.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Checked {
    /// Layouts whose source is this header.
    pub layouts: usize,
    /// Members compared.
    pub members: usize,
    /// Constants compared.
    pub consts: usize,
}

fn applies(l: &LayoutInfo, facts: &Facts) -> bool {
    let dv = facts.label.contains("mlx5dv");
    matches!(
        (l.source, dv),
        (Source::Dv(_), true) | (Source::Ifc(_) | Source::Kernel { .. }, false)
    )
}

/// Compares our layouts and constants with one header's facts.
pub fn compare(
    layouts: &[LayoutInfo],
    consts: &[ConstDesc],
    facts: &Facts,
) -> (Checked, Vec<Mismatch>) {
    let mut out = Vec::new();
    let mut n = Checked::default();
    for l in layouts.iter().filter(|l| applies(l, facts)) {
        n.layouts += 1;
        match facts.sizes.get(l.rust) {
            Some(Ok(theirs)) if l.bits > *theirs => out.push(Mismatch {
                what: format!("{} size", l.rust),
                why: format!("ours {:#x} bits > header {:#x}", l.bits, theirs),
            }),
            Some(Ok(_)) => {}
            Some(Err(e)) => out.push(Mismatch {
                what: format!("{} size", l.rust),
                why: e.clone(),
            }),
            None => out.push(Mismatch {
                what: format!("{} size", l.rust),
                why: "not probed".into(),
            }),
        }
        let ifc = matches!(l.source, Source::Ifc(_));
        for f in l.fields {
            n.members += 1;
            let what = format!("{}.{}", l.rust, f.rust);
            let Some((cname, theirs)) = facts.members.get(&(l.rust, f.rust)) else {
                out.push(Mismatch {
                    what,
                    why: "not probed".into(),
                });
                continue;
            };
            let (tb, tw) = match theirs {
                Ok(x) => *x,
                Err(e) => {
                    out.push(Mismatch {
                        what,
                        why: e.clone(),
                    });
                    continue;
                }
            };
            let ok = match f.kind {
                Kind::Field if ifc => f.bit + f.width == tb + tw && f.width <= tw,
                Kind::Field => f.bit == tb && f.width == tw,
                Kind::Sub(_) => f.bit == tb && f.width <= tw,
                Kind::Flex => f.bit == tb && f.width <= tw,
            };
            if !ok {
                out.push(Mismatch {
                    what,
                    why: format!(
                        "ours bit {:#x} width {} ({:?}); header `{cname}` bit {tb:#x} width {tw}",
                        f.bit, f.width, f.kind
                    ),
                });
            }
        }
    }
    let dv = facts.label.contains("mlx5dv");
    for c in consts
        .iter()
        .filter(|c| matches!(c.header, mlx5::prm::ConstHeader::Dv) == dv)
    {
        n.consts += 1;
        match facts.consts.get(c.c_name) {
            Some(Ok(v)) if *v == c.value => {}
            Some(Ok(v)) => out.push(Mismatch {
                what: c.rust.to_string(),
                why: format!("ours {:#x}, header {} = {v:#x}", c.value, c.c_name),
            }),
            Some(Err(e)) => out.push(Mismatch {
                what: c.rust.to_string(),
                why: format!("{}: {e}", c.c_name),
            }),
            None => out.push(Mismatch {
                what: c.rust.to_string(),
                why: format!("{} not probed", c.c_name),
            }),
        }
    }
    (n, out)
}
