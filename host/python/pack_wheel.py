"""Pack the policyport wheel from a native module cargo already built (no second compile).

Why not `maturin build` here: maturin compiles the crate on its own (`cargo rustc -p policyport-python`), and
cargo unifies features over the packages it was asked to build, so that build resolves burn / wgpu / tch with
other features than the workspace build of tests/scripts/test.sh and compiles the whole graph a second time
(measured: it started over at burn-cubecl). The test command builds each crate graph once, so it packs the
cdylib the workspace build made. A wheel is a zip with a dist-info directory (PEP 427); this writes exactly what
maturin would for an abi3 module: `policyport/_native.abi3.so`, the Python sources, METADATA, WHEEL, RECORD.
`pip install host/python` (pyproject.toml, maturin) stays the route for users.

    python pack_wheel.py --lib path/to/lib_native.so --out dir/   → prints the wheel's path
"""

from __future__ import annotations

import argparse
import base64
import hashlib
import os
import pathlib
import platform
import shutil
import subprocess
import sys
import tempfile
import zipfile

try:
    import tomllib
except ImportError:  # Python < 3.11: pyproject.toml through pip's vendored parser
    from pip._vendor import tomli as tomllib

HERE = pathlib.Path(__file__).resolve().parent


def _hash(data: bytes) -> str:
    return "sha256=" + base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--lib", required=True, help="the cdylib cargo built (lib_native.so)")
    ap.add_argument("--out", required=True, help="directory for the wheel")
    ap.add_argument("--keep-debug", action="store_true", help="do not strip debug info from the module")
    args = ap.parse_args()

    project = tomllib.loads((HERE / "pyproject.toml").read_text())["project"]
    name, version = project["name"], project["version"]
    machine = platform.machine().lower()
    if sys.platform != "linux":
        print("pack_wheel.py packs Linux wheels only (use maturin elsewhere)", file=sys.stderr)
        return 2
    tag = f"cp39-abi3-linux_{machine}"
    dist_info = f"{name}-{version}.dist-info"

    with tempfile.TemporaryDirectory() as tmp:
        module = pathlib.Path(tmp) / "_native.abi3.so"
        shutil.copyfile(args.lib, module)
        if not args.keep_debug:
            # The release profile keeps line tables (profiling); the installed module does not need them.
            subprocess.run(["strip", "--strip-debug", str(module)], check=True)
        files: list[tuple[str, bytes]] = []
        for src in sorted((HERE / "python" / "policyport").rglob("*")):
            if src.is_file() and "__pycache__" not in src.parts:
                files.append((f"policyport/{src.relative_to(HERE / 'python' / 'policyport').as_posix()}", src.read_bytes()))
        files.append(("policyport/_native.abi3.so", module.read_bytes()))
        requires = "".join(f"Requires-Dist: {r}\n" for r in project.get("dependencies", []))
        for extra, reqs in project.get("optional-dependencies", {}).items():
            requires += f"Provides-Extra: {extra}\n"
            requires += "".join(f"Requires-Dist: {r} ; extra == \"{extra}\"\n" for r in reqs)
        metadata = (
            f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\nSummary: {project['description']}\n"
            f"Requires-Python: {project['requires-python']}\n{requires}"
        )
        wheel = f"Wheel-Version: 1.0\nGenerator: policyport pack_wheel.py\nRoot-Is-Purelib: false\nTag: {tag}\n"
        files.append((f"{dist_info}/METADATA", metadata.encode()))
        files.append((f"{dist_info}/WHEEL", wheel.encode()))
        record = "".join(f"{p},{_hash(d)},{len(d)}\n" for p, d in files) + f"{dist_info}/RECORD,,\n"
        files.append((f"{dist_info}/RECORD", record.encode()))

        os.makedirs(args.out, exist_ok=True)
        path = pathlib.Path(args.out) / f"{name}-{version}-{tag}.whl"
        with zipfile.ZipFile(path, "w", compression=zipfile.ZIP_DEFLATED, compresslevel=1) as z:
            for p, d in files:
                info = zipfile.ZipInfo(p, date_time=(2026, 1, 1, 0, 0, 0))
                info.external_attr = (0o755 if p.endswith(".so") else 0o644) << 16
                info.compress_type = zipfile.ZIP_DEFLATED
                z.writestr(info, d, compresslevel=1)
    print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
