#!/usr/bin/env bash
# Build what the GPU check (tests/scripts/gpu-check.sh) runs on a lent NVIDIA machine, which has torch 2.11.0 but
# no Rust toolchain: the CLI and the conformance test binary built here with the `tch` feature against PyPI's
# torch 2.11.0 (same libtorch ABI), stripped, plus the benchmark artifact. Output: gpu-bundle/ (git-ignored),
# carried to the device with `run(carry=["gpu-bundle"], command="bash tests/scripts/gpu-check.sh")`.
# Benchmarks build the `release` profile (what users get), not the test command's `suite` (Cargo.toml).
PP_PROFILE="${PP_PROFILE:-release}"
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
need_cargo
ensure_venv
torch_env
cargo build --profile "$PP_PROFILE" --workspace --features "$PP_FEATURES"
test_bin=$(cargo test --profile "$PP_PROFILE" --workspace --features "$PP_FEATURES" --test conformance --no-run --message-format=json 2>/dev/null \
  | "$PP_VENV/bin/python" -c 'import json,sys
for l in sys.stdin:
    m = json.loads(l)
    if m.get("reason") == "compiler-artifact" and m["target"]["name"] == "conformance" and m.get("executable"):
        print(m["executable"])')
rm -rf gpu-bundle && mkdir -p gpu-bundle
strip -o gpu-bundle/policyport "$PP_BIN"
strip -o gpu-bundle/conformance "$test_bin"
"$PP_BIN" compile tests/fixtures/mlp64/policy.onnx --spec tests/fixtures/mlp64/import.json \
  --golden tests/fixtures/mlp64/io.json -o gpu-bundle/mlp64.policy
# The device tool carries at most 64 MiB: ship the (stripped, ~66 MB each) binaries gzipped; gpu-check.sh unpacks.
gzip -9 gpu-bundle/policyport gpu-bundle/conformance
ls -la gpu-bundle; du -sh gpu-bundle
