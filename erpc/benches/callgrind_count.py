#!/usr/bin/env python3
"""Instructions per RPC charged to eRPC, from two callgrind runs.

Usage: callgrind_count.py BINARY SHORT.out LONG.out RPCS [--rule erpc|host]
                           [--top N] [--max N] [--total]
                           [--exclude-fn REGEX [--keep-fn REGEX]]

SHORT.out and LONG.out are callgrind outputs (``--dump-instr=yes``) of the
same program doing a different number of RPCs; RPCS is the difference. The
difference of the two runs, divided by RPCS, cancels setup.

The counting rule (``--rule erpc``, the default; README "instructions per
RPC" has the same paragraph). An instruction of the binary is eRPC's when,
reading its inline chain (llvm-symbolizer) from the
outermost function inward, the last function that is eRPC's own code
(``erpc/src/``, not the simulated transport ``erpc/sim/src/``) comes after
the last one that is the application's (anything not eRPC, transport or
library: the benchmark's loop, its handlers and continuations) and is not
inside a transport datapath entry point (``tx_burst``, ``rx_burst``,
``tx_flush``, ``post_recvs`` of a ``Transport`` impl): eRPC code and
everything inlined into it count, library and transport helpers included,
wherever the compiler put them. A call made from an instruction that is
eRPC's is charged to eRPC with its inclusive cost when the callee is
library or transport code (std, crates, ``mempool``, libc, the transport's
ring accessors and helpers), less what runs inside it that is counted
anyway (eRPC code it calls back) or belongs to someone else (the
application, the transport's datapath entry points); calls into eRPC's own
functions are counted by their instructions, and calls into the four
transport entry points and into application code (handlers,
continuations) are not charged, though eRPC code that application code
calls (``enqueue_request`` from a continuation) counts as eRPC's. So the
count does not depend on what the compiler inlined or where a helper
lives. Where a library function is called both from eRPC and from
elsewhere, the share of it that is charged is its overall share of plain
library work (callgrind keeps costs per call site, not per call path).

``--rule host`` counts what a host pays per RPC on the mlx5 path: eRPC,
the transport crate and the driver (``driver/src/``) are "ours" alike, the
four entry points included, and the device model (``driver/sim/``, the
network model ``driver/netsim/``, ``erpc/sim/src/``) is opaque: nothing
inside it counts, not even driver code it uses. The application is
everything else, as above.

The "whole program" line is every instruction of the process per RPC.

Two tables follow the totals: the binary's functions (what callgrind
sees, the counted part of each marked), and eRPC's source functions with
the inlining undone (each instruction goes to the function of the level
that made it count, as llvm-symbolizer names the inline levels); then the
library and helper callees charged, by callee.
"""

import collections
import re
import os
import shutil
import subprocess
import sys

# What a source location is, per rule. Checked in order: the first match
# decides. "ours" counts; "opaque" hides everything inside it; "lib" and
# "helper" count when reached from ours code; "app" (anything else) does
# not count, but ours code it calls does.
LIBRARY = ("/rustc/", "/.cargo/registry/", "/mempool/src/")
RULES = {
    "erpc": [
        ("helper", ("erpc/sim/src/",)),
        ("ours", ("erpc/src/",)),
        ("helper", ("transport/", "driver/")),
        ("lib", LIBRARY),
    ],
    "host": [
        ("opaque", ("erpc/sim/src/", "driver/sim/", "driver/netsim/")),
        ("ours", ("erpc/src/", "transport/src/", "driver/src/")),
        ("lib", LIBRARY + ("driver/endpoint/src/",)),
    ],
}
# The crates of ours code, for the host rule's breakdown.
CRATES = [("eRPC", "erpc/src/"), ("transport", "transport/src/"), ("driver", "driver/src/")]
# States of instructions that count only through a call from ours code.
PLAIN = ("lib", "helper")
# Functions whose whole extent is the transport's under the eRPC rule: a
# transport's (helper code's) functions of these names. An inlined level
# is named by its short name, the outermost by its symbol.
ENTRY_POINTS = ("tx_burst", "rx_burst", "tx_flush", "post_recvs")


