//! The differential suite's workload and harness, shared by the suites that
//! compare a side with a real etcd: one seeded random workload of etcd KV
//! requests, sent to two sides in lockstep, every answer compared field by
//! field.
//!
//! Used by `crates/chorus/tests/etcd_differential.rs` (Chorus's machine in
//! process) and `crates/chorus-etcd/tests/etcd_differential.rs` (Chorus over
//! gRPC). The including crate declares this file's neighbours `etcd.rs` as
//! `etcd_server` (the real etcd) and `etcd_watch_answers.rs` as
//! `etcd_watch_answers` at its root, next to this module.
//!
//! The workload ([`Workload`]) draws Put (prev_kv, ignore_value,
//! ignore_lease; a live lease, a revoked one, one never granted), Range with
//! every option (single key, prefix, from-key, explicit ranges; limit; the
//! current, past, compacted, future and negative revisions; every sort order
//! and target; keys_only, count_only, min/max mod and create revisions;
//! serializable), DeleteRange (prev_kv, ranges), Txn (every compare target
//! and result, with ranges, LEASE compares with live and dead leases; every
//! operation in both branches, puts with leases; nested txns), Compact,
//! LeaseGrant (the server's choice of id or the client's, an id that exists;
//! TTLs below etcd's minimum, long ones, its maximum and beyond),
//! LeaseRevoke (live, revoked, never granted, id 0), and requests etcd
//! refuses (an empty key, two writes to one key in a txn, too many
//! operations, an unknown lease, a lease that exists, a TTL too large).
//! Where both sides serve them (over gRPC, not the machine in process) it
//! draws the Lease service's reads too: LeaseTimeToLive (with and without
//! keys; live and dead leases), LeaseLeases and one LeaseKeepAlive. Keys
//! come from a four-letter alphabet, so operations collide. Revisions and
//! lease ids are drawn from what the first side answered, so a seed replays
//! the same requests as long as both agree.
//!
//! Leases never expire during a seed: a grant of a TTL under 60 s is
//! revoked by the very next request (never across the takeover), the others
//! are long; expiry timing is not compared. Right after the takeover every
//! live lease is kept alive once on both sides, as etcd's new leader extends
//! every lease by its TTL and Chorus's new primary does too, so remaining
//! TTLs compare after it.
//!
//! Answers are compared whole (every protobuf field), after zeroing the
//! header's cluster id, member id and raft term, which name a deployment
//! rather than the store; refusals by gRPC code and message. The first
//! difference fails the run with its seed, the operation's number and
//! request, the first differing field, and both answers. Lease reads are
//! compared up to what is not part of the answer: a lease's keys and the
//! list of leases as sets (etcd lists both from Go maps), and remaining TTLs
//! within a second (the sides are asked milliseconds apart and both round
//! down).
//!
//! Lease ids ([`LeaseIds`]): a grant with id 0 lets each server choose, and
//! they choose differently. When both sides granted one, the pair of ids is
//! recorded; from then on the workload names the lease by the first side's
//! id, the second side is sent its own id in its place (in a revoke, a
//! put's lease, a LEASE compare, a grant naming an id, a lease read) and its
//! answers are translated back (a granted id, a key's `lease` in ranges,
//! prev_kv and txn answers, the listed and the read ids) before the
//! comparison, which therefore reads in the first side's ids. Ids a client
//! chose are the same on both sides and are not translated.
//!
//! Watches ([`Watches`]), where both sides serve them (over gRPC): before
//! seeded requests (drawn by a generator of their own, so a seed's requests
//! are unchanged) a watch opens on both sides, one stream each, with drawn
//! options: a key, a prefix, every key from one on, or a range; from the
//! next revision, the current one, a past one within the retained history
//! (never the compaction revision itself, where etcd 3.4 loses a delete:
//! etcd issue 19179) or one below the compaction point (etcd cancels it
//! with `compact_revision`); prev_kv; the NOPUT and NODELETE filters. A
//! task per stream reads its responses as they come; the watches stay open
//! while the workload runs. Before the takeover (the old primary's streams
//! end with it) and at the end of the seed, once no watch of either side
//! has received anything for [`WATCH_QUIET`], every watch is compared and
//! closed (not after a progress request: etcd 3.4 answers one at once, not
//! after the events before it, so it cannot tell that a stream is done):
//! the responses without events (created; canceled, with compact_revision
//! and reason) field by field, the header revision of a compaction cancel
//! aside (etcd's is 0, Chorus's the store revision); then the events
//! grouped by revision (type, key, value, create and mod revisions,
//! version, lease, prev_kv, the right side's lease ids read as the left
//! side's). Grouped by revision because etcd may cut a stream's responses
//! elsewhere than Chorus, but never splits a revision across two: that
//! each side keeps revisions whole and in order is checked too. An event's
//! prev_kv that one side has and the other lacks is forgiven only at or
//! below the compaction revision: etcd reads the previous entry when it
//! sends the event, so a compaction just after the event's revision races
//! with its send. After
//! creating a watch that does not start at the next revision the workload
//! waits [`WATCH_CATCH_UP`], as etcd catches such a watch up (or cancels
//! it as compacted, with the compaction point of that moment) every
//! 100 ms, where Chorus does at once.
//!
//! Seeds: `CHORUS_ETCD_DIFF_SEED=<n>` runs that seed alone;
//! `CHORUS_ETCD_DIFF_SEEDS=<count>` runs that many (from
//! `CHORUS_ETCD_DIFF_FIRST_SEED`, default 1; each suite's own count by
//! default); `CHORUS_ETCD_DIFF_OPS=<n>` sets the operations per seed
//! ([`DEFAULT_OPS_PER_SEED`] by default).

#![allow(dead_code)] // each suite uses a different subset

use std::collections::{BTreeMap, VecDeque};
use std::fmt::{self, Write as _};
use std::time::{Duration, Instant};

use etcd_client::proto::{
    PbCompactionResponse, PbDeleteResponse, PbKeyValue, PbLeaseGrantResponse,
    PbLeaseKeepAliveResponse, PbLeaseLeasesResponse, PbLeaseRevokeResponse,
    PbLeaseTimeToLiveResponse, PbPutResponse, PbRangeResponse, PbResponseHeader, PbTxnOpResponse,
    PbTxnResponse,
};
use etcd_client::{
    Client, CompactionOptions, Compare, CompareOp, DeleteOptions, GetOptions, KvClient,
    LeaseClient, LeaseGrantOptions, LeaseTimeToLiveOptions, PutOptions, SortOrder, SortTarget, Txn,
    TxnOp, WatchClient, WatchFilterType, WatchOptions, WatchRequestSender,
};
use rand::rngs::StdRng;
use rand::seq::IndexedRandom;
use rand::{Rng, SeedableRng};

use crate::etcd_server::EtcdServer;
use crate::etcd_watch_answers::{Ev, Resp, resp};
use tokio::sync::mpsc;

/// Operations per seed unless `CHORUS_ETCD_DIFF_OPS` says otherwise.
pub const DEFAULT_OPS_PER_SEED: usize = 10_000;
/// The letters keys are made of (one or two of them: 20 keys in all).
const KEY_LETTERS: &[u8] = b"abcd";
/// The values puts write and value compares test.
const VALUES: &[&str] = &["", "v", "w", "vw", "a longer value"];
/// etcd's default limit on operations in one txn branch (`--max-txn-ops`).
pub const MAX_TXN_OPS: usize = 128;
/// How deep txns nest.
const MAX_TXN_DEPTH: usize = 2;
/// Requests shown before the differing one, for context.
const CONTEXT_OPS: usize = 5;
/// The TTLs grants ask for, in seconds: below etcd's minimum (raised to
/// it), long ones, etcd's maximum and one beyond it (refused).
const GRANT_TTLS_SECS: &[i64] = &[-1, 0, 1, 2, 90, 300, 3_600, 9_000_000_000, 9_000_000_001];
/// A grant asking for less than this is revoked by the next request: its
/// lease would expire during the seed, and expiry timing is not compared.
const LONG_LEASE_TTL_SECS: i64 = 60;
/// The ids grants choose themselves (besides ids that exist); etcd takes
/// a negative one as any other.
const CLIENT_LEASE_IDS: &[i64] = &[-1, 1, 2, 3];
/// A lease id no grant ever asks for: a lease that does not exist.
const UNKNOWN_LEASE_ID: i64 = 7;
/// Live leases at most; a lease request beyond revokes one.
const MAX_LIVE_LEASES: usize = 6;
/// How far two remaining TTLs may differ, in seconds (the two sides are
/// asked a few milliseconds apart, and both round down).
const REMAINING_TTL_TOLERANCE_SECS: i64 = 1;

// ------------------------------------------------------------- requests ---

/// Bytes shown as a string in reports.
#[derive(Clone, PartialEq, Eq)]
pub struct Text(pub Vec<u8>);

impl fmt::Debug for Text {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&shown(&self.0))
    }
}

/// A key and a range end, as etcd takes them (an empty end: the key alone;
/// `"\0"`: every key from `key` on; otherwise `[key, range_end)`).
#[derive(Clone, PartialEq, Eq)]
pub struct KeyRange {
    pub key: Vec<u8>,
    pub range_end: Vec<u8>,
}

impl fmt::Debug for KeyRange {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.range_end.is_empty() {
            write!(f, "{}", shown(&self.key))
        } else {
            write!(f, "[{}, {})", shown(&self.key), shown(&self.range_end))
        }
    }
}

/// A Range request, every field of etcd's `RangeRequest`.
#[derive(Debug, Clone)]
pub struct RangeSpec {
    pub range: KeyRange,
    pub limit: i64,
    pub revision: i64,
    pub sort: Option<(SortTarget, SortOrder)>,
    pub serializable: bool,
    pub keys_only: bool,
    pub count_only: bool,
    pub min_mod_revision: i64,
    pub max_mod_revision: i64,
    pub min_create_revision: i64,
    pub max_create_revision: i64,
}

/// A Put request.
#[derive(Debug, Clone)]
pub struct PutSpec {
    pub key: Text,
    pub value: Text,
    pub lease: i64,
    pub prev_kv: bool,
    pub ignore_value: bool,
    pub ignore_lease: bool,
}

/// A DeleteRange request.
#[derive(Debug, Clone)]
pub struct DeleteSpec {
    pub range: KeyRange,
    pub prev_kv: bool,
}

/// What a compare reads, and the value it compares with.
#[derive(Debug, Clone)]
pub enum CompareSpecTarget {
    Version(i64),
    Create(i64),
    Mod(i64),
    Value(Text),
    Lease(i64),
}

