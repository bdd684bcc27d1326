//! The space quota (etcd's `--quota-backend-bytes`), one for both APIs.
//!
//! A write is charged what etcd would charge it: a put its key and value
//! plus [`PUT_OVERHEAD_BYTES`], a lease grant [`GRANT_OVERHEAD_BYTES`],
//! anything else nothing. The state's size is its keys and values plus the
//! retained history. A write that costs something is refused before it is
//! appended while the NOSPACE alarm is raised, or when it would take the
//! state to the quota. The size is checked at admission against the applied
//! state, not at apply: whether a record applies must not depend on the
//! quota a process was started with.

use super::{Command, KvState, Operation};

/// etcd's default quota: 2 GiB.
pub const DEFAULT_QUOTA_BYTES: usize = 2 << 30;

/// What the quota charges a put beyond its key and value (etcd's
/// `kvOverhead`).
pub const PUT_OVERHEAD_BYTES: usize = 256;

/// What the quota charges a lease grant (etcd's `leaseOverhead`).
pub const GRANT_OVERHEAD_BYTES: usize = 64;

/// What the quota charges a put of `key` and `value`.
pub fn put_cost(key: &[u8], value: &[u8]) -> usize {
    PUT_OVERHEAD_BYTES + key.len() + value.len()
}

/// Why a write that adds data is refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NoSpace {
    /// The NOSPACE alarm is raised (for any member).
    AlarmRaised,
    /// The write would take the state to the quota.
    OverQuota {
        /// The state's size now.
        used: usize,
        /// What the write costs.
        cost: usize,
        /// The quota.
        quota: usize,
    },
}

impl KvState {
    /// The bytes the quota weighs: current keys and values plus the
    /// retained history.
    pub fn space_bytes(&self) -> usize {
        self.size_bytes().saturating_add(self.history_bytes())
    }

    /// Whether a write costing `cost` may be appended under `quota`.
    pub fn check_space(&self, cost: usize, quota: usize) -> Result<(), NoSpace> {
        if cost == 0 {
            return Ok(());
        }
        if self.out_of_space() {
            return Err(NoSpace::AlarmRaised);
        }
        let used = self.space_bytes();
        if used.saturating_add(cost) >= quota {
            return Err(NoSpace::OverQuota { used, cost, quota });
        }
        Ok(())
    }
}

impl Command {
    /// What the quota charges this command: its puts (a batch applies all
    /// of its operations); deletes cost nothing.
    pub fn quota_cost(&self) -> usize {
        let cost = |operation: &Operation| match operation {
            Operation::Put { key, value, .. } => put_cost(key, value),
            Operation::Delete { .. } => 0,
        };
        match self {
            Command::Single(operation) => cost(operation),
            Command::Batch(operations) => operations.iter().map(cost).sum(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kv::Condition;
    use crate::kv::EtcdCommand;
    use crate::kv::etcd::{AlarmAction, AlarmMember, AlarmRequest, AlarmType, PutRequest};
    use crate::kv::etcd_test_support::{apply, b};

    fn put(key: &str, value: &str) -> Operation {
        Operation::Put {
            key: b(key),
            value: b(value),
            condition: Condition::None,
        }
    }

    fn delete(key: &str) -> Operation {
        Operation::Delete {
            key: b(key),
            condition: Condition::None,
        }
    }

    #[test]
    fn commands_cost_their_puts() {
        assert_eq!(Command::Single(put("k", "vv")).quota_cost(), 256 + 1 + 2);
        assert_eq!(Command::Single(delete("k")).quota_cost(), 0);
        let batch = Command::Batch(vec![put("a", "1"), delete("b"), put("cc", "")]);
        assert_eq!(batch.quota_cost(), (256 + 2) + (256 + 2));
    }

    #[test]
    fn a_write_is_refused_when_it_would_reach_the_quota() {
        let mut state = KvState::default();
        let put = PutRequest {
            key: b("k"),
            value: b("value"),
            ..PutRequest::default()
        };
        apply(&mut state, EtcdCommand::Put(put)).unwrap();
        let used = state.space_bytes();
        assert_eq!(used, state.size_bytes() + state.history_bytes());
        assert_eq!(state.size_bytes(), "k".len() + "value".len());
        let cost = put_cost(b"k2", b"v");
        assert_eq!(state.check_space(cost, used + cost + 1), Ok(()));
        assert_eq!(
            state.check_space(cost, used + cost),
            Err(NoSpace::OverQuota {
                used,
                cost,
                quota: used + cost
            })
        );
        // What adds nothing always fits.
        assert_eq!(state.check_space(0, 1), Ok(()));
    }

    #[test]
    fn the_alarm_refuses_every_write_that_adds_data() {
        let mut state = KvState::default();
        let alarm = EtcdCommand::Alarm(AlarmRequest {
            action: AlarmAction::Activate,
            member: AlarmMember {
                member_id: 7,
                alarm: AlarmType::NoSpace,
            },
        });
        apply(&mut state, alarm).unwrap();
        assert!(state.out_of_space());
        assert_eq!(
            state.check_space(put_cost(b"k", b""), usize::MAX),
            Err(NoSpace::AlarmRaised)
        );
        assert_eq!(state.check_space(0, usize::MAX), Ok(()));
    }
}
