# SPDX-License-Identifier: Apache-2.0
"""gdb commands for coresched fibers, on a live process or a core file.

Load it with `source /path/to/coresched.py` (or from ~/.gdbinit, or gdb's auto-load:
see docs/gdb-readme-draft.md). It adds:

  info fibers            every started fiber of every runtime: id, cookie, state, worker,
                         what a parked fiber waits for, and for how long (live process)
  fiber N                one fiber's details and its backtrace
  fiber bt N [BT-ARGS]   its backtrace only (BT-ARGS go to `bt`, e.g. `full` or `-10`)
  fiber bt all           the backtrace of every switched-out fiber

N is a fiber id (as `info fibers` prints it) or a gdb expression giving one (e.g. a
variable holding JoinHandle::id()), or a `coresched::detail::Fiber *`.

Where it reads (runtime/debug_registry.hpp, stack_header.hpp, fiber.hpp): the extern "C"
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
information. Without it (stripped types, Release without -g) the built-in layout of
coresched 0.1 on x86-64 is used, and the commands say so. Everything read is bounded and a
torn or unreadable list stops the walk with a note, so a broken runtime still gives what
can be read.
"""

import re
import signal
import struct
import time

import gdb

# ---------------------------------------------------------------------------- layout

# Offsets in a normal (non-sanitizer) x86-64 build of coresched 0.1, used only when gdb has
# no type information for these structures. Kept in step with the headers named above.
_DEFAULT_LAYOUT = {
    "rt.next": 0, "rt.scheduler": 8, "rt.stacks": 16, "rt.dump_signal": 24,
    "sh.prev": 0, "sh.next": 8, "sh.running": 16, "sh.wait": 24,
    "wi.kind": 0, "wi.what": 8, "wi.object": 16, "wi.arg": 24, "wi.since_ns": 32, "wi.frame": 40,
    "f.id": 24, "f.cookie": 32, "f.pinned": 40, "f.last_worker": 44, "f.context": 48,
    "f.stack.base": 56, "f.stack.size": 64, "f.context_saved": 82, "f.state": 83,
    "f.inline_child": 112,
}
_DEFAULT_FIBER_STATES = ["runnable", "running", "parking", "parked", "done"]
_DEFAULT_WAIT_KINDS = ["none", "join", "sync", "io", "sleep"]

_NO_COOKIE = (1 << 64) - 1  # kNoCookie
_NOT_PINNED = -1

# Bounds on every walk: a stuck or torn runtime must not hang the debugger.
_MAX_RUNTIMES = 64
_MAX_STACKS = 1 << 20
_MAX_INLINE_CHAIN = 256
_MAX_FP_FRAMES = 64
_MAX_STRING = 128

# Boost.Context jump_fcontext (x86-64 System V): where the switched-out side's registers lie
# relative to its saved context, and its stack pointer once the switch returns.
_CONTEXT_REGS = [("r12", 0x08), ("r13", 0x10), ("r14", 0x18), ("r15", 0x20), ("rbx", 0x28), ("rbp", 0x30)]
_CONTEXT_RIP = 0x38
_CONTEXT_RSP = 0x40
_SWAPPED_REGS = ["rip", "rsp", "rbp", "rbx", "r12", "r13", "r14", "r15"]


class _Layout:
    """Field offsets and enum names, from debug information where there is some."""

    def __init__(self):
        self.off = dict(_DEFAULT_LAYOUT)
        self.states = list(_DEFAULT_FIBER_STATES)
        self.kinds = list(_DEFAULT_WAIT_KINDS)
        self.from_debug_info = False
        self.note = ""
        try:
            self._read_types()
            self.from_debug_info = True
        except (gdb.error, RuntimeError, StopIteration, LookupError) as e:
            self.off = dict(_DEFAULT_LAYOUT)
            self.states = list(_DEFAULT_FIBER_STATES)
            self.kinds = list(_DEFAULT_WAIT_KINDS)
            self.note = ("no debug information for coresched's types (%s): the program is stripped or built "
                         "without -g; using the built-in x86-64 layout of coresched 0.1, which is wrong for "
                         "another version or a sanitizer build" % _first_line(e))

    @staticmethod
    def _offset(t, path):
        off = 0
        for name in path.split("."):
            t = t.strip_typedefs()
            field = next(f for f in t.fields() if f.name == name)
            off += field.bitpos // 8
            t = field.type
        return off

    @staticmethod
    def _enum_names(t):
        t = t.strip_typedefs()
        if t.code != gdb.TYPE_CODE_ENUM:
            raise RuntimeError("%s is not an enum" % t)
        names = {}
        for f in t.fields():
            names[f.enumval] = f.name.split("::")[-1]
        if not names or max(names) > 64:
            raise RuntimeError("odd enum %s" % t)
        return [names.get(i, "?%d" % i) for i in range(max(names) + 1)]

    def _read_types(self):
        rt = gdb.lookup_type("coresched_debug_runtime")
        sh = gdb.lookup_type("coresched::detail::StackHeader")
        wi = gdb.lookup_type("coresched::detail::WaitInfo")
        fb = gdb.lookup_type("coresched::detail::Fiber")
        off = {}
        for key in _DEFAULT_LAYOUT:
            prefix, path = key.split(".", 1)
            t = {"rt": rt, "sh": sh, "wi": wi, "f": fb}[prefix]
            off[key] = self._offset(t, path)
        self.off = off
        self.states = self._enum_names(gdb.lookup_type("coresched::detail::FiberState"))
        self.kinds = self._enum_names(gdb.lookup_type("coresched::detail::WaitKind"))


