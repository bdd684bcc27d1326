//! A metrics recorder for tests: what the library reports through the
//! `metrics` facade, by name and labels, as this thread's local recorder.
//!
//! Include next to `mod support;`:
//! `#[path = "support/metrics.rs"] mod metrics_support;`

#![allow(dead_code)] // each test binary uses a different subset

use std::collections::BTreeMap;
use std::future::Future;
use std::sync::{Arc, Mutex};

use metrics::{
    Counter, CounterFn, Gauge, GaugeFn, Histogram, HistogramFn, Key, KeyName, Metadata,
    SharedString, Unit,
};

/// One series: the metric's name and its labels as `name=value`, sorted.
pub type Series = (String, Vec<String>);

/// Every value each series received, in order (counters: their increments).
#[derive(Debug, Clone, Default)]
pub struct Recorded {
    values: Arc<Mutex<BTreeMap<Series, Vec<f64>>>>,
}

struct Handle {
    series: Series,
    values: Arc<Mutex<BTreeMap<Series, Vec<f64>>>>,
}

impl Handle {
    fn push(&self, value: f64) {
        let mut values = self.values.lock().unwrap();
        values.entry(self.series.clone()).or_default().push(value);
    }
}

impl CounterFn for Handle {
    fn increment(&self, value: u64) {
        self.push(value as f64);
    }

    fn absolute(&self, value: u64) {
        self.push(value as f64);
    }
}

impl GaugeFn for Handle {
    fn increment(&self, value: f64) {
        self.push(value);
    }

    fn decrement(&self, value: f64) {
        self.push(-value);
    }

    fn set(&self, value: f64) {
        self.push(value);
    }
}

impl HistogramFn for Handle {
    fn record(&self, value: f64) {
        self.push(value);
    }
}

impl Recorded {
    fn handle(&self, key: &Key) -> Arc<Handle> {
        let mut labels: Vec<String> = key
            .labels()
            .map(|label| format!("{}={}", label.key(), label.value()))
            .collect();
        labels.sort();
        Arc::new(Handle {
            series: (key.name().to_owned(), labels),
            values: Arc::clone(&self.values),
        })
    }

    /// The values of `name` with exactly `labels` (`name=value`, any order).
    pub fn values(&self, name: &str, labels: &[&str]) -> Vec<f64> {
        let mut labels: Vec<String> = labels.iter().map(|l| (*l).to_owned()).collect();
        labels.sort();
        let values = self.values.lock().unwrap();
        values
            .get(&(name.to_owned(), labels))
            .cloned()
            .unwrap_or_default()
    }

    /// The sum of a counter's increments over every series named `name`.
    pub fn total(&self, name: &str) -> f64 {
        let values = self.values.lock().unwrap();
        values
            .iter()
            .filter(|((series, _), _)| series == name)
            .flat_map(|(_, values)| values)
            .sum()
    }

    /// The series named `name`: their labels and values.
    pub fn series(&self, name: &str) -> Vec<(Vec<String>, Vec<f64>)> {
        let values = self.values.lock().unwrap();
        values
            .iter()
            .filter(|((series, _), _)| series == name)
            .map(|((_, labels), values)| (labels.clone(), values.clone()))
            .collect()
    }

    /// Runs `scenario` on a single-threaded runtime with paused time, with
    /// this as the thread's metrics recorder: every task of the runtime (the
    /// writer's pipeline included) runs on this thread and reports here.
    /// Work handed to the blocking pool reports nowhere.
    pub fn run<F: Future<Output = ()>>(&self, scenario: impl FnOnce() -> F) {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .start_paused(true)
            .build()
            .expect("runtime");
        metrics::with_local_recorder(self, || runtime.block_on(scenario()));
    }
}

impl metrics::Recorder for Recorded {
    fn describe_counter(&self, _: KeyName, _: Option<Unit>, _: SharedString) {}
    fn describe_gauge(&self, _: KeyName, _: Option<Unit>, _: SharedString) {}
    fn describe_histogram(&self, _: KeyName, _: Option<Unit>, _: SharedString) {}

    fn register_counter(&self, key: &Key, _: &Metadata<'_>) -> Counter {
        Counter::from_arc(self.handle(key))
    }

    fn register_gauge(&self, key: &Key, _: &Metadata<'_>) -> Gauge {
        Gauge::from_arc(self.handle(key))
    }

    fn register_histogram(&self, key: &Key, _: &Metadata<'_>) -> Histogram {
        Histogram::from_arc(self.handle(key))
    }
}
