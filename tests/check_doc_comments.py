#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Fails when a public declaration in the public headers has no doc comment.

Usage: check_doc_comments.py [--list] DIR_OR_FILE...
A directory means its *.hpp and *.hpp.in files; --list also prints every
declaration the parser found, to review what the heuristic sees.

A declaration is documented when the line directly above its first line is a
`///` comment (not `///<`, which documents what comes before it), or when a
trailing `///<` comment sits on one of its lines up to the `;` or `{` that ends
its head.

The parser is a heuristic, not a C++ front end. It strips comments and string
and character literals, then follows braces:

* `namespace X {` opens a scope. Ordinary namespaces need no comment; a
  `namespace detail` (or `X::detail`) block must carry one saying it is an
  implementation detail, and nothing inside it is checked.
* `class`/`struct`/`union ... {` is a declaration (checked like any other) and
  opens a scope whose members are checked while the access is public or
  protected (`private:` sections are skipped; a class starts private, a
  struct or union public). A nested class in a private section is skipped whole.
* `enum ... {` is a declaration and opens a scope where each enumerator is a
  declaration. A one-line enum (`enum class E { a, b };`) cannot carry a
  comment per enumerator; there an enumerator counts as documented when the
  enum's own `///` comment names it.
* Any other `{` (a function body, a brace initializer, `= {}`) is opaque: its
  contents are skipped. After its `}`, the declaration goes on when the next
  character is `;`, `,` or `{` (brace initializers, constructor initializer
  lists) or while a parenthesis is open, and ends otherwise (a function body).
* Everything else up to `;` in a checked scope is a declaration: functions,
  data members, aliases, constants, friends, `= default`/`= delete`d members,
  forward declarations. Only `static_assert` and `using namespace` are exempt.
