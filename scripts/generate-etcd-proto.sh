#!/usr/bin/env bash
# Regenerates crates/chorus-etcd/src/proto/{etcdserverpb,mvccpb,authpb}.rs
# from etcd's service definitions as the etcd-client crate ships them (its
# proto/ directory, in the version Cargo.lock names), and chorusfollowpb.rs
# from crates/chorus-etcd/proto/chorus/follow.proto, with tools/etcd-proto:
# a pure-Rust protobuf compiler (protox) and tonic's code generator. Needs no
# protoc. Run it after changing the etcd-client version or follow.proto, and
# commit the result.
#
#   bash scripts/generate-etcd-proto.sh
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"

cargo fetch --quiet
PROTO_ROOT="$(cargo metadata --format-version 1 --locked |
  jq -r '.packages[] | select(.name == "etcd-client") | .manifest_path' |
  xargs -r dirname)/proto"
if [[ ! -f "$PROTO_ROOT/etcd/api/etcdserverpb/rpc.proto" ]]; then
  echo "generate-etcd-proto: no etcd protos at $PROTO_ROOT (is etcd-client a dependency?)" >&2
  exit 1
fi
echo "generate-etcd-proto: protos from $PROTO_ROOT"

OUT="$ROOT/crates/chorus-etcd/src/proto"
cargo run --quiet --release --manifest-path tools/etcd-proto/Cargo.toml -- \
  "$PROTO_ROOT" "$ROOT/crates/chorus-etcd/proto" "$OUT"
rustfmt --edition 2024 "$OUT"/etcdserverpb.rs "$OUT"/mvccpb.rs "$OUT"/authpb.rs "$OUT"/chorusfollowpb.rs
echo "generate-etcd-proto: wrote $OUT/{etcdserverpb,mvccpb,authpb,chorusfollowpb}.rs"
