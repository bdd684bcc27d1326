#!/usr/bin/env bash
# Fails when `cargo build --workspace` would resolve a dependency's features
# differently from `cargo test --workspace`: a clean build (CI's) would then
# compile that crate, and every crate above it, twice. The fix is to ask for
# the test build's features in crates/workspace-hack/Cargo.toml.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

# features EDGES: each package of the workspace's graph with the features
# Cargo resolves for it when those edges are built, one line per variant.
features() {
  cargo tree --workspace -e "$1" -f '{p} {f}' --prefix none |
    sed -e 's/ (\*)$//' -e 's/ *$//' | sort -u
}

build=$(features no-dev)
test=$(features normal,build,dev)
apart=$(comm -23 <(echo "$build") <(echo "$test"))
if [[ -n "$apart" ]]; then
  echo "cargo build --workspace resolves these dependencies with other features than cargo test:"
  echo "$apart" | sed 's/^/  build: /'
  while read -r name version _; do
    grep -E "^$name $version( |$)" <<<"$test" | sed 's/^/  test:  /'
  done <<<"$apart"
  echo "Ask for the test build's features in crates/workspace-hack/Cargo.toml."
  exit 1
fi
echo "cargo build --workspace and cargo test resolve the same dependency features"
