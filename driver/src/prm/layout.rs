//! The machinery every PRM layout is built from: typed fields over
//! big-endian byte buffers, numbered MSB-first within each 32-bit dword as
//! the PRM and `mlx5_ifc.h` number them.
//!
//! A layout is a zero-sized marker type (`Cqc`, `CreateCqIn`, `Cqe64`, ...)
//! with associated constants of type [`Field<S>`] (an integer field),
//! [`Sub<S, T>`] (an embedded layout) or [`Flex<S>`] (a trailing array).
//! Fields are read and written through [`View`]/[`ViewMut`] over byte
//! slices, so a field of one layout cannot be applied to another, and no
//! reference into device memory is ever formed. Code that accesses DMA
//! memory directly uses the same constants through [`Field::dword`],
//! [`Field::shift`] and [`Field::mask`].
//!
//! Each layout also carries a table of [`FieldDesc`] with the names the
//! independent headers use, which the conformance tests compare against
//! the kernel's `mlx5_ifc.h`/`device.h` and rdma-core's `mlx5dv.h`.

use std::fmt;
use std::marker::PhantomData;

/// Where the independent definition of a layout lives.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Source {
    /// `struct mlx5_ifc_<name>_bits` in the kernel's `include/linux/mlx5/mlx5_ifc.h`
    /// (bit offsets and widths).
    Ifc(&'static str),
    /// A byte-layout `struct <name>` in a kernel header under `include/linux/mlx5/`.
    Kernel {
        /// Header file, e.g. `device.h`.
        header: &'static str,
        /// Struct name, e.g. `mlx5_init_seg`.
        name: &'static str,
    },
    /// A byte-layout `struct <name>` in rdma-core's `infiniband/mlx5dv.h`.
    Dv(&'static str),
}

/// What kind of member a [`FieldDesc`] describes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// An integer field of `width` bits.
    Field,
    /// An embedded layout (name of its Rust type).
    Sub(&'static str),
    /// A trailing flexible array whose elements are `width` bits.
    Flex,
}

/// One member of a layout, as the conformance tests see it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FieldDesc {
    /// Rust constant name.
    pub rust: &'static str,
    /// Names this member has in the independent headers; the first that
    /// exists in a given header is used (names change between trees).
    pub names: &'static [&'static str],
    /// Offset in bits from the start of the layout, MSB-first.
    pub bit: u32,
    /// Width in bits (element width for [`Kind::Flex`]).
    pub width: u32,
    /// Member kind.
    pub kind: Kind,
}

/// A layout's identity and field table.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LayoutInfo {
    /// Rust type name.
    pub rust: &'static str,
    /// Independent definition to check against.
    pub source: Source,
    /// Size in bits (0 for a layout whose size the header does not fix).
    pub bits: u32,
    /// Every member we define.
    pub fields: &'static [FieldDesc],
    /// Why this layout deviates from a header, if it does (shown by the
    /// conformance test).
    pub note: Option<&'static str>,
}

/// A PRM structure. Implemented by the zero-sized marker types.
pub trait Layout: 'static {
    /// Identity and field table.
    const INFO: LayoutInfo;
    /// Size in bytes.
    const BYTES: usize = (Self::INFO.bits / 8) as usize;
}

/// An integer field of layout `S`: `width` bits starting `bit` bits into the
/// structure, big-endian, MSB-first.
///
/// Fields of up to 32 bits lie inside one dword; 64-bit fields are
/// dword-aligned; wider byte-aligned fields are read as bytes.
pub struct Field<S> {
    bit: u32,
    width: u32,
    _layout: PhantomData<fn() -> S>,
}

impl<S> Clone for Field<S> {
    fn clone(&self) -> Self {
        *self
    }
}
impl<S> Copy for Field<S> {}

impl<S> fmt::Debug for Field<S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Field(bit {:#x}, width {})", self.bit, self.width)
    }
}

