#!/usr/bin/env python3
"""Instructions per RPC in eRPC's own code, from two callgrind runs.

Usage: callgrind_count.py BINARY SHORT.out LONG.out RPCS [--top N] [--max N] [--total]
                           [--exclude-fn REGEX [--keep-fn REGEX]]

SHORT.out and LONG.out are callgrind outputs (``--dump-instr=yes``) of the
same program doing a different number of RPCs; RPCS is the difference. The
per-instruction difference, divided by RPCS, cancels setup.

Which instructions are eRPC's is decided per instruction address of the
binary (addresses are offsets within their object: a libc address is
never looked up in the binary) from its
inline chain (``addr2line -i``), so the count does not depend on what the
compiler inlined into what: the innermost source location on the chain that
is not library code (the Rust standard library, crates.io crates, the
`mempool` crate) decides. eRPC's files (``erpc/src/``, except the simulated
transport ``erpc/src/sim/``) count; the transport, the simulated network
and the benchmark itself do not. A standard-library `Option` check or a
buffer accessor inlined into eRPC code counts for eRPC, wherever that eRPC
code was itself inlined (the event loop inlined into the benchmark's loop
still counts); transport code inlined into eRPC does not.

Two tables follow the totals: the binary's functions (what callgrind
sees, eRPC's part of each marked), and eRPC's source functions with the
inlining undone (each instruction goes to the eRPC function whose line it
is, as llvm-symbolizer names the inline levels; GNU addr2line, the
fallback, cannot name the innermost level).
"""

import collections
import re
import shutil
import subprocess
import sys


def load(path, main_object=None):
    """Self cost per instruction address of `main_object` (the benchmark
    binary; its base name), the function of each, the number of calls to
    each function, and per call site in the binary the inclusive cost of
    calls into other objects (libc's memcpy, ...).

    Addresses are offsets within their object, so an address in libc can
    equal one in the binary: only the binary's own instructions are keyed
    by address; the cost of every other object is kept per function name
    (in `fn_of`'s key space as ``("ob", name)``)."""
    cost = collections.Counter()
    fn_of = {}
    names = {}
    objs = {}
    calls = collections.Counter()
    out_calls = collections.Counter()
    cur = None
    cur_ob = None
    callee = None
    callee_ob = None
    addr = 0
    skip = False

    def ours(ob):
        return main_object is None or (ob or "").rsplit("/", 1)[-1] == main_object

    for line in open(path):
        c = line[:1]
        if c.isdigit() or c in "+-*":
            parts = line.split()
            a = parts[0]
            if a.startswith("0x"):
                addr = int(a, 16)
            elif a[0] == "+":
                addr += int(a[1:])
            elif a[0] == "-":
                addr -= int(a[1:])
            elif a != "*":
                addr = int(a)
            if skip:
                # The inclusive cost of a call, not this instruction's:
                # kept only for a call from the binary into another object.
                skip = False
                target = callee_ob if callee_ob is not None else cur_ob
                if ours(cur_ob) and not ours(target) and len(parts) >= 3:
                    out_calls[addr] += int(parts[-1])
                callee_ob = None
            elif len(parts) >= 3:
                if ours(cur_ob):
                    cost[addr] += int(parts[-1])
                    fn_of[addr] = cur
                else:
                    key = ("ob", cur)
                    cost[key] += int(parts[-1])
                    fn_of[key] = cur
            continue
        if line.startswith("calls="):
            calls[callee] += int(line[6:].split()[0])
            skip = True
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
    return cost, fn_of, calls, out_calls


LIBRARY = ("/rustc/", "/.cargo/registry/", "/mempool/src/")


def owner(locations):
    """The innermost non-library source file of an inline chain."""
    for loc in locations:
        if not any(p in loc for p in LIBRARY):
            return loc
    return locations[-1] if locations else "?"


def is_erpc(path):
    return "erpc/src/" in path and "erpc/src/sim/" not in path


def chains(binary, addrs):
    """addr -> [source location, innermost first] (addr2line -i)."""
    return {a: [loc for _, loc in levels] for a, levels in inline_levels(binary, addrs).items()}