/// One compare of a txn.
#[derive(Debug, Clone)]
pub struct CompareSpec {
    pub range: KeyRange,
    pub op: CompareOp,
    pub target: CompareSpecTarget,
}

/// One operation of a txn branch.
#[derive(Debug, Clone)]
pub enum TxnOpSpec {
    Range(RangeSpec),
    Put(PutSpec),
    Delete(DeleteSpec),
    Txn(TxnSpec),
}

/// A Txn request.
#[derive(Debug, Clone, Default)]
pub struct TxnSpec {
    pub compare: Vec<CompareSpec>,
    pub success: Vec<TxnOpSpec>,
    pub failure: Vec<TxnOpSpec>,
}

impl TxnSpec {
    /// Whether a branch, at any depth, holds a DeleteRange of every key from
    /// some key on (`range_end` `"\0"`).
    fn deletes_from_key(&self) -> bool {
        self.success.iter().chain(&self.failure).any(|op| match op {
            TxnOpSpec::Delete(delete) => delete.range.range_end == [0],
            TxnOpSpec::Txn(nested) => nested.deletes_from_key(),
            TxnOpSpec::Range(_) | TxnOpSpec::Put(_) => false,
        })
    }

    /// Clears `ignore_value` and `ignore_lease` on every put, at any depth.
    fn clear_ignores(&mut self) {
        for op in self.success.iter_mut().chain(&mut self.failure) {
            match op {
                TxnOpSpec::Put(put) => {
                    put.ignore_value = false;
                    put.ignore_lease = false;
                }
                TxnOpSpec::Txn(nested) => nested.clear_ignores(),
                TxnOpSpec::Range(_) | TxnOpSpec::Delete(_) => {}
            }
        }
    }

    /// Whether a compare or a put, at any depth, names a lease.
    fn names_a_lease(&self) -> bool {
        let compares = self
            .compare
            .iter()
            .any(|compare| matches!(compare.target, CompareSpecTarget::Lease(lease) if lease != 0));
        compares
            || self.success.iter().chain(&self.failure).any(|op| match op {
                TxnOpSpec::Put(put) => put.lease != 0,
                TxnOpSpec::Txn(nested) => nested.names_a_lease(),
                TxnOpSpec::Range(_) | TxnOpSpec::Delete(_) => false,
            })
    }

    /// Whether a branch holds a txn.
    fn nests(&self) -> bool {
        let nested = |op: &TxnOpSpec| matches!(op, TxnOpSpec::Txn(_));
        self.success.iter().chain(&self.failure).any(nested)
    }
}

/// One request of the workload.
#[derive(Debug, Clone)]
pub enum Request {
    Range(RangeSpec),
    Put(PutSpec),
    Delete(DeleteSpec),
    Txn(TxnSpec),
    Compact {
        revision: i64,
        physical: bool,
    },
    /// `id` 0: the server chooses the id.
    LeaseGrant {
        id: i64,
        ttl: i64,
    },
    LeaseRevoke {
        id: i64,
    },
    LeaseTimeToLive {
        id: i64,
        keys: bool,
    },
    LeaseLeases,
    /// One keep-alive on a stream of its own.
    LeaseKeepAlive {
        id: i64,
    },
}

impl Request {
    /// Its kind, for the per-seed tally.
    fn kind(&self) -> &'static str {
        match self {
            Request::Range(_) => "range",
            Request::Put(put) if put.lease != 0 => "put with a lease",
            Request::Put(_) => "put",
            Request::Delete(_) => "delete",
            Request::Txn(txn) if txn.nests() => "txn with a nested txn",
            Request::Txn(txn) if txn.names_a_lease() => "txn naming a lease",
            Request::Txn(_) => "txn",
            Request::Compact { .. } => "compact",
            Request::LeaseGrant { id: 0, .. } => "lease grant",
            Request::LeaseGrant { .. } => "lease grant with an id",
            Request::LeaseRevoke { .. } => "lease revoke",
            Request::LeaseTimeToLive { .. } => "lease time to live",
            Request::LeaseLeases => "lease leases",
            Request::LeaseKeepAlive { .. } => "lease keep-alive",
        }
    }
}

fn get_options(spec: &RangeSpec) -> GetOptions {
    let mut options = GetOptions::new()
        .with_range(spec.range.range_end.clone())
        .with_limit(spec.limit)
        .with_revision(spec.revision)
        .with_min_mod_revision(spec.min_mod_revision)
        .with_max_mod_revision(spec.max_mod_revision)
        .with_min_create_revision(spec.min_create_revision)
        .with_max_create_revision(spec.max_create_revision);
    if let Some((target, order)) = spec.sort {
        // etcd-client sends (KEY, ASCEND) as (KEY, NONE), as Go's clientv3 does.
        options = options.with_sort(target, order);
    }
    if spec.serializable {
        options = options.with_serializable();
    }
    if spec.keys_only {
        options = options.with_keys_only();
    }
    if spec.count_only {
        options = options.with_count_only();
    }
    options
}

fn put_options(spec: &PutSpec) -> PutOptions {
    let mut options = PutOptions::new().with_lease(spec.lease);
    if spec.prev_kv {
        options = options.with_prev_key();
    }
    if spec.ignore_value {
        options = options.with_ignore_value();
    }
    if spec.ignore_lease {
        options = options.with_ignore_lease();
    }
    options
}

fn delete_options(spec: &DeleteSpec) -> DeleteOptions {
    let options = DeleteOptions::new().with_range(spec.range.range_end.clone());
    if spec.prev_kv {
        options.with_prev_key()
    } else {
        options
    }
}

fn compare(spec: &CompareSpec) -> Compare {
    let key = spec.range.key.clone();
    let compare = match &spec.target {
        CompareSpecTarget::Version(version) => Compare::version(key, spec.op, *version),
        CompareSpecTarget::Create(revision) => Compare::create_revision(key, spec.op, *revision),
        CompareSpecTarget::Mod(revision) => Compare::mod_revision(key, spec.op, *revision),
        CompareSpecTarget::Value(value) => Compare::value(key, spec.op, value.0.clone()),
        CompareSpecTarget::Lease(lease) => Compare::lease(key, spec.op, *lease),
    };
    if spec.range.range_end.is_empty() {
        compare
    } else {
        compare.with_range(spec.range.range_end.clone())
    }
}

fn txn_op(spec: &TxnOpSpec) -> TxnOp {
    match spec {
        TxnOpSpec::Range(range) => TxnOp::get(range.range.key.clone(), Some(get_options(range))),
        TxnOpSpec::Put(put) => TxnOp::put(
            put.key.0.clone(),
            put.value.0.clone(),
            Some(put_options(put)),
        ),
        TxnOpSpec::Delete(delete) => {
            TxnOp::delete(delete.range.key.clone(), Some(delete_options(delete)))
        }
        TxnOpSpec::Txn(nested) => TxnOp::txn(txn(nested)),
    }
}

pub fn txn(spec: &TxnSpec) -> Txn {
    Txn::new()
        .when(spec.compare.iter().map(compare).collect::<Vec<_>>())
        .and_then(spec.success.iter().map(txn_op).collect::<Vec<_>>())
        .or_else(spec.failure.iter().map(txn_op).collect::<Vec<_>>())
}

// -------------------------------------------------------------- answers ---

/// One endpoint's answer to one request: the whole response message, or the
/// refusal's gRPC code and message.
#[derive(Debug, Clone, PartialEq)]
pub enum Answer {
    Range(PbRangeResponse),
    Put(PbPutResponse),
    Delete(PbDeleteResponse),
    Txn(PbTxnResponse),
    Compact(PbCompactionResponse),
    LeaseGrant(PbLeaseGrantResponse),
    LeaseRevoke(PbLeaseRevokeResponse),
    LeaseTimeToLive(PbLeaseTimeToLiveResponse),
    LeaseLeases(PbLeaseLeasesResponse),
    LeaseKeepAlive(PbLeaseKeepAliveResponse),
    Refused {
        code: String,
        message: String,
    },
    /// No gRPC answer at all (a transport failure).
    Failed(String),
}

impl Answer {
    /// The store revision the answer reports, if it has a header.
    fn revision(&self) -> Option<i64> {
        let header = match self {
            Answer::Range(r) => r.header.as_ref(),
            Answer::Put(r) => r.header.as_ref(),
            Answer::Delete(r) => r.header.as_ref(),
            Answer::Txn(r) => r.header.as_ref(),
            Answer::Compact(r) => r.header.as_ref(),
            Answer::LeaseGrant(r) => r.header.as_ref(),
            Answer::LeaseRevoke(r) => r.header.as_ref(),
            Answer::LeaseTimeToLive(r) => r.header.as_ref(),
            Answer::LeaseLeases(r) => r.header.as_ref(),
            Answer::LeaseKeepAlive(r) => r.header.as_ref(),
            Answer::Refused { .. } | Answer::Failed(_) => None,
        };
        header.map(|h| h.revision)
    }

    /// A label for the per-seed tally of outcomes; `revision` is the store
    /// revision before the request.
    fn outcome(&self, revision: i64) -> String {
        let leased = |kvs: &[PbKeyValue]| kvs.iter().any(|kv| kv.lease != 0);
        match self {
            Answer::Txn(r) if r.succeeded => "txn succeeded".into(),
            Answer::Txn(_) => "txn failed".into(),
            Answer::Range(r) if r.more => "range with more".into(),
            Answer::Range(r) if leased(&r.kvs) => "range showing a lease".into(),
            Answer::Range(_) => "range".into(),
            Answer::Put(r) if r.prev_kv.is_some() => "put with prev_kv".into(),
            Answer::Put(_) => "put".into(),
            Answer::Delete(r) if r.deleted > 0 => "delete of keys".into(),
            Answer::Delete(_) => "delete of nothing".into(),
            Answer::Compact(_) => "compact".into(),
            Answer::LeaseGrant(_) => "lease granted".into(),
            Answer::LeaseRevoke(_) if self.revision() > Some(revision) => {
                "lease revoked with its keys".into()
            }
            Answer::LeaseRevoke(_) => "lease revoked".into(),
            Answer::LeaseTimeToLive(r) if r.ttl == -1 => "time to live of an unknown lease".into(),
            Answer::LeaseTimeToLive(r) if !r.keys.is_empty() => "time to live with keys".into(),
            Answer::LeaseTimeToLive(_) => "time to live".into(),
            Answer::LeaseLeases(_) => "leases".into(),
            Answer::LeaseKeepAlive(r) if r.ttl == 0 => "keep-alive of an unknown lease".into(),
            Answer::LeaseKeepAlive(_) => "keep-alive".into(),
            Answer::Refused { message, .. } => format!("refused: {message}"),
            Answer::Failed(_) => "transport failure".into(),
        }
    }
}