impl<S> Field<S> {
    /// A field at `bit` of `width` bits. Panics (at compile time, in a
    /// const) if the field is not accessible as described on [`Field`].
    pub const fn new(bit: u32, width: u32) -> Self {
        let in_dword = width >= 1 && width <= 32 && bit / 32 == (bit + width - 1) / 32;
        let qword = width == 64 && bit.is_multiple_of(32);
        let bytes = width > 64 && bit.is_multiple_of(8) && width.is_multiple_of(8);
        assert!(
            in_dword || qword || bytes,
            "field neither within a dword, a dword-aligned u64, nor bytes"
        );
        Field {
            bit,
            width,
            _layout: PhantomData,
        }
    }

    /// Offset in bits.
    pub const fn bit(self) -> u32 {
        self.bit
    }

    /// Width in bits.
    pub const fn width(self) -> u32 {
        self.width
    }

    /// Byte offset of the dword holding the field (fields ≤ 32 bits) or of
    /// its first byte.
    pub const fn dword(self) -> usize {
        if self.width <= 32 {
            (self.bit / 32 * 4) as usize
        } else {
            (self.bit / 8) as usize
        }
    }

    /// Right shift that brings the field to bit 0 of its host-order dword.
    pub const fn shift(self) -> u32 {
        if self.width <= 32 {
            32 - self.width - self.bit % 32
        } else {
            0
        }
    }

    /// Mask of the field after shifting.
    pub const fn mask(self) -> u64 {
        if self.width >= 64 {
            u64::MAX
        } else {
            (1u64 << self.width) - 1
        }
    }

    /// Byte range of a byte-aligned field.
    pub const fn byte_range(self) -> std::ops::Range<usize> {
        let start = (self.bit / 8) as usize;
        start..start + (self.width as usize).div_ceil(8)
    }

    /// The same field moved `bits` further into an enclosing layout `O`.
    pub const fn within<O>(self, bits: u32) -> Field<O> {
        Field::new(self.bit + bits, self.width)
    }

    /// Reads the field from `buf` (which starts at the layout's first byte).
    #[inline]
    pub fn get(self, buf: &[u8]) -> u64 {
        if self.width <= 32 {
            let at = self.dword();
            let dw = u32::from_be_bytes([buf[at], buf[at + 1], buf[at + 2], buf[at + 3]]);
            (u64::from(dw) >> self.shift()) & self.mask()
        } else if self.width == 64 {
            let at = self.dword();
            let mut b = [0u8; 8];
            b.copy_from_slice(&buf[at..at + 8]);
            u64::from_be_bytes(b)
        } else {
            panic!("field of {} bits is read with bytes()", self.width)
        }
    }

    /// Writes `value` into the field. Bits above the width are an error in
    /// debug builds and dropped in release builds; callers validate user
    /// input before it gets here.
    #[inline]
    pub fn set(self, buf: &mut [u8], value: u64) {
        debug_assert!(
            value <= self.mask(),
            "value {value:#x} does not fit {} bits",
            self.width
        );
        if self.width <= 32 {
            let at = self.dword();
            let old = u32::from_be_bytes([buf[at], buf[at + 1], buf[at + 2], buf[at + 3]]);
            let mask = (self.mask() as u32) << self.shift();
            let new = (old & !mask) | (((value as u32) << self.shift()) & mask);
            buf[at..at + 4].copy_from_slice(&new.to_be_bytes());
        } else if self.width == 64 {
            let at = self.dword();
            buf[at..at + 8].copy_from_slice(&value.to_be_bytes());
        } else {
            panic!("field of {} bits is written with set_bytes()", self.width)
        }
    }
}

/// A layout `T` embedded at a byte-aligned offset in layout `S`.
pub struct Sub<S, T> {
    bit: u32,
    _layouts: PhantomData<fn() -> (S, T)>,
}

impl<S, T> Clone for Sub<S, T> {
    fn clone(&self) -> Self {
        *self
    }
}
impl<S, T> Copy for Sub<S, T> {}

