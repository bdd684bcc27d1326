#!/usr/bin/env bash
# The project's test command: bash scripts/test.sh
#
# Starts the test services in the background (3 moto S3 zones, Azurite,
# PostgreSQL, etcd; see services.sh, which also installs protoc for a
# dev-dependency's build script) while it builds the workspace with no protoc
# anywhere (the product must build on a machine without one). Then runs the
# tests (scripts/run_tests.py: two test binaries at once), the doc tests,
# clippy and rustfmt with the services' env, and stops the services again
# (also on failure). Set CHORUS_KEEP_SERVICES=1 to leave them running.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"

# section TITLE: prints a banner and starts timing the stage; the summary lists
# every stage's wall time, so a slow CI run shows where its minutes went.
stage_names=()
stage_starts=()
section() {
  stage_names+=("$*")
  stage_starts+=("$SECONDS")
  printf '\n==================== %s ====================\n' "$*"
}
stage_times() {
  local i end
  for i in "${!stage_names[@]}"; do
    end=${stage_starts[$((i + 1))]:-$SECONDS}
    printf '  %5ds  %s\n' "$((end - stage_starts[i]))" "${stage_names[i]}"
  done
  printf '  %5ds  total\n' "$SECONDS"
}

# Run every stage even if an earlier one fails, then fail at the end, so one
# CI run reports all problems.
failed=()

# path_without_protoc SHADOW_DIR: $PATH with every `protoc` hidden. Each PATH
# directory is replaced by a directory (under SHADOW_DIR) of links to
# everything else in it as it is now: dropping a directory would drop the
# linker and the rest of /usr/bin with it, and a protoc that services.sh
# installs meanwhile must not appear.
path_without_protoc() {
  local shadow_root="$1" dir entry shadow n=0 out=()
  local IFS=:
  for dir in $PATH; do
    [[ -n "$dir" && -d "$dir" ]] || continue
    n=$((n + 1)); shadow="$shadow_root/$n"
    mkdir -p "$shadow"
    for entry in "$dir"/*; do
      [[ -e "$entry" && "${entry##*/}" != protoc ]] && ln -s "$entry" "$shadow/"
    done
    out+=("$shadow")
  done
  echo "${out[*]}"
}

cleanup() {
  if [[ -n "${services_pid:-}" ]]; then wait "$services_pid" 2>/dev/null || true; fi
  if [[ "${CHORUS_KEEP_SERVICES:-0}" != 1 ]]; then
    section "stopping services"
    bash scripts/services.sh stop || true
  fi
}
trap cleanup EXIT

# The services start (installing what they need: apt, pip and npm packages on
# a fresh machine) while the workspace builds; the two barely compete, one
# waits on the network and the other on the CPU.
mkdir -p .ci/state
services_log="$ROOT/.ci/state/services-start.log"
bash scripts/services.sh start >"$services_log" 2>&1 &
services_pid=$!

# Cheap, and first: a dependency whose features the dev-dependencies change
# would compile twice below (once per build), with everything above it.
section "one feature set for cargo build and cargo test"
bash scripts/check_features.sh || failed+=("feature sets")

# The PATH is taken before services.sh installs protoc (the `etcd-client`
# dev-dependency's build script runs it), and the product must build without
# it, as on the fresh machine of the README's first command. `cargo build`
# builds libraries and binaries, not dev-dependencies. On a fresh clone (CI)
# every build script runs here for the first time; a warm target directory may
# skip a build script that ran before.
section "cargo build --workspace, with no protoc"
no_protoc_dir="$(mktemp -d)"
no_protoc_path="$(path_without_protoc "$no_protoc_dir")"
if PATH="$no_protoc_path" command -v protoc >/dev/null; then
  echo "a protoc is still on the PATH: $(PATH="$no_protoc_path" command -v protoc)"
  failed+=("build without protoc")
elif ! env -u PROTOC PATH="$no_protoc_path" cargo build --workspace; then
  failed+=("build without protoc")
fi
rm -rf "$no_protoc_dir"

section "waiting for the services"
services_status=0
wait "$services_pid" || services_status=$?
services_pid=""
cat "$services_log"
if ((services_status != 0)); then
  echo "services.sh start failed (exit $services_status); see above"
  exit 1
fi
set -a
# shellcheck source=/dev/null
source .ci/state/env
set +a
grep -E '^export ' .ci/state/env | sed 's/^export /  /'

test_log="$ROOT/.ci/state/cargo-test.log"

# Two test binaries at once (they mostly wait on leases, TTLs and child
# processes), except those that must have the machine to themselves: their
# timing windows (lease expiries, TTLs, stop schedules) must not stretch under
# a second binary's load. --first starts the longest ones first.
section "tests: cargo test --workspace --all-targets, two binaries at once"
if ! python3 scripts/run_tests.py --jobs 2 \
  --alone stopped_process,etcdctl_lease,runtime \
  --first etcd_differential,chaos,etcd_faults,serve,seeds,serve_memory \
  -- --workspace --all-targets --no-fail-fast 2>&1 | tee "$test_log"; then
  failed+=("tests")
fi

section "cargo test --workspace --doc"
if ! cargo test --workspace --doc 2>&1 | tee -a "$test_log"; then
  failed+=("doc tests")
fi

section "cargo clippy --all-targets -- -D warnings"
cargo clippy --all-targets -- -D warnings || failed+=("cargo clippy")

# The fuzz targets are their own workspace (cargo-fuzz needs nightly flags to
# run them, see docs/fuzzing.md); here we only prove they still build. In the
# main target directory, after clippy: with the same profile, patch and
# locked versions (fuzz/Cargo.toml) most dependencies are checked already.
section "cargo check --manifest-path fuzz/Cargo.toml"
CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$ROOT/target}" \
  cargo check --manifest-path fuzz/Cargo.toml --all-targets || failed+=("fuzz targets")

section "cargo fmt --all -- --check"
cargo fmt --all -- --check || failed+=("cargo fmt")

section "summary"
stage_times
# Sum cargo's per-binary "test result:" lines into one closing line, since
# clippy/fmt output comes after cargo test's own summary.
passed=$(grep -oE 'test result: [A-Za-z]+\. [0-9]+ passed' "$test_log" | awk '{s+=$4} END {print s+0}')
nfailed=$(grep -oE '; [0-9]+ failed' "$test_log" | awk '{s+=$2} END {print s+0}')
if ((${#failed[@]})); then
  echo "FAILED stages: ${failed[*]}"
fi
echo "tests: $passed passed, $nfailed failed"
((${#failed[@]} == 0))
