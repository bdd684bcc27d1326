#!/usr/bin/env bash
# The project's test command: bash scripts/test.sh
#
# Starts the test services (3 moto S3 zones, Azurite, PostgreSQL; see services.sh),
# runs cargo test, clippy and rustfmt with the services' env, then stops the
# services again (also on failure). Set CHORUS_KEEP_SERVICES=1 to leave them
# running afterwards.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"

section() { printf '\n==================== %s ====================\n' "$*"; }

cleanup() {
  if [[ "${CHORUS_KEEP_SERVICES:-0}" != 1 ]]; then
    section "stopping services"
    bash scripts/services.sh stop || true
  fi
}
trap cleanup EXIT

section "starting services"
bash scripts/services.sh start
set -a
# shellcheck source=/dev/null
source .ci/state/env
set +a
grep -E '^export ' .ci/state/env | sed 's/^export /  /'

# Run every stage even if an earlier one fails, then fail at the end, so one
# CI run reports all problems.
failed=()
test_log="$ROOT/.ci/state/cargo-test.log"

section "cargo test --workspace --all-targets --no-fail-fast"
if ! cargo test --workspace --all-targets --no-fail-fast 2>&1 | tee "$test_log"; then
  failed+=("cargo test")
fi

section "cargo test --workspace --doc"
if ! cargo test --workspace --doc 2>&1 | tee -a "$test_log"; then
  failed+=("doc tests")
fi

# The fuzz targets are their own workspace (cargo-fuzz needs nightly flags to
# run them, see docs/fuzzing.md); here we only prove they still build.
section "cargo check --manifest-path fuzz/Cargo.toml"
CARGO_TARGET_DIR="$ROOT/target/fuzz-check" cargo check --manifest-path fuzz/Cargo.toml --all-targets \
  || failed+=("fuzz targets")

section "cargo clippy --all-targets -- -D warnings"
cargo clippy --all-targets -- -D warnings || failed+=("cargo clippy")

section "cargo fmt --all -- --check"
cargo fmt --all -- --check || failed+=("cargo fmt")

section "summary"
# Sum cargo's per-binary "test result:" lines into one closing line, since
# clippy/fmt output comes after cargo test's own summary.
passed=$(grep -oE 'test result: [A-Za-z]+\. [0-9]+ passed' "$test_log" | awk '{s+=$4} END {print s+0}')
nfailed=$(grep -oE '; [0-9]+ failed' "$test_log" | awk '{s+=$2} END {print s+0}')
if ((${#failed[@]})); then
  echo "FAILED stages: ${failed[*]}"
fi
echo "tests: $passed passed, $nfailed failed"
((${#failed[@]} == 0))
