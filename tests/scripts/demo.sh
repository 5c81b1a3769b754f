#!/usr/bin/env bash
# README command 1: build, then compile the bundled trained policies and run them in the Rust environments.
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
need_cargo
cargo build --release -p policyport-host --bin policyport
"$PP_BIN" demo --out-dir "$CARGO_TARGET_DIR/policyport-demo" "$@"
