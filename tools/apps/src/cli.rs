//! What the application binaries share on the command line: value parsers
//! that make clap itself refuse a bad value, naming the flag and the limit
//! (clap's usage errors exit 2, before anything runs), and standard output
//! that ends the program quietly when its reader goes away
//! (`ordered-kv | head -1`).

use std::fmt;
use std::io::{self, Write};

/// An integer from `LO` to `HI`, for `#[arg(value_parser = int_in::<LO, HI>)]`.
pub fn int_in<const LO: u64, const HI: u64>(s: &str) -> Result<u64, String> {
    let v: u64 = s
        .trim()
        .parse()
        .map_err(|e| format!("{e} (an integer from {LO} to {HI})"))?;
    if (LO..=HI).contains(&v) {
        Ok(v)
    } else {
        Err(format!("must be {LO} to {HI}"))
    }
}

/// [`int_in`] as a `usize` (counts of threads, slots, sessions).
pub fn count_in<const LO: u64, const HI: u64>(s: &str) -> Result<usize, String> {
    let v = int_in::<LO, HI>(s)?;
    usize::try_from(v).map_err(|_| format!("must be {LO} to {HI}"))
}

/// A duration in seconds: finite, above 0, at most a day.
pub fn secs(s: &str) -> Result<f64, String> {
    let v: f64 = s.trim().parse().map_err(|e| format!("{e}"))?;
    if v.is_finite() && v > 0.0 && v <= 86_400.0 {
        Ok(v)
    } else {
        Err("must be a number of seconds above 0 and at most 86400".into())
    }
}

/// A load (utilization of the workers): strictly between 0 and 1 (at 0
/// nothing arrives; at 1 and above the queue grows without bound and the
/// ideal queue has no steady state).
pub fn load(s: &str) -> Result<f64, String> {
    let v: f64 = s.trim().parse().map_err(|e| format!("{e}"))?;
    if v.is_finite() && v > 0.0 && v < 1.0 {
        Ok(v)
    } else {
        Err("a load must be above 0 and below 1".into())
    }
}

/// Writes one line to standard output. A closed pipe ends the program
/// quietly with status 0 (its reader has what it wanted); another write
/// error ends it with status 1 and one line on stderr.
pub fn out_line(program: &str, args: fmt::Arguments<'_>) {
    let mut o = io::stdout().lock();
    if let Err(e) = o.write_fmt(args).and_then(|()| o.write_all(b"\n")) {
        if e.kind() == io::ErrorKind::BrokenPipe {
            std::process::exit(0);
        }
        eprintln!("{program}: standard output: {e}");
        std::process::exit(1);
    }
}

/// `println!` for the application binaries: see [`out_line`]. The first
/// argument is the program's name.
#[macro_export]
macro_rules! out {
    ($program:expr, $($arg:tt)*) => {
        $crate::cli::out_line($program, format_args!($($arg)*))
    };
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn values_outside_the_limits_are_refused_naming_them() {
        assert_eq!(int_in::<1, 10>("1"), Ok(1));
        assert_eq!(int_in::<1, 10>("10"), Ok(10));
        assert_eq!(int_in::<1, 10>("0").unwrap_err(), "must be 1 to 10");
        assert!(int_in::<1, 10>("-1").unwrap_err().contains("1 to 10"));
        assert_eq!(
            count_in::<0, 1000>("1001").unwrap_err(),
            "must be 0 to 1000"
        );
        for bad in ["0", "-1", "NaN", "inf", "1e9", "x"] {
            assert!(secs(bad).is_err(), "{bad}");
        }
        assert_eq!(secs("0.5"), Ok(0.5));
        for bad in ["0", "-0.5", "NaN", "1", "1.5", "inf"] {
            assert_eq!(
                load(bad).unwrap_err(),
                "a load must be above 0 and below 1",
                "{bad}"
            );
        }
        assert_eq!(load("0.9"), Ok(0.9));
    }
}
