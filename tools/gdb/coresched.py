# SPDX-License-Identifier: Apache-2.0
"""gdb commands for coresched fibers, on a live process or a core file.

Load it with `source /path/to/coresched.py` (or from ~/.gdbinit, or gdb's auto-load:
see the README, "Fibers in gdb"). It adds:

  info fibers            every started fiber of every runtime: id, cookie (and its name), state, worker,
                         what a parked fiber waits for, and for how long (live process)
  fiber N                one fiber's details and its backtrace
  fiber bt N [BT-ARGS]   its backtrace only (BT-ARGS go to `bt`, e.g. `full` or `-10`)
  fiber bt all           the backtrace of every switched-out fiber

N is a fiber id (as `info fibers` prints it) or a gdb expression giving one (e.g. a
variable holding JoinHandle::id()), or a `coresched::detail::Fiber *`.

Where it reads (runtime/sched/debug_registry.hpp, stack_header.hpp, fiber.hpp): the extern "C"
list `coresched_debug_runtimes` of live runtimes; each names the sentinel of its circular
list of mapped fiber stacks; the header at the top of each stack names the fiber that owns
it (`running`) and what it waits for (`wait`). A fiber that never ran has no stack and is
not listed (Runtime::dump lists it from the run queues).

A backtrace on a live process swaps the selected thread's registers for the fiber's saved
ones (Boost.Context's jump_fcontext leaves r12-r15, rbx, rbp and the return address at its
saved context), runs `bt` and puts them back, as folly's fiber helpers do. A core file's
registers cannot be written: there it walks the frame-pointer chain from the frame
Worker::park recorded and names each return address (code built without frame pointers
makes that walk skip frames).

With debug information (RelWithDebInfo, Debug) the layouts come from gdb's type
information. Without it (Release without -g, strip --strip-debug) they come from the table
`coresched_debug_layout` that the library's compiler filled with that build's offsets, read
from the process or core file, and the commands say so. Everything read is bounded and a
torn or unreadable list stops the walk with a note, so a broken runtime still gives what
can be read.
"""

import os
import re
import sys

import gdb

# The snapshot module sits beside this file (in the source tree and where it is installed).
_here = os.path.dirname(os.path.abspath(__file__))
if _here not in sys.path:
    sys.path.insert(0, _here)

from coresched_gdb_snapshot import (  # noqa: E402  (after the path is set)
    _CONTEXT_REGS,
    _CONTEXT_RIP,
    _CONTEXT_RSP,
    _MAX_FP_FRAMES,
    _SWAPPED_REGS,
    _Snapshot,
    _first_line,
    _signal_name,
    _thread_label,
    _threads_by_stack,
)


# ---------------------------------------------------------------------------- info fibers

class InfoFibers(gdb.Command):
    """List the started fibers of every coresched runtime in the process.

Usage: info fibers

Columns: ID, COOKIE (its number, and its name in parentheses if it has one: asked of a live
process by calling coresched_cookie_name; a core file shows numbers), STATE (runnable, running, parking, parked, finishing), WORKER (the
worker it runs on, or last ran on), WAIT (what a parked fiber waits for) and FOR (how long,
on a live process; on a core file the raw steady-clock time it parked, after `@`).
Fibers that never ran have no stack and are not listed."""

    def __init__(self):
        super().__init__("info fibers", gdb.COMMAND_STATUS, gdb.COMPLETE_NONE)

    def invoke(self, arg, from_tty):
        snap = _Snapshot()
        out = []
        if snap.layout.note:
            out.append("coresched: " + snap.layout.note)
        if not snap.runtimes:
            out.append("coresched: no runtime is alive (coresched_debug_runtimes is empty)")
        threads = _threads_by_stack(snap.fibers)
        for index, entry, sched, sig, stacks, pooled, notes in snap.runtimes:
            mine = sorted((f for f in snap.fibers if f.runtime_index == index), key=lambda f: (f.id, f.addr))
            out.append("runtime %d (scheduler 0x%x, dump signal %s): %d stacks mapped, %d pooled, %d fibers listed"
                       % (index, sched, _signal_name(sig), stacks, pooled, sum(1 + len(f.below) for f in mine)))
            for note in notes:
                out.append("  [%s]" % note)
            if not mine:
                continue
            rows = [("ID", "COOKIE", "STATE", "WORKER", "WAIT", "FOR" if snap.live else "PARKED AT")]
            any_pinned = False
            for f in mine:
                wait = snap.describe_wait(f)
                if f.state == "running" and f.addr in threads:
                    wait = "on " + _thread_label(threads[f.addr])
                state = "finishing" if f.state == "done" else f.state
                worker = "" if f.error else str(f.last_worker)
                if not f.error and f.pinned is not None:
                    worker += "*"
                    any_pinned = True
                rows.append((str(f.id), snap.cookies.label(f.cookie) if not f.error else "?", state, worker, wait,
                             snap.waited_for(f)))
                for addr, fid, cookie in reversed(f.below):
                    rows.append((str(fid), snap.cookies.label(cookie), state, worker,
                                 "joins fiber %d inline (same stack, below it)" % f.id, ""))
            widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]) - 1)]
            for r in rows:
                cells = [r[i].rjust(widths[i]) if i == 0 else r[i].ljust(widths[i]) for i in range(len(widths))]
                out.append(("  " + "  ".join(cells) + "  " + r[-1]).rstrip())
            if any_pinned:
                out.append("  (WORKER*: pinned to that PU)")
        if snap.cookies.note and snap.fibers:
            out.append("coresched: " + snap.cookies.note)
        out.append("(fibers that never ran have no stack and are not listed: they wait in run queues)")
        gdb.write("\n".join(out) + "\n")