fn refusal(error: etcd_client::Error) -> Answer {
    match error {
        // Not an answer: the endpoint is down or unreachable.
        etcd_client::Error::GRpcStatus(status)
            if format!("{:?}", status.code()) == "Unavailable" =>
        {
            Answer::Failed(format!("unavailable: {}", status.message()))
        }
        etcd_client::Error::GRpcStatus(status) => Answer::Refused {
            code: format!("{:?}", status.code()),
            message: status.message().to_owned(),
        },
        other => Answer::Failed(other.to_string()),
    }
}

/// The clients of one endpoint the workload uses.
pub struct Clients {
    pub kv: KvClient,
    pub lease: LeaseClient,
    pub watch: WatchClient,
}

/// Sends `request` and returns the answer with the deployment's ids zeroed.
pub async fn send(clients: &mut Clients, request: &Request) -> Answer {
    let Clients { kv, lease, .. } = clients;
    let answer = match request {
        Request::Range(spec) => kv
            .get(spec.range.key.clone(), Some(get_options(spec)))
            .await
            .map(|r| Answer::Range(r.0)),
        Request::Put(spec) => kv
            .put(
                spec.key.0.clone(),
                spec.value.0.clone(),
                Some(put_options(spec)),
            )
            .await
            .map(|r| Answer::Put(r.0)),
        Request::Delete(spec) => kv
            .delete(spec.range.key.clone(), Some(delete_options(spec)))
            .await
            .map(|r| Answer::Delete(r.0)),
        Request::Txn(spec) => kv.txn(txn(spec)).await.map(|r| Answer::Txn(r.0)),
        Request::Compact { revision, physical } => {
            let options = physical.then(|| CompactionOptions::new().with_physical());
            kv.compact(*revision, options)
                .await
                .map(|r| Answer::Compact(r.0))
        }
        Request::LeaseGrant { id, ttl } => {
            let options = LeaseGrantOptions::new().with_id(*id);
            lease
                .grant(*ttl, Some(options))
                .await
                .map(|r| Answer::LeaseGrant(r.0))
        }
        Request::LeaseRevoke { id } => lease.revoke(*id).await.map(|r| Answer::LeaseRevoke(r.0)),
        Request::LeaseTimeToLive { id, keys } => {
            let options = keys.then(|| LeaseTimeToLiveOptions::new().with_keys());
            lease
                .time_to_live(*id, options)
                .await
                .map(|r| Answer::LeaseTimeToLive(r.0))
        }
        Request::LeaseLeases => lease.leases().await.map(|r| Answer::LeaseLeases(r.0)),
        Request::LeaseKeepAlive { id } => keep_alive_once(lease, *id).await,
    };
    let mut answer = answer.unwrap_or_else(refusal);
    anonymize(&mut answer);
    answer
}

/// One keep-alive of lease `id`, answered whole. `etcd-client` reads the
/// stream's first answer itself and keeps only whether its TTL was above 0,
/// so a lease it renewed is renewed once more and that second answer is
/// the one compared; a TTL of 0 (etcd's answer for a lease that does not
/// exist) comes back as the client's error, and is answered as that TTL
/// with no header.
async fn keep_alive_once(lease: &mut LeaseClient, id: i64) -> Result<Answer, etcd_client::Error> {
    let (mut keeper, mut stream) = match lease.keep_alive(id).await {
        Ok(opened) => opened,
        Err(etcd_client::Error::LeaseKeepAliveError(_)) => {
            return Ok(Answer::LeaseKeepAlive(PbLeaseKeepAliveResponse {
                header: None,
                id,
                ttl: 0,
            }));
        }
        Err(error) => return Err(error),
    };
    keeper.keep_alive().await?;
    match stream.message().await? {
        Some(answer) => Ok(Answer::LeaseKeepAlive(answer.0)),
        None => Ok(Answer::Failed(
            "the keep-alive stream ended unanswered".into(),
        )),
    }
}

/// Zeroes what names the deployment rather than the store: the cluster and
/// member ids and the raft term, in every header (nested ones included).
fn anonymize(answer: &mut Answer) {
    match answer {
        Answer::Range(r) => anonymize_header(&mut r.header),
        Answer::Put(r) => anonymize_header(&mut r.header),
        Answer::Delete(r) => anonymize_header(&mut r.header),
        Answer::Txn(r) => anonymize_txn(r),
        Answer::Compact(r) => anonymize_header(&mut r.header),
        Answer::LeaseGrant(r) => anonymize_header(&mut r.header),
        Answer::LeaseRevoke(r) => anonymize_header(&mut r.header),
        Answer::LeaseTimeToLive(r) => anonymize_header(&mut r.header),
        Answer::LeaseLeases(r) => anonymize_header(&mut r.header),
        Answer::LeaseKeepAlive(r) => anonymize_header(&mut r.header),
        Answer::Refused { .. } | Answer::Failed(_) => {}
    }
}

fn anonymize_txn(response: &mut PbTxnResponse) {
    anonymize_header(&mut response.header);
    for op in &mut response.responses {
        match &mut op.response {
            Some(PbTxnOpResponse::ResponseRange(r)) => anonymize_header(&mut r.header),
            Some(PbTxnOpResponse::ResponsePut(r)) => anonymize_header(&mut r.header),
            Some(PbTxnOpResponse::ResponseDeleteRange(r)) => anonymize_header(&mut r.header),
            Some(PbTxnOpResponse::ResponseTxn(r)) => anonymize_txn(r),
            None => {}
        }
    }
}

fn anonymize_header(header: &mut Option<PbResponseHeader>) {
    if let Some(header) = header {
        header.cluster_id = 0;
        header.member_id = 0;
        header.raft_term = 0;
    }
}

// ---------------------------------------------------------- sort ties ---

/// Puts the keys that tie on a range's sort target in key order. etcd
/// sorts with Go's unstable `sort.Sort`, so the order of tied keys is an
/// accident of its implementation, not part of the answer; where a limit
/// cut the answer, which of the last tied keys made it in is such an
/// accident too, and those keep only their sort value.
pub fn normalize_ties(request: &Request, answer: &mut Answer) {
    match (request, answer) {
        (Request::Range(spec), Answer::Range(response)) => normalize_range(spec, response),
        (Request::Txn(spec), Answer::Txn(response)) => normalize_txn(spec, response),
        _ => {}
    }
}

fn normalize_txn(spec: &TxnSpec, response: &mut PbTxnResponse) {
    let branch = if response.succeeded {
        &spec.success
    } else {
        &spec.failure
    };
    for (op, answer) in branch.iter().zip(&mut response.responses) {
        match (op, &mut answer.response) {
            (TxnOpSpec::Range(spec), Some(PbTxnOpResponse::ResponseRange(r))) => {
                normalize_range(spec, r)
            }
            (TxnOpSpec::Txn(spec), Some(PbTxnOpResponse::ResponseTxn(r))) => normalize_txn(spec, r),
            _ => {}
        }
    }
}

fn normalize_range(spec: &RangeSpec, response: &mut PbRangeResponse) {
    let target = match spec.sort {
        Some((target, _)) if target != SortTarget::Key => target,
        _ => return,
    };
    let sort_value = |kv: &PbKeyValue| match target {
        SortTarget::Version => kv.version.to_string(),
        SortTarget::Create => kv.create_revision.to_string(),
        SortTarget::Mod => kv.mod_revision.to_string(),
        _ => shown(&kv.value),
    };
    let kvs = &mut response.kvs;
    let mut start = 0;
    while start < kvs.len() {
        let value = sort_value(&kvs[start]);
        let end = start
            + kvs[start..]
                .iter()
                .take_while(|kv| sort_value(kv) == value)
                .count();
        kvs[start..end].sort_by(|a, b| a.key.cmp(&b.key));
        let cut = spec.limit > 0 && kvs.len() as i64 == spec.limit && end == kvs.len();
        if cut && response.more {
            for kv in &mut kvs[start..end] {
                *kv = PbKeyValue {
                    key: format!("<one of the keys tied at {value}>").into_bytes(),
                    ..Default::default()
                };
            }
        }
        start = end;
    }
}

// ------------------------------------------------------------ lease ids ---

/// The lease ids the two sides chose for the same grants (see the module
/// docs): left id to right id, and back.
#[derive(Debug, Default)]
pub struct LeaseIds {
    to_right: BTreeMap<i64, i64>,
    to_left: BTreeMap<i64, i64>,
}

impl LeaseIds {
    /// Records the ids both sides chose for a grant that named none.
    pub fn record(&mut self, request: &Request, left: &Answer, right: &Answer) {
        if let (Request::LeaseGrant { id: 0, .. }, Answer::LeaseGrant(l), Answer::LeaseGrant(r)) =
            (request, left, right)
        {
            self.to_right.insert(l.id, r.id);
            self.to_left.insert(r.id, l.id);
        }
    }

    /// `request` (in the left side's ids) as the right side is sent it.
    pub fn right_request(&self, request: &Request) -> Request {
        let mut request = request.clone();
        map_request_leases(&mut request, &|id| lookup(&self.to_right, id));
        request
    }

    /// The right side's lease `id` as the left side's.
    pub fn left_id(&self, id: i64) -> i64 {
        lookup(&self.to_left, id)
    }

    /// The right side's `answer` in the left side's ids.
    pub fn to_left(&self, answer: &mut Answer) {
        map_answer_leases(answer, &|id| lookup(&self.to_left, id));
    }
}

fn lookup(map: &BTreeMap<i64, i64>, id: i64) -> i64 {
    map.get(&id).copied().unwrap_or(id)
}

fn map_request_leases(request: &mut Request, map: &impl Fn(i64) -> i64) {
    match request {
        Request::Put(put) => put.lease = map(put.lease),
        Request::Txn(txn) => map_txn_leases(txn, map),
        Request::LeaseGrant { id, .. }
        | Request::LeaseRevoke { id }
        | Request::LeaseTimeToLive { id, .. }
        | Request::LeaseKeepAlive { id } => *id = map(*id),
        Request::Range(_) | Request::Delete(_) | Request::Compact { .. } | Request::LeaseLeases => {
        }
    }
}

