//! Finding the independent headers and asking gcc where their members are.

use std::collections::{BTreeMap, HashSet};
use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::process::Command;

use mlx5::prm::{Kind, LayoutInfo, Source};

use super::cexpr::Defs;

/// The installed header trees.
#[derive(Debug)]
pub struct Headers {
    /// `(version, .../include/linux/mlx5)` for each kernel header package.
    pub kernels: Vec<(String, PathBuf)>,
    /// rdma-core's `mlx5dv.h`.
    pub dv: Option<PathBuf>,
}

/// Where one member is in a header: bit offset and width (element width for
/// arrays), or why it could not be found.
pub type Member = Result<(u32, u32), String>;

/// What one header tree says about our layouts.
#[derive(Debug, Default)]
pub struct Facts {
    /// Label, e.g. "linux 6.1.0-56" or "rdma-core mlx5dv.h".
    pub label: String,
    /// Layout size in bits, by Rust layout name.
    pub sizes: BTreeMap<&'static str, Result<u32, String>>,
    /// Members by (layout, member) Rust names; the string is the C name used.
    pub members: BTreeMap<(&'static str, &'static str), (String, Member)>,
    /// Constant values by C name.
    pub consts: BTreeMap<&'static str, Result<u64, String>>,
}

impl Headers {
    /// Looks for the Debian packages' files.
    /// `ERPC_PRM_HEADER_ROOT` (default `/`) moves the search, e.g. to an
    /// empty directory to see what a machine without the packages does.
    pub fn discover() -> Headers {
        let root = PathBuf::from(std::env::var_os("ERPC_PRM_HEADER_ROOT").unwrap_or("/".into()));
        let mut kernels = Vec::new();
        if let Ok(rd) = std::fs::read_dir(root.join("usr/src")) {
            for e in rd.flatten() {
                let name = e.file_name().to_string_lossy().into_owned();
                if let Some(ver) = name
                    .strip_prefix("linux-headers-")
                    .and_then(|n| n.strip_suffix("-common"))
                {
                    let dir = e.path().join("include/linux/mlx5");
                    if dir.join("mlx5_ifc.h").exists() {
                        kernels.push((ver.to_string(), dir));
                    }
                }
            }
        }
        kernels.sort();
        let dv = Some(root.join("usr/include/infiniband/mlx5dv.h")).filter(|p| p.exists());
        Headers { kernels, dv }
    }
}

const KERNEL_PRELUDE: &str = "#include <stddef.h>\n#include <stdio.h>\n\
typedef unsigned char u8; typedef unsigned short u16; typedef unsigned int u32; typedef unsigned long long u64;\n\
typedef u16 __be16; typedef u32 __be32; typedef u64 __be64;\n\
#define BIT(n) (1UL << (n))\n#define BIT_ULL(n) (1ULL << (n))\n\
#define __packed __attribute__((packed))\n\
#define DECLARE_FLEX_ARRAY(T, n) struct { struct {} __empty_##n; T n[]; }\n";

/// Runs a generated C program and returns its stdout lines.
fn run_c(src: &str, include: &Path, tag: &str) -> Result<Vec<String>, String> {
    static SEQ: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
    let seq = SEQ.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let dir = std::env::temp_dir().join(format!(
        "prm-conformance-{}-{tag}-{seq}",
        std::process::id()
    ));
    std::fs::create_dir_all(&dir).map_err(|e| e.to_string())?;
    let c = dir.join("probe.c");
    let exe = dir.join("probe");
    std::fs::write(&c, src).map_err(|e| e.to_string())?;
    let out = Command::new("gcc")
        .args(["-w", "-std=gnu11", "-I"])
        .arg(include)
        .arg("-o")
        .arg(&exe)
        .arg(&c)
        .output()
        .map_err(|e| format!("cannot run gcc: {e}"))?;
    if !out.status.success() {
        return Err(format!(
            "gcc failed on {}:\n{}",
            c.display(),
            String::from_utf8_lossy(&out.stderr)
        ));
    }
    let run = Command::new(&exe).output().map_err(|e| e.to_string())?;
    let _ = std::fs::remove_dir_all(&dir);
    Ok(String::from_utf8_lossy(&run.stdout)
        .lines()
        .map(str::to_owned)
        .collect())
}