impl<S, T> fmt::Debug for Sub<S, T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Sub(bit {:#x})", self.bit)
    }
}

impl<S, T: Layout> Sub<S, T> {
    /// `T` at bit `bit` of `S`.
    pub const fn new(bit: u32) -> Self {
        assert!(bit.is_multiple_of(8), "embedded layouts are byte aligned");
        Sub {
            bit,
            _layouts: PhantomData,
        }
    }

    /// Offset in bytes.
    pub const fn byte(self) -> usize {
        (self.bit / 8) as usize
    }

    /// Offset in bits.
    pub const fn bit(self) -> u32 {
        self.bit
    }

    /// A field of the embedded layout, as a field of the outer one.
    pub const fn field(self, f: Field<T>) -> Field<S> {
        f.within(self.bit)
    }
}

/// A trailing array of `width`-bit elements starting at `bit` in `S`.
pub struct Flex<S> {
    bit: u32,
    width: u32,
    _layout: PhantomData<fn() -> S>,
}

impl<S> Clone for Flex<S> {
    fn clone(&self) -> Self {
        *self
    }
}
impl<S> Copy for Flex<S> {}

impl<S> fmt::Debug for Flex<S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Flex(bit {:#x}, element {} bits)", self.bit, self.width)
    }
}

impl<S> Flex<S> {
    /// Elements of `width` bits from bit `bit`.
    pub const fn new(bit: u32, width: u32) -> Self {
        assert!(
            bit.is_multiple_of(32) && (width == 32 || width == 64),
            "flex arrays hold dwords or qwords"
        );
        Flex {
            bit,
            width,
            _layout: PhantomData,
        }
    }

    /// Byte offset of the first element.
    pub const fn byte(self) -> usize {
        (self.bit / 8) as usize
    }

    /// Element `i` as a field.
    pub const fn at(self, i: u32) -> Field<S> {
        Field::new(self.bit + i * self.width, self.width)
    }

    /// Bytes taken by `n` elements.
    pub const fn bytes_for(self, n: usize) -> usize {
        n * (self.width as usize / 8)
    }
}

/// A read-only typed view of a layout at the start of a byte slice.
pub struct View<'a, S> {
    buf: &'a [u8],
    _layout: PhantomData<fn() -> S>,
}

impl<S> fmt::Debug for View<'_, S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "View({} bytes)", self.buf.len())
    }
}

impl<S> Clone for View<'_, S> {
    fn clone(&self) -> Self {
        *self
    }
}
impl<S> Copy for View<'_, S> {}

impl<'a, S: Layout> View<'a, S> {
    /// A view of `buf`, or `None` if it is shorter than the layout.
    #[inline]
    pub fn new(buf: &'a [u8]) -> Option<Self> {
        (buf.len() >= S::BYTES).then_some(View {
            buf,
            _layout: PhantomData,
        })
    }

    /// Reads a field.
    #[inline]
    pub fn get(&self, f: Field<S>) -> u64 {
        f.get(self.buf)
    }

    /// Reads a field of at most 32 bits.
    #[inline]
    pub fn get32(&self, f: Field<S>) -> u32 {
        debug_assert!(f.width() <= 32);
        f.get(self.buf) as u32
    }

    /// Reads a byte-aligned field as bytes.
    #[inline]
    pub fn bytes(&self, f: Field<S>) -> &'a [u8] {
        &self.buf[f.byte_range()]
    }

    /// An embedded layout.
    #[inline]
    pub fn sub<T: Layout>(&self, s: Sub<S, T>) -> View<'a, T> {
        View::new(&self.buf[s.byte()..]).expect("embedded layout fits its container")
    }

    /// Element `i` of a trailing array (may lie beyond the fixed part).
    #[inline]
    pub fn flex(&self, a: Flex<S>, i: u32) -> Option<u64> {
        let f = a.at(i);
        let end = f.dword() + (f.width() as usize) / 8;
        (end <= self.buf.len()).then(|| f.get(self.buf))
    }

    /// The underlying bytes (the whole slice the view was made from).
    #[inline]
    pub fn as_bytes(&self) -> &'a [u8] {
        self.buf
    }
}

