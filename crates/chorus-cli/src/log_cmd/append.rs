//! `chorus log append`: append newline-delimited records, pipelined.
//!
//! Input: records separated by `\n` (standard input, or `--file`). Only the
//! `\n` is removed; a `\r` before it is part of the record. An empty line is an
//! empty record; a last line without a final `\n` is a record too.
//!
//! Output contract: one JSON line `{"index":N}` per acknowledged record, in
//! index order, flushed as each ack arrives. A printed index is durable on a
//! quorum of replicas. Appends are pipelined: the next record is admitted
//! without waiting for earlier acks; when admission refuses with backpressure,
//! the oldest outstanding ack is awaited (and printed) before retrying.
//!
//! On failure the command prints every ack that did arrive, then exits non-zero
//! with one line on stderr. If standard output is closed (`| head`), it stops
//! reading input, waits for the records already admitted, and exits 0.

use std::collections::VecDeque;
use std::io::{self, BufRead, BufReader, Read};
use std::path::PathBuf;
use std::time::Duration;

use bytes::Bytes;
use chorus::ids::RecordIndex;
use chorus::log::{Completion, LogConfig, LogError, Receipt, Recovery, Writer};
use serde::Serialize;
use tokio::sync::mpsc;

use crate::CommandError;
use crate::config::StoreArgs;
use crate::open::{Access, open_log};
use crate::output::{json_line, output_error};

/// Records read ahead of admission.
const INPUT_QUEUE_RECORDS: usize = 256;
/// Read buffer of the input.
const INPUT_BUFFER_BYTES: usize = 64 * 1024;
/// Pause before retrying admission when nothing is outstanding to wait for
/// (the previous segment is still being sealed).
const ADMISSION_RETRY_PAUSE: Duration = Duration::from_millis(10);
/// Bound on the final drain of the writer (every ack was awaited before it).
const SHUTDOWN_TIMEOUT: Duration = Duration::from_secs(30);

/// Arguments of `log append`.
#[derive(Debug, clap::Args)]
pub struct AppendArgs {
    #[command(flatten)]
    store: StoreArgs,

    /// Read records from this file instead of standard input.
    #[arg(long)]
    file: Option<PathBuf>,

    /// Seal the active segment into one object once it holds this many bytes.
    /// Smaller segments mean more seals and directory entries; larger ones mean
    /// longer recovery reads and more memory while sealing.
    #[arg(long, default_value_t = LogConfig::default().max_segment_bytes)]
    max_segment_bytes: u64,

    /// Wait up to this many milliseconds for more records before writing a
    /// fragment that is not full: fewer store requests (cost) for added latency.
    #[arg(long, default_value_t = 0)]
    linger_ms: u64,
}

impl AppendArgs {
    fn log_config(&self) -> LogConfig {
        LogConfig {
            max_segment_bytes: self.max_segment_bytes,
            linger: Duration::from_millis(self.linger_ms),
            ..LogConfig::default()
        }
    }

    fn open_input(&self) -> Result<Box<dyn Read + Send>, CommandError> {
        match &self.file {
            None => Ok(Box::new(io::stdin())),
            Some(path) => match std::fs::File::open(path) {
                Ok(file) => Ok(Box::new(file)),
                Err(e) => Err(format!("cannot open input file {}: {e}", path.display()).into()),
            },
        }
    }
}

/// Runs `log append`.
pub async fn append(args: AppendArgs) -> Result<(), CommandError> {
    let location = args.store.resolve()?;
    let config = args.log_config();
    config.validate()?;
    let input = args.open_input()?;
    let log = open_log(&location, Access::Write).await?;
    let max_record_bytes = config.max_record_bytes as usize;
    let writer = start_writer(log.stores, config).await?;
    let records = spawn_input(input, max_record_bytes);
    Appender::new(writer).run(records).await
}

/// Recovers the log and starts a writer at its end. Appending needs none of
/// the existing records, so the replay runs from the recovered end (empty).
async fn start_writer(
    stores: chorus::log::LogStores,
    config: LogConfig,
) -> Result<Writer, CommandError> {
    let recovery = Recovery::run(stores, config)
        .await
        .map_err(|e| format!("cannot recover the log: {e}"))?;
    let mut replay = recovery.replay(recovery.end())?;
    while replay.next().await?.is_some() {}
    let writer = recovery
        .start()
        .await
        .map_err(|e| format!("cannot start writing: {e}"))?;
    Ok(writer)
}