/// The text of `struct|union name { ... }` (through the closing `;`).
fn block<'t>(text: &'t str, name: &str) -> Option<&'t str> {
    for kw in ["struct", "union"] {
        let pat = format!("{kw} {name} {{");
        let mut from = 0;
        while let Some(p) = text[from..].find(&pat) {
            let start = from + p;
            from = start + pat.len();
            // Must start a line (a definition, not a member declaration).
            if start > 0 && text.as_bytes()[start - 1] != b'\n' {
                continue;
            }
            let mut depth = 0usize;
            for (i, ch) in text[start..].char_indices() {
                match ch {
                    '{' => depth += 1,
                    '}' => {
                        depth -= 1;
                        if depth == 0 {
                            let end = text[start + i..].find(';')? + start + i + 1;
                            return Some(&text[start..end]);
                        }
                    }
                    _ => {}
                }
            }
        }
    }
    None
}

/// Member names declared in a block (including those of anonymous nested
/// structs/unions, which C also exposes).
fn member_names(block: &str) -> HashSet<String> {
    let inner = &block[block.find('{').map_or(0, |i| i + 1)..];
    let mut names = HashSet::new();
    for stmt in inner.split([';', '{', '}']) {
        let stmt = stmt.split("/*").next().unwrap_or("").trim();
        let decl = stmt
            .split('[')
            .next()
            .unwrap_or("")
            .split(':')
            .next()
            .unwrap_or("")
            .trim();
        if let Some(last) = decl.split_whitespace().last()
            && last.chars().all(|c| c.is_alphanumeric() || c == '_')
            && decl.contains(char::is_whitespace)
        {
            names.insert(last.to_string());
        }
    }
    names
}

/// A block plus every struct/union type it uses that the header defines,
/// dependencies first.
fn block_with_deps(
    text: &str,
    name: &str,
    out: &mut Vec<String>,
    seen: &mut HashSet<String>,
) -> Result<(), String> {
    if !seen.insert(name.to_string()) {
        return Ok(());
    }
    let b = block(text, name).ok_or_else(|| format!("no definition of {name}"))?;
    let inner = &b[b.find('{').unwrap() + 1..];
    let toks: Vec<&str> = inner
        .split(|c: char| !(c.is_alphanumeric() || c == '_'))
        .filter(|t| !t.is_empty())
        .collect();
    for w in toks.windows(2) {
        if (w[0] == "struct" || w[0] == "union") && block(text, w[1]).is_some() {
            block_with_deps(text, w[1], out, seen)?;
        }
    }
    out.push(b.to_string());
    Ok(())
}

/// Upper-case identifiers (macro or enum names) used in a block.
fn constants_used(b: &str) -> HashSet<String> {
    b.split(|c: char| !(c.is_alphanumeric() || c == '_'))
        .filter(|t| {
            t.starts_with("MLX5_")
                && t.chars()
                    .all(|c| c.is_ascii_uppercase() || c.is_ascii_digit() || c == '_')
        })
        .map(str::to_owned)
        .collect()
}

fn member_line(src: &mut String, ty: &str, name: &str, kind: Kind, scale: u32) {
    let size = match kind {
        Kind::Flex => format!("sizeof((({ty} *)0)->{name}[0])"),
        _ => format!("sizeof((({ty} *)0)->{name})"),
    };
    let _ = writeln!(
        src,
        "printf(\"%zu %zu\\n\", offsetof({ty}, {name}) * {scale}, {size} * {scale});"
    );
}

