//! Named integer constants from C header text: `#define NAME expr` lines and
//! `enum { NAME [= expr], ... }` blocks (with implicit values), evaluated
//! with a small integer-expression evaluator. Used for kernel headers that
//! do not compile standalone.

use std::collections::HashMap;

/// Unevaluated definitions by name.
#[derive(Debug, Default)]
pub struct Defs {
    raw: HashMap<String, String>,
}

impl Defs {
    /// Collects definitions from one header's text (later ones win).
    pub fn add_text(&mut self, text: &str) {
        let text = strip_comments(text);
        for line in text.lines() {
            let t = line.trim_start();
            if let Some(rest) = t.strip_prefix("#define") {
                let rest = rest.trim_start();
                let name: String = rest
                    .chars()
                    .take_while(|c| c.is_alphanumeric() || *c == '_')
                    .collect();
                let after = &rest[name.len()..];
                if name.is_empty() || after.starts_with('(') {
                    continue; // function-like macro
                }
                self.raw.insert(name, after.trim().to_string());
            }
        }
        let bytes = text.as_bytes();
        let mut i = 0;
        while let Some(pos) = text[i..].find("enum") {
            let start = i + pos;
            i = start + 4;
            let before_ok = start == 0 || !is_ident(bytes[start - 1]);
            let after_ok = bytes.get(start + 4).is_some_and(|b| !is_ident(*b));
            if !before_ok || !after_ok {
                continue;
            }
            let Some(open_rel) = text[i..].find(['{', ';', '(']) else {
                break;
            };
            if bytes[i + open_rel] != b'{' {
                continue;
            }
            let open = i + open_rel;
            let Some(close_rel) = text[open..].find('}') else {
                break;
            };
            let body = &text[open + 1..open + close_rel];
            i = open + close_rel;
            let mut prev: Option<String> = None;
            for entry in body.split(',') {
                let entry = entry.trim();
                if entry.is_empty() || entry.starts_with('#') {
                    continue;
                }
                let (name, expr) = match entry.split_once('=') {
                    Some((n, e)) => (n.trim().to_string(), e.trim().to_string()),
                    None => {
                        let e = match &prev {
                            Some(p) => format!("({p}) + 1"),
                            None => "0".to_string(),
                        };
                        (entry.to_string(), e)
                    }
                };
                if !name.chars().all(|c| c.is_alphanumeric() || c == '_') {
                    prev = None;
                    continue;
                }
                self.raw.insert(name.clone(), expr);
                prev = Some(name);
            }
        }
    }

    /// True if `name` is defined.
    pub fn has(&self, name: &str) -> bool {
        self.raw.contains_key(name)
    }

    /// Evaluates `name`.
    pub fn eval(&self, name: &str) -> Result<u64, String> {
        self.eval_depth(name, 0)
    }

    fn eval_depth(&self, name: &str, depth: usize) -> Result<u64, String> {
        if depth > 32 {
            return Err(format!("{name}: definition nests too deep"));
        }
        let expr = self
            .raw
            .get(name)
            .ok_or_else(|| format!("{name}: not defined"))?;
        let tokens = tokenize(expr)?;
        let mut p = Parser {
            t: &tokens,
            i: 0,
            defs: self,
            depth,
        };
        let v = p.or()?;
        if p.i != tokens.len() {
            return Err(format!("{name}: cannot evaluate `{expr}`"));
        }
        Ok(v)
    }
}

fn is_ident(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b == b'_'
}

fn strip_comments(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    let mut rest = s;
    loop {
        let block = rest.find("/*");
        let line = rest.find("//");
        match (block, line) {
            (Some(b), l) if l.is_none_or(|l| b < l) => {
                out.push_str(&rest[..b]);
                match rest[b..].find("*/") {
                    Some(e) => rest = &rest[b + e + 2..],
                    None => return out,
                }
            }
            (_, Some(l)) => {
                out.push_str(&rest[..l]);
                match rest[l..].find('\n') {
                    Some(e) => rest = &rest[l + e..],
                    None => return out,
                }
            }
            _ => {
                out.push_str(rest);
                return out;
            }
        }
    }
}