# ---------------------------------------------------------------------------- backtraces

def _symbolize(pc):
    """`name at file:line` for a return address (the call is the instruction before it)."""
    look = pc - 1 if pc else pc
    name = None
    try:
        # The function the code belongs to, not a function inlined into it (as Runtime::dump names it).
        block = gdb.block_for_pc(look)
        while block is not None and not block.is_static and not block.is_global:
            if block.function is not None:
                name = block.function.print_name
            block = block.superblock
    except (RuntimeError, gdb.error):
        pass
    if name is None:
        try:
            text = gdb.execute("info symbol 0x%x" % look, to_string=True).strip()
            if text.startswith("No symbol"):
                name = "??"
            else:  # "f(int) + 12 in section .text of /lib/x.so": keep the name, offset and file
                hit = re.match(r"(.*?) in section \S+(?: of (.*))?$", text)
                name = text if not hit else hit.group(1) + (" (%s)" % hit.group(2) if hit.group(2) else "")
        except gdb.error:
            name = "??"
    where = ""
    try:
        sal = gdb.find_pc_line(look)
        if sal.symtab is not None and sal.line:
            where = " at %s:%d" % (sal.symtab.filename, sal.line)
    except (RuntimeError, gdb.error):
        pass
    return name + where


def _frame_walk(snap, f):
    """Frames of a switched-out fiber by frame pointer, never leaving its stack."""
    m = snap.mem
    lo, hi = f.stack_base, f.header
    lines = []
    ctx = f.context

    def in_stack(a, n):
        return a and lo <= a and a + n <= hi and a % 8 == 0

    pcs = []
    error = None
    try:
        if in_stack(ctx, _CONTEXT_RSP):
            pcs.append(m.u64(ctx + _CONTEXT_RIP))  # where it switched out
        if snap.waiting(f) and in_stack(f.frame, 16):
            fp = f.frame  # Worker::park's frame: [fp] its caller's rbp, [fp+8] the return address into it
        elif in_stack(ctx, _CONTEXT_RSP):
            fp = m.u64(ctx + 0x30)  # the rbp jump_fcontext saved
        else:
            fp = 0
        floor = fp
        # Callers' frames lie above (the stack grows down): stop at anything else.
        while fp and len(pcs) < _MAX_FP_FRAMES and in_stack(fp, 16) and fp >= floor:
            pcs.append(m.u64(fp + 8))
            floor = fp + 16
            fp = m.u64(fp)
    except gdb.MemoryError as e:
        error = "(stack unreadable: %s)" % _first_line(e)
    for depth, pc in enumerate(pcs):
        if not pc:
            break
        lines.append("#%-2d 0x%016x in %s" % (depth, pc, _symbolize(pc)))
    if not lines:
        lines.append("(no saved frame on its stack)")
    if error:
        lines.append(error)
    return lines


def _registers_from_context(snap, f):
    m = snap.mem
    ctx = f.context
    if not ctx or not (f.stack_base <= ctx and ctx + _CONTEXT_RSP <= f.header):
        raise gdb.GdbError("fiber %d: its saved context 0x%x is not on its stack [0x%x, 0x%x)"
                           % (f.id, ctx, f.stack_base, f.header))
    regs = {name: m.u64(ctx + off) for name, off in _CONTEXT_REGS}
    regs["rip"] = m.u64(ctx + _CONTEXT_RIP)
    regs["rsp"] = ctx + _CONTEXT_RSP
    return regs


