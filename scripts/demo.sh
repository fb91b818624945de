#!/usr/bin/env bash
# Builds drover and runs one agent turn against the loopback demo model (no API key needed):
# the model asks for `uname -sr` through the terminal tool, drover runs it in a managed worker,
# and the answer streams to stdout. Uses a throwaway home and stops its daemon at the end.
set -euo pipefail
cd "$(dirname "$0")/.."
cargo build --release -p drover -p drover-test-support --bins
bin="${CARGO_TARGET_DIR:-target}/release"
home=$(mktemp -d)
mock_out=$(mktemp)
"$bin"/drover-mock-model >"$mock_out" &
mock=$!
trap '"$bin"/drover stop --home "$home" >/dev/null 2>&1 || true; kill $mock 2>/dev/null || true; rm -rf "$home" "$mock_out"' EXIT
for _ in $(seq 100); do [ -s "$mock_out" ] && break; sleep 0.05; done
url=$(head -n1 "$mock_out")
"$bin"/drover run --home "$home" --base-url "$url" --model demo "What kernel is this machine running?"
"$bin"/drover sessions --home "$home"
