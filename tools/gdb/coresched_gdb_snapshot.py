# SPDX-License-Identifier: Apache-2.0
"""What coresched.py reads from the process or core file: the layouts of the
runtime's records (from gdb's type information, or the table the library
records at build time), bounded memory reads, one snapshot of every runtime's
fibers, and the threads that run them. No gdb commands here (coresched.py
defines them); loaded by coresched.py from its own directory.
"""

import signal
import struct
import time

import gdb

# ---------------------------------------------------------------------------- layout

# The fields read, by the names the library's table gives them (runtime/sched/debug_registry.cpp):
# the record's prefix, then the member's path in it.
_RECORDS = {"rt": "coresched_debug_runtime", "sh": "coresched::detail::StackHeader",
            "wi": "coresched::detail::WaitInfo", "f": "coresched::detail::Fiber"}
_FIELDS = ["rt.next", "rt.scheduler", "rt.stacks", "rt.dump_signal", "sh.next", "sh.running", "sh.wait",
           "wi.kind", "wi.what", "wi.object", "wi.arg", "wi.since_ns", "wi.frame",
           "f.id", "f.cookie", "f.pinned", "f.last_worker", "f.context", "f.stack.base", "f.stack.size",
           "f.context_saved", "f.state", "f.inline_child"]

# The table `coresched_debug_layout` (debug_registry.hpp), format 1: magic, format, field count, the
# names of FiberState and of WaitKind (NUL-separated, 64 bytes each), kNoCookie, kNotPinned, then 32
# fields of {name[24], offset u32, size u16, is_signed u16}. The library checks these offsets when it
# is built (static_assert), so a change there comes with a new format number.
_TABLE_SYMBOL = "coresched_debug_layout"
_TABLE_MAGIC = b"coresched-layout"
_TABLE_FORMAT = 1
_TABLE_BYTES = 1192
_TABLE_FIELDS_AT = 168
_TABLE_FIELD_BYTES = 32
_TABLE_MAX_FIELDS = 32

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

# kNoCookie and kNotPinned where the library has no table to give them.
_NO_COOKIE = (1 << 64) - 1
_NOT_PINNED = -1


def _symbol_address(name):
    """The address of a data symbol, with or without debug information; None if there is none."""
    try:
        return int(gdb.parse_and_eval("(unsigned long) &%s" % name))
    except gdb.error:
        pass
    sym = gdb.lookup_minimal_symbol(name) if hasattr(gdb, "lookup_minimal_symbol") else None
    if sym is not None:
        return int(sym.value().address)
    return None


def _names(raw):
    """The NUL-separated names of a table's enum field, up to the empty one."""
    out = []
    for name in raw.split(b"\0"):
        if not name:
            break
        out.append(name.decode("ascii", "replace"))
    return out


class _Table:
    """The layout table the library recorded at build time, read from the process or core file."""

    def __init__(self, mem):
        self.addr = _symbol_address(_TABLE_SYMBOL)
        if self.addr is None:
            raise LookupError("no symbol `%s` (a coresched older than this extension, or a stripped "
                              "symbol table)" % _TABLE_SYMBOL)
        try:
            raw = mem.read(self.addr, _TABLE_BYTES)
        except gdb.MemoryError as e:
            raise LookupError("`%s` at 0x%x is unreadable (%s)" % (_TABLE_SYMBOL, self.addr, _first_line(e)))
        if raw[:16] != _TABLE_MAGIC:
            raise LookupError("`%s` at 0x%x is not a coresched layout table" % (_TABLE_SYMBOL, self.addr))
        self.format, count = struct.unpack_from("<II", raw, 16)
        if self.format != _TABLE_FORMAT:
            raise LookupError("`%s` is in format %d; this extension reads format %d (use the extension of the "
                              "same coresched version)" % (_TABLE_SYMBOL, self.format, _TABLE_FORMAT))
        self.states = _names(raw[24:88])
        self.kinds = _names(raw[88:152])
        self.no_cookie, self.not_pinned = struct.unpack_from("<Qq", raw, 152)
        self.fields = {}
        for i in range(min(count, _TABLE_MAX_FIELDS)):
            at = _TABLE_FIELDS_AT + i * _TABLE_FIELD_BYTES
            name = raw[at:at + 24].split(b"\0", 1)[0].decode("ascii", "replace")
            offset, size, signed = struct.unpack_from("<IHH", raw, at + 24)
            self.fields[name] = (offset, size, bool(signed))
        missing = [k for k in _FIELDS if k not in self.fields]
        if missing:
            raise LookupError("`%s` lacks %s (a coresched of another version than this extension)"
                              % (_TABLE_SYMBOL, ", ".join(missing)))


