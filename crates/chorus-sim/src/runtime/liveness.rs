//! The liveness stages (R7): with every fault healed and the clocks
//! agreeing, a process must become primary, every write resolve, a new
//! write be acknowledged, the primary's final state hold everything
//! acknowledged, and every other process converge on it.

use std::time::Duration;

use chorus::kv::KvState;
use tokio::time::Instant;

use super::RuntimePhase;
use super::workload::{COUNTER, counter_value};
use crate::model::Violation;

/// How long (virtual) each liveness stage may take.
const LIVENESS_DEADLINE: Duration = Duration::from_secs(600);
/// How often the liveness stages look.
const LIVENESS_POLL: Duration = Duration::from_millis(100);

impl RuntimePhase<'_> {
    /// Heals everything, lets the clocks agree, and demands progress.
    pub(super) async fn liveness(&mut self) -> Result<(), Violation> {
        self.event("runtime liveness: healing every fault, clocks agree");
        self.world.heal();
        self.control.faults.clear();
        self.expiring.clear();
        for node in 0..self.nodes.len() {
            self.nodes[node].isolated = None;
            self.nodes[node].clear();
            self.nodes[node].clock.set_skew(0);
        }
        self.liveness_shutdowns().await?;
        let primary = self.liveness_primary().await?;
        self.liveness_resolve().await?;
        let primary = self.liveness_write(primary).await?;
        let primary = self.liveness_final_state(primary).await?;
        self.liveness_converge(primary).await
    }

    /// Lets `LIVENESS_POLL` pass and checks.
    async fn tick(&mut self) -> Result<(), Violation> {
        self.step += 1;
        tokio::time::sleep(LIVENESS_POLL).await;
        self.observe()
    }

    /// Lets the graceful shutdowns the schedule asked for finish, so that no
    /// process stops in the middle of the stages below.
    async fn liveness_shutdowns(&mut self) -> Result<(), Violation> {
        let deadline = Instant::now() + LIVENESS_DEADLINE;
        let stopping = |phase: &Self| {
            phase.nodes.iter().any(|node| {
                node.process
                    .as_ref()
                    .is_some_and(|process| process.shutdown.is_some())
            })
        };
        while stopping(self) {
            if Instant::now() >= deadline {
                return Err(format!(
                    "runtime liveness: a graceful shutdown did not finish within \
                     {LIVENESS_DEADLINE:?} after every fault was healed"
                ));
            }
            self.tick().await?;
        }
        Ok(())
    }

    /// Boots every node that has no process (crashed or shut down) and
    /// waits until one answers current reads.
    async fn liveness_primary(&mut self) -> Result<usize, Violation> {
        let deadline = Instant::now() + LIVENESS_DEADLINE;
        loop {
            for node in 0..self.nodes.len() {
                if self.nodes[node].process.is_none() {
                    self.boot(node, false, false);
                }
            }
            self.tick().await?;
            if let Some(primary) = self.primary() {
                self.event(format!("runtime liveness: n{primary} is primary"));
                return Ok(primary);
            }
            if Instant::now() >= deadline {
                let roles: Vec<String> = self
                    .nodes
                    .iter()
                    .enumerate()
                    .filter_map(|(node, slot)| {
                        let status = slot.process.as_ref()?.runtime.status();
                        Some(format!("n{node} {} {:?}", status.role, status.last_error))
                    })
                    .collect();
                return Err(format!(
                    "runtime liveness: no process became primary within {LIVENESS_DEADLINE:?} \
                     after every fault was healed: {}",
                    roles.join("; ")
                ));
            }
        }
    }

    async fn liveness_resolve(&mut self) -> Result<(), Violation> {
        let deadline = Instant::now() + LIVENESS_DEADLINE;
        while !self.writes.is_empty() {
            if Instant::now() >= deadline {
                let ids: Vec<String> = self
                    .writes
                    .iter()
                    .map(|write| format!("W{} on n{}", write.id, write.node))
                    .collect();
                return Err(format!(
                    "runtime liveness: writes unresolved {LIVENESS_DEADLINE:?} after every \
                     fault was healed: {}",
                    ids.join(", ")
                ));
            }
            self.tick().await?;
        }
        Ok(())
    }

    /// A put through the primary must be acknowledged (refusals while the
    /// primary settles are retried, wherever the primary is then).
    async fn liveness_write(&mut self, mut primary: usize) -> Result<usize, Violation> {
        let deadline = Instant::now() + LIVENESS_DEADLINE;
        loop {
            let acked = self.stats.acked;
            self.write(primary);
            while !self.writes.is_empty() && Instant::now() < deadline {
                self.tick().await?;
            }
            if self.stats.acked > acked {
                return Ok(primary);
            }
            if Instant::now() >= deadline {
                return Err(format!(
                    "runtime liveness: no write acknowledged within {LIVENESS_DEADLINE:?} \
                     after every fault was healed"
                ));
            }
            self.tick().await?;
            primary = self.primary().unwrap_or(primary);
        }
    }

    /// The final check on the primary's current state, including the
    /// counter's upper bound.
    /// Returns the primary that answered, which may have changed meanwhile: a
    /// primary can be unsure of its lease for a moment after healing (its
    /// refreshes failed until then), as a client of the service would see.
    async fn liveness_final_state(&mut self, mut primary: usize) -> Result<usize, Violation> {
        let deadline = Instant::now() + LIVENESS_DEADLINE;
        let (state, end) = loop {
            let answer = self.nodes[primary]
                .process
                .as_ref()
                .map(|process| process.runtime.read(KvState::clone));
            match answer {
                Some(Ok(answer)) => break answer,
                _ if Instant::now() >= deadline => {
                    return Err(format!(
                        "runtime liveness: no primary answered a current read within \
                         {LIVENESS_DEADLINE:?} after every fault was healed: {answer:?}"
                    ));
                }
                _ => {
                    self.tick().await?;
                    primary = self.primary().unwrap_or(primary);
                }
            }
        };
        let what = format!("the primary n{primary}'s final state");
        self.check_state(&state, end.0, &what)?;
        if let Some((&index, _)) = self.acked.last_key_value()
            && end.0 <= index
        {
            return Err(format!(
                "{what} reflects records below {end}, but index {index} was acknowledged"
            ));
        }
        let counter = match state.get(COUNTER) {
            None => 0,
            Some(entry) => counter_value(&entry.value).ok_or("the counter does not decode")?,
        };
        let acked = self.acked_increments.len() as u64;
        let most = acked + self.ambiguous_increments;
        if counter < acked || counter > most {
            return Err(format!(
                "{what}: the counter is {counter}, with {acked} increments acknowledged and {} \
                 ambiguous",
                self.ambiguous_increments
            ));
        }
        self.event(format!(
            "runtime liveness: final state at {end}: {} keys, counter {counter} ({acked} acked, \
             {} ambiguous)",
            state.len(),
            self.ambiguous_increments
        ));
        Ok(primary)
    }

    /// Every other live process converges on the primary's state.
    async fn liveness_converge(&mut self, primary: usize) -> Result<(), Violation> {
        let deadline = Instant::now() + LIVENESS_DEADLINE;
        loop {
            let Some(leader) = self.nodes[primary].process.as_ref() else {
                return Err("runtime liveness: the primary vanished".into());
            };
            let expected = leader.runtime.read_stale(KvState::clone);
            let behind: Vec<usize> = (0..self.nodes.len())
                .filter(|node| {
                    self.nodes[*node].process.as_ref().is_some_and(|process| {
                        process.runtime.read_stale(KvState::clone) != expected
                    })
                })
                .collect();
            if behind.is_empty() {
                return Ok(());
            }
            if Instant::now() >= deadline {
                return Err(format!(
                    "runtime liveness: n{behind:?} did not converge on the primary's state \
                     within {LIVENESS_DEADLINE:?}"
                ));
            }
            self.tick().await?;
        }
    }
}
