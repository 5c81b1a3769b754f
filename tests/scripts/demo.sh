#!/usr/bin/env bash
# README command 1: build, then compile the bundled trained policies and run them in the Rust environments.
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
need_cargo
# The lean CLI: the native cpu backend only (no burn, no wasmtime/cranelift, no libtorch), its own profile dir.
cargo build --profile demo -p policyport-cli --bin policyport --no-default-features
"$CARGO_TARGET_DIR/demo/policyport" demo --out-dir "$CARGO_TARGET_DIR/policyport-demo" "$@"
