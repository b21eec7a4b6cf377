//! The host's log writer: formatted lines go through a bounded queue to a
//! thread of their own that writes them to stderr. A slow or stalled log
//! pipe then never blocks the runtime's workers (and with them every
//! tenant); lines that find the queue full are dropped and counted
//! (`wharf_log_lines_dropped_total`). The queue is bounded in lines and in
//! bytes, and each line is one line: at most [`MAX_LINE_BYTES`], its inner
//! line breaks escaped, whatever text a field brought into it.

use std::io::Write;
use std::sync::OnceLock;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::mpsc::{Receiver, SyncSender, TrySendError, sync_channel};
use std::time::Duration;

use tracing_subscriber::fmt::MakeWriter;

/// Lines waiting for the writer thread before further ones are dropped.
const QUEUED_LINES: usize = 16 * 1024;

/// Bytes of lines waiting for the writer thread before further ones are
/// dropped.
pub const QUEUED_BYTES: usize = 16 << 20;

/// The longest line written; the rest of a longer one is cut, saying so.
pub const MAX_LINE_BYTES: usize = 16 * 1024;

/// Bytes of the lines now queued, across the process.
static QUEUED: AtomicUsize = AtomicUsize::new(0);

/// How long [`flush`] waits for the queue to be written at exit.
const FLUSH_WAIT: Duration = Duration::from_secs(2);

static DROPPED: AtomicU64 = AtomicU64::new(0);

/// Lines dropped because the queue was full, since the process started.
pub fn dropped_lines() -> u64 {
    DROPPED.load(Ordering::Relaxed)
}

enum Line {
    Text(Vec<u8>),
    /// Answered once every line before it is written.
    Flush(SyncSender<()>),
}

/// Hands each formatted line to the writer thread; cloned into the
/// subscriber.
#[derive(Clone)]
pub struct LogWriter {
    queue: SyncSender<Line>,
}

static WRITER: OnceLock<LogWriter> = OnceLock::new();

impl LogWriter {
    /// The process's writer, its thread started on first use.
    pub fn stderr() -> LogWriter {
        WRITER
            .get_or_init(|| {
                let (queue, lines) = sync_channel(QUEUED_LINES);
                std::thread::Builder::new()
                    .name("wharf-log".into())
                    .spawn(move || write_lines(lines, std::io::stderr()))
                    .expect("spawning the log thread only fails when the OS is out of threads");
                LogWriter { queue }
            })
            .clone()
    }
}

fn write_lines(lines: Receiver<Line>, mut out: impl Write) {
    for line in lines {
        match line {
            Line::Text(text) => {
                let _ = out.write_all(&text);
                QUEUED.fetch_sub(text.len(), Ordering::Relaxed);
            }
            Line::Flush(done) => {
                let _ = out.flush();
                let _ = done.send(());
            }
        }
    }
}

/// Waits (at most [`FLUSH_WAIT`]) for every queued line to be written:
/// before exit. A stalled pipe cannot hold the exit: the flush is queued
/// from a thread of its own.
pub fn flush() {
    let Some(writer) = WRITER.get() else {
        return;
    };
    let (done, written) = sync_channel(1);
    let queue = writer.queue.clone();
    let _ = std::thread::Builder::new()
        .name("wharf-log-flush".into())
        .spawn(move || queue.send(Line::Flush(done)));
    let _ = written.recv_timeout(FLUSH_WAIT);
}

/// One event's line, sent when the formatter is done with it.
pub struct PendingLine {
    queue: SyncSender<Line>,
    text: Vec<u8>,
}