fn map_txn_leases(txn: &mut TxnSpec, map: &impl Fn(i64) -> i64) {
    for compare in &mut txn.compare {
        if let CompareSpecTarget::Lease(lease) = &mut compare.target {
            *lease = map(*lease);
        }
    }
    for op in txn.success.iter_mut().chain(&mut txn.failure) {
        match op {
            TxnOpSpec::Put(put) => put.lease = map(put.lease),
            TxnOpSpec::Txn(nested) => map_txn_leases(nested, map),
            TxnOpSpec::Range(_) | TxnOpSpec::Delete(_) => {}
        }
    }
}

fn map_answer_leases(answer: &mut Answer, map: &impl Fn(i64) -> i64) {
    let map_kvs =
        |kvs: &mut Vec<PbKeyValue>| kvs.iter_mut().for_each(|kv| kv.lease = map(kv.lease));
    match answer {
        Answer::Range(r) => map_kvs(&mut r.kvs),
        Answer::Put(r) => r.prev_kv.iter_mut().for_each(|kv| kv.lease = map(kv.lease)),
        Answer::Delete(r) => map_kvs(&mut r.prev_kvs),
        Answer::Txn(r) => map_txn_answer_leases(r, map),
        Answer::LeaseGrant(r) => r.id = map(r.id),
        Answer::LeaseTimeToLive(r) => r.id = map(r.id),
        Answer::LeaseLeases(r) => r.leases.iter_mut().for_each(|l| l.id = map(l.id)),
        Answer::LeaseKeepAlive(r) => r.id = map(r.id),
        Answer::Compact(_)
        | Answer::LeaseRevoke(_)
        | Answer::Refused { .. }
        | Answer::Failed(_) => {}
    }
}

fn map_txn_answer_leases(response: &mut PbTxnResponse, map: &impl Fn(i64) -> i64) {
    for op in &mut response.responses {
        let mut answer = match op.response.take() {
            Some(PbTxnOpResponse::ResponseRange(r)) => Answer::Range(r),
            Some(PbTxnOpResponse::ResponsePut(r)) => Answer::Put(r),
            Some(PbTxnOpResponse::ResponseDeleteRange(r)) => Answer::Delete(r),
            Some(PbTxnOpResponse::ResponseTxn(r)) => Answer::Txn(r),
            None => continue,
        };
        map_answer_leases(&mut answer, map);
        op.response = match answer {
            Answer::Range(r) => Some(PbTxnOpResponse::ResponseRange(r)),
            Answer::Put(r) => Some(PbTxnOpResponse::ResponsePut(r)),
            Answer::Delete(r) => Some(PbTxnOpResponse::ResponseDeleteRange(r)),
            Answer::Txn(r) => Some(PbTxnOpResponse::ResponseTxn(r)),
            _ => unreachable!("a txn operation's answer stays one"),
        };
    }
}

/// Makes two answers to one lease read comparable: the keys of a lease
/// and the ids of the leases as sets (etcd lists both from Go maps, in no
/// set order), and two remaining TTLs within
/// [`REMAINING_TTL_TOLERANCE_SECS`] of each other as the left one.
pub fn reconcile_lease_reads(left: &mut Answer, right: &mut Answer) {
    for answer in [&mut *left, &mut *right] {
        match answer {
            Answer::LeaseTimeToLive(r) => r.keys.sort(),
            Answer::LeaseLeases(r) => r.leases.sort_by_key(|lease| lease.id),
            _ => {}
        }
    }
    if let (Answer::LeaseTimeToLive(l), Answer::LeaseTimeToLive(r)) = (left, right)
        && l.ttl > 0
        && r.ttl > 0
        && (l.ttl - r.ttl).abs() <= REMAINING_TTL_TOLERANCE_SECS
    {
        r.ttl = l.ttl;
    }
}

// ------------------------------------------------- field-by-field diffs ---

/// Every field of an answer as `(path, value)`, in message order, so the
/// first differing field of two answers can be named.
pub fn fields(answer: &Answer) -> Vec<(String, String)> {
    let mut out = Vec::new();
    match answer {
        Answer::Range(r) => range_fields("range", r, &mut out),
        Answer::Put(r) => put_fields("put", r, &mut out),
        Answer::Delete(r) => delete_fields("delete_range", r, &mut out),
        Answer::Txn(r) => txn_fields("txn", r, &mut out),
        Answer::Compact(r) => header_fields("compact", &r.header, &mut out),
        Answer::LeaseGrant(r) => {
            header_fields("lease_grant", &r.header, &mut out);
            out.push(("lease_grant.id".into(), r.id.to_string()));
            out.push(("lease_grant.ttl".into(), r.ttl.to_string()));
            out.push(("lease_grant.error".into(), format!("{:?}", r.error)));
        }
        Answer::LeaseRevoke(r) => header_fields("lease_revoke", &r.header, &mut out),
        Answer::LeaseTimeToLive(r) => {
            header_fields("lease_time_to_live", &r.header, &mut out);
            out.push(("lease_time_to_live.id".into(), r.id.to_string()));
            out.push(("lease_time_to_live.ttl".into(), r.ttl.to_string()));
            let granted = r.granted_ttl.to_string();
            out.push(("lease_time_to_live.granted_ttl".into(), granted));
            let keys: Vec<_> = r.keys.iter().map(|key| shown(key)).collect();
            out.push(("lease_time_to_live.keys".into(), format!("{keys:?}")));
        }
        Answer::LeaseLeases(r) => {
            header_fields("lease_leases", &r.header, &mut out);
            let ids: Vec<_> = r.leases.iter().map(|lease| lease.id).collect();
            out.push(("lease_leases.leases".into(), format!("{ids:?}")));
        }
        Answer::LeaseKeepAlive(r) => {
            header_fields("lease_keep_alive", &r.header, &mut out);
            out.push(("lease_keep_alive.id".into(), r.id.to_string()));
            out.push(("lease_keep_alive.ttl".into(), r.ttl.to_string()));
        }
        Answer::Refused { code, message } => {
            out.push(("refused.code".into(), code.clone()));
            out.push(("refused.message".into(), format!("{message:?}")));
        }
        Answer::Failed(why) => out.push(("transport_failure".into(), why.clone())),
    }
    out
}

fn header_fields(path: &str, header: &Option<PbResponseHeader>, out: &mut Vec<(String, String)>) {
    match header {
        Some(h) => out.push((format!("{path}.header.revision"), h.revision.to_string())),
        None => out.push((format!("{path}.header"), "none".into())),
    }
}

fn kv_fields(path: &str, kv: &PbKeyValue, out: &mut Vec<(String, String)>) {
    out.push((format!("{path}.key"), shown(&kv.key)));
    out.push((format!("{path}.value"), shown(&kv.value)));
    out.push((
        format!("{path}.create_revision"),
        kv.create_revision.to_string(),
    ));
    out.push((format!("{path}.mod_revision"), kv.mod_revision.to_string()));
    out.push((format!("{path}.version"), kv.version.to_string()));
    out.push((format!("{path}.lease"), kv.lease.to_string()));
}

fn kvs_fields(path: &str, kvs: &[PbKeyValue], out: &mut Vec<(String, String)>) {
    out.push((format!("{path}.len()"), kvs.len().to_string()));
    for (i, kv) in kvs.iter().enumerate() {
        kv_fields(&format!("{path}[{i}]"), kv, out);
    }
}

fn range_fields(path: &str, r: &PbRangeResponse, out: &mut Vec<(String, String)>) {
    header_fields(path, &r.header, out);
    out.push((format!("{path}.count"), r.count.to_string()));
    out.push((format!("{path}.more"), r.more.to_string()));
    kvs_fields(&format!("{path}.kvs"), &r.kvs, out);
}

fn put_fields(path: &str, r: &PbPutResponse, out: &mut Vec<(String, String)>) {
    header_fields(path, &r.header, out);
    match &r.prev_kv {
        Some(kv) => kv_fields(&format!("{path}.prev_kv"), kv, out),
        None => out.push((format!("{path}.prev_kv"), "none".into())),
    }
}

fn delete_fields(path: &str, r: &PbDeleteResponse, out: &mut Vec<(String, String)>) {
    header_fields(path, &r.header, out);
    out.push((format!("{path}.deleted"), r.deleted.to_string()));
    kvs_fields(&format!("{path}.prev_kvs"), &r.prev_kvs, out);
}

fn txn_fields(path: &str, r: &PbTxnResponse, out: &mut Vec<(String, String)>) {
    header_fields(path, &r.header, out);
    out.push((format!("{path}.succeeded"), r.succeeded.to_string()));
    out.push((
        format!("{path}.responses.len()"),
        r.responses.len().to_string(),
    ));
    for (i, op) in r.responses.iter().enumerate() {
        let at = format!("{path}.responses[{i}]");
        match &op.response {
            Some(PbTxnOpResponse::ResponseRange(r)) => range_fields(&format!("{at}.range"), r, out),
            Some(PbTxnOpResponse::ResponsePut(r)) => put_fields(&format!("{at}.put"), r, out),
            Some(PbTxnOpResponse::ResponseDeleteRange(r)) => {
                delete_fields(&format!("{at}.delete_range"), r, out)
            }
            Some(PbTxnOpResponse::ResponseTxn(r)) => txn_fields(&format!("{at}.txn"), r, out),
            None => out.push((at, "none".into())),
        }
    }
}

/// The first field where two answers differ, as a sentence; `None` when
/// they agree on every field listed. Answers that list the same fields but
/// differ elsewhere (a field this list misses) are reported whole.
pub fn first_difference(left: &Answer, right: &Answer) -> Option<String> {
    if left == right {
        return None;
    }
    let (left_fields, right_fields) = (fields(left), fields(right));
    for i in 0..left_fields.len().max(right_fields.len()) {
        match (left_fields.get(i), right_fields.get(i)) {
            (Some(l), Some(r)) if l == r => continue,
            (Some((path, l)), Some((rpath, r))) if path == rpath => {
                return Some(format!("field {path}: {l} vs {r}"));
            }
            (l, r) => return Some(format!("answer shape: {l:?} vs {r:?}")),
        }
    }
    Some("a field outside the compared list differs (see both answers)".into())
}

/// Bytes as a quoted string (invalid UTF-8 shown as U+FFFD).
pub fn shown(bytes: &[u8]) -> String {
    format!("{:?}", String::from_utf8_lossy(bytes))
}

// ------------------------------------------------------------- workload ---