def _first_line(e):
    text = str(e).strip()
    return text.splitlines()[0] if text else type(e).__name__


# ---------------------------------------------------------------------------- memory

class _Memory:
    def __init__(self):
        self.inf = gdb.selected_inferior()

    def read(self, addr, n):
        return bytes(self.inf.read_memory(addr, n))

    def u8(self, addr):
        return self.read(addr, 1)[0]

    def i32(self, addr):
        return struct.unpack("<i", self.read(addr, 4))[0]

    def u32(self, addr):
        return struct.unpack("<I", self.read(addr, 4))[0]

    def u64(self, addr):
        return struct.unpack("<Q", self.read(addr, 8))[0]

    def i64(self, addr):
        return struct.unpack("<q", self.read(addr, 8))[0]

    def cstring(self, addr):
        if not addr:
            return None
        out = b""
        # Read in small pieces: a string near the end of a mapping must not fail as a whole.
        while len(out) < _MAX_STRING:
            try:
                chunk = self.read(addr + len(out), 16)
            except gdb.MemoryError:
                break
            nul = chunk.find(b"\0")
            if nul >= 0:
                out += chunk[:nul]
                return out.decode("utf-8", "replace")
            out += chunk
        return out.decode("utf-8", "replace") + ("..." if out else "?")


# ---------------------------------------------------------------------------- the process

def _is_live():
    """True for a process gdb runs or attached to on this machine (its steady clock is ours)."""
    inf = gdb.selected_inferior()
    if not inf.pid:
        return False
    conn = getattr(inf, "connection", None)
    if conn is not None:
        return conn.type == "native"
    try:
        text = gdb.execute("info target", to_string=True)
    except gdb.error:
        return False
    return "core dump" not in text and "remote" not in text.lower()


def _now_ns():
    return time.clock_gettime_ns(time.CLOCK_MONOTONIC)  # std::chrono::steady_clock on Linux


def _registry_address():
    """The address of `coresched_debug_runtimes`, with or without debug information."""
    try:
        return int(gdb.parse_and_eval("(unsigned long) &coresched_debug_runtimes"))
    except gdb.error:
        pass
    sym = gdb.lookup_minimal_symbol("coresched_debug_runtimes") if hasattr(gdb, "lookup_minimal_symbol") else None
    if sym is not None:
        return int(sym.value().address)
    raise gdb.GdbError("coresched: no symbol `coresched_debug_runtimes` in this program: it does not link "
                       "coresched, or its symbol table was stripped (strip removes .symtab; keep it, or load "
                       "the separate debug file)")


def _duration(ns):
    if ns >= 10_000_000_000:
        return "%.1f s" % (ns / 1e9)
    if ns >= 1_000_000:
        return "%.1f ms" % (ns / 1e6)
    return "%.0f us" % (ns / 1e3)


def _signal_name(sig):
    if not sig:
        return "none"
    try:
        return signal.Signals(sig).name
    except ValueError:
        return str(sig)


def _cookie_name(c):
    return "none" if c == _NO_COOKIE else str(c)


class _Fiber:
    """One started fiber, read from its stack's header and its control block."""
    __slots__ = ("addr", "id", "cookie", "pinned", "last_worker", "state", "context", "context_saved",
                 "stack_base", "stack_size", "header", "below", "wait_kind", "what", "object", "arg",
                 "since_ns", "frame", "error", "runtime_index")

    def __init__(self):
        self.error = None
        self.below = []  # fibers joining it inline on the same stack, outermost first
        self.id = 0
        self.cookie = 0
        self.state = "?"


