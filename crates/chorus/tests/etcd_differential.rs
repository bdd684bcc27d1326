//! The differential suite: one seeded random workload of etcd KV requests,
//! sent through the `etcd-client` crate to two endpoints in lockstep, every
//! answer compared field by field.
//!
//! The workload ([`Workload`]) draws Put (prev_kv, ignore_value,
//! ignore_lease, an unknown lease), Range with every option (single key,
//! prefix, from-key, explicit ranges; limit; the current, past, compacted,
//! future and negative revisions; every sort order and target; keys_only,
//! count_only, min/max mod and create revisions; serializable), DeleteRange
//! (prev_kv, ranges), Txn (every compare target and result, with ranges;
//! every operation in both branches; nested txns), Compact, and requests etcd
//! refuses (an empty key, two writes to one key in a txn, too many
//! operations). Keys come from a four-letter alphabet, so operations
//! collide. Revisions are drawn from what the first endpoint answered, so a
//! seed replays the same requests as long as both agree.
//!
//! Answers are compared whole (every protobuf field), after zeroing the
//! header's cluster id, member id and raft term, which name a deployment
//! rather than the store; refusals by gRPC code and message. The first
//! difference fails the run with its seed, the operation's number and
//! request, the first differing field, and both answers.
//!
//! Seeds: `CHORUS_ETCD_DIFF_SEED=<n>` runs that seed alone;
//! `CHORUS_ETCD_DIFF_SEEDS=<count>` runs that many (from
//! `CHORUS_ETCD_DIFF_FIRST_SEED`, default 1; [`DEFAULT_SEEDS`] by default);
//! `CHORUS_ETCD_DIFF_OPS=<n>` sets the operations per seed
//! ([`DEFAULT_OPS_PER_SEED`] by default).

#[path = "support/etcd.rs"]
mod etcd_server;
mod support;

use std::collections::BTreeMap;
use std::fmt::{self, Write as _};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use chorus::blob::DynBlobStore;
use chorus::clock::SystemClock;
use chorus::kv::etcd::{self, EtcdErrorCode};
use chorus::kv::{Applied, DEFAULT_MAX_TXN_OPS, EtcdCommand, EtcdError, EtcdResponse, KvState};
use chorus::lease::{DatabaseKey, HolderId, LeaseConfig, LeaseStore};
use chorus::log::LogStores;
use chorus::register::{DEFAULT_WINDOW, ManifestStore, MemoryRegister, initialize};
use chorus::runtime::{Runtime, RuntimeConfig, RuntimeStores, WriteError, Written};
use chorus::snapshot::{SnapshotConfig, SnapshotStore};

use etcd_client::proto::{
    PbCompactionResponse, PbDeleteResponse, PbKeyValue, PbPutResponse, PbRangeResponse,
    PbResponseHeader, PbResponseOp, PbTxnOpResponse, PbTxnResponse,
};
use etcd_client::{
    Client, CompactionOptions, Compare, CompareOp, DeleteOptions, GetOptions, KvClient, PutOptions,
    SortOrder, SortTarget, Txn, TxnOp,
};
use etcd_server::EtcdServer;
use rand::rngs::StdRng;
use rand::seq::IndexedRandom;
use rand::{Rng, SeedableRng};

/// Operations per seed unless `CHORUS_ETCD_DIFF_OPS` says otherwise.
const DEFAULT_OPS_PER_SEED: usize = 10_000;
/// Seeds per run unless `CHORUS_ETCD_DIFF_SEEDS` says otherwise.
const DEFAULT_SEEDS: u64 = 3;
/// The letters keys are made of (one or two of them: 20 keys in all).
const KEY_LETTERS: &[u8] = b"abcd";
/// The values puts write and value compares test.
const VALUES: &[&str] = &["", "v", "w", "vw", "a longer value"];
/// etcd's default limit on operations in one txn branch (`--max-txn-ops`).
const MAX_TXN_OPS: usize = 128;
/// How deep txns nest.
const MAX_TXN_DEPTH: usize = 2;
/// Requests shown before the differing one, for context.
const CONTEXT_OPS: usize = 5;

// ------------------------------------------------------------- requests ---

/// Bytes shown as a string in reports.
#[derive(Clone, PartialEq, Eq)]
struct Text(Vec<u8>);

impl fmt::Debug for Text {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&shown(&self.0))
    }
}

