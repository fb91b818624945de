#!/usr/bin/env bash
# drover beside OpenAI Codex CLI and Hermes Agent on one loopback fake model, interleaved round
# by round; prints the table of issue 15 with drover/Codex ratios. See docs/benchmarks.md.
#
#   bash bench/compare.sh                 # installs the peers once, builds drover, measures
#   ROUNDS=3 WARM_TURNS=10 bash bench/compare.sh     # a quicker, noisier run
#   bash bench/compare.sh install         # only install the pinned peers
#
# Knobs (environment): COMPARE_DIR (scratch directory, default /tmp/drover-compare: the peers'
# installs, homes and each run's output), CODEX_VERSION (0.171.0), HERMES_VERSION (0.19.0),
# DROVER_BIN (default: `cargo build --release -p drover`, then target/release/drover), ROUNDS
# (9 counted one-shot runs of each after one warm-up), WARM_TURNS (50, after WARM_WARMUP 5).
# Needs node/npm, python3 (3.11+, with venv), cargo; the network only for npm and PyPI.
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/.." && pwd)
dir=${COMPARE_DIR:-/tmp/drover-compare}
codex_version=${CODEX_VERSION:-0.171.0}
hermes_version=${HERMES_VERSION:-0.19.0}
say() { printf '[compare %s] %s\n' "$(date -u +%H:%M:%S)" "$*" >&2; }
mkdir -p "$dir"

# ------------------------------------------------------------------ the pinned peers, once
if [ ! -d "$dir/npm/lib/node_modules/@openai/codex" ] || \
   [ "$(node -p "require('$dir/npm/lib/node_modules/@openai/codex/package.json').version")" != "$codex_version" ]; then
  say "installing @openai/codex@$codex_version (npm) into $dir/npm"
  npm install --global --no-fund --no-audit --prefix "$dir/npm" "@openai/codex@$codex_version" >&2
fi
# The npm package is a node launcher around a native binary: run the binary itself, as the
# launcher would, so node's start-up is not counted against Codex.
codex=$(find "$dir/npm/lib/node_modules/@openai/codex" -path '*/vendor/*linux*/bin/codex' -type f | head -n 1)
[ -x "$codex" ] || { say "no native codex binary under $dir/npm"; exit 1; }

if [ "$("$dir/hermes/bin/pip" show hermes-agent 2>/dev/null | awk '/^Version/{print $2}')" != "$hermes_version" ]; then
  say "installing hermes-agent==$hermes_version (PyPI) into $dir/hermes"
  python3 -m venv "$dir/hermes"
  "$dir/hermes/bin/pip" install --quiet --disable-pip-version-check "hermes-agent==$hermes_version" >&2
  rm -f "$dir/hermes/.primed"
fi
# The driver: the repository's own Python client (one dependency, websockets).
if [ ! -x "$dir/driver/bin/python" ]; then
  python3 -m venv "$dir/driver"
fi
"$dir/driver/bin/pip" install --quiet --disable-pip-version-check "$repo/clients/python" >&2
[ "${1:-}" = install ] && exit 0

if [ -z "${DROVER_BIN:-}" ]; then
  say "building drover (release)"
  (cd "$repo" && cargo build --release -p drover --bin drover >&2)
  DROVER_BIN=$(realpath "${CARGO_TARGET_DIR:-$repo/target}")/release/drover
fi

# ------------------------------------------------------------------ a run: homes, model, driver
run=$dir/runs/$(date -u +%Y%m%dT%H%M%SZ)
mkdir -p "$run/work" "$run/home" "$run/codex-home" "$run/hermes-home"
port=$("$dir/driver/bin/python" -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
base=http://127.0.0.1:$port/v1

# Each peer reads its endpoint from its own config; none gets a real key.
cat > "$run/codex-home/config.toml" <<EOF
model = "fake-model"
model_provider = "fake"

[model_providers.fake]
name = "loopback fake model"
base_url = "$base"
env_key = "FAKE_API_KEY"
wire_api = "responses"
EOF
cat > "$run/hermes-home/config.yaml" <<EOF
model:
  provider: custom
  default: fake-model
  base_url: $base
  api_key: dummy-local-key
EOF

"$dir/driver/bin/python" "$here/fake_model.py" "$port" > "$run/model.log" 2>&1 &
model_pid=$!
trap 'kill "$model_pid" 2>/dev/null; wait "$model_pid" 2>/dev/null || true' EXIT
for _ in $(seq 200); do
  grep -q listening "$run/model.log" && break
  sleep 0.05
done
grep -q listening "$run/model.log" || { say "the fake model did not start"; exit 1; }

# A clean environment for every system: its own HOME, no proxies, no real keys.
peer_env=(env -i "HOME=$run/home" PATH=/usr/local/bin:/usr/bin:/bin LANG=C.UTF-8 TERM=dumb)
# Hermes installs a text-to-speech package on its first run: prime it outside the measurement.
if [ ! -f "$dir/hermes/.primed" ]; then
  say "priming hermes (its first run installs more packages)"
  (cd "$run/work" && "${peer_env[@]}" "HERMES_HOME=$run/hermes-home" "$dir/hermes/bin/hermes" -z "say hi" \
     </dev/null >"$run/hermes-prime.log" 2>&1) && touch "$dir/hermes/.primed" \
     || say "hermes priming failed (see $run/hermes-prime.log)"
fi

{
  echo "date: $(date -u +%FT%TZ); host: $(uname -sr), $(nproc) cores; load: $(cut -d' ' -f1-3 /proc/loadavg)"
  echo "drover: $("$DROVER_BIN" --version) ($DROVER_BIN; repo at $(git -C "$repo" rev-parse --short HEAD 2>/dev/null || echo '?'))"
  echo "codex: $("${peer_env[@]}" "CODEX_HOME=$run/codex-home" "$codex" --version 2>/dev/null | tail -n 1)"
  echo "hermes: hermes-agent $hermes_version (python $("$dir/hermes/bin/python" -c 'import sys; print(sys.version.split()[0])'))"
} | tee "$run/versions.txt"

say "measuring (output in $run)"
RUN_DIR=$run BASE_URL=$base DROVER_BIN=$DROVER_BIN CODEX_BIN=$codex HERMES_BIN=$dir/hermes/bin/hermes \
  "$dir/driver/bin/python" "$here/compare.py" | tee "$run/table.txt"
echo "load at end: $(cut -d' ' -f1-3 /proc/loadavg)" | tee -a "$run/table.txt"
