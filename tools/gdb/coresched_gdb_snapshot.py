# SPDX-License-Identifier: Apache-2.0
"""What coresched.py reads from the process or core file: the layouts of the
runtime's records (from gdb's type information, or the built-in layout of a
normal x86-64 build), bounded memory reads, one snapshot of every runtime's
fibers, and the threads that run them. No gdb commands here (coresched.py
defines them); loaded by coresched.py from its own directory.
"""

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