#[derive(Debug, Clone, PartialEq)]
enum Tok {
    Num(u64),
    Id(String),
    Op(&'static str),
}

fn tokenize(s: &str) -> Result<Vec<Tok>, String> {
    let b = s.as_bytes();
    let mut i = 0;
    let mut out = Vec::new();
    while i < b.len() {
        let c = b[i];
        if c.is_ascii_whitespace() || c == b'\\' {
            i += 1;
        } else if c.is_ascii_digit() {
            let start = i;
            while i < b.len() && (b[i].is_ascii_alphanumeric()) {
                i += 1;
            }
            let lit = s[start..i].trim_end_matches(['u', 'U', 'l', 'L']);
            let v = if let Some(h) = lit.strip_prefix("0x").or_else(|| lit.strip_prefix("0X")) {
                u64::from_str_radix(h, 16)
            } else {
                lit.parse()
            }
            .map_err(|_| format!("bad number `{}`", &s[start..i]))?;
            out.push(Tok::Num(v));
        } else if is_ident(c) {
            let start = i;
            while i < b.len() && is_ident(b[i]) {
                i += 1;
            }
            out.push(Tok::Id(s[start..i].to_string()));
        } else {
            let two = s.get(i..i + 2).unwrap_or("");
            let op: &'static str = match two {
                "<<" => "<<",
                ">>" => ">>",
                _ => match c {
                    b'|' => "|",
                    b'&' => "&",
                    b'^' => "^",
                    b'+' => "+",
                    b'-' => "-",
                    b'*' => "*",
                    b'/' => "/",
                    b'~' => "~",
                    b'(' => "(",
                    b')' => ")",
                    _ => return Err(format!("unexpected `{}` in `{s}`", c as char)),
                },
            };
            i += op.len();
            out.push(Tok::Op(op));
        }
    }
    Ok(out)
}

struct Parser<'a> {
    t: &'a [Tok],
    i: usize,
    defs: &'a Defs,
    depth: usize,
}

impl Parser<'_> {
    fn peek_op(&self, op: &str) -> bool {
        matches!(self.t.get(self.i), Some(Tok::Op(o)) if *o == op)
    }

    fn binary(
        &mut self,
        ops: &[&str],
        next: fn(&mut Self) -> Result<u64, String>,
    ) -> Result<u64, String> {
        let mut v = next(self)?;
        loop {
            let Some(op) = ops.iter().find(|o| self.peek_op(o)).copied() else {
                return Ok(v);
            };
            self.i += 1;
            let r = next(self)?;
            v = match op {
                "|" => v | r,
                "^" => v ^ r,
                "&" => v & r,
                "<<" => v.wrapping_shl(r as u32),
                ">>" => v.wrapping_shr(r as u32),
                "+" => v.wrapping_add(r),
                "-" => v.wrapping_sub(r),
                "*" => v.wrapping_mul(r),
                "/" => v.checked_div(r).ok_or("division by zero")?,
                _ => unreachable!(),
            };
        }
    }

    fn or(&mut self) -> Result<u64, String> {
        self.binary(&["|"], Self::xor)
    }
    fn xor(&mut self) -> Result<u64, String> {
        self.binary(&["^"], Self::and)
    }
    fn and(&mut self) -> Result<u64, String> {
        self.binary(&["&"], Self::shift)
    }
    fn shift(&mut self) -> Result<u64, String> {
        self.binary(&["<<", ">>"], Self::add)
    }
    fn add(&mut self) -> Result<u64, String> {
        self.binary(&["+", "-"], Self::mul)
    }
    fn mul(&mut self) -> Result<u64, String> {
        self.binary(&["*", "/"], Self::unary)
    }

    fn unary(&mut self) -> Result<u64, String> {
        match self.t.get(self.i).cloned() {
            Some(Tok::Op("~")) => {
                self.i += 1;
                Ok(!self.unary()?)
            }
            Some(Tok::Op("-")) => {
                self.i += 1;
                Ok(self.unary()?.wrapping_neg())
            }
            Some(Tok::Op("(")) => {
                self.i += 1;
                let v = self.or()?;
                if !self.peek_op(")") {
                    return Err("missing )".into());
                }
                self.i += 1;
                Ok(v)
            }
            Some(Tok::Num(n)) => {
                self.i += 1;
                Ok(n)
            }
            Some(Tok::Id(id)) => {
                self.i += 1;
                if (id == "BIT" || id == "BIT_ULL") && self.peek_op("(") {
                    let n = self.unary()?;
                    return Ok(1u64.wrapping_shl(n as u32));
                }
                self.defs.eval_depth(&id, self.depth + 1)
            }
            other => Err(format!("unexpected token {other:?}")),
        }
    }
}

/// Run by `main` (this test binary has its own harness).
pub(crate) mod tests {
    use super::*;

    pub(crate) fn evaluates_enums_defines_and_expressions() {
        let mut d = Defs::default();
        d.add_text(
            "#define A 0x10 /* c */\n#define F(x) x\nenum foo {\n X = 2 << 2, // c\n Y,\n Z = (1 << 6) | A,\n};\n\
             enum { P = BIT(3), Q };\n#define R 0x80000000U\n",
        );
        assert_eq!(d.eval("A"), Ok(16));
        assert_eq!(d.eval("X"), Ok(8));
        assert_eq!(d.eval("Y"), Ok(9));
        assert_eq!(d.eval("Z"), Ok(0x50));
        assert_eq!(d.eval("P"), Ok(8));
        assert_eq!(d.eval("Q"), Ok(9));
        assert_eq!(d.eval("R"), Ok(0x8000_0000));
        assert!(!d.has("F"));
    }
}