def _read_reg(frame, name):
    return int(frame.read_register(name)) & ((1 << 64) - 1)


def _with_registers(regs, action):
    """Runs `action` with the selected thread's registers set to `regs`, then restores them."""
    try:
        level = gdb.selected_frame().level()
    except gdb.error:
        level = 0
    gdb.newest_frame().select()
    f0 = gdb.newest_frame()
    saved = {r: _read_reg(f0, r) for r in _SWAPPED_REGS}
    try:
        saved_orig_rax = _read_reg(f0, "orig_rax")  # so that an interrupted system call restarts as before
    except (gdb.error, ValueError):
        saved_orig_rax = None
    try:
        for r in _SWAPPED_REGS:
            gdb.execute("set $%s = 0x%x" % (r, regs[r]), to_string=True)
        action()
    finally:
        gdb.newest_frame().select()
        for r in _SWAPPED_REGS:
            gdb.execute("set $%s = 0x%x" % (r, saved[r]), to_string=True)
        if saved_orig_rax is not None:
            try:
                gdb.execute("set $orig_rax = 0x%x" % saved_orig_rax, to_string=True)
            except gdb.error:
                pass
        try:
            frame = gdb.newest_frame()
            while level > 0 and frame.older() is not None:
                frame = frame.older()
                level -= 1
            frame.select()
        except gdb.error:
            pass


def _cut_at_fiber_entry(text):
    """Drops what gdb unwinds past the fiber's first frame (Boost.Context's make_fcontext trampoline)."""
    out = []
    entry_seen = False
    for line in text.splitlines(True):
        if line.startswith("#"):
            if entry_seen:
                out.append("(the fiber's first frame: nothing above it)\n")
                break
            entry_seen = "make_fcontext" in line
        out.append(line)
    return "".join(out)


def _limit_frames(text, count):
    """Like `bt N` (innermost N frames) or `bt -N` (outermost N), on gdb's printed backtrace."""
    if not count:
        return text
    frames = []
    for line in text.splitlines(True):
        if line.startswith("#") or not frames:
            frames.append([line])
        else:
            frames[-1].append(line)
    if frames and frames[-1][0].startswith("(the fiber's first frame"):
        frames.pop()
    kept = frames[:count] if count > 0 else frames[count:]
    more = "(More stack frames follow...)\n" if count > 0 and len(frames) > count else ""
    return "".join("".join(f) for f in kept) + more


def _header_line(snap, f, inline_id=None):
    text = "fiber %d (cookie %s, %s, %s worker %d)" % (
        f.id, snap.cookies.label(f.cookie), "finishing" if f.state == "done" else f.state,
        "on" if f.state == "running" else "last on", f.last_worker)
    wait = snap.describe_wait(f)
    if snap.waiting(f):
        how_long = snap.waited_for(f)
        text += ": waits %sfor %s" % (("" if how_long.startswith("@") else how_long + " ") if how_long else "", wait)
        if how_long.startswith("@"):
            text += " since %s (steady clock ns)" % how_long[1:]
    if inline_id is not None:
        text = ("fiber %d joins fiber %d inline: it runs on the same stack, below it; showing that stack\n"
                % (inline_id, f.id)) + text
    return text


def _backtrace(snap, f, bt_args, inline_id=None):
    gdb.write(_header_line(snap, f, inline_id) + "\n")
    if f.error:
        gdb.write("  (fiber %s)\n" % f.error)
        return
    if f.state == "running":
        t = _threads_by_stack([f]).get(f.addr)
        where = "on " + _thread_label(t) + ": `thread %d` then `bt`" % t.num if t else \
                "on worker %d: its thread's own backtrace is the fiber's (`info threads`, `thread N`, `bt`)" % f.last_worker
        gdb.write("  running %s\n" % where)
        return
    if not f.context_saved:
        gdb.write("  (switching out just now: its context is not saved yet)\n")
        return
    if snap.live:
        try:
            regs = _registers_from_context(snap, f)
            # A frame count is applied after the cut: gdb unwinds past the fiber's first frame.
            words = bt_args.split()
            counts = [w for w in words if re.fullmatch(r"-?\d+", w)]
            rest = " ".join(w for w in words if w not in counts)
            text = []
            _with_registers(regs, lambda: text.append(gdb.execute(("bt " + rest).strip(), to_string=True)))
            gdb.write(_limit_frames(_cut_at_fiber_entry("".join(text)), int(counts[-1]) if counts else 0))
            return
        except gdb.MemoryError as e:
            gdb.write("  (its saved context is unreadable: %s)\n" % _first_line(e))
            return
        except gdb.error as e:
            gdb.write("  (cannot switch registers: %s; walking frame pointers instead)\n" % _first_line(e))
    else:
        gdb.write("  (core file: registers cannot be set; frame-pointer walk from the saved context)\n")
    for line in _frame_walk(snap, f):
        gdb.write(line + "\n")


