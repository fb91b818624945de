#!/usr/bin/env bash
# Runs every test suite: the Rust workspace, then the Python client (clients/python: its
# types.py against the schema, mypy --strict and pytest against the `drover` binary just
# built), in a venv under target/.
#   bash scripts/test.sh          # everything (what CI runs)
#   bash scripts/test.sh python   # only the Python client (builds the binary first)
set -euo pipefail
cd "$(dirname "$0")/.."
target="${CARGO_TARGET_DIR:-target}"

if [ "${1:-all}" != python ]; then
  # Builds target/debug/drover too, for the end-to-end tests and for the Python client's.
  cargo test --workspace
else
  # Not `after cargo test`: dev-dependency features make this build differ from the tests' one,
  # so it would compile the workspace again (about a minute in CI) for an equivalent binary.
  cargo build -p drover --bin drover
fi
bin="$(realpath "$target")/debug/drover"

venv="$(realpath "$target")/py-venv"
[ -x "$venv/bin/python" ] || python3 -m venv "$venv"
"$venv/bin/python" -m pip install --quiet --disable-pip-version-check -e 'clients/python[test,gen]'
cd clients/python
# drover_client/types.py is generated from schema/ (scripts/gen_types.py); stale fails here.
"$venv/bin/python" scripts/gen_types.py --check
"$venv/bin/python" -m mypy
DROVER_BIN="$bin" "$venv/bin/python" -m pytest -q