class _Snapshot:
    """Everything `info fibers` shows, read once."""

    def __init__(self):
        self.layout = _Layout()
        self.mem = _Memory()
        self.live = _is_live()
        self.now = _now_ns() if self.live else None
        self.runtimes = []  # (index, entry address, scheduler, dump_signal, stacks, pooled, notes)
        self.fibers = []
        self._read()

    def _read(self):
        L, m = self.layout.off, self.mem
        head_addr = _registry_address()
        try:
            entry = m.u64(head_addr)
        except gdb.MemoryError:
            raise gdb.GdbError("coresched: cannot read coresched_debug_runtimes at 0x%x" % head_addr)
        seen = set()
        while entry and len(self.runtimes) < _MAX_RUNTIMES:
            if entry in seen:
                self.runtimes.append((len(self.runtimes), entry, 0, 0, 0, 0, ["the list of runtimes loops"]))
                break
            seen.add(entry)
            notes = []
            try:
                nxt = m.u64(entry + L["rt.next"])
                sched = m.u64(entry + L["rt.scheduler"])
                sentinel = m.u64(entry + L["rt.stacks"])
                sig = m.i32(entry + L["rt.dump_signal"])
            except gdb.MemoryError:
                self.runtimes.append((len(self.runtimes), entry, 0, 0, 0, 0,
                                      ["entry unreadable at 0x%x: list torn" % entry]))
                break
            index = len(self.runtimes)
            stacks, pooled = self._read_stacks(index, sentinel, notes)
            self.runtimes.append((index, entry, sched, sig, stacks, pooled, notes))
            entry = nxt
        if entry and len(self.runtimes) >= _MAX_RUNTIMES:
            self.runtimes[-1][6].append("more than %d runtimes: the rest not read" % _MAX_RUNTIMES)

    def _read_stacks(self, index, sentinel, notes):
        L, m = self.layout.off, self.mem
        stacks = pooled = 0
        try:
            h = m.u64(sentinel + L["sh.next"])
        except gdb.MemoryError:
            notes.append("stack list sentinel unreadable at 0x%x" % sentinel)
            return 0, 0
        seen = set()
        while h and h != sentinel:
            if h in seen:
                notes.append("the list of stacks loops at 0x%x: stopped there" % h)
                break
            if len(seen) >= _MAX_STACKS:
                notes.append("more than %d stacks: the rest not read" % _MAX_STACKS)
                break
            seen.add(h)
            try:
                nxt = m.u64(h + L["sh.next"])
                owner = m.u64(h + L["sh.running"])
            except gdb.MemoryError:
                notes.append("stack header unreadable at 0x%x: the list is torn there" % h)
                break
            stacks += 1
            if owner:
                self.fibers.append(self._read_fiber(index, h, owner))
            else:
                pooled += 1
            h = nxt
        return stacks, pooled

    def _read_fiber(self, index, header, owner):
        L, m = self.layout.off, self.mem
        f = _Fiber()
        f.runtime_index = index
        f.header = header
        f.addr = owner
        try:
            # The innermost fiber on the stack is the one that runs or waits; those below join it inline.
            chain = [owner]
            while len(chain) < _MAX_INLINE_CHAIN:
                child = m.u64(chain[-1] + L["f.inline_child"])
                if not child or child in chain:
                    break
                chain.append(child)
            for addr in chain[:-1]:
                f.below.append((addr, m.u64(addr + L["f.id"]), m.u64(addr + L["f.cookie"])))
            f.addr = a = chain[-1]
            f.id = m.u64(a + L["f.id"])
            f.cookie = m.u64(a + L["f.cookie"])
            f.pinned = m.i32(a + L["f.pinned"])
            f.last_worker = m.u32(a + L["f.last_worker"])
            f.context = m.u64(a + L["f.context"])
            f.context_saved = m.u8(a + L["f.context_saved"]) != 0
            st = m.u8(a + L["f.state"])
            f.state = self.layout.states[st] if st < len(self.layout.states) else "?%d" % st
            f.stack_base = m.u64(a + L["f.stack.base"])
            f.stack_size = m.u64(a + L["f.stack.size"])
            w = header + L["sh.wait"]
            kind = m.u8(w + L["wi.kind"])
            f.wait_kind = self.layout.kinds[kind] if kind < len(self.layout.kinds) else "?%d" % kind
            f.what = m.cstring(m.u64(w + L["wi.what"]))
            f.object = m.u64(w + L["wi.object"])
            f.arg = m.i64(w + L["wi.arg"])
            f.since_ns = m.u64(w + L["wi.since_ns"])
            f.frame = m.u64(w + L["wi.frame"])
        except gdb.MemoryError as e:
            f.error = "unreadable (%s)" % _first_line(e)
        return f

    # --- presentation

    def waiting(self, f):
        return f.state in ("parked", "parking")

    def describe_wait(self, f):
        if f.error:
            return f.error
        if f.state == "running":
            return ""
        if not self.waiting(f):
            return "(runnable: waits for a worker)" if f.state == "runnable" else ""
        name = f.what or "?"
        k = f.wait_kind
        if k == "join":
            return "join of fiber %d" % f.arg
        if k == "sync":
            return "%s at 0x%x" % (name, f.object)
        if k == "io":
            return "io %s on fd %d" % (name, f.arg) if f.arg >= 0 else "io %s" % name
        if k == "sleep":
            deadline = f.arg & ((1 << 64) - 1)
            if self.now is None:
                return "sleep until %d (steady clock ns)" % deadline
            if deadline > self.now:
                return "sleep, %s left" % _duration(deadline - self.now)
            return "sleep, due %s ago" % _duration(self.now - deadline)
        return "nothing recorded"

    def waited_for(self, f):
        if f.error or not self.waiting(f) or not f.since_ns:
            return ""
        if self.now is None:
            return "@%d" % f.since_ns
        return _duration(self.now - min(self.now, f.since_ns))

    def find(self, spec):
        """The fiber with that id, or at that control block address (innermost or joining inline)."""
        for f in self.fibers:
            if f.id == spec or f.addr == spec:
                return f, None
            for addr, fid, _ in f.below:
                if fid == spec or addr == spec:
                    return f, fid
        return None, None


