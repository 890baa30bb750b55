//! Conformance of the PRM layouts with independent headers: the kernel's
//! `mlx5_ifc.h`/`device.h` (Debian `linux-headers-*-common`, both the 6.1
//! and the 6.12 trees) and rdma-core's `mlx5dv.h` (Debian `libibverbs-dev`).
//!
//! In CI missing headers fail the test: under `.ci/run` (`ERPC_CI=1`) and
//! under any CI service that sets `CI` (GitHub Actions, GitLab, Buildkite,
//! ... set `CI=true`). On a developer machine the test is reported as
//! ignored (a libtest-mimic harness, `harness = false`) and names the
//! packages to install; run anyway (`--ignored`, `--include-ignored`), it
//! fails rather than pass without having compared anything.

mod cexpr;
mod compare;
mod headers;

use compare::{Mismatch, compare};
use headers::{Facts, Headers, dv_facts, kernel_facts};
use mlx5::prm::{ConstHeader, Kind, LayoutInfo, all_consts, all_layouts};

fn ci() -> bool {
    is_ci(
        std::env::var("ERPC_CI").ok().as_deref(),
        std::env::var("CI").ok().as_deref(),
    )
}

/// Whether these environment values mean CI: `ERPC_CI=1`, or `CI` set to
/// anything but empty, `0` or `false` (`ERPC_CI=0` opts a CI machine out).
fn is_ci(erpc_ci: Option<&str>, ci: Option<&str>) -> bool {
    match erpc_ci {
        Some("1") => true,
        Some("0") => false,
        _ => ci.is_some_and(|v| !v.is_empty() && v != "0" && !v.eq_ignore_ascii_case("false")),
    }
}

fn ci_detection() {
    assert!(is_ci(Some("1"), None));
    assert!(is_ci(None, Some("true")));
    assert!(is_ci(None, Some("1")));
    assert!(is_ci(Some(""), Some("yes")));
    assert!(!is_ci(None, None));
    assert!(!is_ci(None, Some("false")));
    assert!(!is_ci(None, Some("")));
    assert!(!is_ci(Some("0"), Some("true")));
}

/// The header facts, or None (after printing why) when they are missing on
/// a developer machine. Panics in CI.
fn gather() -> Option<&'static [Facts]> {
    static FACTS: std::sync::OnceLock<Option<Vec<Facts>>> = std::sync::OnceLock::new();
    FACTS.get_or_init(gather_uncached).as_deref()
}

fn main() -> std::process::ExitCode {
    use libtest_mimic::{Arguments, Trial};
    let args = Arguments::from_args();
    let plain = |name: &str, f: fn()| {
        Trial::test(name, move || {
            f();
            Ok(())
        })
    };
    let missing = missing_packages();
    let needs_headers = |name: &'static str, f: fn()| match &missing {
        None => plain(name, f),
        Some(why) if ci() => {
            let why = why.clone();
            Trial::test(name, move || {
                Err(format!("{why}; CI (ERPC_CI=1, or CI set) forbids skipping").into())
            })
        }
        Some(why) => {
            if !args.list {
                eprintln!("{name}: ignored: {why}");
            }
            // Ignored, never passed: asked to run anyway, it fails.
            let why = why.clone();
            Trial::test(name, move || {
                Err(format!("{why}: nothing was compared").into())
            })
            .with_ignored_flag(true)
        }
    };
    let trials = vec![
        needs_headers(
            "layouts_and_constants_match_independent_headers",
            layouts_and_constants_match_independent_headers,
        ),
        needs_headers(
            "one_bit_change_to_any_field_is_caught",
            one_bit_change_to_any_field_is_caught,
        ),
        plain("ci_detection", ci_detection),
        plain(
            "cexpr::tests::evaluates_enums_defines_and_expressions",
            cexpr::tests::evaluates_enums_defines_and_expressions,
        ),
    ];
    libtest_mimic::run(&args, trials).exit_code()
}

/// The packages whose headers are missing, as an install hint, if any.
fn missing_packages() -> Option<String> {
    let h = Headers::discover();
    let has = |prefix: &str| h.kernels.iter().any(|(v, _)| v.starts_with(prefix));
    let mut missing = Vec::new();
    if !has("6.1.") {
        missing.push("linux-headers-6.1.0-<abi>-common");
    }
    if !has("6.12.") {
        missing.push("linux-headers-6.12.<n>+deb12-common");
    }
    if h.dv.is_none() {
        missing.push("libibverbs-dev");
    }
    (!missing.is_empty()).then(|| {
        format!(
            "PRM conformance needs {} (apt-get install --no-install-recommends ...)",
            missing.join(", ")
        )
    })
}