/// A key and a range end, as etcd takes them (an empty end: the key alone;
/// `"\0"`: every key from `key` on; otherwise `[key, range_end)`).
#[derive(Clone, PartialEq, Eq)]
struct KeyRange {
    key: Vec<u8>,
    range_end: Vec<u8>,
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
struct RangeSpec {
    range: KeyRange,
    limit: i64,
    revision: i64,
    sort: Option<(SortTarget, SortOrder)>,
    serializable: bool,
    keys_only: bool,
    count_only: bool,
    min_mod_revision: i64,
    max_mod_revision: i64,
    min_create_revision: i64,
    max_create_revision: i64,
}

/// A Put request.
#[derive(Debug, Clone)]
struct PutSpec {
    key: Text,
    value: Text,
    lease: i64,
    prev_kv: bool,
    ignore_value: bool,
    ignore_lease: bool,
}

/// A DeleteRange request.
#[derive(Debug, Clone)]
struct DeleteSpec {
    range: KeyRange,
    prev_kv: bool,
}

/// What a compare reads, and the value it compares with.
#[derive(Debug, Clone)]
enum CompareSpecTarget {
    Version(i64),
    Create(i64),
    Mod(i64),
    Value(Text),
    Lease(i64),
}

/// One compare of a txn.
#[derive(Debug, Clone)]
struct CompareSpec {
    range: KeyRange,
    op: CompareOp,
    target: CompareSpecTarget,
}

/// One operation of a txn branch.
#[derive(Debug, Clone)]
enum TxnOpSpec {
    Range(RangeSpec),
    Put(PutSpec),
    Delete(DeleteSpec),
    Txn(TxnSpec),
}

/// A Txn request.
#[derive(Debug, Clone, Default)]
struct TxnSpec {
    compare: Vec<CompareSpec>,
    success: Vec<TxnOpSpec>,
    failure: Vec<TxnOpSpec>,
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

    /// Whether a branch holds a txn.
    fn nests(&self) -> bool {
        let nested = |op: &TxnOpSpec| matches!(op, TxnOpSpec::Txn(_));
        self.success.iter().chain(&self.failure).any(nested)
    }
}

/// One request of the workload.
#[derive(Debug, Clone)]
enum Request {
    Range(RangeSpec),
    Put(PutSpec),
    Delete(DeleteSpec),
    Txn(TxnSpec),
    Compact { revision: i64, physical: bool },
}

impl Request {
    /// Its kind, for the per-seed tally.
    fn kind(&self) -> &'static str {
        match self {
            Request::Range(_) => "range",
            Request::Put(_) => "put",
            Request::Delete(_) => "delete",
            Request::Txn(txn) if txn.nests() => "txn with a nested txn",
            Request::Txn(_) => "txn",
            Request::Compact { .. } => "compact",
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

fn txn(spec: &TxnSpec) -> Txn {
    Txn::new()
        .when(spec.compare.iter().map(compare).collect::<Vec<_>>())
        .and_then(spec.success.iter().map(txn_op).collect::<Vec<_>>())
        .or_else(spec.failure.iter().map(txn_op).collect::<Vec<_>>())
}

// -------------------------------------------------------------- answers ---

/// One endpoint's answer to one request: the whole response message, or the
/// refusal's gRPC code and message.
#[derive(Debug, Clone, PartialEq)]
enum Answer {
    Range(PbRangeResponse),
    Put(PbPutResponse),
    Delete(PbDeleteResponse),
    Txn(PbTxnResponse),
    Compact(PbCompactionResponse),
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
            Answer::Refused { .. } | Answer::Failed(_) => None,
        };
        header.map(|h| h.revision)
    }

