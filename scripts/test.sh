#!/usr/bin/env bash
# Runs the rules (cargo fmt --check, no issue numbers in code and docs, cargo shear for unused
# dependencies, cargo clippy -D warnings) and every test suite: the Rust workspace, then the Python client (clients/python:
# its types.py against the schema, mypy --strict and pytest against the `drover` binary just
# built), in a venv under target/.
#   bash scripts/test.sh          # everything (what CI runs)
#   bash scripts/test.sh lint     # only the rules (a minute or two once the tree is built)
#   bash scripts/test.sh python   # only the Python client (builds the binary first)
set -euo pipefail
cd "$(dirname "$0")/.."
target="${CARGO_TARGET_DIR:-target}"

bin="$(realpath -m "$target")/debug/drover"

# What the Rust tests left running: drover processes of this build on a test's home (every
# test home is a temporary `drover-test-*` directory, removed when its test ends).
bin_re="$(printf '%s' "$bin" | sed 's/[][\\.*^$+?(){}|]/\\&/g')"
leftovers() { pgrep -f -- "^$bin_re --home /[^ ]*/drover-test-[^ /]*/home " || true; }

# The Node packages of the tests, each folder installed by `npm ci` only when missing or when
# its package-lock.json changed since the last install (node_modules/.drover-lock is the lock it
# was installed from): tests/acp, the ACP clients (acpx, the TypeScript SDK, a Node >= 22
# binary); tests/agents, the real ACP agents run against the mock model (codex-acp, OpenCode).
npm_packages() {
  local dir=$1
  cmp -s "$dir/package-lock.json" "$dir/node_modules/.drover-lock" && return 0
  # No package install scripts: each native binary (Node's, codex-acp's, OpenCode's) is in its
  # platform package's tarball itself.
  npm ci --prefix "$dir" --ignore-scripts --no-audit --no-fund --loglevel=error
  cp "$dir/package-lock.json" "$dir/node_modules/.drover-lock"
}

# The rules, cheapest first: formatting; dependencies no code uses, or that only tests use
# outside [dev-dependencies] (cargo shear reads the sources, no build); then every clippy lint
# of the workspace with warnings as errors, clippy.toml's architecture rules among them.
lint() {
  cargo fmt --all --check
  # Code and docs name the topic or link its decision, never a tracker's issue number: the
  # tracker is not in the repository.
  if grep -rnEi --exclude-dir='*.egg-info' 'issue #?[0-9]' crates docs clients/python README.md \
    CONTRIBUTING.md Cargo.toml; then
    echo "the lines above cite an issue number; name the topic or docs/decisions/ instead" >&2
    exit 1
  fi
  # Asked through cargo, which also finds subcommands in $CARGO_HOME/bin off the PATH.
  if ! cargo shear --version >/dev/null 2>&1; then
    # Installed once, from source (crates.io). Pinned: later versions need a newer rustc than
    # the tree's. `--debug`: on 2 cores it builds in 2 minutes instead of 4, and checks the
    # workspace in 5 s instead of 2.
    echo "cargo-shear is missing: installing cargo-shear@1.9.1 (about 2 minutes)" >&2
    cargo install --locked --debug --quiet cargo-shear@1.9.1
  fi
  cargo shear
  cargo clippy --workspace --all-targets -- -D warnings
}

if [ "${1:-all}" = lint ]; then
  lint
  exit 0
fi

if [ "${1:-all}" != python ]; then
  # The rules first, as CI runs them, so a change that breaks one fails here, not in review.
  lint
  npm_packages tests/acp
  npm_packages tests/agents
  # Builds target/debug/drover too, for the end-to-end tests and for the Python client's.
  cargo test --workspace
  # Every test stops what it started: a daemon or client still running once the tests are
  # done is a leak. A process being killed gets 5 s to go; what is left is named, killed,
  # and fails the run.
  for _ in $(seq 50); do
    [ -z "$(leftovers)" ] && break
    sleep 0.1
  done
  left="$(leftovers)"
  if [ -n "$left" ]; then
    echo "the tests left these processes running (killed now):" >&2
    ps -o pid,ppid,etime,args -p "$(echo "$left" | paste -sd, -)" >&2 || true
    echo "$left" | xargs -r kill -KILL 2>/dev/null || true
    exit 1
  fi
else
  # Not `after cargo test`: dev-dependency features make this build differ from the tests' one,
  # so it would compile the workspace again (about a minute in CI) for an equivalent binary.
  cargo build -p drover --bin drover
  # The external-agent test sets its agent up with this program (tests/agents).
  cargo build -p drover-test-support --bin drover-agent-setup
fi

venv="$(realpath "$target")/py-venv"
[ -x "$venv/bin/python" ] || python3 -m venv "$venv"
"$venv/bin/python" -m pip install --quiet --disable-pip-version-check -e 'clients/python[test,gen]'
cd clients/python
# drover_client/types.py is generated from schema/ (scripts/gen_types.py); stale fails here.
"$venv/bin/python" scripts/gen_types.py --check
"$venv/bin/python" -m mypy
DROVER_BIN="$bin" "$venv/bin/python" -m pytest -q