/// A mutable typed view of a layout at the start of a byte slice.
pub struct ViewMut<'a, S> {
    buf: &'a mut [u8],
    _layout: PhantomData<fn() -> S>,
}

impl<S> fmt::Debug for ViewMut<'_, S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "ViewMut({} bytes)", self.buf.len())
    }
}

impl<'a, S: Layout> ViewMut<'a, S> {
    /// A mutable view of `buf`, or `None` if it is shorter than the layout.
    #[inline]
    pub fn new(buf: &'a mut [u8]) -> Option<Self> {
        (buf.len() >= S::BYTES).then_some(ViewMut {
            buf,
            _layout: PhantomData,
        })
    }

    /// Reads a field.
    #[inline]
    pub fn get(&self, f: Field<S>) -> u64 {
        f.get(self.buf)
    }

    /// Writes a field.
    #[inline]
    pub fn set(&mut self, f: Field<S>, value: u64) -> &mut Self {
        f.set(self.buf, value);
        self
    }

    /// Writes a byte-aligned field from bytes (must match its width).
    #[inline]
    pub fn set_bytes(&mut self, f: Field<S>, bytes: &[u8]) -> &mut Self {
        self.buf[f.byte_range()].copy_from_slice(bytes);
        self
    }

    /// An embedded layout, mutably.
    #[inline]
    pub fn sub<T: Layout>(&mut self, s: Sub<S, T>) -> ViewMut<'_, T> {
        ViewMut::new(&mut self.buf[s.byte()..]).expect("embedded layout fits its container")
    }

    /// Writes element `i` of a trailing array; `false` if it does not fit.
    #[inline]
    pub fn set_flex(&mut self, a: Flex<S>, i: u32, value: u64) -> bool {
        let f = a.at(i);
        let end = f.dword() + (f.width() as usize) / 8;
        if end > self.buf.len() {
            return false;
        }
        f.set(self.buf, value);
        true
    }

    /// Read-only view of the same bytes.
    #[inline]
    pub fn as_view(&self) -> View<'_, S> {
        View {
            buf: self.buf,
            _layout: PhantomData,
        }
    }

    /// The underlying bytes.
    #[inline]
    pub fn as_bytes_mut(&mut self) -> &mut [u8] {
        self.buf
    }
}