/// Facts from one kernel header tree for every layout whose source is the
/// kernel, plus every kernel constant.
pub fn kernel_facts(
    version: &str,
    dir: &Path,
    layouts: &[LayoutInfo],
    consts: &[(&'static str, bool)],
) -> Facts {
    let mut facts = Facts {
        label: format!("linux {version}"),
        ..Default::default()
    };
    let ifc_text = std::fs::read_to_string(dir.join("mlx5_ifc.h")).unwrap_or_default();
    let mut defs = Defs::default();
    let mut texts = BTreeMap::new();
    if let Ok(rd) = std::fs::read_dir(dir) {
        for e in rd.flatten() {
            if e.path().extension().is_some_and(|x| x == "h") {
                let t = std::fs::read_to_string(e.path()).unwrap_or_default();
                defs.add_text(&t);
                texts.insert(e.file_name().to_string_lossy().into_owned(), t);
            }
        }
    }

    // mlx5_ifc.h compiles standalone: one program for every ifc layout.
    let mut src = String::from(KERNEL_PRELUDE);
    src.push_str("#include \"mlx5_ifc.h\"\nint main(void) {\n");
    let mut order: Vec<(&'static str, Option<&'static str>, String)> = Vec::new();
    // Byte-layout structs from device.h etc.: extracted blocks.
    let mut extracted = Vec::new();
    let mut seen = HashSet::new();
    let mut byte_src = String::new();
    let mut byte_order: Vec<(&'static str, Option<&'static str>, String)> = Vec::new();
    for l in layouts {
        match l.source {
            Source::Ifc(c) => {
                let ty = format!("struct mlx5_ifc_{c}_bits");
                let Some(b) = block(&ifc_text, &format!("mlx5_ifc_{c}_bits")) else {
                    facts
                        .sizes
                        .insert(l.rust, Err(format!("{ty} not in mlx5_ifc.h")));
                    continue;
                };
                let names = member_names(b);
                let _ = writeln!(src, "printf(\"%zu\\n\", sizeof({ty}));");
                order.push((l.rust, None, String::new()));
                for f in l.fields {
                    match f.names.iter().find(|n| names.contains(**n)) {
                        Some(n) => {
                            member_line(&mut src, &ty, n, f.kind, 1);
                            order.push((l.rust, Some(f.rust), n.to_string()));
                        }
                        None => {
                            facts.members.insert(
                                (l.rust, f.rust),
                                (
                                    f.names.join("|"),
                                    Err(format!("none of {:?} in {ty}", f.names)),
                                ),
                            );
                        }
                    }
                }
            }
            Source::Kernel { header, name } => {
                let text = texts.get(header).map(String::as_str).unwrap_or("");
                let mut blocks = Vec::new();
                if let Err(e) = block_with_deps(text, name, &mut blocks, &mut seen) {
                    facts.sizes.insert(l.rust, Err(format!("{header}: {e}")));
                    continue;
                }
                extracted.extend(blocks);
                let kw = if block(text, name).is_some_and(|b| b.starts_with("union")) {
                    "union"
                } else {
                    "struct"
                };
                let ty = format!("{kw} {name}");
                let names = block(text, name).map(member_names).unwrap_or_default();
                let _ = writeln!(byte_src, "printf(\"%zu\\n\", sizeof({ty}) * 8);");
                byte_order.push((l.rust, None, String::new()));
                for f in l.fields {
                    match f.names.iter().find(|n| names.contains(**n)) {
                        Some(n) => {
                            member_line(&mut byte_src, &ty, n, f.kind, 8);
                            byte_order.push((l.rust, Some(f.rust), n.to_string()));
                        }
                        None => {
                            facts.members.insert(
                                (l.rust, f.rust),
                                (
                                    f.names.join("|"),
                                    Err(format!("none of {:?} in {ty}", f.names)),
                                ),
                            );
                        }
                    }
                }
            }
            Source::Dv(_) => {}
        }
    }
    src.push_str("return 0;\n}\n");
    collect(&mut facts, run_c(&src, dir, "ifc"), &order);

    // Constants used by the extracted blocks (array sizes) become #defines.
    let mut bsrc = String::from(KERNEL_PRELUDE);
    let mut used = HashSet::new();
    for b in &extracted {
        used.extend(constants_used(b));
    }
    for c in used {
        if let Ok(v) = defs.eval(&c) {
            let _ = writeln!(bsrc, "#define {c} {v}ULL");
        }
    }
    for b in &extracted {
        bsrc.push_str(b);
        bsrc.push('\n');
    }
    bsrc.push_str("int main(void) {\n");
    bsrc.push_str(&byte_src);
    bsrc.push_str("return 0;\n}\n");
    collect(&mut facts, run_c(&bsrc, dir, "bytes"), &byte_order);

    for (name, kernel) in consts {
        if *kernel {
            facts.consts.insert(name, defs.eval(name));
        }
    }
    facts
}

/// Facts from rdma-core's `mlx5dv.h` (compiles standalone).
pub fn dv_facts(path: &Path, layouts: &[LayoutInfo], consts: &[(&'static str, bool)]) -> Facts {
    let mut facts = Facts {
        label: "rdma-core mlx5dv.h".into(),
        ..Default::default()
    };
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let mut src = String::from(
        "#include <stddef.h>\n#include <stdio.h>\n#include <infiniband/mlx5dv.h>\nint main(void) {\n",
    );
    let mut order = Vec::new();
    for l in layouts {
        let Source::Dv(name) = l.source else { continue };
        let ty = format!("struct {name}");
        let Some(b) = block(&text, name) else {
            facts
                .sizes
                .insert(l.rust, Err(format!("{ty} not in mlx5dv.h")));
            continue;
        };
        let names = member_names(b);
        let _ = writeln!(src, "printf(\"%zu\\n\", sizeof({ty}) * 8);");
        order.push((l.rust, None, String::new()));
        for f in l.fields {
            match f.names.iter().find(|n| names.contains(**n)) {
                Some(n) => {
                    member_line(&mut src, &ty, n, f.kind, 8);
                    order.push((l.rust, Some(f.rust), n.to_string()));
                }
                None => {
                    facts.members.insert(
                        (l.rust, f.rust),
                        (
                            f.names.join("|"),
                            Err(format!("none of {:?} in {ty}", f.names)),
                        ),
                    );
                }
            }
        }
    }
    let dv_consts: Vec<&str> = consts.iter().filter(|(_, k)| !k).map(|(n, _)| *n).collect();
    for c in &dv_consts {
        let _ = writeln!(src, "printf(\"%llu\\n\", (unsigned long long)({c}));");
    }
    src.push_str("return 0;\n}\n");
    let inc = path
        .parent()
        .and_then(Path::parent)
        .unwrap_or(Path::new("/usr/include"));
    match run_c(&src, inc, "dv") {
        Ok(lines) => {
            let (layout_lines, const_lines) = lines.split_at(order.len().min(lines.len()));
            collect(&mut facts, Ok(layout_lines.to_vec()), &order);
            for (c, line) in dv_consts.iter().zip(const_lines) {
                facts
                    .consts
                    .insert(c, line.trim().parse().map_err(|e| format!("{e}")));
            }
        }
        Err(e) => {
            collect(&mut facts, Err(e.clone()), &order);
            for c in dv_consts {
                facts.consts.insert(c, Err(e.clone()));
            }
        }
    }
    facts
}

fn collect(
    facts: &mut Facts,
    lines: Result<Vec<String>, String>,
    order: &[(&'static str, Option<&'static str>, String)],
) {
    let lines = match lines {
        Ok(l) => l,
        Err(e) => {
            for (l, f, n) in order {
                match f {
                    None => {
                        facts.sizes.insert(l, Err(e.clone()));
                    }
                    Some(f) => {
                        facts.members.insert((l, f), (n.clone(), Err(e.clone())));
                    }
                }
            }
            return;
        }
    };
    assert_eq!(
        lines.len(),
        order.len(),
        "probe printed {} lines for {} queries",
        lines.len(),
        order.len()
    );
    for ((l, f, n), line) in order.iter().zip(lines) {
        let nums: Vec<u32> = line
            .split_whitespace()
            .map(|x| x.parse().expect("number"))
            .collect();
        match f {
            None => {
                facts.sizes.insert(l, Ok(nums[0]));
            }
            Some(f) => {
                facts
                    .members
                    .insert((l, f), (n.clone(), Ok((nums[0], nums[1]))));
            }
        }
    }
}
