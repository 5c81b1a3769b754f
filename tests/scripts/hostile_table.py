#!/usr/bin/env python3
"""The hostile-input table with its browser column: the Rust suite's table (bad_input.rs writes
<target>/hostile-inputs.md: Rust, the plugin, the C ABI native and sandboxed, the CLI) joined with what the browser
suite saw (tests/browser/run.mjs writes browser-results.json: each hostile artifact loaded on the CPU-only and the
WebGPU bundle, and the bad-observation calls) and with what the Python wheel saw (tests/python/test_api.py writes
python-hostile.json: each artifact at its native size through policyport.Policy.load, the bad calls through act()).
Nothing is typed in: a row the browser did not run says so.

    python3 tests/scripts/hostile_table.py <hostile-inputs.md> <browser-results.json> [<python-hostile.json>
        [<hostile-trainer-files.md>]]

The trainer-file table (tests/conformance/trainer_files.rs: the import crate and the CLI) follows the first, with
its Python column (policyport.compile on the same files).

Prints the joined table; exits 1 when a browser or Python cell is not a typed error (a silent load, a crash) or a
row either suite should have run is missing from its results."""

import json
import re
import sys


def slug(name):
    return "".join(c if c.isascii() and c.isalnum() else "_" for c in name)


def error_name(text):
    # "PolicyportArtifactError: invalid artifact: ..." -> the typed name and the first words of the message.
    name, _, msg = text.partition(": ")
    return f"{name} ({msg[:48]}{'…' if len(msg) > 48 else ''})" if msg else name


def python_cell(name, got, broken):
    """The Python column's cell of a row from what the wheel answered (None: the row is not in its results)."""
    if got is None:
        broken.append(f"{name}: not in the Python results")
        return "MISSING"
    if got == "accepted" or got.startswith("untyped"):
        broken.append(f"{name}: Python {got}")
    return error_name(got)


def trainer_table(path, python, broken):
    """The trainer-file rows with the Python column (by each row's file, `<slug>.model`)."""
    lines = [l for l in open(path, encoding="utf-8").read().splitlines() if l.startswith("| ")]
    out = [lines[0] + " Python (`policyport.compile`) |", "|" + "---|" * (lines[0].count("|") - 1 + 1)]
    for row in lines[1:]:
        if set(row.replace("|", "").strip()) <= {"-"}:
            continue
        name = row.split("|")[1].strip()
        cell = python_cell(name, python.get(f"{slug(name)}.model"), broken)
        out.append(f"{row} {cell.replace('|', '/')} |")
    return out


def main(table_path, results_path, python_path=None, trainer_path=None):
    lines = [l for l in open(table_path, encoding="utf-8").read().splitlines() if l.startswith("| ")]
    results = json.load(open(results_path, encoding="utf-8"))
    hostile = {}
    for r in results.get("hostile", []):
        hostile.setdefault(r["file"], {})[r["bundle"]] = r["got"]
    checks = {c["name"]: c for c in results.get("checks", [])}
    bad_obs = checks.get("bad observations -> PolicyportObservationError")
    obs_len, nan = (bad_obs["detail"].split(" | ") + ["", ""])[:2] if bad_obs else ("", "")

    python = json.load(open(python_path, encoding="utf-8")) if python_path else None
    broken = []
    out = []
    header, rows = lines[0], lines[1:]
    extra = " browser (CPU-only / WebGPU bundle) |" + (" Python (wheel, cpu) |" if python is not None else "")
    out.append(header + extra)
    out.append("|" + "---|" * (header.count("|") - 1 + (2 if python is not None else 1)))
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
        line = f"{row} {cell.replace('|', '/')} |"
        if python is not None:
            got = python.get(f"{slug(name)}.policy", python.get(name))
            line += f" {python_cell(name, got, broken).replace('|', '/')} |"
        out.append(line)
    if trainer_path:
        out.append("")
        out.extend(trainer_table(trainer_path, python or {}, broken))
    print("\n".join(out))
    if broken:
        print("hostile_table: cells that are not typed errors:\n  " + "\n  ".join(broken), file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    if len(sys.argv) not in (3, 4, 5):
        print(__doc__, file=sys.stderr)
        sys.exit(2)
    sys.exit(main(*sys.argv[1:]))