/// Declares a layout: a marker type, its member constants and its
/// [`LayoutInfo`].
///
/// ```ignore
/// layout! {
///     /// Completion queue context.
///     pub struct Cqc: Ifc("cqc"), 0x200;
///     /// Overrun ignore.
///     OI: field = "oi" @ 0x00e, 1;
///     CQ_CONTEXT: sub<Cqc> = "cq_context" @ 0x80;
///     PAS: flex = "pas" @ 0x880, 64;
/// }
/// ```
#[macro_export]
#[doc(hidden)]
macro_rules! layout {
    (
        $(#[$meta:meta])*
        pub struct $T:ident : $src:expr, $bits:expr $(; note = $note:literal)?;
        $(
            $(#[$fmeta:meta])*
            $F:ident : $kind:ident $(<$Sub:ty>)? = $($name:literal)|+ @ $bit:expr $(, $w:expr)?;
        )*
    ) => {
        $(#[$meta])*
        #[derive(Debug, Clone, Copy)]
        pub enum $T {}

        // Byte-layout tables write offsets as `8 * 0x00`, `8 * 0x01`, ...
        #[allow(clippy::erasing_op, clippy::identity_op)]
        impl $crate::prm::Layout for $T {
            const INFO: $crate::prm::LayoutInfo = $crate::prm::LayoutInfo {
                rust: stringify!($T),
                source: $src,
                bits: $bits,
                fields: &[
                    $( $crate::prm::FieldDesc {
                        rust: stringify!($F),
                        names: &[$($name),+],
                        bit: $bit,
                        width: $crate::layout!(@width $kind $(<$Sub>)? $(, $w)?),
                        kind: $crate::layout!(@kind $kind $(<$Sub>)?),
                    }, )*
                ],
                note: $crate::layout!(@note $($note)?),
            };
        }

        #[allow(missing_docs, clippy::erasing_op, clippy::identity_op)]
        impl $T {
            $(
                $(#[$fmeta])*
                pub const $F: $crate::layout!(@ty $T, $kind $(<$Sub>)?) =
                    $crate::layout!(@val $kind $(<$Sub>)?, $bit $(, $w)?);
            )*
        }
    };
    (@ty $T:ident, field) => { $crate::prm::Field<$T> };
    (@ty $T:ident, sub<$Sub:ty>) => { $crate::prm::Sub<$T, $Sub> };
    (@ty $T:ident, flex) => { $crate::prm::Flex<$T> };
    (@val field, $bit:expr, $w:expr) => { $crate::prm::Field::new($bit, $w) };
    (@val sub<$Sub:ty>, $bit:expr) => { $crate::prm::Sub::new($bit) };
    (@val flex, $bit:expr, $w:expr) => { $crate::prm::Flex::new($bit, $w) };
    (@width field, $w:expr) => { $w };
    (@width flex, $w:expr) => { $w };
    (@width sub<$Sub:ty>) => { <$Sub as $crate::prm::Layout>::INFO.bits };
    (@kind field) => { $crate::prm::Kind::Field };
    (@kind flex) => { $crate::prm::Kind::Flex };
    (@kind sub<$Sub:ty>) => { $crate::prm::Kind::Sub(stringify!($Sub)) };
    (@note) => { None };
    (@note $note:literal) => { Some($note) };
}

#[cfg(test)]
mod tests {
    use super::*;

    enum T {}
    impl Layout for T {
        const INFO: LayoutInfo = LayoutInfo {
            rust: "T",
            source: Source::Ifc("t"),
            bits: 128,
            fields: &[],
            note: None,
        };
    }

    #[test]
    fn msb_first_within_big_endian_dwords() {
        let mut buf = [0u8; 16];
        // bit 0x0e width 1 = dword 0, host bit 17.
        let oi: Field<T> = Field::new(0x0e, 1);
        oi.set(&mut buf, 1);
        assert_eq!(buf[..4], [0x00, 0x02, 0x00, 0x00]);
        assert_eq!(oi.get(&buf), 1);
        // 24-bit field at dw1[23:0].
        let n: Field<T> = Field::new(0x28, 24);
        n.set(&mut buf, 0xabcdef);
        assert_eq!(buf[4..8], [0x00, 0xab, 0xcd, 0xef]);
        // Neighbours are untouched.
        let top: Field<T> = Field::new(0x20, 8);
        top.set(&mut buf, 0x5a);
        assert_eq!(n.get(&buf), 0xabcdef);
        assert_eq!(buf[4], 0x5a);
        // 64-bit field is plain big-endian.
        let addr: Field<T> = Field::new(0x40, 64);
        addr.set(&mut buf, 0x0102_0304_0506_0708);
        assert_eq!(buf[8..16], [1, 2, 3, 4, 5, 6, 7, 8]);
        assert_eq!(addr.get(&buf), 0x0102_0304_0506_0708);
    }

    #[test]
    fn shift_and_mask_match_facts_sheet_convention() {
        // "the shift is 32 - w - (o % 32)"
        let o = 0x38 + 3;
        let f: Field<T> = Field::new(o, 5);
        assert_eq!(f.shift(), 32 - 5 - (o % 32));
        assert_eq!(f.mask(), 0x1f);
        assert_eq!(f.dword(), 4);
    }

    #[test]
    fn views_check_length() {
        assert!(View::<T>::new(&[0u8; 15]).is_none());
        assert!(View::<T>::new(&[0u8; 16]).is_some());
    }
}