# ---------------------------------------------------------------------------- threads

def _threads_by_stack(fibers):
    """For running fibers: the gdb thread whose stack pointer is in the fiber's stack."""
    want = [f for f in fibers if f.state == "running" and not f.error and f.stack_base]
    found = {}
    if not want:
        return found
    inf = gdb.selected_inferior()
    try:
        original = gdb.selected_thread()
    except gdb.error:
        original = None
    try:
        for t in inf.threads()[:4096]:
            try:
                t.switch()
                sp = int(gdb.newest_frame().read_register("rsp")) & ((1 << 64) - 1)
            except (gdb.error, gdb.MemoryError):
                continue
            for f in want:
                if f.stack_base <= sp < f.stack_base + f.stack_size:
                    found[f.addr] = t
    finally:
        if original is not None and original.is_valid():
            original.switch()
    return found


def _thread_label(t):
    return "thread %d%s" % (t.num, " (%s)" % t.name if t.name else "")


# ---------------------------------------------------------------------------- info fibers

class InfoFibers(gdb.Command):
    """List the started fibers of every coresched runtime in the process.

Usage: info fibers

Columns: ID, COOKIE, STATE (runnable, running, parking, parked, finishing), WORKER (the
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
                if not f.error and f.pinned != _NOT_PINNED:
                    worker += "*"
                    any_pinned = True
                rows.append((str(f.id), _cookie_name(f.cookie) if not f.error else "?", state, worker, wait,
                             snap.waited_for(f)))
                for addr, fid, cookie in reversed(f.below):
                    rows.append((str(fid), _cookie_name(cookie), state, worker,
                                 "joins fiber %d inline (same stack, below it)" % f.id, ""))
            widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]) - 1)]
            for r in rows:
                cells = [r[i].rjust(widths[i]) if i == 0 else r[i].ljust(widths[i]) for i in range(len(widths))]
                out.append(("  " + "  ".join(cells) + "  " + r[-1]).rstrip())
            if any_pinned:
                out.append("  (WORKER*: pinned to that PU)")
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
        f.id, _cookie_name(f.cookie), "finishing" if f.state == "done" else f.state,
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
                _cookie_name(f.cookie), "finishing" if f.state == "done" else f.state,
                "on" if f.state == "running" else "last on", f.last_worker,
                ", pinned to PU %d" % f.pinned if f.pinned != _NOT_PINNED else ""))
            gdb.write("  stack [0x%x, 0x%x), header 0x%x, saved context 0x%x%s\n" % (
                f.stack_base, f.stack_base + f.stack_size, f.header, f.context,
                "" if f.context_saved else " (not saved yet)"))
            if snap.waiting(f):
                gdb.write("  waits for %s (%s), %s\n" % (
                    snap.describe_wait(f), f.wait_kind,
                    "for " + snap.waited_for(f) if snap.live else "since %d (steady clock ns)" % f.since_ns))
        for addr, fid, cookie in f.below:
            gdb.write("  below it on the same stack: fiber %d (cookie %s) at 0x%x, joining it inline\n"
                      % (fid, _cookie_name(cookie), addr))
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