/// One input record.
#[derive(Debug)]
struct Line {
    /// Its line number in the input, from 1.
    number: u64,
    payload: Bytes,
}

/// An input record, or why the input could not be read.
type InputItem = Result<Line, String>;

/// Reads records on a thread of its own: reads of standard input block, and a
/// thread blocked in one must not keep the process from exiting.
fn spawn_input(source: Box<dyn Read + Send>, max_record_bytes: usize) -> mpsc::Receiver<InputItem> {
    let (sender, receiver) = mpsc::channel(INPUT_QUEUE_RECORDS);
    std::thread::spawn(move || {
        let mut reader = BufReader::with_capacity(INPUT_BUFFER_BYTES, source);
        for number in 1.. {
            let item = match read_record(&mut reader, max_record_bytes) {
                Ok(None) => return,
                Ok(Some(payload)) => Ok(Line {
                    number,
                    payload: Bytes::from(payload),
                }),
                Err(e) => Err(format!("cannot read input line {number}: {e}")),
            };
            let failed = item.is_err();
            if sender.blocking_send(item).is_err() || failed {
                return;
            }
        }
    });
    receiver
}

/// The next `\n`-terminated record without its `\n`; `None` at the end of the
/// input. A line longer than `max_bytes` is an error before it is all read.
fn read_record(reader: &mut impl BufRead, max_bytes: usize) -> io::Result<Option<Vec<u8>>> {
    let mut record = Vec::new();
    let mut any = false;
    loop {
        let available = match reader.fill_buf() {
            Ok(available) => available,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
        };
        if available.is_empty() {
            return Ok(any.then_some(record));
        }
        any = true;
        let newline = available.iter().position(|&byte| byte == b'\n');
        let taken = newline.unwrap_or(available.len());
        record.extend_from_slice(&available[..taken]);
        reader.consume(newline.map_or(taken, |at| at + 1));
        if record.len() > max_bytes {
            return Err(io::Error::other(format!(
                "record longer than max_record_bytes={max_bytes}"
            )));
        }
        if newline.is_some() {
            return Ok(Some(record));
        }
    }
}

/// One ack line.
#[derive(Debug, Serialize)]
struct Ack {
    index: u64,
}

/// Why appending stopped early.
#[derive(Debug)]
enum Halt {
    /// The input failed, or admission refused a record: records already
    /// admitted are still awaited and their acks printed.
    Refused(String),
    /// Standard output failed: records already admitted are still awaited.
    Output(io::Error),
    /// An admitted record failed: nothing after it is printed.
    Failed(String),
}

impl Halt {
    fn into_error(self) -> CommandError {
        match self {
            Halt::Refused(message) | Halt::Failed(message) => message.into(),
            Halt::Output(error) => output_error(error),
        }
    }
}

/// What woke the append loop.
enum Event {
    Ack(RecordIndex, Result<Receipt, LogError>),
    Input(Option<InputItem>),
}

/// The append loop: admits records, prints acks in order as they arrive.
struct Appender {
    writer: Writer,
    /// Admitted records not yet acknowledged, oldest first.
    outstanding: VecDeque<Completion>,
    /// False once standard output failed.
    printing: bool,
}

impl Appender {
    fn new(writer: Writer) -> Appender {
        Appender {
            writer,
            outstanding: VecDeque::new(),
            printing: true,
        }
    }

    /// Appends everything, then awaits every ack and shuts the writer down.
    async fn run(mut self, mut records: mpsc::Receiver<InputItem>) -> Result<(), CommandError> {
        let mut halt = self.pump(&mut records).await.err();
        drop(records);
        if !matches!(halt, Some(Halt::Failed(_)))
            && let Err(failed) = self.drain().await
        {
            halt = Some(failed);
        }
        match halt {
            Some(Halt::Failed(_)) => self.writer.abort(),
            _ => {
                if let Err(e) = self.writer.shutdown(SHUTDOWN_TIMEOUT).await {
                    halt.get_or_insert(Halt::Failed(format!("cannot shut down the writer: {e}")));
                }
            }
        }
        halt.map_or(Ok(()), |halt| Err(halt.into_error()))
    }