def inline_levels(binary, addrs):
    """addr -> [(function, source location in it), innermost first].

    llvm-symbolizer names every level right; GNU addr2line (the fallback)
    prints the symbol's name for the innermost level, so there the
    innermost function is unknown ("?"); the locations agree."""
    addrs = list(addrs)
    stdin = "".join(f"0x{a:x}\n" for a in addrs)
    if shutil.which("llvm-symbolizer"):
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
                # file:line:column -> file:line, as addr2line prints it.
                levels.append((fn.strip(), re.sub(r":\d+$", "", loc.strip())))
            res[a] = levels
        return res
    out = subprocess.run(
        ["addr2line", "-i", "-f", "-C", "-a", "-e", binary],
        input=stdin,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    res, cur, fn = {}, None, None
    for line in out.splitlines():
        if line.startswith("0x"):
            cur = int(line, 16)
            res[cur] = []
            fn = None
        elif cur is not None:
            if fn is None:
                fn = line.strip() if res[cur] else "?"
            else:
                res[cur].append((fn, line.strip()))
                fn = None
    return res


def source_fn(levels):
    """The eRPC function an instruction belongs to, inlining undone: the
    function of the owner's level, without module path or generics (a
    closure counts for the function it is in)."""

    def short(fn):
        fn = re.sub(r"::h[0-9a-f]{16}$", "", fn)
        depth, name = 0, ""
        for ch in fn:  # drop every <...>, nested ones included
            depth += (ch == "<") - (ch == ">")
            if depth == 0 and ch != ">":
                name += ch
        return [part for part in name.split("::") if part] or ["?"]

    for k, (fn, loc) in enumerate(levels):
        if not any(p in loc for p in LIBRARY):
            parts = short(fn)
            name = parts[-1]
            # A closure counts for the function it is in: an outlined one
            # carries that function in its path, an inlined one is named
            # alone (its function is the first eRPC level up: a closure
            # given to `Option::and_then` is called from the library).
            if name.startswith("{"):
                if len(parts) > 1:
                    name = parts[-2]
                else:
                    up = [f for f, l in levels[k + 1 :] if not any(p in l for p in LIBRARY)]
                    name = short(up[0])[-1] if up else name
            return name
    return "?"


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


def main():
    args = sys.argv[1:]
    opts = {"--top": 15, "--max": None, "--total": False, "--exclude-fn": None, "--keep-fn": None}
    pos = []
    i = 0
    while i < len(args):
        if args[i] in ("--top", "--max"):
            opts[args[i]] = int(args[i + 1])
            i += 2
        elif args[i] in ("--exclude-fn", "--keep-fn"):
            opts[args[i]] = args[i + 1]
            i += 2
        elif args[i] == "--total":
            opts["--total"] = True
            i += 1
        else:
            pos.append(args[i])
            i += 1
    binary, short, long_, rpcs = pos[0], pos[1], pos[2], int(pos[3])
    main_object = binary.rsplit("/", 1)[-1]
    a, _, calls_a, out_a = load(short, main_object)
    b, fn_of, calls_b, out_b = load(long_, main_object)
    diff = {k: (v - a.get(k, 0)) / rpcs for k, v in b.items()}
    diff = {k: d for k, d in diff.items() if d != 0}
    out = {k: (v - out_a.get(k, 0)) / rpcs for k, v in out_b.items()}
    out = {k: d for k, d in out.items() if d != 0}
    lv = inline_levels(binary, sorted({k for k in diff if isinstance(k, int)} | set(out)))
    ch = {a: [loc for _, loc in levels] for a, levels in lv.items()}
    mine = 0.0
    left_out = 0.0
    rows = collections.Counter()
    by_source = collections.Counter()
    ex, keep = opts["--exclude-fn"], opts["--keep-fn"]
    for addr, d in diff.items():
        # Another object's instructions (libc, the loader) are nobody's
        # source here: they count for eRPC only through a call from eRPC
        # code, below.
        ours = isinstance(addr, int) and is_erpc(owner(ch.get(addr, [])))
        if ours and excluded(lv.get(addr, []), ex, keep):
            left_out += d
            ours = False
        if ours:
            mine += d
            by_source[source_fn(lv.get(addr, []))] += d
        fn = re.sub(r"::h[0-9a-f]{16}$", "", fn_of.get(addr) or "?")
        rows[(ours, fn)] += d
    # A call from eRPC code into another object (a memcpy the compiler did
    # not inline, say) is eRPC's, like library code inlined into it.
    for addr, d in out.items():
        if is_erpc(owner(ch.get(addr, []))) and excluded(lv.get(addr, []), ex, keep):
            left_out += d
        elif is_erpc(owner(ch.get(addr, []))):
            mine += d
            fn = re.sub(r"::h[0-9a-f]{16}$", "", fn_of.get(addr) or "?")
            rows[(True, fn + " (calls out)")] += d
            by_source[source_fn(lv.get(addr, [])) + " (calls out)"] += d
    total = sum(diff.values())
    if opts["--total"]:
        print(round(mine))
        return 0
    print(f"eRPC instructions per RPC (client + server): {round(mine)}")
    if ex is not None:
        print(f"left out (inside {ex}, not inside {keep}): {left_out:.1f} per RPC")
    print(f"whole program (eRPC + simulated network + benchmark loop) per RPC: {round(total)}")
    print(f"top {opts['--top']} functions by instructions per RPC "
          "(eRPC's part of each function marked *, the rest unmarked):")
    for (ours, name), d in sorted(rows.items(), key=lambda kv: -kv[1])[: opts["--top"]]:
        if len(name) > 90:
            name = name[:87] + "..."
        print(f"  {d:7.1f} {'*' if ours else ' '} {name}")
    print(f"top {opts['--top']} eRPC source functions (inlining undone: each instruction "
          "goes to the eRPC function whose line it is):")
    for name, d in sorted(by_source.items(), key=lambda kv: -kv[1])[: opts["--top"]]:
        print(f"  {d:7.1f}   {name}")
    # Event-loop iterations per RPC: one RX poll each; and how many found
    # packets (the rest are empty polls, whose cost the total includes: the
    # harness steps the simulated network 100 ns at a time).
    def per_rpc(pat):
        n = sum(v for k, v in calls_b.items() if k and re.search(pat, k))
        n -= sum(v for k, v in calls_a.items() if k and re.search(pat, k))
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