/// The seeded generator of requests. Revisions it draws come from the
/// answers of the first endpoint, which it is told after every request.
pub struct Workload {
    rng: StdRng,
    /// The store revision as last answered.
    revision: i64,
    /// The compaction revision as last accepted (0 before any).
    compacted: i64,
    /// The leases granted and not revoked, in the first endpoint's ids.
    live_leases: Vec<i64>,
    /// The leases revoked and not granted again.
    revoked_leases: Vec<i64>,
    /// Requests drawn ahead (the revoke of a short lease, the keep-alives
    /// after the takeover), sent before any new one.
    queued: VecDeque<Request>,
    /// The number of the next request.
    op: usize,
    /// The request before which the sides take over.
    midpoint: usize,
    /// Whether both sides serve the Lease service's reads (TimeToLive,
    /// Leases, KeepAlive); the machine in process does not.
    lease_reads: bool,
}

impl Workload {
    fn new(seed: u64, midpoint: usize, lease_reads: bool) -> Workload {
        Workload {
            rng: StdRng::seed_from_u64(seed),
            revision: 1,
            compacted: 0,
            live_leases: Vec::new(),
            revoked_leases: Vec::new(),
            queued: VecDeque::new(),
            op: 0,
            midpoint,
            lease_reads,
        }
    }

    /// Learns from the first endpoint's answer to `request`.
    fn observe(&mut self, request: &Request, answer: &Answer) {
        if let Some(revision) = answer.revision() {
            self.revision = revision;
        }
        match (request, answer) {
            (Request::Compact { revision, .. }, Answer::Compact(_)) => self.compacted = *revision,
            (Request::LeaseGrant { ttl, .. }, Answer::LeaseGrant(granted)) => {
                self.live_leases.push(granted.id);
                self.revoked_leases.retain(|id| *id != granted.id);
                if *ttl < LONG_LEASE_TTL_SECS {
                    let revoke = Request::LeaseRevoke { id: granted.id };
                    self.queued.push_front(revoke);
                }
            }
            (Request::LeaseRevoke { id }, Answer::LeaseRevoke(_)) => {
                self.live_leases.retain(|live| live != id);
                self.revoked_leases.push(*id);
            }
            _ => {}
        }
    }

    fn chance(&mut self, probability: f64) -> bool {
        self.rng.random_bool(probability)
    }

    /// A key of one or two letters.
    fn key(&mut self) -> Vec<u8> {
        let len = self.rng.random_range(1..=2);
        (0..len)
            .map(|_| *KEY_LETTERS.choose(&mut self.rng).unwrap())
            .collect()
    }

    /// A key, now and then an empty one (which etcd refuses).
    fn key_or_empty(&mut self) -> Vec<u8> {
        if self.chance(0.02) {
            Vec::new()
        } else {
            self.key()
        }
    }

    fn value(&mut self) -> Vec<u8> {
        VALUES.choose(&mut self.rng).unwrap().as_bytes().to_vec()
    }

    /// A single key, a prefix, a from-key range, every key, or an explicit
    /// range (possibly empty or inverted); now and then an empty key.
    fn key_range(&mut self) -> KeyRange {
        let key = self.key_or_empty();
        match self.rng.random_range(0..100) {
            0..45 => KeyRange {
                key,
                range_end: Vec::new(),
            },
            45..65 => {
                let prefix = key[..key.len().min(1)].to_vec();
                KeyRange {
                    range_end: prefix_end(&prefix),
                    key: prefix,
                }
            }
            65..75 => KeyRange {
                key,
                range_end: vec![0],
            },
            75..80 => KeyRange {
                key: vec![0],
                range_end: vec![0],
            },
            _ => KeyRange {
                key,
                range_end: self.key(),
            },
        }
    }

    /// A revision for a read: current (0 or exactly), past, compacted,
    /// future or negative.
    fn read_revision(&mut self) -> i64 {
        let floor = self.compacted.max(1);
        match self.rng.random_range(0..100) {
            0..40 => 0,
            40..65 => self.rng.random_range(floor..=self.revision),
            65..75 if self.compacted > 1 => self.rng.random_range(1..self.compacted),
            65..75 => self.compacted,
            75..85 => self.revision + self.rng.random_range(1..=3),
            85..90 => -self.rng.random_range(1..=3),
            _ => self.revision,
        }
    }

    /// A revision bound for min/max mod/create: mostly unset.
    fn revision_bound(&mut self) -> i64 {
        if self.chance(0.12) {
            self.rng.random_range(0..=self.revision + 2)
        } else {
            0
        }
    }

    fn range_spec(&mut self) -> RangeSpec {
        const TARGETS: [SortTarget; 5] = [
            SortTarget::Key,
            SortTarget::Version,
            SortTarget::Create,
            SortTarget::Mod,
            SortTarget::Value,
        ];
        const ORDERS: [SortOrder; 3] = [SortOrder::None, SortOrder::Ascend, SortOrder::Descend];
        let range = self.key_range();
        let limit = match self.rng.random_range(0..100) {
            0..50 => 0,
            50..97 => self.rng.random_range(1..=4),
            _ => -1,
        };
        let sort = self.chance(0.4).then(|| {
            (
                *TARGETS.choose(&mut self.rng).unwrap(),
                *ORDERS.choose(&mut self.rng).unwrap(),
            )
        });
        RangeSpec {
            range,
            limit,
            revision: self.read_revision(),
            sort,
            serializable: self.chance(0.3),
            keys_only: self.chance(0.15),
            count_only: self.chance(0.1),
            min_mod_revision: self.revision_bound(),
            max_mod_revision: self.revision_bound(),
            min_create_revision: self.revision_bound(),
            max_create_revision: self.revision_bound(),
        }
    }

    fn put_spec(&mut self) -> PutSpec {
        let ignore_value = self.chance(0.06);
        let value = if ignore_value && self.chance(0.8) {
            Vec::new()
        } else {
            self.value()
        };
        PutSpec {
            key: Text(self.key_or_empty()),
            value: Text(value),
            lease: self.put_lease(),
            prev_kv: self.chance(0.4),
            ignore_value,
            ignore_lease: self.chance(0.06),
        }
    }

    /// A live lease, if there is one.
    fn live_lease(&mut self) -> Option<i64> {
        self.live_leases.choose(&mut self.rng).copied()
    }

    /// A lease that does not exist: revoked, or never granted.
    fn dead_lease(&mut self) -> i64 {
        match self.revoked_leases.choose(&mut self.rng) {
            Some(revoked) if self.rng.random_bool(0.6) => *revoked,
            _ => UNKNOWN_LEASE_ID,
        }
    }

    /// The lease of a put: mostly none, else a live one, a revoked one or
    /// one never granted (the last two refused).
    fn put_lease(&mut self) -> i64 {
        match self.rng.random_range(0..100) {
            0..72 => 0,
            72..94 => self.live_lease().unwrap_or(0),
            _ => self.dead_lease(),
        }
    }

    /// The lease a compare compares with: none, a live one, a dead one.
    fn compared_lease(&mut self) -> i64 {
        match self.rng.random_range(0..100) {
            0..40 => 0,
            40..85 => self.live_lease().unwrap_or(0),
            _ => self.dead_lease(),
        }
    }

    /// A grant: the server's choice of id, a client's (one that may exist,
    /// or a live one), with a TTL below the minimum, long, or too long. No
    /// short lease is granted just before the takeover: its revoke would
    /// come after, and the takeover may outlast it.
    fn lease_grant(&mut self) -> Request {
        let mut ttl = *GRANT_TTLS_SECS.choose(&mut self.rng).unwrap();
        if ttl < LONG_LEASE_TTL_SECS && self.op + 1 == self.midpoint {
            ttl = LONG_LEASE_TTL_SECS;
        }
        let id = match self.rng.random_range(0..100) {
            0..55 => 0,
            55..85 => *CLIENT_LEASE_IDS.choose(&mut self.rng).unwrap(),
            _ => self.live_lease().unwrap_or(0),
        };
        Request::LeaseGrant { id, ttl }
    }

    /// A revoke of a live lease, a revoked one, one never granted, or id 0.
    fn lease_revoke(&mut self) -> Request {
        let id = match self.rng.random_range(0..100) {
            0..65 => self.live_lease().unwrap_or(UNKNOWN_LEASE_ID),
            65..90 => self.dead_lease(),
            _ => 0,
        };
        Request::LeaseRevoke { id }
    }

    /// A read of the Lease service: one lease's TTL (live or dead, with or
    /// without its keys), the list of leases, or one keep-alive.
    fn lease_read(&mut self) -> Request {
        let lease = |workload: &mut Workload| match workload.rng.random_range(0..100) {
            0..75 => workload.live_lease().unwrap_or(UNKNOWN_LEASE_ID),
            _ => workload.dead_lease(),
        };
        match self.rng.random_range(0..10) {
            0..5 => Request::LeaseTimeToLive {
                id: lease(self),
                keys: self.chance(0.6),
            },
            5..7 => Request::LeaseLeases,
            _ => Request::LeaseKeepAlive { id: lease(self) },
        }
    }

    /// A request of the Lease service.
    fn lease_request(&mut self) -> Request {
        if self.live_leases.len() >= MAX_LIVE_LEASES {
            return Request::LeaseRevoke {
                id: self.live_lease().expect("leases are live"),
            };
        }
        match self.rng.random_range(0..10) {
            0..4 => self.lease_grant(),
            4..7 => self.lease_revoke(),
            _ if self.lease_reads => self.lease_read(),
            _ => self.lease_grant(),
        }
    }

    fn delete_spec(&mut self) -> DeleteSpec {
        DeleteSpec {
            range: self.key_range(),
            prev_kv: self.chance(0.5),
        }
    }

    fn compare_spec(&mut self) -> CompareSpec {
        const OPS: [CompareOp; 4] = [
            CompareOp::Equal,
            CompareOp::Greater,
            CompareOp::Less,
            CompareOp::NotEqual,
        ];
        let range = if self.chance(0.8) {
            KeyRange {
                key: self.key(),
                range_end: Vec::new(),
            }
        } else {
            self.key_range()
        };
        let around = self.revision + 1;
        let target = match self.rng.random_range(0..5) {
            0 => CompareSpecTarget::Version(self.rng.random_range(0..=4)),
            1 => CompareSpecTarget::Create(self.rng.random_range(0..=around)),
            2 => CompareSpecTarget::Mod(self.rng.random_range(0..=around)),
            3 => CompareSpecTarget::Value(Text(self.value())),
            _ => CompareSpecTarget::Lease(self.compared_lease()),
        };
        CompareSpec {
            range,
            op: *OPS.choose(&mut self.rng).unwrap(),
            target,
        }
    }