* `#define` at namespace or file scope is a declaration; other preprocessor
  lines are skipped (an include guard's `#define` is recognised and exempt).

Limits: macros that expand to declarations, `/** */` doc blocks, raw string
literals and declarations split by preprocessor conditionals are not
understood; unbalanced braces are reported as a parse error rather than
guessed at.

Before checking, the script runs itself on a built-in sample with known gaps
and stops if it does not find exactly those, so a parser change that silently
stops looking fails loudly.
"""

from __future__ import annotations

import pathlib
import re
import sys
from dataclasses import dataclass, field

ACCESS_LABELS = ("public", "protected", "private")


def strip_comments_and_literals(text: str) -> str:
    """Returns `text` with comments and string/char literals blanked (newlines kept)."""
    out = []
    i, n = 0, len(text)
    while i < n:
        c = text[i]
        if text.startswith("//", i):
            j = text.find("\n", i)
            j = n if j < 0 else j
            out.append(" " * (j - i))
            i = j
        elif text.startswith("/*", i):
            j = text.find("*/", i + 2)
            j = n if j < 0 else j + 2
            out.append("".join(ch if ch == "\n" else " " for ch in text[i:j]))
            i = j
        elif c in "\"'":
            # A digit separator (1'000) is not a character literal.
            if c == "'" and i > 0 and text[i - 1].isalnum():
                out.append(" ")
                i += 1
                continue
            j = i + 1
            while j < n and text[j] != c and text[j] != "\n":
                j += 2 if text[j] == "\\" else 1
            j = min(j + 1, n)
            out.append(c + " " * (j - i - 2) + c if j - i >= 2 else " " * (j - i))
            i = j
        else:
            out.append(c)
            i += 1
    return "".join(out)


@dataclass
class Scope:
    kind: str  # "file", "namespace", "class", "enum", "opaque"
    checked: bool
    access: str = "public"
    head_line: int = 0  # class, enum: the line of its `{`
    head_doc: str = ""  # enum: the text of its `///` comment
    one_line: bool = False  # enum: `}` on the head line


@dataclass
class Statement:
    chars: list = field(default_factory=list)
    start: int = 0  # first line with code
    head_end: int = 0  # line of the `;` or `{` that ended the head
    parens: int = 0
    after_opaque: bool = False

    def text(self) -> str:
        return re.sub(r"\s+", " ", "".join(self.chars)).strip()


def strip_template_prefix(head: str) -> str:
    """`template <class T> class X` -> `class X` (balanced angle brackets)."""
    while True:
        m = re.match(r"\s*template\s*<", head)
        if not m:
            return head.strip()
        depth, i = 1, m.end()
        while i < len(head) and depth:
            depth += {"<": 1, ">": -1}.get(head[i], 0)
            i += 1
        head = head[i:]


class Checker:
    def __init__(self, path: str, text: str):
        self.path = path
        self.raw = text.split("\n")
        self.code = strip_comments_and_literals(text).split("\n")
        self.problems: list[str] = []
        self.declarations = 0
        self.seen: list[str] = []  # every declaration checked, for --list

    # ----------------------------------------------------------------- docs
    def doc_above(self, line: int) -> str | None:
        """The `///` block directly above 1-based `line`, or None."""
        block = []
        i = line - 2
        while i >= 0:
            s = self.raw[i].strip()
            if s.startswith("///") and not s.startswith("///<"):
                block.append(s[3:])
                i -= 1
            else:
                break
        return "\n".join(reversed(block)) if block else None

    def trailing_doc(self, first: int, last: int) -> bool:
        return any("///<" in self.raw[i - 1] for i in range(first, max(first, last) + 1))

    def require(self, stmt: Statement, what: str | None = None, scope: Scope | None = None) -> None:
        self.declarations += 1
        self.seen.append(f"{self.path}:{stmt.start}: {what or stmt.text()}")
        # A member on the line of its class's or enum's `{` would borrow the
        # comment of the class or enum: it needs its own line.
        if scope is not None and scope.kind in ("class", "enum") and stmt.start == scope.head_line:
            pass
        elif self.doc_above(stmt.start) is not None or self.trailing_doc(stmt.start, stmt.head_end or stmt.start):
            return
        self.problems.append(f"{self.path}:{stmt.start}: undocumented declaration: {what or stmt.text()}")

    # ---------------------------------------------------------------- parse
    def run(self) -> list[str]:
        scopes = [Scope("file", checked=True)]
        stmt = Statement()
        guard_candidate = None  # name from `#ifndef NAME` at the top of the file
        line_no = 0
        in_directive = False

        def top() -> Scope:
            return scopes[-1]

        def finish(end_line: int) -> None:
            nonlocal stmt
            stmt.head_end = stmt.head_end or end_line
            self.consider(stmt, top())
            stmt = Statement()

        for line_no, line in enumerate(self.code, start=1):
            stripped = line.strip()
            if in_directive or stripped.startswith("#"):
                if not in_directive:
                    m = re.match(r"#\s*(\w+)\s*(\w*)", stripped)
                    directive, name = (m.group(1), m.group(2)) if m else ("", "")
                    if directive == "ifndef" and guard_candidate is None:
                        guard_candidate = name
                    elif directive == "define":
                        is_guard = name == guard_candidate and stripped.split() == ["#define", name]
                        if not is_guard and top().kind in ("file", "namespace") and top().checked:
                            self.require(Statement(start=line_no, head_end=line_no), f"#define {name}")
                    if directive != "ifndef":
                        guard_candidate = guard_candidate or ""
                in_directive = stripped.endswith("\\")
                continue
            if stmt.chars and stmt.chars[-1] != " ":
                stmt.chars.append(" ")  # a line break separates tokens
            for col, c in enumerate(line):
                scope = top()
                if scope.kind == "opaque":
                    if c == "{":
                        scopes.append(Scope("opaque", checked=False))
                    elif c == "}":
                        scopes.pop()
                        if top().kind != "opaque":
                            stmt.after_opaque = True
                    continue
                if c.isspace():
                    if stmt.chars:
                        stmt.chars.append(" ")
                    continue
                if stmt.after_opaque:
                    stmt.after_opaque = False
                    if c == ";":
                        finish(line_no)
                        continue
                    if not (c in ",{" or stmt.parens > 0):
                        finish(stmt.head_end or line_no)  # a function body ended the declaration
                        scope = top()
                if not stmt.chars:
                    stmt.start = line_no
                if c == "(":
                    stmt.parens += 1
                elif c == ")":
                    stmt.parens -= 1
                if c == ":" and scope.kind == "class" and stmt.parens == 0:
                    label = stmt.text()
                    nxt = line[col + 1] if col + 1 < len(line) else ""
                    prev = stmt.chars[-1] if stmt.chars else ""
                    if label in ACCESS_LABELS and nxt != ":" and prev != ":":
                        scope.access = label
                        stmt = Statement()
                        continue
                if c == ";" and stmt.parens == 0 and scope.kind != "enum":
                    finish(line_no)
                    continue
                if c == "," and stmt.parens == 0 and scope.kind == "enum":
                    finish(line_no)
                    continue
                if c == "{":
                    self.open_brace(scopes, stmt, line_no, line, col)
                    if top().kind == "opaque":
                        if stmt.parens == 0 and not stmt.head_end:
                            stmt.head_end = line_no
                    else:
                        stmt = Statement()
                    continue
                if c == "}":
                    if stmt.chars:
                        finish(line_no)
                    if len(scopes) == 1:
                        raise ParseError(f"{self.path}:{line_no}: unbalanced '}}'")
                    scopes.pop()
                    continue
                stmt.chars.append(c)
        if len(scopes) != 1:
            raise ParseError(f"{self.path}: {len(scopes) - 1} unclosed '{{' at end of file")
        if stmt.text():
            self.consider(stmt, scopes[0])
        return self.problems

    def open_brace(self, scopes: list, stmt: Statement, line_no: int, line: str, col: int) -> None:
        parent = scopes[-1]
        visible = parent.checked and not (parent.kind == "class" and parent.access == "private")
        if parent.kind == "enum" or stmt.parens > 0 or stmt.after_opaque:
            if stmt.parens > 0:
                stmt.chars.append("{}")  # a default argument: keep `o = {}` readable in reports
            scopes.append(Scope("opaque", checked=False))
            return
        head = stmt.text()
        bare = strip_template_prefix(head)
        ns = re.match(r"(inline\s+)?namespace\b\s*([\w:]*)", bare)
        if ns:
            name = ns.group(2)
            detail = name == "detail" or name.endswith("::detail")
            if detail and visible:
                stmt.head_end = line_no
                self.require(stmt, f"namespace {name} (say that it is an implementation detail)")
            scopes.append(Scope("namespace", checked=visible and not detail))
            return
        if re.match(r"extern\s*\"\"", bare):
            scopes.append(Scope("namespace", checked=visible))
            return
        no_align = re.sub(r"alignas\s*\([^)]*\)", "", bare)
        if re.match(r"(class|struct|union)\b", no_align) and "(" not in no_align and "=" not in no_align:
            stmt.head_end = line_no
            if visible:
                self.require(stmt)
            kind = no_align.split()[0]
            scopes.append(Scope("class", checked=visible, access="private" if kind == "class" else "public",
                                head_line=line_no))
            return
        if re.match(r"enum\b", no_align) and "(" not in no_align and "=" not in no_align:
            stmt.head_end = line_no
            if visible:
                self.require(stmt)
            rest = line[col + 1:]
            scopes.append(Scope("enum", checked=visible, head_line=line_no,
                                head_doc=self.doc_above(stmt.start) or "", one_line="}" in rest))
            return
        if not head:
            scopes.append(Scope("opaque", checked=False))  # a stray block
            return
        scopes.append(Scope("opaque", checked=False))

    def consider(self, stmt: Statement, scope: Scope) -> None:
        text = stmt.text()
        if not text or not scope.checked or scope.kind == "opaque":
            return
        if scope.kind == "class" and scope.access == "private":
            return
        if re.match(r"(static_assert\b|using\s+namespace\b)", text):
            return
        if scope.kind == "enum":
            name = re.match(r"\w+", text)
            if (scope.one_line and stmt.start == scope.head_line and name
                    and re.search(r"\b%s\b" % re.escape(name.group(0)), scope.head_doc)):
                self.declarations += 1
                self.seen.append(f"{self.path}:{stmt.start}: enumerator {text} (named in the enum's comment)")
                return
            self.require(stmt, f"enumerator {text}", scope)
            return
        self.require(stmt, scope=scope)


class ParseError(Exception):
    pass


def check_file(path: pathlib.Path, listing: bool) -> tuple[list[str], int]:
    checker = Checker(str(path), path.read_text(encoding="utf-8"))
    problems = checker.run()
    if listing:
        print("\n".join(checker.seen))
    return problems, checker.declarations


SELF_TEST = '''\
#pragma once
/// Documented macro.
#define DOC_MACRO 1
#define BARE_MACRO 2
namespace ns {
/// Implementation details.
namespace detail { struct Hidden; void hidden(); }
namespace detail { int undocumented_detail_namespace; }
/// A documented class.
class Widget {
public:
  /// Documented constructor.
  Widget() : a_{1}, b_(2) {}
  Widget(const Widget&) = delete;
  int value() const { return a_; } ///< Trailing doc.
  int bare_function() const {
    if (a_) { return 1; }
    return 2;
  }
  std::atomic<bool> flag{false};
protected:
  void bare_protected();
private:
  void private_is_skipped();
  struct Inner { void also_skipped(); };
public:
  /// Documented enum.
  enum class Mode {
    a, ///< Documented.
    bare_enumerator,
  };
  /// Names `x` but not the other one.
  enum class Short { x, bare_short };
  static_assert(sizeof(int) == 4);
};
struct Bare {};
/// Documented template function.
template <class T> T twice(T t) { return t + t; }
int bare_variable = 0;
} // namespace ns
'''
SELF_TEST_EXPECTED = [
    "#define BARE_MACRO",
    "namespace detail (say that it is an implementation detail)",
    "Widget(const Widget&) = delete",
    "int bare_function() const",
    "std::atomic<bool> flag",
    "void bare_protected()",
    "enumerator bare_enumerator",
    "enumerator bare_short",
    "struct Bare",
    "int bare_variable = 0",
]


def self_test() -> None:
    problems = Checker("self-test", SELF_TEST).run()
    found = [p.split("undocumented declaration: ", 1)[1] for p in problems]
    if found != SELF_TEST_EXPECTED:
        sys.exit("check_doc_comments.py: self-test failed; the parser found\n  " + "\n  ".join(found) +
                 "\nexpected\n  " + "\n  ".join(SELF_TEST_EXPECTED))


def main(argv: list[str]) -> int:
    if not argv:
        print(__doc__, file=sys.stderr)
        return 2
    listing = "--list" in argv
    argv = [a for a in argv if a != "--list"]
    self_test()
    files: list[pathlib.Path] = []
    for arg in argv:
        p = pathlib.Path(arg)
        if p.is_dir():
            files += sorted(f for f in p.iterdir() if f.name.endswith((".hpp", ".hpp.in")))
        elif p.is_file():
            files.append(p)
        else:
            print(f"check_doc_comments.py: no such file or directory: {arg}", file=sys.stderr)
            return 2
    if not files:
        print("check_doc_comments.py: no headers found", file=sys.stderr)
        return 2
    problems: list[str] = []
    total = 0
    for f in files:
        try:
            found, n = check_file(f, listing)
        except ParseError as e:
            problems.append(f"{e}: parse error (the heuristic could not follow the braces)")
            continue
        problems += found
        total += n
    for p in problems:
        print(p)
    if problems:
        print(f"{len(problems)} problem(s) in {len(files)} header(s)", file=sys.stderr)
        return 1
    if total == 0:
        print("check_doc_comments.py: found no declarations at all; the parser is broken", file=sys.stderr)
        return 1
    print(f"{total} public declarations in {len(files)} headers, all documented")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
