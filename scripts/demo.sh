#!/usr/bin/env bash
# Builds drover and runs one agent turn against the loopback demo model (no API key needed):
# the model asks for `uname -sr` through the terminal tool, drover runs it in a managed worker,
# and the answer streams to stdout. `bash scripts/demo.sh chat` opens `drover chat` on the demo
# model instead (type `run: <command>` to have it run one; Ctrl-D leaves). Uses a throwaway home
# and stops its daemon and the model at the end.
set -euo pipefail
cd "$(dirname "$0")/.."
mode="${1:-turn}"
case "$mode" in
turn | chat) ;;
*)
    echo "usage: bash scripts/demo.sh [chat]" >&2
    exit 1
    ;;
esac
cargo build --release -p drover -p drover-test-support --bins
bin="${CARGO_TARGET_DIR:-target}/release"
home=$(mktemp -d)
mock_out=$(mktemp)
"$bin"/drover-mock-model >"$mock_out" &
mock=$!
trap '"$bin"/drover stop --home "$home" >/dev/null 2>&1 || true; kill $mock 2>/dev/null || true; rm -rf "$home" "$mock_out"' EXIT
for _ in $(seq 100); do [ -s "$mock_out" ] && break; sleep 0.05; done
url=$(head -n1 "$mock_out")
if [ "$mode" = chat ]; then
    "$bin"/drover chat --home "$home" --base-url "$url" --model demo
    exit 0
fi
"$bin"/drover run --home "$home" --base-url "$url" --model demo "What kernel is this machine running?"
"$bin"/drover sessions --home "$home"
echo
echo "Chat with the demo model: bash scripts/demo.sh chat"