    fn txn_op_spec(&mut self, depth: usize) -> TxnOpSpec {
        let nested_chance = if depth < MAX_TXN_DEPTH { 0.12 } else { 0.0 };
        if self.chance(nested_chance) {
            return TxnOpSpec::Txn(self.txn_spec(depth + 1));
        }
        match self.rng.random_range(0..10) {
            0..4 => TxnOpSpec::Range(self.range_spec()),
            4..8 => TxnOpSpec::Put(self.put_spec()),
            _ => TxnOpSpec::Delete(self.delete_spec()),
        }
    }

    fn branch(&mut self, depth: usize) -> Vec<TxnOpSpec> {
        let len = self.rng.random_range(0..=3);
        (0..len).map(|_| self.txn_op_spec(depth)).collect()
    }

    fn txn_spec(&mut self, depth: usize) -> TxnSpec {
        let compares = self.rng.random_range(0..=3);
        let compare = (0..compares).map(|_| self.compare_spec()).collect();
        if depth == 0 && self.chance(0.02) {
            // One operation more than etcd allows in a branch.
            let reads = (0..=MAX_TXN_OPS)
                .map(|_| TxnOpSpec::Range(self.range_spec()))
                .collect();
            return TxnSpec {
                compare,
                success: reads,
                failure: Vec::new(),
            };
        }
        let mut txn = TxnSpec {
            compare,
            success: self.branch(depth),
            failure: self.branch(depth),
        };
        if depth == 0 && txn.deletes_from_key() {
            // etcd's duplicate-key check misses a put inside a from-key
            // delete's range; a put with ignore_value or ignore_lease after
            // such a delete of its key then fails mid-apply, and etcd 3.4
            // panics ("unexpected error during txn"). The oracle must live.
            txn.clear_ignores();
        }
        txn
    }

    fn compact_revision(&mut self) -> i64 {
        match self.rng.random_range(0..100) {
            0..70 if self.revision > self.compacted => {
                self.rng.random_range(self.compacted + 1..=self.revision)
            }
            0..80 => self.compacted.max(1) - self.rng.random_range(0..=1),
            80..90 => self.revision + self.rng.random_range(1..=2),
            _ => self.revision,
        }
    }

    /// The next request. Right after the takeover every live lease is kept
    /// alive once on both sides, as etcd's new leader extends every lease
    /// by its TTL (Chorus's new primary does it on its own), so that later
    /// remaining TTLs compare.
    fn next(&mut self) -> Request {
        let op = self.op;
        self.op += 1;
        if op == self.midpoint && self.lease_reads {
            let live = self.live_leases.iter();
            let keep_alives = live.map(|id| Request::LeaseKeepAlive { id: *id });
            self.queued.extend(keep_alives.collect::<Vec<_>>());
        }
        if let Some(queued) = self.queued.pop_front() {
            return queued;
        }
        match self.rng.random_range(0..100) {
            0..26 => Request::Put(self.put_spec()),
            26..54 => Request::Range(self.range_spec()),
            54..63 => Request::Delete(self.delete_spec()),
            63..90 => Request::Txn(self.txn_spec(0)),
            90..93 => Request::Compact {
                revision: self.compact_revision(),
                physical: self.chance(0.5),
            },
            _ => self.lease_request(),
        }
    }
}

/// The end of the range of keys starting with `prefix` (etcd's `GetPrefix`).
fn prefix_end(prefix: &[u8]) -> Vec<u8> {
    let mut end = prefix.to_vec();
    while let Some(last) = end.pop() {
        if last < 0xff {
            end.push(last + 1);
            return end;
        }
    }
    vec![0]
}

// -------------------------------------------------------------- watches ---

/// The chance that a watch opens before a request: about 40 in a seed of
/// 10 000 requests.
const WATCH_CHANCE: f64 = 1.0 / 250.0;
/// Watches open at once at most (they are compared and closed at the
/// takeover and at the end of the seed).
const MAX_OPEN_WATCHES: usize = 32;
/// How long no watch of either side may have received anything before
/// their responses are compared: etcd catches a watch from the past up
/// every 100 ms, and sends live events at once.
const WATCH_QUIET: Duration = Duration::from_millis(1_500);
/// How long comparing the watches waits for them to fall quiet at most.
const WATCH_DRAIN_PATIENCE: Duration = Duration::from_secs(60);
/// How long a created response may take.
const WATCH_CREATE_PATIENCE: Duration = Duration::from_secs(10);
/// How long the workload waits after creating a watch from the past: etcd
/// catches it up (or cancels it as compacted) within 100 ms, and decides
/// with the compaction point of that moment, where Chorus decides at once;
/// a compaction in between would be a race, not a difference.
const WATCH_CATCH_UP: Duration = Duration::from_millis(300);
/// Mixed into the seed for the watches' generator, so that a seed's
/// requests are the ones it sent before watches were drawn.
const WATCH_SEED_SALT: u64 = 0x7761_7463_6865_7321;

/// Where a watch starts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WatchStart {
    /// start_revision 0: the next revision.
    Next,
    /// The store revision as last answered.
    Current,
    /// A revision after the compaction point, in the retained history.
    Past,
    /// A revision below the compaction point: etcd cancels the watch with
    /// `compact_revision`.
    Compacted,
}

/// A watch the workload opens on both sides.
#[derive(Debug, Clone)]
pub struct WatchSpec {
    pub range: KeyRange,
    pub start: WatchStart,
    pub start_revision: i64,
    pub prev_kv: bool,
    pub no_put: bool,
    pub no_delete: bool,
}

impl WatchSpec {
    fn options(&self) -> WatchOptions {
        let mut options = WatchOptions::new().with_start_revision(self.start_revision);
        if !self.range.range_end.is_empty() {
            options = options.with_range(self.range.range_end.clone());
        }
        if self.prev_kv {
            options = options.with_prev_key();
        }
        let mut filters = Vec::new();
        if self.no_put {
            filters.push(WatchFilterType::NoPut);
        }
        if self.no_delete {
            filters.push(WatchFilterType::NoDelete);
        }
        options.with_filters(filters)
    }

    /// The options it exercises, for the coverage check.
    fn kinds(&self) -> Vec<&'static str> {
        let range = match self.range.range_end.as_slice() {
            [] => "watch of a key",
            [0] => "watch from a key on",
            end if *end == prefix_end(&self.range.key) => "watch of a prefix",
            _ => "watch of a range",
        };
        let start = match self.start {
            WatchStart::Next => "watch from the next revision",
            WatchStart::Current => "watch from the current revision",
            WatchStart::Past => "watch from a past revision",
            WatchStart::Compacted => "watch from a compacted revision",
        };
        let options = [
            (self.prev_kv, "watch with prev_kv"),
            (self.no_put, "watch without puts"),
            (self.no_delete, "watch without deletes"),
        ];
        let chosen = options.into_iter().filter(|(on, _)| *on);
        [range, start]
            .into_iter()
            .chain(chosen.map(|(_, kind)| kind))
            .collect()
    }
}

/// The responses of one side's watch, read as they come by a task of
/// their own (a watcher that stops reading is cut off by the server).
struct WatchFeed {
    /// Keeps the request stream, so the watch, open.
    _requests: WatchRequestSender,
    arrivals: mpsc::UnboundedReceiver<Resp>,
    reader: tokio::task::JoinHandle<()>,
    seen: Vec<Resp>,
}

impl WatchFeed {
    /// Opens `spec` with `client`; the created response is read before
    /// it returns, so the watch is registered before the next request.
    async fn open(client: &mut WatchClient, spec: &WatchSpec) -> Result<WatchFeed, String> {
        let stream = client
            .watch(spec.range.key.clone(), Some(spec.options()))
            .await
            .map_err(|e| format!("cannot open the watch: {e}"))?;
        let (requests, mut responses) = stream.split();
        let (sender, arrivals) = mpsc::unbounded_channel();
        let reader = tokio::spawn(async move {
            loop {
                let ended = match responses.message().await {
                    Ok(Some(message)) => {
                        let _ = sender.send(resp(&message));
                        continue;
                    }
                    Ok(None) => "the stream ended".to_owned(),
                    Err(error) => format!("the stream failed: {error}"),
                };
                let end = Resp {
                    cancel_reason: ended,
                    ..Resp::default()
                };
                let _ = sender.send(end);
                return;
            }
        });
        let mut feed = WatchFeed {
            _requests: requests,
            arrivals,
            reader,
            seen: Vec::new(),
        };
        match tokio::time::timeout(WATCH_CREATE_PATIENCE, feed.arrivals.recv()).await {
            Ok(Some(created)) => feed.seen.push(created),
            _ => return Err("no created response".into()),
        }
        Ok(feed)
    }

    /// Takes what arrived; whether anything did.
    fn take_arrivals(&mut self) -> bool {
        let before = self.seen.len();
        while let Ok(response) = self.arrivals.try_recv() {
            self.seen.push(response);
        }
        self.seen.len() > before
    }
}

impl Drop for WatchFeed {
    fn drop(&mut self) {
        self.reader.abort();
    }
}

/// A watch open on both sides.
struct OpenWatch {
    spec: WatchSpec,
    /// The request before which it opened.
    op: usize,
    left: WatchFeed,
    right: WatchFeed,
}

/// The watches of a seed: drawn by a generator of their own, opened on
/// both sides before seeded requests, compared and closed before the
/// takeover and at the end.
pub struct Watches {
    rng: StdRng,
    open: Vec<OpenWatch>,
}

impl Watches {
    fn new(seed: u64) -> Watches {
        Watches {
            rng: StdRng::seed_from_u64(seed ^ WATCH_SEED_SALT),
            open: Vec::new(),
        }
    }

    fn key(&mut self) -> Vec<u8> {
        let len = self.rng.random_range(1..=2);
        (0..len)
            .map(|_| *KEY_LETTERS.choose(&mut self.rng).unwrap())
            .collect()
    }

    fn range(&mut self) -> KeyRange {
        let key = self.key();
        let range_end = match self.rng.random_range(0..4) {
            0 => Vec::new(),
            1 => prefix_end(&key[..1]),
            2 => vec![0],
            _ => {
                let mut end = self.key();
                end.push(b'z');
                end
            }
        };
        let key = match range_end.as_slice() {
            [] | [0] => key,
            end if *end == prefix_end(&key[..1]) => key[..1].to_vec(),
            end => match key.as_slice() < end {
                true => key,
                false => KEY_LETTERS[..1].to_vec(),
            },
        };
        KeyRange { key, range_end }
    }