def _parse_spec(text):
    text = text.strip()
    if re.fullmatch(r"\d+", text):
        return int(text)
    try:
        v = gdb.parse_and_eval(text)
    except gdb.error as e:
        raise gdb.GdbError("fiber: `%s` is neither a fiber id nor an expression (%s)" % (text, _first_line(e)))
    return int(v) & ((1 << 64) - 1)


def _lookup(snap, text):
    spec = _parse_spec(text)
    f, inline_id = snap.find(spec)
    if f is None:
        raise gdb.GdbError("fiber: no started fiber %s (`info fibers` lists them; a fiber that never ran has no "
                           "stack and no backtrace)" % (spec if spec < (1 << 32) else "at 0x%x" % spec))
    return f, inline_id


class FiberCommand(gdb.Command):
    """Show a coresched fiber: its details and its backtrace.

Usage: fiber N        (N: a fiber id, an expression giving one, or a Fiber *)
       fiber bt N [BT-ARGS]
       fiber bt all
See `info fibers` for the ids."""

    def __init__(self):
        super().__init__("fiber", gdb.COMMAND_STACK, gdb.COMPLETE_EXPRESSION, True)

    def invoke(self, arg, from_tty):
        if not arg.strip():
            raise gdb.GdbError("usage: fiber N | fiber bt N [BT-ARGS] | fiber bt all (ids: info fibers)")
        snap = _Snapshot()
        if snap.layout.note:
            gdb.write("coresched: " + snap.layout.note + "\n")
        f, inline_id = _lookup(snap, arg)
        runtime = next((r for r in snap.runtimes if r[0] == f.runtime_index), None)
        gdb.write("fiber %d at (coresched::detail::Fiber *) 0x%x\n" % (f.id, f.addr))
        gdb.write("  runtime %d (scheduler 0x%x)\n" % (f.runtime_index, runtime[2] if runtime else 0))
        if not f.error:
            gdb.write("  cookie %s, state %s, %s worker %d%s\n" % (
                snap.cookies.label(f.cookie), "finishing" if f.state == "done" else f.state,
                "on" if f.state == "running" else "last on", f.last_worker,
                ", pinned to PU %d" % f.pinned if f.pinned is not None else ""))
            gdb.write("  stack [0x%x, 0x%x), header 0x%x, saved context 0x%x%s\n" % (
                f.stack_base, f.stack_base + f.stack_size, f.header, f.context,
                "" if f.context_saved else " (not saved yet)"))
            if snap.waiting(f):
                gdb.write("  waits for %s (%s), %s\n" % (
                    snap.describe_wait(f), f.wait_kind,
                    "for " + snap.waited_for(f) if snap.live else "since %d (steady clock ns)" % f.since_ns))
        for addr, fid, cookie in f.below:
            gdb.write("  below it on the same stack: fiber %d (cookie %s) at 0x%x, joining it inline\n"
                      % (fid, snap.cookies.label(cookie), addr))
        _backtrace(snap, f, "", inline_id)


class FiberBtCommand(gdb.Command):
    """Backtrace of a switched-out coresched fiber (parked or runnable).

Usage: fiber bt N [BT-ARGS]   N: a fiber id, an expression giving one, or a Fiber *;
                              BT-ARGS go to `bt` (e.g. full, -10)
       fiber bt all           every switched-out fiber
On a live process the selected thread's registers are set to the fiber's saved ones for
the `bt` and then restored; on a core file the frame pointers are walked instead."""

    def __init__(self):
        super().__init__("fiber bt", gdb.COMMAND_STACK, gdb.COMPLETE_EXPRESSION)

    def invoke(self, arg, from_tty):
        words = arg.split(None, 1)
        if not words:
            raise gdb.GdbError("usage: fiber bt N [BT-ARGS] | fiber bt all (ids: info fibers)")
        snap = _Snapshot()
        if snap.layout.note:
            gdb.write("coresched: " + snap.layout.note + "\n")
        bt_args = words[1] if len(words) > 1 else ""
        if words[0] == "all":
            for f in sorted(snap.fibers, key=lambda f: (f.id, f.addr)):
                _backtrace(snap, f, bt_args)
                gdb.write("\n")
            return
        f, inline_id = _lookup(snap, words[0])
        _backtrace(snap, f, bt_args, inline_id)


InfoFibers()
FiberCommand()
FiberBtCommand()
