#!/usr/bin/env python3
"""The hostile-input table with its browser column: the Rust suite's table (bad_input.rs writes
<target>/hostile-inputs.md: Rust, the plugin, the C ABI native and sandboxed, the CLI) joined with what the browser
suite saw (tests/browser/run.mjs writes browser-results.json: each hostile artifact loaded on the CPU-only and the
WebGPU bundle, and the bad-observation calls). Nothing is typed in: a row the browser did not run says so.

    python3 tests/scripts/hostile_table.py <hostile-inputs.md> <browser-results.json>

Prints the joined table; exits 1 when a browser cell is not a typed error (a silent load, a crash) or a row the
browser suite should have run is missing from its results."""

import json
import re
import sys


def slug(name):
    return "".join(c if c.isascii() and c.isalnum() else "_" for c in name)


def error_name(text):
    # "PolicyportArtifactError: invalid artifact: ..." -> the typed name and the first words of the message.
    name, _, msg = text.partition(": ")
    return f"{name} ({msg[:48]}{'…' if len(msg) > 48 else ''})" if msg else name


def main(table_path, results_path):
    lines = [l for l in open(table_path, encoding="utf-8").read().splitlines() if l.startswith("| ")]
    results = json.load(open(results_path, encoding="utf-8"))
    hostile = {}
    for r in results.get("hostile", []):
        hostile.setdefault(r["file"], {})[r["bundle"]] = r["got"]
    checks = {c["name"]: c for c in results.get("checks", [])}
    bad_obs = checks.get("bad observations -> PolicyportObservationError")
    obs_len, nan = (bad_obs["detail"].split(" | ") + ["", ""])[:2] if bad_obs else ("", "")

    broken = []
    out = []
    header, rows = lines[0], lines[1:]
    out.append(header + " browser (CPU-only / WebGPU bundle) |")
    out.append("|" + "---|" * (header.count("|") - 1 + 1))
    for row in rows:
        if set(row.replace("|", "").strip()) <= {"-"}:
            continue
        name = row.split("|")[1].strip()
        file = f"{slug(name)}.policy"
        if name.startswith("memory bomb"):
            # The 64 MB bomb is too big to ship to the page; the browser loads one sized for wasm32's 1 GiB budget.
            file = "memory_bomb_for_wasm32.policy"
        if file in hostile:
            cells = [hostile[file].get(b, "not run") for b in ("cpu", "webgpu")]
            for c in cells:
                if not c.startswith("PolicyportArtifactError"):
                    broken.append(f"{name}: {c}")
            note = " (the wasm32-sized bomb)" if file.startswith("memory_bomb") else ""
            cell = " / ".join(error_name(c) for c in cells) + note
        elif name == "NaN observation" and nan:
            cell = error_name(nan) + " (CPU-only bundle)"
            if not nan.startswith("PolicyportObservationError"):
                broken.append(f"{name}: {nan}")
        elif re.match(r"\d+ numbers for a \d+-number observation", name) and obs_len:
            cell = error_name(obs_len) + " (the browser suite's case: 5 numbers for 4, CPU-only bundle)"
            if not obs_len.startswith("PolicyportObservationError"):
                broken.append(f"{name}: {obs_len}")
        elif name.startswith(("batch 0", "env ids past")):
            cell = "not run in the browser (the JS API infers the batch; env ids are u32 arrays)"
        else:
            cell = "MISSING"
            broken.append(f"{name}: not in the browser results")
        out.append(f"{row} {cell.replace('|', '/')} |")
    print("\n".join(out))
    if broken:
        print("hostile_table: browser cells that are not typed errors:\n  " + "\n  ".join(broken), file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    if len(sys.argv) != 3:
        print(__doc__, file=sys.stderr)
        sys.exit(2)
    sys.exit(main(sys.argv[1], sys.argv[2]))