    /// A watch, its start drawn from the workload's revisions.
    fn spec(&mut self, workload: &Workload) -> WatchSpec {
        let (revision, compacted) = (workload.revision, workload.compacted);
        let mut start = match self.rng.random_range(0..4) {
            0 => WatchStart::Next,
            1 => WatchStart::Current,
            2 => WatchStart::Past,
            _ => WatchStart::Compacted,
        };
        if start == WatchStart::Compacted && compacted < 2 {
            start = WatchStart::Past;
        }
        // Never at the compaction revision itself: etcd 3.4 loses a delete
        // there (etcd issue 19179; docs/etcd.md).
        if matches!(start, WatchStart::Current | WatchStart::Past) && compacted >= revision {
            start = WatchStart::Next;
        }
        let start_revision = match start {
            WatchStart::Next => 0,
            WatchStart::Current => revision,
            WatchStart::Past => self.rng.random_range(compacted + 1..=revision),
            WatchStart::Compacted => self.rng.random_range((compacted - 3).max(1)..compacted),
        };
        WatchSpec {
            range: self.range(),
            start,
            start_revision,
            prev_kv: self.rng.random_bool(0.5),
            no_put: self.rng.random_bool(0.2),
            no_delete: self.rng.random_bool(0.2),
        }
    }

    /// Before request `op`: now and then opens a watch on both sides.
    async fn maybe_open(
        &mut self,
        op: usize,
        workload: &Workload,
        left: &impl Side,
        right: &impl Side,
        tally: &mut Tally,
    ) {
        if !self.rng.random_bool(WATCH_CHANCE) || self.open.len() >= MAX_OPEN_WATCHES {
            return;
        }
        let (Some(mut left_client), Some(mut right_client)) =
            (left.watch_client(), right.watch_client())
        else {
            return;
        };
        let spec = self.spec(workload);
        let open = |client: &'static str, result: Result<WatchFeed, String>| {
            result.unwrap_or_else(|why| panic!("operation {op}: {client}: {spec:?}: {why}"))
        };
        let left_feed = open("left", WatchFeed::open(&mut left_client, &spec).await);
        let right_feed = open("right", WatchFeed::open(&mut right_client, &spec).await);
        if spec.start != WatchStart::Next {
            tokio::time::sleep(WATCH_CATCH_UP).await;
        }
        for kind in spec.kinds() {
            *tally.requests.entry(kind).or_default() += 1;
        }
        self.open.push(OpenWatch {
            spec,
            op,
            left: left_feed,
            right: right_feed,
        });
    }

    /// Waits until no watch of either side has received anything for
    /// [`WATCH_QUIET`], then compares every watch and closes them all.
    async fn compare_and_close(
        &mut self,
        lease_ids: &LeaseIds,
        compacted: i64,
        tally: &mut Tally,
    ) -> Result<(), String> {
        let started = Instant::now();
        let mut last_arrival = started;
        while last_arrival.elapsed() < WATCH_QUIET && started.elapsed() < WATCH_DRAIN_PATIENCE {
            tokio::time::sleep(Duration::from_millis(50)).await;
            for watch in &mut self.open {
                if watch.left.take_arrivals() | watch.right.take_arrivals() {
                    last_arrival = Instant::now();
                }
            }
        }
        for watch in std::mem::take(&mut self.open) {
            let compared = compare_watch(&watch, lease_ids, compacted).map_err(|why| {
                format!(
                    "the watch opened before operation {} differs: {why}\n  watch: {:?}\n  \
                     left:  {:?}\n  right: {:?}",
                    watch.op, watch.spec, watch.left.seen, watch.right.seen
                )
            })?;
            tally.watches += 1;
            tally.watch_events += compared.events;
            for outcome in compared.outcomes {
                *tally.outcomes.entry(outcome.to_owned()).or_default() += 1;
            }
        }
        Ok(())
    }
}

/// What comparing one watch found alike on both sides.
struct WatchCompared {
    events: usize,
    outcomes: Vec<&'static str>,
}

/// The events of one revision, in the order delivered.
type RevisionEvents = (i64, Vec<Ev>);

/// etcd reads an event's previous entry when it sends the event (at the
/// revision before the event's), so a compaction that reaches the event's
/// revision before the send leaves prev_kv out; Chorus reads it as the
/// revision applies. Which comes first is a race, not a difference: where
/// one side has an event's previous entry and the other has none, and a
/// compaction reached that revision, the entry is dropped before the sides
/// are compared. Returns whether it dropped one.
fn forgive_compacted_prev(
    left: &mut [RevisionEvents],
    right: &mut [RevisionEvents],
    compacted: i64,
) -> bool {
    let mut forgiven = false;
    for ((at, left), (right_at, right)) in left.iter_mut().zip(right.iter_mut()) {
        if at != right_at || *at > compacted {
            continue;
        }
        for (left, right) in left.iter_mut().zip(right.iter_mut()) {
            if left.kv == right.kv && left.prev.is_some() != right.prev.is_some() {
                left.prev = None;
                right.prev = None;
                forgiven = true;
            }
        }
    }
    forgiven
}

/// Compares one watch's responses: the responses without events (created,
/// canceled with compact_revision) field by field, the header revision of
/// a compaction cancel aside (etcd's is 0, Chorus's the store revision);
/// then the events grouped by revision, as etcd may cut a stream's
/// responses elsewhere but never splits a revision. The right side's lease
/// ids are read as the left side's. `compacted` is the compaction revision
/// as last accepted.
fn compare_watch(
    watch: &OpenWatch,
    lease_ids: &LeaseIds,
    compacted: i64,
) -> Result<WatchCompared, String> {
    let mut left = by_revision(&watch.left.seen).map_err(|why| format!("left: {why}"))?;
    let mut right = by_revision(&watch.right.seen).map_err(|why| format!("right: {why}"))?;
    for (_, events) in &mut right {
        for event in events {
            event.kv.5 = lease_ids.left_id(event.kv.5);
            if let Some(prev) = &mut event.prev {
                prev.5 = lease_ids.left_id(prev.5);
            }
        }
    }
    let (left_other, right_other) = (
        without_events(&watch.left.seen),
        without_events(&watch.right.seen),
    );
    if left_other != right_other {
        return Err(format!(
            "responses without events: left {left_other:?}, right {right_other:?}"
        ));
    }
    let forgiven = forgive_compacted_prev(&mut left, &mut right, compacted);
    if let Some(at) = (0..left.len().max(right.len())).find(|i| left.get(*i) != right.get(*i)) {
        return Err(format!(
            "events, revision group {at}: left {:?}, right {:?}",
            left.get(at),
            right.get(at)
        ));
    }
    let events: Vec<&Ev> = left.iter().flat_map(|(_, events)| events).collect();
    let outcomes = [
        (
            left_other.iter().any(|r| r.compact_revision != 0),
            "watch canceled as compacted",
        ),
        (
            left.iter().any(|(_, e)| e.len() > 1),
            "watch revision of several events",
        ),
        (events.iter().any(|e| !e.put), "watch delete event"),
        (
            events.iter().any(|e| e.prev.is_some()),
            "watch event with prev_kv",
        ),
        (
            events.iter().any(|e| e.kv.5 != 0),
            "watch event with a lease",
        ),
        (forgiven, "watch prev_kv lost to a compaction on one side"),
    ];
    Ok(WatchCompared {
        events: events.len(),
        outcomes: outcomes
            .into_iter()
            .filter(|(seen, _)| *seen)
            .map(|(_, outcome)| outcome)
            .collect(),
    })
}

/// The responses without events, the header revision of compaction
/// cancels unset.
fn without_events(responses: &[Resp]) -> Vec<Resp> {
    let other = responses.iter().filter(|r| r.events.is_empty());
    other
        .map(|response| {
            let mut response = response.clone();
            if response.compact_revision != 0 {
                response.revision = 0;
            }
            response
        })
        .collect()
}

/// The events of `responses` grouped by revision; an error if a revision
/// is split across responses (not fragmenting) or revisions go back.
fn by_revision(responses: &[Resp]) -> Result<Vec<RevisionEvents>, String> {
    let mut groups: Vec<RevisionEvents> = Vec::new();
    let mut group_response = Vec::new();
    for (number, response) in responses.iter().enumerate() {
        for event in &response.events {
            let revision = event.kv.3;
            match groups.last_mut() {
                Some((last, events)) if *last == revision => {
                    if *group_response.last().unwrap() != number {
                        return Err(format!("revision {revision} split across responses"));
                    }
                    events.push(event.clone());
                }
                Some((last, _)) if *last > revision => {
                    return Err(format!("revision {revision} after revision {last}"));
                }
                _ => {
                    groups.push((revision, vec![event.clone()]));
                    group_response.push(number);
                }
            }
        }
    }
    Ok(groups)
}

// -------------------------------------------------------------- drivers ---

/// One side of the comparison: something that answers etcd requests.
pub trait Side {
    /// A name for reports.
    fn name(&self) -> String;
    /// Its answer to `request`, with the deployment's ids zeroed.
    async fn answer(&mut self, request: &Request) -> Answer;
    /// Whether it serves the Lease service's reads (TimeToLive, Leases,
    /// KeepAlive), which need a primary's clock.
    fn serves_lease_reads(&self) -> bool {
        false
    }
    /// Called once halfway through a seed (a side that fails over does so
    /// here).
    async fn midpoint(&mut self) {}
    /// Called before every request (for planted faults).
    async fn before(&mut self, _op: usize) {}
    /// What the server logged last, for failure reports.
    fn log_tail(&self) -> String {
        String::new()
    }
    /// A client of its Watch service, if it serves one now (the seed's
    /// watches are drawn when both sides do).
    fn watch_client(&self) -> Option<WatchClient> {
        None
    }
}

/// A real etcd started for the seed, and clients of it.
pub struct RealEtcd {
    pub server: EtcdServer,
    pub clients: Clients,
}

impl RealEtcd {
    /// A fresh etcd (revision 1); `None` outside CI without the services.
    pub async fn start(label: &str) -> Option<RealEtcd> {
        let server = EtcdServer::start(label)?;
        let clients = connect(server.endpoint()).await;
        Some(RealEtcd { server, clients })
    }
}

impl Side for RealEtcd {
    fn name(&self) -> String {
        format!("etcd at {}", self.server.endpoint())
    }

    async fn answer(&mut self, request: &Request) -> Answer {
        send(&mut self.clients, request).await
    }

    fn serves_lease_reads(&self) -> bool {
        true
    }

    fn log_tail(&self) -> String {
        self.server.log_tail()
    }

    fn watch_client(&self) -> Option<WatchClient> {
        Some(self.clients.watch.clone())
    }
}

/// The first difference of a run.
#[derive(Debug)]
pub struct Difference {
    report: String,
}

impl fmt::Display for Difference {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.report)
    }
}

