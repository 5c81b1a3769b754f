#!/usr/bin/env python3
"""Every `unsafe` in the library code says why it is sound (issue 37): each `unsafe { .. }` block and `unsafe impl`
has a `// SAFETY:` comment on its line or just above its statement, and each `unsafe fn` a `# Safety` section in its
doc comment (what the caller must uphold). The workspace's lints ask the same of clippy
(`clippy::undocumented_unsafe_blocks`, `clippy::missing_safety_doc`; run `cargo clippy` for the exact check); this
is the fast check test.sh runs, with no compile (a clippy pass over the full crate graph would cost CI's cold run
minutes).

    python3 tests/scripts/unsafe_audit.py [ROOT]

Scans guest/, host/ and shaders/ sources, leaving out tests (a `#[cfg(test)]` module to the end of its file, and
tests/, fuzz/, benches/ and examples/ folders). Prints each finding as path:line and exits 1 when there is one;
prints the counts it checked otherwise."""

import pathlib
import re
import sys

SKIP_DIRS = {"tests", "fuzz", "benches", "examples", "target", "node_modules", "pkg"}
BLOCK = re.compile(r"\bunsafe\s*\{|\bunsafe\s+impl\b")
UNSAFE_FN = re.compile(r"^\s*(pub(\([^)]*\))?\s+)?(const\s+)?unsafe\s+(extern\s+\"[^\"]*\"\s+)?fn\b")
# How far above an unsafe block its SAFETY comment may sit: the statement holding the block may start a few lines
# up (a `let` over several lines, a closure argument).
LOOKBACK = 6


def code_part(line):
    """The line without a trailing // comment (good enough: no `//` inside the strings next to unsafe here)."""
    return line.split("//", 1)[0]


def in_trait_impl(lines, i):
    """Whether line i's item sits in an `impl Trait for Type` block: its `# Safety` is the trait's (as clippy
    reads it)."""
    indent = len(lines[i]) - len(lines[i].lstrip())
    for j in range(i - 1, -1, -1):
        t = lines[j].strip()
        if not t or t.startswith(("//", "#[")):
            continue
        k = len(lines[j]) - len(lines[j].lstrip())
        if k < indent:
            return bool(re.match(r"^(unsafe\s+)?impl\b.*\bfor\b", t))
    return False


def audit(root):
    findings, blocks, fns = [], 0, 0
    for path in sorted(root.glob("**/*.rs")):
        rel = path.relative_to(root)
        if rel.parts[0] not in ("guest", "host", "shaders") or SKIP_DIRS & set(rel.parts[:-1]):
            continue
        lines = path.read_text(encoding="utf-8").splitlines()
        for i, line in enumerate(lines):
            if re.match(r"^\s*#\[cfg\(test\)\]", line) and i + 1 < len(lines) and re.match(r"^\s*mod\s+\w+", lines[i + 1]):
                break
            code = code_part(line)
            if BLOCK.search(code):
                blocks += 1
                window = lines[max(0, i - LOOKBACK): i + 1]
                if not any("SAFETY:" in w for w in window):
                    findings.append(f"{rel}:{i + 1}: unsafe block without a `// SAFETY:` comment")
            if UNSAFE_FN.search(code) and not code.rstrip().endswith(";") and not in_trait_impl(lines, i):
                fns += 1
                j = i - 1
                doc = []
                while j >= 0 and (lines[j].strip().startswith(("///", "#[", "#![")) or lines[j].strip() == ""):
                    if lines[j].strip().startswith("///"):
                        doc.append(lines[j])
                    if lines[j].strip() == "" and doc:
                        break
                    j -= 1
                if not any("# Safety" in d for d in doc):
                    findings.append(f"{rel}:{i + 1}: unsafe fn without a `# Safety` section in its doc comment")
    return findings, blocks, fns


def main():
    root = pathlib.Path(sys.argv[1] if len(sys.argv) > 1 else pathlib.Path(__file__).resolve().parents[2])
    findings, blocks, fns = audit(root)
    for f in findings:
        print(f)
    if findings:
        print(f"unsafe_audit: {len(findings)} undocumented of {blocks} unsafe blocks / impls and {fns} unsafe fns",
              file=sys.stderr)
        return 1
    print(f"unsafe_audit: {blocks} unsafe blocks / impls and {fns} unsafe fns, each with its reason")
    return 0


if __name__ == "__main__":
    sys.exit(main())