# The workspace root: workspace paths in the rules match from here, so a
# checkout whose own path contains "driver/" (a worktree named so) does
# not turn the benchmark's code into helper code.
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))) + "/"


def classify(loc, rule):
    if not loc or loc.startswith("?"):
        return "lib"  # no debug info: PLT stubs, runtime glue
    rel = loc[len(ROOT):] if loc.startswith(ROOT) else None
    for kind, pats in RULES[rule]:
        for p in pats:
            # Library patterns are absolute fragments; workspace ones are
            # relative to the root (when debug info has relative paths,
            # the location is matched as it is).
            if p.startswith("/") or rel is None:
                if p in loc:
                    return kind
            elif rel.startswith(p):
                return kind
    return "app"


def demangled(fn):
    """A symbol name as llvm-symbolizer may print the outermost level of a
    chain (legacy Rust mangling half undone: `_$LT$a..B$u20$as$u20$...`)."""
    if "$" not in fn and ".." not in fn:
        return fn
    for k, v in (("$LT$", "<"), ("$GT$", ">"), ("$u20$", " "), ("$RF$", "&"), ("$C$", ",")):
        fn = fn.replace(k, v)
    return fn.replace("..", "::").lstrip("_")


def level_kind(fn, loc, rule):
    kind = classify(loc, rule)
    if rule == "erpc" and kind == "helper" and short_name(demangled(fn or ""))[-1] in ENTRY_POINTS:
        return "opaque"
    return kind


def state_of(levels, rule):
    """Whether an instruction with this inline chain (innermost first)
    counts: "in" (ours), "out" (the application's), "opaque", or "lib" /
    "helper" (library or helper code not inside ours code: it counts only
    through a call from ours code), and the index of the level that
    decided (for naming the source function)."""
    state, at = "lib", None
    for k in range(len(levels) - 1, -1, -1):
        kind = level_kind(levels[k][0], levels[k][1], rule)
        if state == "opaque":
            break
        if kind == "ours":
            # eRPC code that a helper runs on its own (the simulated
            # transport reading eRPC's clock) is the helper's.
            if state != "helper":
                state, at = "in", k
        elif kind == "helper":
            if state != "in":
                state, at = "helper", k
        elif kind == "opaque":
            state, at = "opaque", k
        elif kind == "app":
            state, at = "out", k
    return state, at


def parse_pos(tok, cur):
    if tok.startswith("0x"):
        return int(tok, 16)
    if tok[0] == "+":
        return cur + int(tok[1:])
    if tok[0] == "-":
        return cur - int(tok[1:])
    if tok == "*":
        return cur
    return int(tok)


def load(path, main_object):
    """Self cost per instruction address of `main_object` (the benchmark
    binary; its base name) and per function of every other object (as
    ``("ob", name)``), the function of each binary address, and every call:
    ``calls[(site, callee)] = inclusive cost`` where site is a binary
    address or ``("ob", caller)`` and callee is ``("bin", entry address)``
    or ``("ob", name)``; plus call counts per callee name.

    Addresses are offsets within their object, so an address in libc can
    equal one in the binary: only the binary's own instructions are keyed
    by address."""
    cost = collections.Counter()
    fn_of = {}
    calls = collections.Counter()
    ncalls = collections.Counter()
    names, objs = {}, {}
    cur = cur_ob = callee = callee_ob = None
    target = None
    addr = 0
    pending_call = False

    def ours(ob):
        return (ob or "").rsplit("/", 1)[-1] == main_object

    for line in open(path):
        c = line[:1]
        if c.isdigit() or c in "+-*":
            parts = line.split()
            addr = parse_pos(parts[0], addr)
            if len(parts) < 3:
                continue
            v = int(parts[-1])
            site = addr if ours(cur_ob) else ("ob", cur)
            if pending_call:
                # The inclusive cost of the call announced by `calls=`.
                pending_call = False
                tob = callee_ob if callee_ob is not None else cur_ob
                key = ("bin", target) if ours(tob) else ("ob", callee)
                calls[(site, key)] += v
                callee_ob = None
            else:
                cost[site] += v
                if ours(cur_ob):
                    fn_of[addr] = cur
            continue
        if line.startswith("calls="):
            parts = line[6:].split()
            ncalls[callee] += int(parts[0])
            target = parse_pos(parts[1], addr)
            pending_call = True
            continue
        # ob= / fn= (the current object and function), cob= / cfn= (a
        # call's target); "(id) name" the first time, "(id)" after.
        m = re.match(r"(c?)(ob|fn)=\((\d+)\)(?: (.*))?", line.rstrip("\n"))
        if m:
            is_call, kind, ident, name = m.groups()
            table = objs if kind == "ob" else names
            if name:
                table[ident] = name
            value = table.get(ident)
            if kind == "ob" and is_call:
                callee_ob = value
            elif kind == "ob":
                cur_ob = value
            elif is_call:
                callee = value
            else:
                cur = value
    return cost, fn_of, calls, ncalls


