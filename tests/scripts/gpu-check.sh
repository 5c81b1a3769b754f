#!/usr/bin/env bash
# The GPU check for the libtorch host (one call on a lent NVIDIA machine; well under 10 min; table last).
# Needs gpu-bundle/ from tests/scripts/gpu-bundle.sh and a Python with torch 2.11.0 (+cu130), onnx, numpy.
#  1. versions: driver, torch, glibc; the bundle's binaries load against this machine's libtorch;
#  2. the torch conformance tests on CUDA (f32, f16, bf16; eager and CUDA graphs) with POLICYPORT_REQUIRE_CUDA=1;
#  3. act() latency at batch 1, 64, 1024, 65536: torch eager (Python), our tch eager, our CUDA graphs (f32, bf16,
#     f16); speed-ups as ratios against torch eager.
set -uo pipefail
cd "$(dirname "$0")/../.."
PY=${PYTHON:-python3}
OUT=${OUT:-/tmp/gpu-check}
mkdir -p "$OUT"
SITE=$($PY -c 'import torch, os; print(os.path.dirname(os.path.dirname(torch.__file__)))')
# libtorch, and the CUDA runtime wheels (the CUDA-graph shim links libcudart directly).
export LD_LIBRARY_PATH="$SITE/torch/lib:$(ls -d "$SITE"/nvidia/cu*/lib 2>/dev/null | tr '\n' ':')${LD_LIBRARY_PATH:-}"
for f in policyport conformance; do
  [ -f "gpu-bundle/$f.gz" ] && gunzip -c "gpu-bundle/$f.gz" > "$OUT/$f" && chmod +x "$OUT/$f"
done
BIN="$OUT"
echo "== versions"
nvidia-smi -L || true
$PY -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda, "available", torch.cuda.is_available())'
ldd --version | head -1
ldd $BIN/policyport | grep -E "torch|c10|not found" || true

echo "== conformance (torch tests) on CUDA"
POLICYPORT_FIXTURES="$PWD/tests/fixtures" POLICYPORT_REQUIRE_CUDA=1 POLICYPORT_REQUIRE_TCH=1 \
  timeout 240 $BIN/conformance torch:: --include-ignored --test-threads 1 --nocapture 2>&1 | tee "$OUT/conformance.txt" | tail -n 60
conf_rc=${PIPESTATUS[0]}

echo "== wgpu backend on this machine's Vulkan adapter (informative: needs the NVIDIA Vulkan ICD)"
POLICYPORT_FIXTURES="$PWD/tests/fixtures" timeout 120 $BIN/conformance gpu:: parity::every --test-threads 1 --nocapture 2>&1 \
  | grep -E "wgpu|dispatches|auto|test result|panicked" | tail -n 30 || true

echo "== latency"
B=1,64,1024,65536
: > "$OUT/bench.jsonl"
timeout 60 $PY tests/bench/torch_eager.py --device cuda --batches $B --seconds 0.5 >> "$OUT/bench.jsonl" || echo "torch eager failed"
timeout 60 $PY tests/bench/torch_eager.py --device cuda --batches $B --seconds 0.5 --precision bf16 >> "$OUT/bench.jsonl" || echo "torch eager bf16 failed"
for cfg in "eager f32" "graphs f32" "graphs bf16" "graphs f16"; do
  set -- $cfg
  timeout 90 $BIN/policyport bench-torch gpu-bundle/mlp64.policy --device cuda --launch "$1" --precision "$2" \
    --batches $B --seconds 0.5 >> "$OUT/bench.jsonl" || echo "bench $cfg failed"
done
# The wgpu backend on whatever Vulkan adapter this machine has (the NVIDIA ICD when installed).
timeout 90 $BIN/policyport bench gpu-bundle/mlp64.policy --backend wgpu --batches $B --seconds 0.5 \
  >> "$OUT/bench.jsonl" || echo "wgpu bench failed (no Vulkan adapter?)"
timeout 60 $BIN/policyport bench gpu-bundle/mlp64.policy --backend cpu --batches 1,64,1024 --seconds 0.5 \
  >> "$OUT/bench.jsonl" || echo "cpu bench failed"
timeout 60 $BIN/policyport bench-torch gpu-bundle/mlp64.policy --device cpu --batches 1,64,1024 --seconds 0.5 \
  >> "$OUT/bench.jsonl" || echo "bench cpu failed"
echo "conformance exit code: $conf_rc"
$PY - "$OUT/bench.jsonl" <<'PYEOF'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.startswith("{")]
by = {}
for r in rows:
    dev = str(r.get("device", "")).lower()
    name = r["runtime"] + (" (cpu)" if dev.startswith("cpu") else "")
    by.setdefault(name, {})[r["batch"]] = r["us_per_act"]
batches = sorted({r["batch"] for r in rows})
base = by.get("torch-eager-f32", {})
print("\n| runtime | " + " | ".join(f"batch {b} µs" for b in batches) + " | " + " | ".join(f"vs torch eager @{b}" for b in batches) + " |")
print("|---" * (1 + 2 * len(batches)) + "|")
for name, d in by.items():
    lat = " | ".join(f"{d[b]:.1f}" if b in d else "-" for b in batches)
    rat = " | ".join(f"{base[b] / d[b]:.2f}x" if b in d and b in base else "-" for b in batches)
    print(f"| {name} | {lat} | {rat} |")
PYEOF
