//! Watch responses as the suites compare them with a real etcd's: every
//! field but the header's deployment ids, events as PUT or DELETE with the
//! key-value and the previous one. Shared by
//! `crates/chorus-etcd/tests/watch.rs` (scripted scenarios) and the
//! differential workload (`etcd_workload.rs`, seeded watches).

#![allow(dead_code)] // each suite uses a different subset

/// One event as compared: PUT or DELETE, the key-value's key, value,
/// create, mod revision, version and lease, and the previous one's if any.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Ev {
    pub put: bool,
    pub kv: Kv,
    pub prev: Option<Kv>,
}

/// A key-value as compared: key, value, create revision, mod revision,
/// version, lease.
pub type Kv = (String, String, i64, i64, i64, i64);

/// One response as compared, every field but the header's ids.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Resp {
    pub revision: i64,
    pub watch_id: i64,
    pub created: bool,
    pub canceled: bool,
    pub compact_revision: i64,
    pub cancel_reason: String,
    pub fragment: bool,
    pub events: Vec<Ev>,
}

/// A key-value of etcd's client as compared.
pub fn kv(kv: &etcd_client::KeyValue) -> Kv {
    (
        String::from_utf8_lossy(kv.key()).into_owned(),
        String::from_utf8_lossy(kv.value()).into_owned(),
        kv.create_revision(),
        kv.mod_revision(),
        kv.version(),
        kv.lease(),
    )
}

/// A response of etcd's client as compared.
pub fn resp(response: &etcd_client::WatchResponse) -> Resp {
    Resp {
        revision: response.header().map_or(0, |h| h.revision()),
        watch_id: response.watch_id(),
        created: response.created(),
        canceled: response.canceled(),
        compact_revision: response.compact_revision(),
        cancel_reason: response.cancel_reason().to_owned(),
        fragment: response.0.fragment,
        events: response
            .events()
            .iter()
            .map(|event| Ev {
                put: event.event_type() == etcd_client::EventType::Put,
                kv: kv(event.kv().expect("an event's kv")),
                prev: event.prev_kv().map(kv),
            })
            .collect(),
    }
}