impl Write for PendingLine {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.text.extend_from_slice(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl Drop for PendingLine {
    fn drop(&mut self) {
        if self.text.is_empty() {
            return;
        }
        let text = one_line(std::mem::take(&mut self.text));
        let len = text.len();
        if QUEUED.fetch_add(len, Ordering::Relaxed) + len > QUEUED_BYTES {
            QUEUED.fetch_sub(len, Ordering::Relaxed);
            DROPPED.fetch_add(1, Ordering::Relaxed);
            return;
        }
        match self.queue.try_send(Line::Text(text)) {
            Ok(()) => {}
            Err(TrySendError::Disconnected(_)) => {
                QUEUED.fetch_sub(len, Ordering::Relaxed);
            }
            Err(TrySendError::Full(_)) => {
                QUEUED.fetch_sub(len, Ordering::Relaxed);
                DROPPED.fetch_add(1, Ordering::Relaxed);
            }
        }
    }
}

/// A formatted event as one line: line breaks inside it escaped (a field's
/// text can hold them, and a reader of the log would take what follows for
/// a line of its own), cut to [`MAX_LINE_BYTES`], ending in one newline.
fn one_line(mut text: Vec<u8>) -> Vec<u8> {
    while text.last().is_some_and(|b| *b == b'\n' || *b == b'\r') {
        text.pop();
    }
    if text.len() > MAX_LINE_BYTES || text.iter().any(|b| *b == b'\n' || *b == b'\r') {
        let mut line = Vec::with_capacity(text.len().min(MAX_LINE_BYTES) + 64);
        for (at, byte) in text.iter().enumerate() {
            if line.len() >= MAX_LINE_BYTES {
                // Not inside a character: back to its first byte.
                while line.last().is_some_and(|b: &u8| b & 0xc0 == 0x80) {
                    line.pop();
                }
                line.pop_if(|b: &mut u8| *b >= 0xc0);
                let _ = write!(line, "…(line cut: +{} bytes)", text.len() - at);
                break;
            }
            match byte {
                b'\n' => line.extend_from_slice(b"\\n"),
                b'\r' => line.extend_from_slice(b"\\r"),
                b => line.push(*b),
            }
        }
        text = line;
    }
    text.push(b'\n');
    text
}

impl<'a> MakeWriter<'a> for LogWriter {
    type Writer = PendingLine;

    fn make_writer(&'a self) -> PendingLine {
        PendingLine {
            queue: self.queue.clone(),
            text: Vec::new(),
        }
    }
}

/// A duration as a log line gives it: to the millisecond under ten
/// seconds, else to the second (`94ms`, `1m 2s`).
pub fn human(duration: Duration) -> String {
    let rounded = if duration < Duration::from_secs(10) {
        Duration::from_millis(u64::try_from(duration.as_millis()).unwrap_or(u64::MAX))
    } else {
        Duration::from_secs(duration.as_secs())
    };
    humantime::format_duration(rounded).to_string()
}

/// How often a failure that keeps repeating is told again.
pub const REMIND_EVERY: Duration = Duration::from_secs(60);

/// A failure that may repeat at every retry: told in full the first time,
/// then as a short reminder at most once per [`REMIND_EVERY`], so a broker
/// that refuses for hours leaves a few lines, not one per attempt.
#[derive(Debug, Default)]
pub struct Repeats {
    last: Option<Repeat>,
}

#[derive(Debug)]
struct Repeat {
    text: String,
    first: tokio::time::Instant,
    told: tokio::time::Instant,
    /// Times it happened since it was last told.
    untold: u32,
}

/// What to log about a failure that happened (again).
#[derive(Debug, PartialEq, Eq)]
pub enum Tell {
    /// It is new (or differs from the last one): tell it in full.
    First,
    /// It is the same as before: a reminder, with how often it happened
    /// since it was last told and how long it has lasted.
    Again {
        /// Times since it was last told, this one included.
        times: u32,
        /// Since it was first told.
        lasting: Duration,
    },
    /// Told recently: nothing above debug level.
    Quiet,
}

impl Repeats {
    /// Notes that `text` happened now; says how to tell it.
    pub fn happened(&mut self, text: &str) -> Tell {
        let now = tokio::time::Instant::now();
        match &mut self.last {
            Some(last) if last.text == text => {
                last.untold += 1;
                if now.duration_since(last.told) < REMIND_EVERY {
                    return Tell::Quiet;
                }
                let times = std::mem::take(&mut last.untold);
                last.told = now;
                Tell::Again {
                    times,
                    lasting: now.duration_since(last.first),
                }
            }
            _ => {
                self.last = Some(Repeat {
                    text: text.to_owned(),
                    first: now,
                    told: now,
                    untold: 0,
                });
                Tell::First
            }
        }
    }

    /// It stopped happening: the next time is a first again. Returns how
    /// long it lasted, if it was happening.
    pub fn ended(&mut self) -> Option<Duration> {
        self.last.take().map(|last| last.first.elapsed())
    }
}

#[cfg(test)]
mod tests {
    use std::sync::{Arc, Mutex};

    use super::*;

    /// A sink that blocks until told to go on, as a stalled pipe does.
    struct Stalled(Receiver<()>, Arc<Mutex<Vec<u8>>>);

    impl Write for Stalled {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            let _ = self.0.recv();
            self.1.lock().expect("sink").extend_from_slice(buf);
            Ok(buf.len())
        }

        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    #[test]
    fn a_stalled_sink_drops_and_counts_lines_and_never_blocks_the_caller() {
        let (queue, lines) = sync_channel(2);
        let (go, wait) = std::sync::mpsc::channel();
        let written = Arc::new(Mutex::new(Vec::new()));
        let sink = Stalled(wait, written.clone());
        let thread = std::thread::spawn(move || write_lines(lines, sink));
        let writer = LogWriter { queue };
        let before = dropped_lines();
        for i in 0..10 {
            let mut line = writer.make_writer();
            writeln!(line, "line {i}").expect("buffered");
        }
        // One line is with the stalled sink, two are queued, the rest dropped.
        assert!(
            dropped_lines() - before >= 7,
            "{}",
            dropped_lines() - before
        );
        for _ in 0..10 {
            let _ = go.send(());
        }
        drop(writer);
        thread.join().expect("writer thread");
        let text = String::from_utf8(written.lock().expect("sink").clone()).expect("utf-8");
        assert!(text.starts_with("line 0\n"), "{text}");
    }

    #[test]
    fn a_line_is_one_line_and_bounded() {
        assert_eq!(one_line(b"plain\n".to_vec()), b"plain\n");
        assert_eq!(
            one_line(b"forged\nERROR line\r\n".to_vec()),
            b"forged\\nERROR line\n"
        );
        let long = one_line("é".repeat(MAX_LINE_BYTES).into_bytes());
        let text = String::from_utf8(long).expect("cut on a character boundary");
        assert!(text.len() < MAX_LINE_BYTES + 40, "{}", text.len());
        assert!(text.ends_with(" bytes)\n"), "{}", &text[text.len() - 40..]);
        assert_eq!(text.matches('\n').count(), 1);
    }

    #[tokio::test(start_paused = true)]
    async fn a_repeated_failure_is_told_once_then_reminded_once_a_minute() {
        let mut repeats = Repeats::default();
        assert_eq!(repeats.happened("refused"), Tell::First);
        for _ in 0..5 {
            tokio::time::advance(Duration::from_secs(10)).await;
            assert_eq!(repeats.happened("refused"), Tell::Quiet);
        }
        tokio::time::advance(Duration::from_secs(10)).await;
        assert_eq!(
            repeats.happened("refused"),
            Tell::Again {
                times: 6,
                lasting: Duration::from_secs(60)
            }
        );
        assert_eq!(repeats.happened("another reason"), Tell::First);
        assert_eq!(repeats.ended(), Some(Duration::ZERO));
        assert_eq!(repeats.happened("another reason"), Tell::First);
    }
}