fn gather_uncached() -> Option<Vec<Facts>> {
    if let Some(msg) = missing_packages() {
        if ci() {
            panic!("{msg}; CI (ERPC_CI=1, or CI set) forbids skipping");
        }
        eprintln!("SKIPPED {msg}");
        return None;
    }
    let h = Headers::discover();
    let layouts = all_layouts();
    let consts: Vec<(&'static str, bool)> = all_consts()
        .iter()
        .map(|c| (c.c_name, matches!(c.header, ConstHeader::Kernel)))
        .collect();
    let mut all = Vec::new();
    // Newest of each series we test against: 6.1 and 6.12.
    for prefix in ["6.1.", "6.12."] {
        let (ver, dir) = h
            .kernels
            .iter()
            .rfind(|(v, _)| v.starts_with(prefix))
            .unwrap();
        all.push(kernel_facts(ver, dir, &layouts, &consts));
    }
    all.push(dv_facts(h.dv.as_ref().unwrap(), &layouts, &consts));
    Some(all)
}

fn report(label: &str, mism: &[Mismatch]) -> String {
    let mut s = format!("{} mismatches against {label}:\n", mism.len());
    for m in mism {
        s.push_str(&format!("  {}: {}\n", m.what, m.why));
    }
    s
}

fn layouts_and_constants_match_independent_headers() {
    let Some(all) = gather() else { return };
    let layouts = all_layouts();
    let consts = all_consts();
    let mut failures = String::new();
    let mut total_fields = 0;
    for facts in all {
        let (n, mism) = compare(&layouts, &consts, facts);
        println!(
            "PRM conformance vs {}: {} structs, {} fields, {} constants checked, {} mismatches",
            facts.label,
            n.layouts,
            n.members,
            n.consts,
            mism.len()
        );
        total_fields += n.members;
        if !mism.is_empty() {
            failures.push_str(&report(&facts.label, &mism));
        }
    }
    // Every layout and constant is covered by some header.
    let covered_layouts: usize = layouts.len();
    println!(
        "PRM conformance total: {covered_layouts} layouts, {total_fields} field checks across {} header trees",
        all.len()
    );
    for l in &layouts {
        if let Some(note) = l.note {
            println!("  note {}: {note}", l.rust);
        }
    }
    assert!(failures.is_empty(), "{failures}");
}

/// A copy of our table with one member moved or resized.
fn mutated(
    layouts: &[LayoutInfo],
    li: usize,
    fi: usize,
    bit_delta: i64,
    width_delta: i64,
) -> Vec<LayoutInfo> {
    let mut copy = layouts.to_vec();
    let mut fields = copy[li].fields.to_vec();
    fields[fi].bit = (fields[fi].bit as i64 + bit_delta) as u32;
    fields[fi].width = (fields[fi].width as i64 + width_delta) as u32;
    copy[li].fields = Box::leak(fields.into_boxed_slice());
    copy
}

/// A one-bit change to any checked member makes the comparison fail: its
/// offset moved by one bit either way, or (for integer fields and array
/// elements) its width grown by one bit. Needs the real headers: reported
/// as ignored like its sibling when they are missing (fails under
/// `ERPC_CI=1`).
fn one_bit_change_to_any_field_is_caught() {
    let Some(facts) = gather() else { return };
    let layouts = all_layouts();
    let consts = all_consts();
    let mut mutations = 0;
    for facts in facts {
        let (_, base) = compare(&layouts, &consts, facts);
        assert!(
            base.is_empty(),
            "baseline must be clean: {}",
            report(&facts.label, &base)
        );
        for (li, l) in layouts.iter().enumerate() {
            let applies = compare(&[*l], &[], facts).0.layouts == 1;
            if !applies {
                continue;
            }
            for (fi, f) in l.fields.iter().enumerate() {
                let mut changes = vec![(1, 0)];
                if f.bit > 0 {
                    changes.push((-1, 0));
                }
                if matches!(f.kind, Kind::Field) {
                    changes.push((0, 1));
                }
                for (db, dw) in changes {
                    let m = mutated(&layouts, li, fi, db, dw);
                    let (_, mism) = compare(&m, &[], facts);
                    mutations += 1;
                    assert!(
                        mism.iter()
                            .any(|x| x.what == format!("{}.{}", l.rust, f.rust)),
                        "{}.{} with bit {:+} width {:+} went unnoticed against {}",
                        l.rust,
                        f.rust,
                        db,
                        dw,
                        facts.label
                    );
                }
            }
        }
    }
    // And a wrong constant.
    let mut bad = consts.clone();
    bad[0].value ^= 1;
    let kernel = facts.iter().find(|f| !f.label.contains("mlx5dv")).unwrap();
    if !kernel.consts.is_empty() {
        assert!(
            !compare(&[], &bad, kernel).1.is_empty(),
            "a flipped constant went unnoticed"
        );
    }
    println!("{mutations} single-bit mutations, all caught");
}