def inline_levels(binary, addrs):
    """addr -> [(function, source location in it), innermost first], from
    llvm-symbolizer, which names every inline level (GNU addr2line names
    the innermost level by the symbol's name, which the rule cannot use to
    find the transport's entry points)."""
    if not shutil.which("llvm-symbolizer"):
        sys.exit("callgrind_count.py: needs llvm-symbolizer (Debian: apt install llvm)")
    addrs = list(addrs)
    stdin = "".join(f"0x{a:x}\n" for a in addrs)
    out = subprocess.run(
        ["llvm-symbolizer", f"--obj={binary}", "-i", "-f", "-C", "--output-style=LLVM"],
        input=stdin,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    res = {}
    for a, block in zip(addrs, out.split("\n\n")):
        lines = block.strip("\n").splitlines()
        levels = []
        for fn, loc in zip(lines[0::2], lines[1::2]):
            # file:line:column -> file:line.
            levels.append((fn.strip(), re.sub(r":\d+$", "", loc.strip())))
        res[a] = levels
    return res


def short_name(fn):
    """A function's name without module path or generics."""
    fn = re.sub(r"::h[0-9a-f]{16}$", "", fn)
    depth, name = 0, ""
    for ch in fn:  # drop every <...>, nested ones included
        depth += (ch == "<") - (ch == ">")
        if depth == 0 and ch != ">":
            name += ch
    return [part for part in name.split("::") if part] or ["?"]


def source_fn(levels, at):
    """The function of the level that made an instruction count, inlining
    undone; a closure counts for the function it is in."""
    if at is None or at >= len(levels):
        return "?"
    parts = short_name(levels[at][0])
    name = parts[-1]
    if name.startswith("{"):
        if len(parts) > 1:
            return parts[-2]
        for fn, _ in levels[at + 1 :]:
            up = short_name(fn)[-1]
            if not up.startswith("{"):
                return up
    return name


def excluded(levels, exclude, keep):
    """True if an inline chain runs inside a function matching `exclude`
    (any level) and not inside one matching `keep` (the test harness of a
    measurement, e.g. a driver that stands in for another thread, whose
    own code is not part of what is measured)."""
    if exclude is None:
        return False
    fns = [fn for fn, _ in levels]
    if keep is not None and any(re.search(keep, fn) for fn in fns):
        return False
    return any(re.search(exclude, fn) for fn in fns)


class Charges:
    """The share of each callee's inclusive cost that is plain library
    (or helper) work, from one run's totals: what a call into it from ours
    code is charged, per unit of its inclusive cost."""

    def __init__(self, cost, fn_of, calls, states, kinds, rule):
        self.kinds = kinds  # ("bin", entry) -> kind of the callee's own code
        self.rule = rule
        self.incl = collections.Counter()
        self.own = collections.defaultdict(float)  # plain self cost per function
        self.out = collections.defaultdict(list)  # plain call sites per function
        entry_of = {}
        for (site, callee), v in calls.items():
            self.incl[callee] += v
        for (site, callee), v in calls.items():
            if callee[0] == "bin":
                entry_of.setdefault(fn_of.get(callee[1]), callee)
        self.entry_of = entry_of
        for addr, v in cost.items():
            if isinstance(addr, int) and states.get(addr, ("lib",))[0] in PLAIN:
                f = entry_of.get(fn_of.get(addr))
                if f is not None:
                    self.own[f] += v
        for (site, callee), v in calls.items():
            if isinstance(site, int) and states.get(site, ("lib",))[0] in PLAIN:
                f = entry_of.get(fn_of.get(site))
                if f is not None:
                    self.out[f].append((callee, v))
        self.memo = {}

    def chargeable(self, callee):
        kind = self.kinds.get(callee, "lib") if callee[0] == "bin" else "lib"
        return kind in ("lib", "helper")

    def fraction(self, callee, depth=0):
        """Plain share of `callee`'s inclusive cost (1 for other objects)."""
        if callee[0] == "ob":
            return 1.0
        if callee in self.memo:
            return self.memo[callee]
        total = self.incl.get(callee, 0)
        if total <= 0 or depth > 50:
            return 1.0
        self.memo[callee] = 1.0  # recursion: count it as plain
        plain = self.own.get(callee, 0.0)
        for c, v in self.out.get(callee, []):
            if self.chargeable(c):
                plain += v * self.fraction(c, depth + 1)
        f = max(0.0, min(1.0, plain / total))
        self.memo[callee] = f
        return f


def main():
    args = sys.argv[1:]
    opts = {
        "--top": 15,
        "--max": None,
        "--total": False,
        "--exclude-fn": None,
        "--keep-fn": None,
        "--rule": "erpc",
    }
    pos = []
    i = 0
    while i < len(args):
        if args[i] in ("--top", "--max"):
            opts[args[i]] = int(args[i + 1])
            i += 2
        elif args[i] in ("--exclude-fn", "--keep-fn", "--rule"):
            opts[args[i]] = args[i + 1]
            i += 2
        elif args[i] == "--total":
            opts["--total"] = True
            i += 1
        else:
            pos.append(args[i])
            i += 1
    rule = opts["--rule"]
    if rule not in RULES:
        print(f"--rule {rule}: erpc or host", file=sys.stderr)
        return 2
    binary, short, long_, rpcs = pos[0], pos[1], pos[2], int(pos[3])
    main_object = binary.rsplit("/", 1)[-1]
    a_cost, _, a_calls, a_n = load(short, main_object)
    b_cost, fn_of, b_calls, b_n = load(long_, main_object)
    diff = {k: (v - a_cost.get(k, 0)) / rpcs for k, v in b_cost.items()}
    diff = {k: d for k, d in diff.items() if d != 0}
    cdiff = {k: (v - a_calls.get(k, 0)) / rpcs for k, v in b_calls.items()}
    cdiff = {k: d for k, d in cdiff.items() if d != 0}

    addrs = {k for k in b_cost if isinstance(k, int)}
    addrs |= {s for s, _ in b_calls if isinstance(s, int)}
    addrs |= {c[1] for _, c in b_calls if c[0] == "bin"}
    lv = inline_levels(binary, sorted(addrs))
    states = {a: state_of(lv.get(a, []), rule) for a in addrs}
    kinds = {}
    for _, c in b_calls:
        if c[0] == "bin":
            levels = lv.get(c[1], [])
            fn, loc = levels[-1] if levels else ("", "")
            kinds[c] = level_kind(fn, loc, rule)
    charges = Charges(b_cost, fn_of, b_calls, states, kinds, rule)

    ex, keep = opts["--exclude-fn"], opts["--keep-fn"]
    own = 0.0
    called = 0.0
    left_out = 0.0
    rows = collections.Counter()
    by_source = collections.Counter()
    by_callee = collections.Counter()
    by_crate = collections.Counter()

    def crate_of(addr):
        levels, at = lv.get(addr, []), states[addr][1]
        loc = levels[at][1] if at is not None and at < len(levels) else ""
        for name, pat in CRATES:
            if pat in loc:
                return name
        return "other"

    for addr, d in diff.items():
        counts = isinstance(addr, int) and states[addr][0] == "in"
        if counts and excluded(lv.get(addr, []), ex, keep):
            left_out += d
            counts = False
        if counts:
            own += d
            by_source[source_fn(lv.get(addr, []), states[addr][1])] += d
            by_crate[crate_of(addr)] += d
        name = fn_of.get(addr) if isinstance(addr, int) else addr[1]
        rows[(counts, re.sub(r"::h[0-9a-f]{16}$", "", name or "?"))] += d
    for (site, callee), d in cdiff.items():
        if not isinstance(site, int) or states[site][0] != "in":
            continue
        if not charges.chargeable(callee):
            continue
        share = d * charges.fraction(callee)
        if excluded(lv.get(site, []), ex, keep):
            left_out += share
            continue
        called += share
        by_crate[crate_of(site)] += share
        fn = re.sub(r"::h[0-9a-f]{16}$", "", fn_of.get(site) or "?")
        rows[(True, fn + " (calls out)")] += share
        by_source[source_fn(lv.get(site, []), states[site][1]) + " (calls out)"] += share
        if callee[0] == "ob":
            cname = callee[1]
        else:
            cname = fn_of.get(callee[1]) or f"0x{callee[1]:x}"
        by_callee[re.sub(r"::h[0-9a-f]{16}$", "", cname)] += share
    mine = own + called
    total = sum(diff.values())
    if opts["--total"]:
        print(round(mine))
        return 0
    who = {"erpc": "eRPC", "host": "eRPC + transport + driver"}[rule]
    print(f"{who} instructions per RPC (client + server): {round(mine)}")
    print(f"  of which in calls to library and helper code: {called:.1f}")
    if rule == "host":
        parts = ", ".join(f"{name} {by_crate[name]:.0f}" for name, _ in CRATES if by_crate[name])
        print(f"  by the crate of the code that made it count: {parts}")
    if ex is not None:
        print(f"left out (inside {ex}, not inside {keep}): {left_out:.1f} per RPC")
    print(f"whole program per RPC: {round(total)}")
    print(f"top {opts['--top']} functions by instructions per RPC "
          "(the counted part of each function marked *, the rest unmarked):")
    for (counts, name), d in sorted(rows.items(), key=lambda kv: -kv[1])[: opts["--top"]]:
        if len(name) > 90:
            name = name[:87] + "..."
        print(f"  {d:7.1f} {'*' if counts else ' '} {name}")
    print(f"top {opts['--top']} source functions counted (inlining undone: each instruction "
          "goes to the function whose line made it count):")
    for name, d in sorted(by_source.items(), key=lambda kv: -kv[1])[: opts["--top"]]:
        print(f"  {d:7.1f}   {name}")
    if by_callee:
        print("library and helper callees charged (inclusive, less what counts elsewhere):")
        for name, d in sorted(by_callee.items(), key=lambda kv: -kv[1])[: opts["--top"]]:
            if len(name) > 90:
                name = name[:87] + "..."
            print(f"  {d:7.1f}   {name}")

    # Event-loop iterations per RPC: one RX poll each; and how many found
    # packets (the rest are empty polls, whose cost the total includes).
    def per_rpc(pat):
        n = sum(v for k, v in b_n.items() if k and re.search(pat, k))
        n -= sum(v for k, v in a_n.items() if k and re.search(pat, k))
        return n / rpcs

    iters = per_rpc(r"as transport::Transport>::rx_burst")
    busy = per_rpc(r"::process_rx(::h[0-9a-f]+)?$")
    if iters > 0:
        print(f"event-loop iterations per RPC: {iters:.2f} ({busy:.2f} with received packets, "
              f"{iters - busy:.2f} empty)")
    if opts["--max"] is not None and mine > opts["--max"]:
        print(f"FAIL: {round(mine)} instructions per RPC is above the limit of {opts['--max']}")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
