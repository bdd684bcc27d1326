//! The etcd gRPC service driven by etcd's own Rust client (etcd-client)
//! over loopback: every RPC served answers as etcd does, every other one
//! answers `Unimplemented`.

mod support;

use etcd_client::{
    AlarmAction, AlarmType, Compare, CompareOp, DeleteOptions, GetOptions, PutOptions, SortOrder,
    SortTarget, Txn, TxnOp, TxnOpResponse,
};
use tonic::Code;

use chorus_etcd::proto::etcdserverpb as pb;
use support::memory_runtime::{MemoryStores, wait_until};
use support::{assert_refused, status};

/// Asserts that `result` is `Unimplemented` naming `rpc`.
fn assert_unimplemented<T: std::fmt::Debug>(result: Result<T, etcd_client::Error>, rpc: &str) {
    let refused = status(result.expect_err("not served"));
    assert_eq!(refused.code(), Code::Unimplemented, "{rpc}: {refused:?}");
    assert!(refused.message().contains(rpc), "{rpc}: {refused:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn puts_ranges_deletes_and_compactions_answer_as_etcd_does() {
    let served = support::serve("etcd-kv", |_| {}).await;
    let mut client = served.client().await;
    let identity = served.service.identity();

    let first = client.put("a/1", "one", None).await.unwrap();
    let header = first.header().unwrap();
    assert_eq!(header.revision(), 2, "an empty store is at revision 1");
    assert_eq!(
        (header.cluster_id(), header.member_id()),
        (identity.cluster_id, identity.member_id)
    );
    assert!(header.raft_term() > 0, "the lease's term: {header:?}");
    client.put("a/2", "two", None).await.unwrap();
    let again = client
        .put("a/1", "uno", Some(PutOptions::new().with_prev_key()))
        .await
        .unwrap();
    let prev = again.prev_key().unwrap();
    assert_eq!(
        (prev.value(), prev.version(), prev.mod_revision()),
        (&b"one"[..], 1, 2)
    );

    let listed = client
        .get("a/", Some(GetOptions::new().with_prefix().with_limit(1)))
        .await
        .unwrap();
    assert_eq!(listed.header().unwrap().revision(), 4);
    assert_eq!(
        (listed.count(), listed.more(), listed.kvs().len()),
        (2, true, 1)
    );
    let kv = &listed.kvs()[0];
    assert_eq!(
        (
            kv.key(),
            kv.value(),
            kv.create_revision(),
            kv.mod_revision(),
            kv.version()
        ),
        (&b"a/1"[..], &b"uno"[..], 2, 4, 2)
    );
    let descending = client
        .get(
            "a/",
            Some(
                GetOptions::new()
                    .with_prefix()
                    .with_sort(SortTarget::Mod, SortOrder::Descend)
                    .with_serializable(),
            ),
        )
        .await
        .unwrap();
    let keys: Vec<&[u8]> = descending.kvs().iter().map(|kv| kv.key()).collect();
    assert_eq!(keys, [&b"a/1"[..], &b"a/2"[..]]);
    let past = client
        .get("a/1", Some(GetOptions::new().with_revision(2)))
        .await
        .unwrap();
    assert_eq!(past.kvs()[0].value(), b"one");

    let deleted = client
        .delete(
            "a/",
            Some(DeleteOptions::new().with_prefix().with_prev_key()),
        )
        .await
        .unwrap();
    assert_eq!((deleted.deleted(), deleted.prev_kvs().len()), (2, 2));
    assert_eq!(deleted.header().unwrap().revision(), 5);
    let nothing = client
        .delete("a/", Some(DeleteOptions::new().with_prefix()))
        .await
        .unwrap();
    assert_eq!(
        (nothing.deleted(), nothing.header().unwrap().revision()),
        (0, 5)
    );

    let compacted = client.compact(4, None).await.unwrap();
    assert_eq!(compacted.header().unwrap().revision(), 5);
    assert_refused(
        client
            .get("a/1", Some(GetOptions::new().with_revision(3)))
            .await,
        Code::OutOfRange,
        "etcdserver: mvcc: required revision has been compacted",
    );
    assert_refused(
        client
            .get("a/1", Some(GetOptions::new().with_revision(6)))
            .await,
        Code::OutOfRange,
        "etcdserver: mvcc: required revision is a future revision",
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn transactions_take_one_revision_and_reads_take_none() {
    let served = support::serve("etcd-txn", |_| {}).await;
    let mut client = served.client().await;
    client.put("k", "v1", None).await.unwrap();

    let create_if_absent = |key: &str| {
        Txn::new()
            .when([Compare::create_revision(key, CompareOp::Equal, 0)])
            .and_then([TxnOp::put(key, "new", None), TxnOp::get("k", None)])
            .or_else([TxnOp::get(key, None)])
    };
    let created = client.txn(create_if_absent("fresh")).await.unwrap();
    assert!(created.succeeded());
    assert_eq!(created.header().unwrap().revision(), 3);
    match &created.op_responses()[1] {
        TxnOpResponse::Get(get) => assert_eq!(get.kvs()[0].value(), b"v1"),
        other => panic!("a get's answer: {other:?}"),
    }
    let refused = client.txn(create_if_absent("fresh")).await.unwrap();
    assert!(!refused.succeeded());
    assert_eq!(
        refused.header().unwrap().revision(),
        3,
        "a failed compare writes nothing"
    );

    // Only ranges: served from the state, no revision, no record.
    let applied = served.runtime.applied().borrow().0;
    let read = Txn::new()
        .when([Compare::value("k", CompareOp::Equal, "v1")])
        .and_then([TxnOp::get("k", None)]);
    let answered = client.txn(read).await.unwrap();
    assert!(answered.succeeded());
    assert_eq!(answered.header().unwrap().revision(), 3);
    assert_eq!(
        served.runtime.applied().borrow().0,
        applied,
        "no record appended"
    );

    let nested = Txn::new().and_then([
        TxnOp::put("n1", "x", None),
        TxnOp::txn(Txn::new().and_then([TxnOp::put("n2", "y", None)])),
    ]);
    let nested = client.txn(nested).await.unwrap();
    assert_eq!(
        nested.header().unwrap().revision(),
        4,
        "one txn, one revision"
    );
    let both = client
        .get("n", Some(GetOptions::new().with_prefix()))
        .await
        .unwrap();
    assert!(both.kvs().iter().all(|kv| kv.mod_revision() == 4));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refusals_carry_etcds_codes_and_messages() {
    const MAX_REQUEST_BYTES: usize = 1024;
    let served = support::serve("etcd-refusals", |config| {
        config.max_request_bytes = MAX_REQUEST_BYTES;
        config.max_txn_ops = 2;
    })
    .await;
    let mut client = served.client().await;
    assert_refused(
        client.put("", "v", None).await,
        Code::InvalidArgument,
        "etcdserver: key is not provided",
    );
    let twice = Txn::new().and_then([TxnOp::put("d", "1", None), TxnOp::put("d", "2", None)]);
    assert_refused(
        client.txn(twice).await,
        Code::InvalidArgument,
        "etcdserver: duplicate key given in txn request",
    );
    let three = Txn::new().and_then([
        TxnOp::put("a", "1", None),
        TxnOp::put("b", "2", None),
        TxnOp::put("c", "3", None),
    ]);
    assert_refused(
        client.txn(three).await,
        Code::InvalidArgument,
        "etcdserver: too many operations in txn request",
    );
    assert_refused(
        client
            .put("k", "v", Some(PutOptions::new().with_lease(7)))
            .await,
        Code::NotFound,
        "etcdserver: requested lease not found",
    );
    assert_refused(
        client
            .put("k", vec![b'x'; MAX_REQUEST_BYTES + 1], None)
            .await,
        Code::InvalidArgument,
        "etcdserver: request is too large",
    );
    // Beyond the limit plus etcd's gRPC overhead the message is not even
    // decoded: grpc-go's answer, as etcd's server gives it.
    let huge = vec![b'x'; MAX_REQUEST_BYTES + chorus_etcd::config::GRPC_OVERHEAD_BYTES + 1];
    let refused = status(client.put("k", huge, None).await.unwrap_err());
    assert_eq!(refused.code(), Code::ResourceExhausted, "{refused:?}");
    assert!(
        refused
            .message()
            .starts_with("grpc: received message larger than max ("),
        "{refused:?}"
    );
    let revision = client
        .get("k", None)
        .await
        .unwrap()
        .header()
        .unwrap()
        .revision();
    assert_eq!(revision, 1, "no refusal wrote anything");
}

/// The NOSPACE alarm: raised by the primary at the quota, listed by Alarm
/// and Status, refusing puts but not deletes, cleared by a disarm.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_space_quota_raises_nospace_until_it_is_disarmed() {
    let served = support::serve("etcd-quota", |config| {
        config.quota_backend_bytes = 3000;
    })
    .await;
    let mut client = served.client().await;
    let member = served.service.identity().member_id;
    let value = vec![b'v'; 1000];
    client.put("a", value.clone(), None).await.unwrap();
    client.put("b", value.clone(), None).await.unwrap();
    // 2,002 bytes held; a third put costs 1,257 (etcd's 256 per put).
    let no_space = "etcdserver: mvcc: database space exceeded";
    assert_refused(
        client.put("c", value.clone(), None).await,
        Code::ResourceExhausted,
        no_space,
    );
    let listed = client
        .alarm(AlarmAction::Get, AlarmType::None, None)
        .await
        .unwrap();
    let raised: Vec<(u64, i32)> = listed
        .alarms()
        .iter()
        .map(|alarm| (alarm.member_id(), alarm.alarm() as i32))
        .collect();
    assert_eq!(raised, vec![(member, AlarmType::Nospace as i32)]);
    let status = client.status().await.unwrap();
    assert_eq!(
        status.errors(),
        [format!("memberID:{member} alarm:NOSPACE ")]
    );
    // Capped: even a small put is refused; a delete is served.
    assert_refused(
        client.put("d", "v", None).await,
        Code::ResourceExhausted,
        no_space,
    );
    client.delete("b", None).await.unwrap();
    let mut disarm = etcd_client::AlarmOptions::new();
    disarm.with_member(member);
    let cleared = client
        .alarm(AlarmAction::Deactivate, AlarmType::Nospace, Some(disarm))
        .await
        .unwrap();
    assert_eq!(cleared.alarms().len(), 1);
    client.put("d", "v", None).await.unwrap();
    assert!(client.status().await.unwrap().errors().is_empty());
}

/// Every node lists every node serving the database, with its client URLs,
/// and names the same leader: what `etcdctl endpoint status --cluster` reads.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn member_list_names_every_node_and_status_the_same_leader() {
    let (primary, standby) = support::primary_and_standby("etcd-members").await;
    let expected = vec![
        ("http://primary:1".to_owned(), vec![primary.endpoint()]),
        ("http://standby:1".to_owned(), vec![standby.endpoint()]),
    ];
    for served in [&primary, &standby] {
        let mut client = served.client().await;
        let mut listed = Vec::new();
        for _ in 0..100 {
            let members = client.member_list().await.unwrap();
            listed = members
                .members()
                .iter()
                .map(|m| (m.name().to_owned(), m.client_urls().to_vec()))
                .collect::<Vec<_>>();
            listed.sort();
            if listed == expected {
                break;
            }
            tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        }
        assert_eq!(listed, expected, "as listed by {}", served.endpoint());
        let leader = client.status().await.unwrap().leader();
        assert_eq!(leader, primary.service.identity().member_id);
    }
}

/// HashKV answers the same hash on the primary and a standby at one
/// revision, and a different one once the state changed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hash_kv_agrees_between_primary_and_standby() {
    let (primary, standby) = support::primary_and_standby("etcd-hashkv").await;
    let mut to_primary = primary.client().await;
    to_primary.put("a", "1", None).await.unwrap();
    to_primary.put("b", "2", None).await.unwrap();
    to_primary.put("a", "3", None).await.unwrap();
    wait_until("applied on the standby", || {
        standby.runtime.read_stale(|state| state.revision()).0 == 4
    })
    .await;
    let mut to_standby = standby.client().await;
    let on_primary = to_primary.hash_kv(3).await.unwrap();
    let on_standby = to_standby.hash_kv(3).await.unwrap();
    assert_eq!(on_primary.hash(), on_standby.hash());
    assert_eq!(on_primary.0.hash_revision, 3);
    let now = to_standby.hash_kv(0).await.unwrap();
    assert_eq!(now.0.hash_revision, 4);
    assert_ne!(now.hash(), on_primary.hash());
    assert_eq!(to_primary.hash_kv(0).await.unwrap().hash(), now.hash());
    assert_refused(
        to_standby.hash_kv(9).await,
        Code::OutOfRange,
        "etcdserver: mvcc: required revision is a future revision",
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn status_alarms_members_and_health_serve_what_tools_need() {
    let served = support::serve("etcd-maintenance", |_| {}).await;
    let mut client = served.client().await;
    let identity = served.service.identity();
    client.put("k", "some value", None).await.unwrap();

    let status = client.status().await.unwrap();
    let version: Vec<u64> = status
        .version()
        .split('.')
        .map(|part| part.parse().unwrap())
        .collect();
    assert!(version >= vec![3, 5, 8], "{}", status.version());
    assert_eq!(
        status.leader(),
        identity.member_id,
        "this node is the primary"
    );
    let applied = served.runtime.applied().borrow().0;
    assert_eq!(
        (status.raft_index(), status.raft_applied_index()),
        (applied, applied)
    );
    assert!(status.raft_term() > 0);
    assert!(status.db_size() >= "k".len() as i64 + "some value".len() as i64);
    assert!(status.errors().is_empty(), "{:?}", status.errors());
    assert_eq!(status.header().unwrap().revision(), 2);

    for action in [AlarmAction::Get, AlarmAction::Deactivate] {
        let alarms = client
            .alarm(action, AlarmType::Nospace, None)
            .await
            .unwrap();
        assert!(alarms.alarms().is_empty());
    }
    let none = client
        .alarm(AlarmAction::Activate, AlarmType::None, None)
        .await
        .unwrap();
    assert!(none.alarms().is_empty());
    let defragmented = client.defragment().await.unwrap();
    assert_eq!(defragmented.header().unwrap().revision(), 2);

    let members = client.member_list().await.unwrap();
    let [member] = members.members() else {
        panic!("one member: {members:?}");
    };
    assert_eq!(member.id(), identity.member_id);
    assert_eq!(member.client_urls(), [format!("http://{}", served.address)]);
    assert_eq!(member.name(), served.runtime.config().holder.as_str());
    assert!(!member.is_learner());

    let channel = tonic::transport::Endpoint::from_shared(format!("http://{}", served.address))
        .unwrap()
        .connect()
        .await
        .unwrap();
    let mut health = tonic_health::pb::health_client::HealthClient::new(channel);
    let answer = health
        .check(tonic_health::pb::HealthCheckRequest::default())
        .await
        .unwrap();
    assert_eq!(
        answer.into_inner().status,
        tonic_health::pb::health_check_response::ServingStatus::Serving as i32
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_rpc_not_served_answers_unimplemented_naming_it() {
    let served = support::serve("etcd-unserved", |_| {}).await;
    let mut client = served.client().await;
    assert_unimplemented(client.auth_enable().await, "Auth/AuthEnable");
    assert_unimplemented(client.user_list().await, "Auth/UserList");
    assert_unimplemented(client.role_add("r").await, "Auth/RoleAdd");
    assert_unimplemented(client.hash().await, "Maintenance/Hash");
    assert_unimplemented(client.snapshot().await, "Maintenance/Snapshot");
    assert_unimplemented(client.move_leader(1).await, "Maintenance/MoveLeader");
    assert_unimplemented(
        client.member_add(["http://127.0.0.1:2380"], None).await,
        "Cluster/MemberAdd",
    );
    assert_unimplemented(client.member_remove(1).await, "Cluster/MemberRemove");
    assert_unimplemented(client.member_promote(1).await, "Cluster/MemberPromote");

    // etcd 3.7's RangeStream, which etcd-client does not call yet.
    let channel = tonic::transport::Endpoint::from_shared(format!("http://{}", served.address))
        .unwrap()
        .connect()
        .await
        .unwrap();
    let mut kv = pb::kv_client::KvClient::new(channel);
    let request = pb::RangeRequest {
        key: bytes::Bytes::from_static(b"k"),
        ..Default::default()
    };
    let refused = kv.range_stream(request).await.unwrap_err();
    assert_eq!(refused.code(), Code::Unimplemented, "{refused:?}");
    assert!(refused.message().contains("KV/RangeStream"), "{refused:?}");
}

/// How long a standby may take to apply what the primary wrote.
const STANDBY_PATIENCE: std::time::Duration = std::time::Duration::from_secs(20);

/// A standby serves what etcd serves from any member (serializable reads,
/// Status, MemberList) and forwards everything that needs the primary
/// (linearizable reads, writes) to it, as an etcd follower forwards to its
/// leader; a request already forwarded once is answered `Unavailable`
/// naming the primary, and so is one the primary itself refuses.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_standby_serves_serializable_reads_and_forwards_the_rest_to_the_primary() {
    let database = support::unique("etcd-standby");
    let stores = MemoryStores::new(&database, |store| store).await;
    let first = stores.runtime("http://first:1");
    wait_until("primary", || first.is_primary_and_sure()).await;
    let primary = support::serve_runtime(first, &database, |_| {}).await;
    let standby =
        support::serve_runtime(stores.runtime("http://second:2"), &database, |_| {}).await;
    let put = primary.client().await.put("k", "v", None).await.unwrap();
    let revision = put.header().unwrap().revision();
    let mut client = standby.client().await;

    let serializable = || Some(GetOptions::new().with_serializable());
    let deadline = tokio::time::Instant::now() + STANDBY_PATIENCE;
    let read = loop {
        let read = client.get("k", serializable()).await.unwrap();
        if read.header().unwrap().revision() == revision {
            break read;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "standby at {read:?}"
        );
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    };
    assert_eq!(read.kvs()[0].value(), b"v");
    let read_only = Txn::new().and_then([TxnOp::get("k", serializable())]);
    assert!(client.txn(read_only).await.unwrap().succeeded());

    // Forwarded: each answers as the primary does.
    let written = client.put("k", "w", None).await.unwrap();
    assert_eq!(written.header().unwrap().revision(), revision + 1);
    let read = client.get("k", None).await.unwrap();
    assert_eq!(read.kvs()[0].value(), b"w", "a linearizable read");
    let linearizable_txn = Txn::new().and_then([TxnOp::get("k", None)]);
    let answered = client.txn(linearizable_txn).await.unwrap();
    assert_eq!(answered.header().unwrap().revision(), revision + 1);
    let write_txn = Txn::new().and_then([TxnOp::put("j", "x", None)]);
    assert!(client.txn(write_txn).await.unwrap().succeeded());
    assert_eq!(client.delete("j", None).await.unwrap().deleted(), 1);
    client.compact(revision, None).await.unwrap();
    let on_primary = primary.client().await.get("k", None).await.unwrap();
    assert_eq!(on_primary.header().unwrap().revision(), revision + 3);
    wait_until("the forwarded writes applied on the standby", || {
        standby.runtime.read_stale(|state| state.revision()).0 == revision + 3
    })
    .await;

    // Forwarded once already: the standby answers itself.
    let channel = tonic::transport::Endpoint::from_shared(standby.endpoint())
        .unwrap()
        .connect()
        .await
        .unwrap();
    let mut kv = pb::kv_client::KvClient::new(channel);
    let mut again = tonic::Request::new(pb::PutRequest {
        key: bytes::Bytes::from_static(b"k"),
        ..Default::default()
    });
    again
        .metadata_mut()
        .insert(chorus_etcd::forward::FORWARDED, "1".parse().unwrap());
    let refused = kv.put(again).await.unwrap_err();
    assert_eq!(refused.code(), Code::Unavailable, "{refused:?}");
    assert!(
        refused.message().contains("the primary is http://first:1"),
        "{refused:?}"
    );

    let members = client.member_list().await.unwrap();
    let names: Vec<_> = members.members().iter().map(|m| m.name()).collect();
    assert_eq!(names, ["http://second:2", "http://first:1"], "{members:?}");
    let [own, leader] = members.members() else {
        unreachable!("two members");
    };
    assert_eq!(own.client_urls(), [standby.endpoint()]);
    assert_eq!(leader.client_urls(), [primary.endpoint()]);
    assert_eq!(leader.id(), primary.service.identity().member_id);
    assert_eq!(leader.peer_urls(), ["http://first:1"]);
    let status = client.status().await.unwrap();
    assert_eq!(
        status.leader(),
        leader.id(),
        "the standby names the primary"
    );
    assert_eq!(status.header().unwrap().revision(), revision + 3);

    // A primary that stopped (its lease not yet expired) refuses, and the
    // standby relays the refusal: nothing is written.
    primary.runtime.abort();
    let refused = self::status(client.put("k", "z", None).await.unwrap_err());
    assert_eq!(refused.code(), Code::Unavailable, "{refused:?}");
    assert!(refused.message().contains("not the primary"), "{refused:?}");
    let read = client.get("k", serializable()).await.unwrap();
    assert_eq!(read.kvs()[0].value(), b"w");
}