class _Layout:
    """Where each field read lies (offset, size, signedness) and the enums' names: from gdb's type
    information where there is some, else from the table the library recorded at build time."""

    def __init__(self, mem):
        self.note = ""
        self.no_cookie, self.not_pinned = _NO_COOKIE, _NOT_PINNED
        table = table_error = None
        try:
            table = _Table(mem)
            self.no_cookie, self.not_pinned = table.no_cookie, table.not_pinned
        except LookupError as e:
            table_error = str(e)
        try:
            self._read_types()
            self.source = "debug information"
        except (gdb.error, RuntimeError, StopIteration, LookupError) as e:
            if table is None:
                raise gdb.GdbError("coresched: no layout for coresched's records: no debug information for its "
                                   "types (%s), and %s" % (_first_line(e), table_error))
            self.fields, self.states, self.kinds = dict(table.fields), table.states, table.kinds
            self.source = "the table `%s` (format %d)" % (_TABLE_SYMBOL, table.format)
            self.note = ("no debug information for coresched's types (%s): using the layout this build of the "
                         "library recorded, %s" % (_first_line(e), self.source))
            return
        if table is not None:
            differs = [k for k in _FIELDS if table.fields[k] != self.fields[k]]
            if table.states != self.states or table.kinds != self.kinds:
                differs.append("enum names")
            if differs:
                self.note = ("the table `%s` disagrees with the debug information on %s; using the debug "
                             "information" % (_TABLE_SYMBOL, ", ".join(differs)))

    def offset(self, key):
        return self.fields[key][0]

    def read(self, mem, base, key):
        """The field `key` of the record at `base`, as an integer."""
        offset, size, signed = self.fields[key]
        return int.from_bytes(mem.read(base + offset, size), "little", signed=signed)

    @staticmethod
    def _field(t, path):
        """(offset, size, signed) of a member path in type `t`."""
        off = 0
        for name in path.split("."):
            t = t.strip_typedefs()
            field = next(f for f in t.fields() if f.name == name)
            off += field.bitpos // 8
            t = field.type
        t = t.strip_typedefs()
        signed = False
        if t.code == gdb.TYPE_CODE_INT:
            signed = t.is_signed if hasattr(t, "is_signed") else \
                t.name in ("int", "long", "long long", "short", "signed char")
        return off, t.sizeof, signed

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
        types = {prefix: gdb.lookup_type(name) for prefix, name in _RECORDS.items()}
        fields = {}
        for key in _FIELDS:
            prefix, path = key.split(".", 1)
            fields[key] = self._field(types[prefix], path)
        self.fields = fields
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

    def u64(self, addr):
        return struct.unpack("<Q", self.read(addr, 8))[0]

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
    addr = _symbol_address("coresched_debug_runtimes")
    if addr is None:
        raise gdb.GdbError("coresched: no symbol `coresched_debug_runtimes` in this program: it does not link "
                           "coresched, or its symbol table was stripped (strip removes .symtab; keep it, or load "
                           "the separate debug file)")
    return addr


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


def _cookie_label(c, name):
    """How the runtime prints a cookie (Cookie::label()): "7 (premium)", "7", "0 (untagged)"; "none"."""
    if c is None:
        return "none"
    if c == 0:
        return "0 (untagged)"
    return "%d (%s)" % (c, name) if name else str(c)


# The library's accessor for a cookie's name (debug_registry.hpp), called by its C name so that no debug
# information is needed.
_NAME_CALL = "((const char *(*)(unsigned long)) coresched_cookie_name)(%dUL)"