    /// Admits input records and prints acks until the input ends or a halt.
    async fn pump(&mut self, records: &mut mpsc::Receiver<InputItem>) -> Result<(), Halt> {
        loop {
            let event = tokio::select! {
                biased;
                (index, outcome) = oldest(&mut self.outstanding) => Event::Ack(index, outcome),
                item = records.recv() => Event::Input(item),
            };
            match event {
                Event::Ack(index, outcome) => {
                    self.outstanding.pop_front();
                    self.print(index, outcome)?;
                }
                Event::Input(None) => return Ok(()),
                Event::Input(Some(Err(message))) => return Err(Halt::Refused(message)),
                Event::Input(Some(Ok(line))) => self.admit(line).await?,
            }
        }
    }

    /// Admits `line`, waiting for room while admission refuses with backpressure.
    async fn admit(&mut self, line: Line) -> Result<(), Halt> {
        loop {
            match self.writer.append(line.payload.clone()) {
                Ok(completion) => {
                    self.outstanding.push_back(completion);
                    return Ok(());
                }
                Err(LogError::Backpressure { .. } | LogError::ActiveSegmentFull { .. }) => {
                    self.wait_for_room().await?;
                }
                Err(e) => {
                    return Err(Halt::Refused(format!(
                        "cannot append input line {}: {e}",
                        line.number
                    )));
                }
            }
        }
    }

    /// Awaits (and prints) the oldest ack, or pauses if nothing is outstanding.
    async fn wait_for_room(&mut self) -> Result<(), Halt> {
        match self.outstanding.pop_front() {
            Some(completion) => {
                let index = completion.index();
                let outcome = completion.await;
                self.print(index, outcome)
            }
            None => {
                tokio::time::sleep(ADMISSION_RETRY_PAUSE).await;
                Ok(())
            }
        }
    }

    /// Awaits every outstanding ack in order, printing each, until one fails.
    /// A failing standard output stops the printing, not the awaiting.
    async fn drain(&mut self) -> Result<(), Halt> {
        while let Some(completion) = self.outstanding.pop_front() {
            let index = completion.index();
            let outcome = completion.await;
            match self.print(index, outcome) {
                Ok(()) | Err(Halt::Output(_)) => {}
                Err(halt) => return Err(halt),
            }
        }
        Ok(())
    }

    /// Prints the ack of `index`, or turns its failure into a halt.
    fn print(
        &mut self,
        index: RecordIndex,
        outcome: Result<Receipt, LogError>,
    ) -> Result<(), Halt> {
        let receipt = outcome.map_err(|e| {
            Halt::Failed(format!(
                "append failed: index={index} may_have_committed={}: {e}",
                e.may_have_committed()
            ))
        })?;
        if !self.printing {
            return Ok(());
        }
        let ack = Ack {
            index: receipt.index.0,
        };
        json_line(&ack).map_err(|e| {
            self.printing = false;
            Halt::Output(e)
        })
    }
}

/// The outcome of the oldest outstanding append; pending while there is none.
async fn oldest(
    outstanding: &mut VecDeque<Completion>,
) -> (RecordIndex, Result<Receipt, LogError>) {
    match outstanding.front_mut() {
        Some(completion) => (completion.index(), completion.await),
        None => std::future::pending().await,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn records(input: &[u8], max_bytes: usize) -> io::Result<Vec<Vec<u8>>> {
        let mut reader = BufReader::with_capacity(4, input);
        let mut records = Vec::new();
        while let Some(record) = read_record(&mut reader, max_bytes)? {
            records.push(record);
        }
        Ok(records)
    }

    #[test]
    fn only_the_newline_is_stripped() {
        let parsed = records(b"alpha\r\n\nlonger line\nlast", 64).unwrap();
        let expected: Vec<&[u8]> = vec![b"alpha\r", b"", b"longer line", b"last"];
        assert_eq!(parsed, expected);
        assert!(records(b"", 64).unwrap().is_empty());
        assert_eq!(records(b"\n", 64).unwrap(), vec![Vec::<u8>::new()]);
    }

    #[test]
    fn an_overlong_line_is_refused() {
        assert_eq!(
            records(b"12345678\n", 8).unwrap(),
            vec![b"12345678".to_vec()]
        );
        let error = records(b"ok\n123456789\n", 8).unwrap_err();
        assert!(error.to_string().contains("max_record_bytes=8"), "{error}");
    }
}