/// What a seed did: requests by kind and answers by outcome.
#[derive(Debug, Default)]
pub struct Tally {
    pub requests: BTreeMap<&'static str, usize>,
    pub outcomes: BTreeMap<String, usize>,
    /// Whether the Lease service's reads were drawn.
    pub lease_reads: bool,
    /// Whether watches were drawn (both sides serve them).
    pub watched: bool,
    /// Watches compared.
    pub watches: usize,
    /// Events compared, over all watches.
    pub watch_events: usize,
}

pub async fn connect(endpoint: &str) -> Clients {
    let client = Client::connect([endpoint], None)
        .await
        .unwrap_or_else(|e| panic!("cannot connect to {endpoint}: {e}"));
    Clients {
        kv: client.kv_client(),
        lease: client.lease_client(),
        watch: client.watch_client(),
    }
}

/// Runs `ops` requests of seed `seed` against `left` and `right` in
/// lockstep, comparing every answer; the first difference ends the run.
pub async fn run_seed(
    seed: u64,
    ops: usize,
    left: &mut impl Side,
    right: &mut impl Side,
) -> Result<Tally, Difference> {
    let lease_reads = left.serves_lease_reads() && right.serves_lease_reads();
    let mut workload = Workload::new(seed, ops / 2, lease_reads);
    let mut lease_ids = LeaseIds::default();
    let mut tally = Tally {
        lease_reads,
        watched: left.watch_client().is_some() && right.watch_client().is_some(),
        ..Tally::default()
    };
    let mut watches = Watches::new(seed);
    let mut recent: Vec<Request> = Vec::new();
    for op in 0..ops {
        if op == ops / 2 {
            // The old primary's watch streams end with it.
            watches
                .compare_and_close(&lease_ids, workload.compacted, &mut tally)
                .await
                .map_err(|why| watch_difference(seed, op, ops, why))?;
            left.midpoint().await;
            right.midpoint().await;
        }
        watches
            .maybe_open(op, &workload, left, right, &mut tally)
            .await;
        let request = workload.next();
        left.before(op).await;
        right.before(op).await;
        let mut left_answer = left.answer(&request).await;
        let mut right_answer = right.answer(&lease_ids.right_request(&request)).await;
        lease_ids.record(&request, &left_answer, &right_answer);
        lease_ids.to_left(&mut right_answer);
        normalize_ties(&request, &mut left_answer);
        normalize_ties(&request, &mut right_answer);
        reconcile_lease_reads(&mut left_answer, &mut right_answer);
        if let Some(field) = first_difference(&left_answer, &right_answer) {
            let mut report = format!(
                "seed {seed}, operation {op} of {ops}: {} and {} differ\n  {field}\n",
                left.name(),
                right.name()
            );
            let _ = writeln!(report, "  the last requests before it:");
            for (back, earlier) in recent.iter().enumerate() {
                let _ = writeln!(report, "    #{}: {earlier:?}", op - recent.len() + back);
            }
            let _ = writeln!(report, "  request #{op}: {request:?}");
            let _ = writeln!(report, "  {}: {left_answer:?}", left.name());
            let _ = writeln!(report, "  {}: {right_answer:?}", right.name());
            let _ = writeln!(
                report,
                "  replay: CHORUS_ETCD_DIFF_SEED={seed} CHORUS_ETCD_DIFF_OPS={}",
                op + 1
            );
            return Err(Difference { report });
        }
        let failure = match (&left_answer, &right_answer) {
            (Answer::Failed(why), _) => Some((left.name(), left.log_tail(), why)),
            (_, Answer::Failed(why)) => Some((right.name(), right.log_tail(), why)),
            _ => None,
        };
        if let Some((name, log, why)) = failure {
            panic!(
                "seed {seed}, operation {op}: {name} did not answer {request:?}: {why}\n\
                 the requests before it: {recent:#?}\nits log:\n{log}"
            );
        }
        *tally.requests.entry(request.kind()).or_default() += 1;
        let outcome = left_answer.outcome(workload.revision);
        *tally.outcomes.entry(outcome).or_default() += 1;
        workload.observe(&request, &left_answer);
        recent.push(request);
        if recent.len() > CONTEXT_OPS {
            recent.remove(0);
        }
    }
    watches
        .compare_and_close(&lease_ids, workload.compacted, &mut tally)
        .await
        .map_err(|why| watch_difference(seed, ops, ops, why))?;
    Ok(tally)
}

/// The difference a watch of seed `seed` showed, compared before request
/// `op`.
fn watch_difference(seed: u64, op: usize, ops: usize, why: String) -> Difference {
    let report = format!(
        "seed {seed}, watches compared before operation {op} of {ops}: {why}\n  \
         replay: CHORUS_ETCD_DIFF_SEED={seed} CHORUS_ETCD_DIFF_OPS={ops}"
    );
    Difference { report }
}

/// The seeds of this run (see the module docs): `default_count` of them
/// unless the environment says otherwise.
pub fn seeds(default_count: u64) -> Vec<u64> {
    let number = |name: &str| {
        std::env::var(name).ok().map(|value| {
            value
                .parse::<u64>()
                .unwrap_or_else(|_| panic!("{name}={value:?} is not a number"))
        })
    };
    if let Some(seed) = number("CHORUS_ETCD_DIFF_SEED") {
        return vec![seed];
    }
    let first = number("CHORUS_ETCD_DIFF_FIRST_SEED").unwrap_or(1);
    let count = number("CHORUS_ETCD_DIFF_SEEDS").unwrap_or(default_count);
    (first..first + count).collect()
}

/// Operations per seed (see the module docs).
pub fn ops_per_seed() -> usize {
    match std::env::var("CHORUS_ETCD_DIFF_OPS") {
        Ok(value) => value
            .parse()
            .unwrap_or_else(|_| panic!("CHORUS_ETCD_DIFF_OPS={value:?} is not a number")),
        Err(_) => DEFAULT_OPS_PER_SEED,
    }
}

/// The outcomes every full seed must reach, so a run that stopped
/// exercising one (a generator bug) fails rather than passes vacuously.
pub const EXPECTED_OUTCOMES: &[&str] = &[
    "txn succeeded",
    "txn failed",
    "range with more",
    "put with prev_kv",
    "delete of keys",
    "delete of nothing",
    "compact",
    "refused: etcdserver: mvcc: required revision has been compacted",
    "refused: etcdserver: mvcc: required revision is a future revision",
    "refused: etcdserver: key is not provided",
    "refused: etcdserver: duplicate key given in txn request",
    "refused: etcdserver: too many operations in txn request",
    "refused: etcdserver: key not found",
    "refused: etcdserver: value is provided",
    "refused: etcdserver: requested lease not found",
    "range showing a lease",
    "lease granted",
    "lease revoked",
    "lease revoked with its keys",
    "refused: etcdserver: lease already exists",
    "refused: etcdserver: too large lease TTL",
];

/// The outcomes of the Lease service's reads every full seed must reach
/// when both sides serve them.
pub const EXPECTED_LEASE_READ_OUTCOMES: &[&str] = &[
    "time to live",
    "time to live with keys",
    "time to live of an unknown lease",
    "leases",
    "keep-alive",
    "keep-alive of an unknown lease",
];

/// The kinds of request every full seed must send.
pub const EXPECTED_REQUESTS: &[&str] = &[
    "txn with a nested txn",
    "txn naming a lease",
    "put with a lease",
    "lease grant",
    "lease grant with an id",
    "lease revoke",
];

/// What every full seed's watches must exercise when both sides serve
/// watches: each option, and each kind of answer.
pub const EXPECTED_WATCH_REQUESTS: &[&str] = &[
    "watch of a key",
    "watch of a prefix",
    "watch from a key on",
    "watch of a range",
    "watch from the next revision",
    "watch from the current revision",
    "watch from a past revision",
    "watch from a compacted revision",
    "watch with prev_kv",
    "watch without puts",
    "watch without deletes",
];

/// The answers every full seed's watches must see.
pub const EXPECTED_WATCH_OUTCOMES: &[&str] = &[
    "watch canceled as compacted",
    "watch revision of several events",
    "watch delete event",
    "watch event with prev_kv",
    "watch event with a lease",
];

pub fn check_coverage(seed: u64, ops: usize, tally: &Tally) {
    eprintln!("seed {seed}: {tally:#?}");
    if ops < DEFAULT_OPS_PER_SEED {
        return;
    }
    let lease_reads = match tally.lease_reads {
        true => EXPECTED_LEASE_READ_OUTCOMES,
        false => &[],
    };
    let (watch_outcomes, watch_requests) = match tally.watched {
        true => (EXPECTED_WATCH_OUTCOMES, EXPECTED_WATCH_REQUESTS),
        false => (&[][..], &[][..]),
    };
    let missing: Vec<_> = EXPECTED_OUTCOMES
        .iter()
        .chain(lease_reads)
        .chain(watch_outcomes)
        .filter(|outcome| !tally.outcomes.contains_key(**outcome))
        .chain(
            EXPECTED_REQUESTS
                .iter()
                .chain(watch_requests)
                .filter(|kind| !tally.requests.contains_key(**kind)),
        )
        .collect();
    assert!(
        missing.is_empty(),
        "seed {seed} never reached {missing:?}: the workload lost coverage"
    );
}

/// A prev_kv one side lacks is forgiven at or below the compaction
/// revision only, and a prev_kv that differs is never forgiven.
#[test]
fn a_missing_prev_kv_is_forgiven_only_where_a_compaction_reached() {
    let kv = |value: &str, revision: i64| ("k".to_owned(), value.to_owned(), 2, revision, 1, 0);
    let event = |revision: i64, prev: Option<crate::etcd_watch_answers::Kv>| Ev {
        put: true,
        kv: kv("new", revision),
        prev,
    };
    let sides = |revision: i64, right_prev: Option<crate::etcd_watch_answers::Kv>| {
        (
            vec![(revision, vec![event(revision, None)])],
            vec![(revision, vec![event(revision, right_prev)])],
        )
    };
    let (mut left, mut right) = sides(9, Some(kv("old", 8)));
    assert!(forgive_compacted_prev(&mut left, &mut right, 9));
    assert_eq!(left, right);
    let (mut left, mut right) = sides(10, Some(kv("old", 8)));
    assert!(!forgive_compacted_prev(&mut left, &mut right, 9));
    assert_ne!(left, right);
    let (mut left, mut right) = sides(9, Some(kv("old", 8)));
    left[0].1[0].prev = Some(kv("other", 8));
    assert!(!forgive_compacted_prev(&mut left, &mut right, 9));
    assert_ne!(left, right);
}