    /// A label for the per-seed tally of outcomes.
    fn outcome(&self) -> String {
        match self {
            Answer::Txn(r) if r.succeeded => "txn succeeded".into(),
            Answer::Txn(_) => "txn failed".into(),
            Answer::Range(r) if r.more => "range with more".into(),
            Answer::Range(_) => "range".into(),
            Answer::Put(r) if r.prev_kv.is_some() => "put with prev_kv".into(),
            Answer::Put(_) => "put".into(),
            Answer::Delete(r) if r.deleted > 0 => "delete of keys".into(),
            Answer::Delete(_) => "delete of nothing".into(),
            Answer::Compact(_) => "compact".into(),
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

/// Sends `request` and returns the answer with the deployment's ids zeroed.
async fn send(kv: &mut KvClient, request: &Request) -> Answer {
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
    };
    let mut answer = answer.unwrap_or_else(refusal);
    anonymize(&mut answer);
    answer
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
fn normalize_ties(request: &Request, answer: &mut Answer) {
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

// ------------------------------------------------- field-by-field diffs ---

/// Every field of an answer as `(path, value)`, in message order, so the
/// first differing field of two answers can be named.
fn fields(answer: &Answer) -> Vec<(String, String)> {
    let mut out = Vec::new();
    match answer {
        Answer::Range(r) => range_fields("range", r, &mut out),
        Answer::Put(r) => put_fields("put", r, &mut out),
        Answer::Delete(r) => delete_fields("delete_range", r, &mut out),
        Answer::Txn(r) => txn_fields("txn", r, &mut out),
        Answer::Compact(r) => header_fields("compact", &r.header, &mut out),
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
fn first_difference(left: &Answer, right: &Answer) -> Option<String> {
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
fn shown(bytes: &[u8]) -> String {
    format!("{:?}", String::from_utf8_lossy(bytes))
}

// ------------------------------------------------------------- workload ---

/// The seeded generator of requests. Revisions it draws come from the
/// answers of the first endpoint, which it is told after every request.
struct Workload {
    rng: StdRng,
    /// The store revision as last answered.
    revision: i64,
    /// The compaction revision as last accepted (0 before any).
    compacted: i64,
}

impl Workload {
    fn new(seed: u64) -> Workload {
        Workload {
            rng: StdRng::seed_from_u64(seed),
            revision: 1,
            compacted: 0,
        }
    }

    /// Learns from the first endpoint's answer to `request`.
    fn observe(&mut self, request: &Request, answer: &Answer) {
        if let Some(revision) = answer.revision() {
            self.revision = revision;
        }
        if let (Request::Compact { revision, .. }, Answer::Compact(_)) = (request, answer) {
            self.compacted = *revision;
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
            // A lease that does not exist: etcd refuses the put.
            lease: if self.chance(0.02) { 7 } else { 0 },
            prev_kv: self.chance(0.4),
            ignore_value,
            ignore_lease: self.chance(0.06),
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
            _ => CompareSpecTarget::Lease(self.rng.random_range(0..=1)),
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

    /// The next request.
    fn next(&mut self) -> Request {
        match self.rng.random_range(0..100) {
            0..28 => Request::Put(self.put_spec()),
            28..58 => Request::Range(self.range_spec()),
            58..68 => Request::Delete(self.delete_spec()),
            68..97 => Request::Txn(self.txn_spec(0)),
            _ => Request::Compact {
                revision: self.compact_revision(),
                physical: self.chance(0.5),
            },
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

// -------------------------------------------------------------- drivers ---

/// One side of the comparison: something that answers etcd requests.
trait Side {
    /// A name for reports.
    fn name(&self) -> String;
    /// Its answer to `request`, with the deployment's ids zeroed.
    async fn answer(&mut self, request: &Request) -> Answer;
    /// Called once halfway through a seed (a side that fails over does so
    /// here).
    async fn midpoint(&mut self) {}
    /// Called before every request (for planted faults).
    async fn before(&mut self, _op: usize) {}
    /// What the server logged last, for failure reports.
    fn log_tail(&self) -> String {
        String::new()
    }
}

/// A real etcd started for the seed, and a client of it.
struct RealEtcd {
    server: EtcdServer,
    kv: KvClient,
}

impl RealEtcd {
    /// A fresh etcd (revision 1); `None` outside CI without the services.
    async fn start(label: &str) -> Option<RealEtcd> {
        let server = EtcdServer::start(label)?;
        let kv = connect(server.endpoint()).await;
        Some(RealEtcd { server, kv })
    }
}

impl Side for RealEtcd {
    fn name(&self) -> String {
        format!("etcd at {}", self.server.endpoint())
    }

    async fn answer(&mut self, request: &Request) -> Answer {
        send(&mut self.kv, request).await
    }

    fn log_tail(&self) -> String {
        self.server.log_tail()
    }
}

/// The first difference of a run.
#[derive(Debug)]
struct Difference {
    report: String,
}

impl fmt::Display for Difference {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.report)
    }
}

/// What a seed did: requests by kind and answers by outcome.
#[derive(Debug, Default)]
struct Tally {
    requests: BTreeMap<&'static str, usize>,
    outcomes: BTreeMap<String, usize>,
}

async fn connect(endpoint: &str) -> KvClient {
    Client::connect([endpoint], None)
        .await
        .unwrap_or_else(|e| panic!("cannot connect to {endpoint}: {e}"))
        .kv_client()
}

/// Runs `ops` requests of seed `seed` against `left` and `right` in
/// lockstep, comparing every answer; the first difference ends the run.
async fn run_seed(
    seed: u64,
    ops: usize,
    left: &mut impl Side,
    right: &mut impl Side,
) -> Result<Tally, Difference> {
    let mut workload = Workload::new(seed);
    let mut tally = Tally::default();
    let mut recent: Vec<Request> = Vec::new();
    for op in 0..ops {
        if op == ops / 2 {
            left.midpoint().await;
            right.midpoint().await;
        }
        let request = workload.next();
        left.before(op).await;
        right.before(op).await;
        let mut left_answer = left.answer(&request).await;
        let mut right_answer = right.answer(&request).await;
        normalize_ties(&request, &mut left_answer);
        normalize_ties(&request, &mut right_answer);
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
        *tally.outcomes.entry(left_answer.outcome()).or_default() += 1;
        workload.observe(&request, &left_answer);
        recent.push(request);
        if recent.len() > CONTEXT_OPS {
            recent.remove(0);
        }
    }
    Ok(tally)
}

/// The seeds of this run (see the module docs).
fn seeds() -> Vec<u64> {
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
    let count = number("CHORUS_ETCD_DIFF_SEEDS").unwrap_or(DEFAULT_SEEDS);
    (first..first + count).collect()
}

/// Operations per seed (see the module docs).
fn ops_per_seed() -> usize {
    match std::env::var("CHORUS_ETCD_DIFF_OPS") {
        Ok(value) => value
            .parse()
            .unwrap_or_else(|_| panic!("CHORUS_ETCD_DIFF_OPS={value:?} is not a number")),
        Err(_) => DEFAULT_OPS_PER_SEED,
    }
}

/// The outcomes every full seed must reach, so a run that stopped
/// exercising one (a generator bug) fails rather than passes vacuously.
const EXPECTED_OUTCOMES: &[&str] = &[
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
];

fn check_coverage(seed: u64, ops: usize, tally: &Tally) {
    eprintln!("seed {seed}: {tally:#?}");
    if ops < DEFAULT_OPS_PER_SEED {
        return;
    }
    let missing: Vec<_> = EXPECTED_OUTCOMES
        .iter()
        .filter(|outcome| !tally.outcomes.contains_key(**outcome))
        .chain(
            ["txn with a nested txn"]
                .iter()
                .filter(|kind| !tally.requests.contains_key(**kind)),
        )
        .collect();
    assert!(
        missing.is_empty(),
        "seed {seed} never reached {missing:?}: the workload lost coverage"
    );
}

// ---------------------------------------------------------------- tests ---

/// The harness itself: two real etcds given the same workload answer the
/// same, field for field (else the suite would report noise as differences).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_real_etcds_answer_every_seed_identically() {
    let ops = ops_per_seed();
    for seed in seeds() {
        let Some(mut left) = RealEtcd::start("left").await else {
            return;
        };
        let mut right = RealEtcd::start("right").await.expect("etcd is there");
        match run_seed(seed, ops, &mut left, &mut right).await {
            Ok(tally) => check_coverage(seed, ops, &tally),
            Err(difference) => panic!("{difference}"),
        }
    }
}

/// A real etcd with one write the other never sees, at a given operation.
struct PlantedWrite {
    etcd: RealEtcd,
    at_op: usize,
}

impl Side for PlantedWrite {
    fn name(&self) -> String {
        format!("{} (one extra write)", self.etcd.name())
    }

    async fn answer(&mut self, request: &Request) -> Answer {
        self.etcd.answer(request).await
    }

    async fn before(&mut self, op: usize) {
        if op == self.at_op {
            let kv = &mut self.etcd.kv;
            kv.put("a", "planted", None).await.expect("the planted put");
        }
    }
}

/// The harness catches a difference: one extra write on one side is
/// reported at the first answer it changes, with the seed and operation.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_planted_write_is_reported_with_its_seed_and_operation() {
    const PLANTED_AT: usize = 300;
    let Some(mut left) = RealEtcd::start("left").await else {
        return;
    };
    let mut right = PlantedWrite {
        etcd: RealEtcd::start("right").await.expect("etcd is there"),
        at_op: PLANTED_AT,
    };
    let difference = run_seed(7, 2 * PLANTED_AT, &mut left, &mut right)
        .await
        .expect_err("an extra write changes some answer");
    let report = difference.to_string();
    eprintln!("{report}");
    let op: usize = report
        .split("operation ")
        .nth(1)
        .and_then(|rest| rest.split_whitespace().next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no operation number in {report}"));
    assert!(op >= PLANTED_AT, "reported before the plant: {report}");
    assert!(report.starts_with("seed 7, "), "{report}");
    assert!(report.contains("field "), "no field named: {report}");
    assert!(report.contains("CHORUS_ETCD_DIFF_SEED=7"), "{report}");
}

/// The field-by-field comparison names the first differing field, deep in
/// a nested txn answer.
#[test]
fn the_first_differing_field_is_named_by_its_path() {
    let kv = |mod_revision| PbKeyValue {
        key: b"a".to_vec(),
        value: b"v".to_vec(),
        create_revision: 2,
        mod_revision,
        version: 1,
        lease: 0,
    };
    let answer = |mod_revision| {
        let range = PbRangeResponse {
            header: Some(PbResponseHeader {
                revision: 5,
                ..Default::default()
            }),
            kvs: vec![kv(3), kv(mod_revision)],
            more: false,
            count: 2,
        };
        let inner = PbTxnResponse {
            header: None,
            succeeded: true,
            responses: vec![PbResponseOp {
                response: Some(PbTxnOpResponse::ResponseRange(range)),
            }],
        };
        Answer::Txn(PbTxnResponse {
            header: None,
            succeeded: false,
            responses: vec![PbResponseOp {
                response: Some(PbTxnOpResponse::ResponseTxn(inner)),
            }],
        })
    };
    assert_eq!(first_difference(&answer(4), &answer(4)), None);
    assert_eq!(
        first_difference(&answer(4), &answer(5)).as_deref(),
        Some("field txn.responses[0].txn.responses[0].range.kvs[1].mod_revision: 4 vs 5")
    );
    let refused = |message: &str| Answer::Refused {
        code: "InvalidArgument".into(),
        message: message.into(),
    };
    assert_eq!(
        first_difference(&refused("a"), &refused("b")).as_deref(),
        Some("field refused.message: \"a\" vs \"b\"")
    );
}

// ------------------------------------------- chorus's machine, in process ---

/// How long a runtime may take to boot or take over (a loaded 2-core machine).
const CHORUS_PATIENCE: Duration = Duration::from_secs(30);

/// The stores of one in-process database: three in-memory replicas, a
/// memory register and a memory store for leases and snapshots. Runtimes
/// built from the same `Stores` share them (a takeover's second node).
struct Stores {
    database: String,
    replicas: Vec<(String, DynBlobStore)>,
    register: Arc<dyn ManifestStore>,
    meta: DynBlobStore,
}

/// A fresh in-memory store: named memory stores are shared within a
/// process, so every call gets a name of its own.
fn memory_store(label: &str) -> DynBlobStore {
    let url = format!("memory://{}", support::unique(label))
        .parse()
        .expect("a memory URL");
    chorus::blob::open_store_unprobed(&url).expect("a memory store")
}

impl Stores {
    /// Fresh stores holding a new, empty log.
    async fn new(label: &str) -> Stores {
        let database = support::unique(label);
        let replicas: Vec<(String, DynBlobStore)> = (0..3)
            .map(|position| {
                let store = memory_store(&format!("{database}-r{position}"));
                (format!("memory://r{position}"), store)
            })
            .collect();
        let register: Arc<dyn ManifestStore> = Arc::new(MemoryRegister::new());
        let identities = replicas.iter().map(|(name, _)| name.clone()).collect();
        initialize(register.as_ref(), identities, DEFAULT_WINDOW)
            .await
            .expect("a new log");
        let meta = memory_store(&format!("{database}-meta"));
        Stores {
            database,
            replicas,
            register,
            meta,
        }
    }

    /// A runtime over these stores as `holder`; it takes the lease once it
    /// can.
    fn runtime(&self, holder: &str) -> Arc<Runtime<KvState>> {
        let key = DatabaseKey::new(&self.database).expect("a valid database key");
        let lease = LeaseConfig {
            ttl: Duration::from_secs(10),
            safety_margin: Duration::from_secs(2),
            store_call_timeout: Duration::from_secs(2),
        };
        let stores = RuntimeStores {
            log: LogStores {
                replicas: self.replicas.clone(),
                register: Arc::clone(&self.register),
            },
            snapshots: SnapshotStore::new(
                self.meta.clone(),
                key.clone(),
                SnapshotConfig::default(),
                SystemClock::shared(),
            ),
            leases: LeaseStore::new(self.meta.clone(), key, lease, SystemClock::shared())
                .expect("a lease config"),
        };
        let config = RuntimeConfig::new(HolderId::new(holder).expect("a holder id"));
        Arc::new(Runtime::start(stores, config).expect("a valid runtime config"))
    }
}

/// Polls `done` until it holds, failing the test after [`CHORUS_PATIENCE`].
async fn wait_until(what: &str, mut done: impl FnMut() -> bool) {
    let deadline = tokio::time::Instant::now() + CHORUS_PATIENCE;
    while !done() {
        assert!(
            tokio::time::Instant::now() < deadline,
            "not {what} within {CHORUS_PATIENCE:?}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Chorus's key-value machine in this process, on in-memory stores, driven
/// as the etcd service drives it: a read is [`KvState::range`] on the
/// primary, a write is validated against the applied state, appended as a
/// record and answered with what applying it returned. Halfway through a
/// seed a second runtime takes over: on odd seeds a warm standby that tailed
/// the log from the start, on even seeds a cold one started then (it
/// restores the final snapshot the first one published at shutdown).
struct ChorusMachine {
    stores: Stores,
    primary: Arc<Runtime<KvState>>,
    standby: Option<Arc<Runtime<KvState>>>,
    seed: u64,
}

impl ChorusMachine {
    async fn start(seed: u64) -> ChorusMachine {
        let stores = Stores::new(&format!("etcd-diff-{seed}")).await;
        let primary = stores.runtime("http://first:1");
        wait_until("primary", || primary.is_primary_and_sure()).await;
        let standby = (seed % 2 == 1).then(|| stores.runtime("http://second:2"));
        ChorusMachine {
            stores,
            primary,
            standby,
            seed,
        }
    }

    async fn shut_down(&self) {
        self.primary.shutdown().await.expect("a clean shutdown");
    }

    async fn write(&self, command: EtcdCommand) -> Answer {
        let written = self
            .primary
            .write(|state: &KvState| {
                command.validate(state, DEFAULT_MAX_TXN_OPS)?;
                Ok::<_, EtcdError>(command.encode())
            })
            .await;
        match written {
            Ok(Written {
                output: Applied::Etcd(Ok(response)),
                ..
            }) => etcd_answer(response),
            Ok(Written {
                output: Applied::Etcd(Err(error)),
                ..
            }) => chorus_refusal(&error),
            Ok(Written { output, .. }) => Answer::Failed(format!("applied as {output:?}")),
            Err(WriteError::Rejected(error)) => chorus_refusal(&error),
            Err(error) => Answer::Failed(format!("write failed: {error}")),
        }
    }
}

impl Side for ChorusMachine {
    fn name(&self) -> String {
        "chorus".to_owned()
    }

    async fn answer(&mut self, request: &Request) -> Answer {
        match request {
            Request::Range(spec) => {
                let request = chorus_range(spec);
                match self.primary.read(|state| state.range(&request)) {
                    Ok((Ok(response), _)) => Answer::Range(pb_range(response)),
                    Ok((Err(error), _)) => chorus_refusal(&error),
                    Err(unavailable) => Answer::Failed(format!("read failed: {unavailable}")),
                }
            }
            Request::Put(spec) => self.write(EtcdCommand::Put(chorus_put(spec))).await,
            Request::Delete(spec) => {
                let command = EtcdCommand::DeleteRange(chorus_delete(spec));
                self.write(command).await
            }
            Request::Txn(spec) => self.write(EtcdCommand::Txn(chorus_txn(spec))).await,
            Request::Compact { revision, physical } => {
                let command = EtcdCommand::Compact(etcd::CompactionRequest {
                    revision: *revision,
                    physical: *physical,
                });
                self.write(command).await
            }
        }
    }

    async fn midpoint(&mut self) {
        self.primary.shutdown().await.expect("a clean shutdown");
        let (next, how) = match self.standby.take() {
            Some(warm) => (warm, "a warm standby"),
            None => (self.stores.runtime("http://second:2"), "a cold start"),
        };
        let deadline = tokio::time::Instant::now() + CHORUS_PATIENCE;
        while !next.is_primary_and_sure() {
            if matches!(next.status().role, chorus::runtime::Role::Stopped) {
                panic!(
                    "seed {}: {how} stopped before taking over: {:?}",
                    self.seed,
                    next.finished().await
                );
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "seed {}: {how} did not take over within {CHORUS_PATIENCE:?}: {:#?}",
                self.seed,
                next.status()
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        eprintln!("seed {}: {how} took over", self.seed);
        self.primary = next;
    }
}

fn bytes(value: &[u8]) -> Bytes {
    Bytes::copy_from_slice(value)
}

fn chorus_range(spec: &RangeSpec) -> etcd::RangeRequest {
    let (sort_order, sort_target) = match spec.sort {
        None => (etcd::SortOrder::None, etcd::SortTarget::Key),
        Some((target, order)) => {
            let target = match target {
                SortTarget::Key => etcd::SortTarget::Key,
                SortTarget::Version => etcd::SortTarget::Version,
                SortTarget::Create => etcd::SortTarget::Create,
                SortTarget::Mod => etcd::SortTarget::Mod,
                SortTarget::Value => etcd::SortTarget::Value,
            };
            let order = match order {
                // etcd-client sends (KEY, ASCEND) as (KEY, NONE).
                SortOrder::Ascend if target == etcd::SortTarget::Key => etcd::SortOrder::None,
                SortOrder::None => etcd::SortOrder::None,
                SortOrder::Ascend => etcd::SortOrder::Ascend,
                SortOrder::Descend => etcd::SortOrder::Descend,
            };
            (order, target)
        }
    };
    etcd::RangeRequest {
        key: bytes(&spec.range.key),
        range_end: bytes(&spec.range.range_end),
        limit: spec.limit,
        revision: spec.revision,
        sort_order,
        sort_target,
        serializable: spec.serializable,
        keys_only: spec.keys_only,
        count_only: spec.count_only,
        min_mod_revision: spec.min_mod_revision,
        max_mod_revision: spec.max_mod_revision,
        min_create_revision: spec.min_create_revision,
        max_create_revision: spec.max_create_revision,
    }
}

fn chorus_put(spec: &PutSpec) -> etcd::PutRequest {
    etcd::PutRequest {
        key: bytes(&spec.key.0),
        value: bytes(&spec.value.0),
        lease: spec.lease,
        prev_kv: spec.prev_kv,
        ignore_value: spec.ignore_value,
        ignore_lease: spec.ignore_lease,
    }
}

fn chorus_delete(spec: &DeleteSpec) -> etcd::DeleteRangeRequest {
    etcd::DeleteRangeRequest {
        key: bytes(&spec.range.key),
        range_end: bytes(&spec.range.range_end),
        prev_kv: spec.prev_kv,
    }
}

fn chorus_compare(spec: &CompareSpec) -> etcd::Compare {
    etcd::Compare {
        key: bytes(&spec.range.key),
        range_end: bytes(&spec.range.range_end),
        result: match spec.op {
            CompareOp::Equal => etcd::CompareResult::Equal,
            CompareOp::Greater => etcd::CompareResult::Greater,
            CompareOp::Less => etcd::CompareResult::Less,
            CompareOp::NotEqual => etcd::CompareResult::NotEqual,
        },
        target: match &spec.target {
            CompareSpecTarget::Version(version) => etcd::CompareTarget::Version(*version),
            CompareSpecTarget::Create(revision) => etcd::CompareTarget::Create(*revision),
            CompareSpecTarget::Mod(revision) => etcd::CompareTarget::Mod(*revision),
            CompareSpecTarget::Value(value) => etcd::CompareTarget::Value(bytes(&value.0)),
            CompareSpecTarget::Lease(lease) => etcd::CompareTarget::Lease(*lease),
        },
    }
}

fn chorus_txn(spec: &TxnSpec) -> etcd::TxnRequest {
    let op = |op: &TxnOpSpec| match op {
        TxnOpSpec::Range(range) => etcd::RequestOp::Range(chorus_range(range)),
        TxnOpSpec::Put(put) => etcd::RequestOp::Put(chorus_put(put)),
        TxnOpSpec::Delete(delete) => etcd::RequestOp::DeleteRange(chorus_delete(delete)),
        TxnOpSpec::Txn(nested) => etcd::RequestOp::Txn(chorus_txn(nested)),
    };
    etcd::TxnRequest {
        compare: spec.compare.iter().map(chorus_compare).collect(),
        success: spec.success.iter().map(op).collect(),
        failure: spec.failure.iter().map(op).collect(),
    }
}

/// A header carrying only the revision (the ids are zeroed on both sides).
fn pb_header(revision: i64) -> Option<PbResponseHeader> {
    Some(PbResponseHeader {
        revision,
        ..Default::default()
    })
}

fn pb_kv(kv: etcd::KeyValue) -> PbKeyValue {
    PbKeyValue {
        key: kv.key.to_vec(),
        create_revision: kv.create_revision,
        mod_revision: kv.mod_revision,
        version: kv.version,
        value: kv.value.to_vec(),
        lease: kv.lease,
    }
}

fn pb_range(response: etcd::RangeResponse) -> PbRangeResponse {
    PbRangeResponse {
        header: pb_header(response.header_revision),
        kvs: response.kvs.into_iter().map(pb_kv).collect(),
        more: response.more,
        count: response.count,
    }
}

fn pb_put(response: etcd::PutResponse) -> PbPutResponse {
    PbPutResponse {
        header: pb_header(response.header_revision),
        prev_kv: response.prev_kv.map(pb_kv),
    }
}

fn pb_delete(response: etcd::DeleteRangeResponse) -> PbDeleteResponse {
    PbDeleteResponse {
        header: pb_header(response.header_revision),
        deleted: response.deleted,
        prev_kvs: response.prev_kvs.into_iter().map(pb_kv).collect(),
    }
}

fn pb_txn(response: etcd::TxnResponse) -> PbTxnResponse {
    let op = |op: etcd::ResponseOp| PbResponseOp {
        response: Some(match op {
            etcd::ResponseOp::Range(r) => PbTxnOpResponse::ResponseRange(pb_range(r)),
            etcd::ResponseOp::Put(r) => PbTxnOpResponse::ResponsePut(pb_put(r)),
            etcd::ResponseOp::DeleteRange(r) => PbTxnOpResponse::ResponseDeleteRange(pb_delete(r)),
            etcd::ResponseOp::Txn(r) => PbTxnOpResponse::ResponseTxn(pb_txn(r)),
        }),
    };
    PbTxnResponse {
        header: pb_header(response.header_revision),
        succeeded: response.succeeded,
        responses: response.responses.into_iter().map(op).collect(),
    }
}

fn etcd_answer(response: EtcdResponse) -> Answer {
    match response {
        EtcdResponse::Put(r) => Answer::Put(pb_put(r)),
        EtcdResponse::DeleteRange(r) => Answer::Delete(pb_delete(r)),
        EtcdResponse::Txn(r) => Answer::Txn(pb_txn(r)),
        EtcdResponse::Compact(r) => Answer::Compact(PbCompactionResponse {
            header: pb_header(r.header_revision),
        }),
    }
}

/// A refusal as etcd's gRPC status would carry it.
fn chorus_refusal(error: &EtcdError) -> Answer {
    let code = match error.code() {
        EtcdErrorCode::InvalidArgument => "InvalidArgument",
        EtcdErrorCode::OutOfRange => "OutOfRange",
        EtcdErrorCode::NotFound => "NotFound",
    };
    Answer::Refused {
        code: code.to_owned(),
        message: error.to_string(),
    }
}

/// Chorus's machine answers every seed as the real etcd does, through a
/// takeover in the middle of each.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chorus_machine_answers_every_seed_as_etcd_does() {
    let ops = ops_per_seed();
    for seed in seeds() {
        let Some(mut etcd) = RealEtcd::start("oracle").await else {
            return;
        };
        let mut chorus = ChorusMachine::start(seed).await;
        let outcome = run_seed(seed, ops, &mut etcd, &mut chorus).await;
        chorus.shut_down().await;
        match outcome {
            Ok(tally) => check_coverage(seed, ops, &tally),
            Err(difference) => panic!("{difference}"),
        }
    }
}