class _CookieNames:
    """Cookies' names, asked of a live process through coresched_cookie_name, once per cookie and snapshot.

    The call runs on the selected thread with the others held (scheduler-locking on), so no fiber moves
    while gdb lists them; a process stopped while one of its threads was creating a cookie would block it
    (interrupt gdb: the call is unwound). A core file has no process to ask: it shows numbers."""

    def __init__(self, mem, live):
        self.mem = mem
        self.names = {}
        self.note = "" if live else "a core file shows cookies by number (names are asked of a live process)"

    def label(self, c):
        if c is None or c == 0 or self.note:
            return _cookie_label(c, None)
        if c not in self.names:
            self.names[c] = self._ask(c)
        return _cookie_label(c, self.names[c])

    def _ask(self, c):
        saved = {}
        try:
            for param, value in (("scheduler-locking", "on"), ("unwindonsignal", "on")):
                saved[param] = gdb.parameter(param)
                gdb.execute("set %s %s" % (param, value), to_string=True)
            ptr = int(gdb.parse_and_eval(_NAME_CALL % c)) & ((1 << 64) - 1)
            return self.mem.cstring(ptr) if ptr else None
        except (gdb.error, gdb.MemoryError, RuntimeError) as e:
            self.note = "cookies by number: coresched_cookie_name could not be called (%s)" % _first_line(e)
            return None
        finally:
            for param, value in saved.items():
                if isinstance(value, bool):
                    value = "on" if value else "off"
                try:
                    gdb.execute("set %s %s" % (param, value), to_string=True)
                except gdb.error:
                    pass


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
        self.mem = _Memory()
        self.layout = _Layout(self.mem)
        self.live = _is_live()
        self.now = _now_ns() if self.live else None
        self.cookies = _CookieNames(self.mem, self.live)
        self.runtimes = []  # (index, entry address, scheduler, dump_signal, stacks, pooled, notes)
        self.fibers = []
        self._read()

    def _read(self):
        L, m = self.layout, self.mem
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
                nxt = L.read(m, entry, "rt.next")
                sched = L.read(m, entry, "rt.scheduler")
                sentinel = L.read(m, entry, "rt.stacks")
                sig = L.read(m, entry, "rt.dump_signal")
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
        L, m = self.layout, self.mem
        stacks = pooled = 0
        try:
            h = L.read(m, sentinel, "sh.next")
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
                nxt = L.read(m, h, "sh.next")
                owner = L.read(m, h, "sh.running")
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

    def _cookie(self, value):
        return None if value == self.layout.no_cookie else value

    def _read_fiber(self, index, header, owner):
        L, m = self.layout, self.mem
        f = _Fiber()
        f.runtime_index = index
        f.header = header
        f.addr = owner
        try:
            # The innermost fiber on the stack is the one that runs or waits; those below join it inline.
            chain = [owner]
            while len(chain) < _MAX_INLINE_CHAIN:
                child = L.read(m, chain[-1], "f.inline_child")
                if not child or child in chain:
                    break
                chain.append(child)
            for addr in chain[:-1]:
                f.below.append((addr, L.read(m, addr, "f.id"), self._cookie(L.read(m, addr, "f.cookie"))))
            f.addr = a = chain[-1]
            f.id = L.read(m, a, "f.id")
            f.cookie = self._cookie(L.read(m, a, "f.cookie"))
            pinned = L.read(m, a, "f.pinned")
            f.pinned = None if pinned == L.not_pinned else pinned
            f.last_worker = L.read(m, a, "f.last_worker")
            f.context = L.read(m, a, "f.context")
            f.context_saved = L.read(m, a, "f.context_saved") != 0
            st = L.read(m, a, "f.state")
            f.state = L.states[st] if 0 <= st < len(L.states) else "?%d" % st
            f.stack_base = L.read(m, a, "f.stack.base")
            f.stack_size = L.read(m, a, "f.stack.size")
            w = header + L.offset("sh.wait")
            kind = L.read(m, w, "wi.kind")
            f.wait_kind = L.kinds[kind] if 0 <= kind < len(L.kinds) else "?%d" % kind
            f.what = m.cstring(L.read(m, w, "wi.what"))
            f.object = L.read(m, w, "wi.object")
            f.arg = L.read(m, w, "wi.arg")
            f.since_ns = L.read(m, w, "wi.since_ns")
            f.frame = L.read(m, w, "wi.frame")
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
