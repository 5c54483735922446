//! The ledger file: one `ID\tPARTITION\tPOSITION\n` line per handled
//! delivery, in the OS's hands before the handler reports success.
//!
//! Handlers do not write the file themselves: a syscall per message would
//! cap the consumer at the disk's syscall rate. They hand their line to a
//! writer thread and wait; the thread takes every line that queued up while
//! it wrote the previous batch, writes them with one `write(2)`, and only
//! then tells each handler its line is written. A handler therefore
//! returns success (and its message can be acknowledged) only after its
//! line reached the kernel, so a SIGKILL after an acknowledgement cannot lose
//! a line; yet under load one syscall carries hundreds of lines.

use std::fs::{File, OpenOptions};
use std::io::{self, Write};
use std::thread::JoinHandle;

use tokio::sync::{mpsc, oneshot};

/// A line waiting to be written, and who waits for it.
struct Pending {
    line: String,
    written: oneshot::Sender<Result<(), io::ErrorKind>>,
}

/// Appends lines to the ledger file; clones share one writer thread.
#[derive(Clone)]
pub struct Journal {
    lines: mpsc::UnboundedSender<Pending>,
}

/// Waits for the writer thread once every [`Journal`] is gone, so that the
/// last lines are written before the process exits.
pub struct JournalThread(JoinHandle<()>);

impl JournalThread {
    pub fn join(self) {
        if self.0.join().is_err() {
            tracing::error!("the ledger writer thread panicked");
        }
    }
}

/// Most bytes written by one syscall; a backlog larger than this is written
/// in several, each completing its own lines.
const MAX_BATCH_BYTES: usize = 1 << 20;

impl Journal {
    /// Opens `path` for appending (created if missing) and starts the
    /// writer thread.
    pub fn open(path: &str) -> io::Result<(Self, JournalThread)> {
        let file = OpenOptions::new().create(true).append(true).open(path)?;
        let (lines, queue) = mpsc::unbounded_channel();
        let thread = std::thread::Builder::new()
            .name("ledger-writer".into())
            .spawn(move || write_batches(file, queue))?;
        Ok((Self { lines }, JournalThread(thread)))
    }

    /// Appends `line` (with its newline) and returns once `write(2)` took it.
    pub async fn append(&self, line: String) -> io::Result<()> {
        let (written, done) = oneshot::channel();
        self.lines
            .send(Pending { line, written })
            .map_err(|_| io::Error::other("the ledger writer stopped"))?;
        match done.await {
            Ok(result) => result.map_err(io::Error::from),
            Err(_) => Err(io::Error::other("the ledger writer stopped")),
        }
    }
}

fn write_batches(mut file: File, mut queue: mpsc::UnboundedReceiver<Pending>) {
    let mut buffer = Vec::with_capacity(64 * 1024);
    let mut waiting = Vec::new();
    // Blocks between batches; ends when every Journal has been dropped.
    while let Some(first) = queue.blocking_recv() {
        let mut next = Some(first);
        while let Some(Pending { line, written }) = next {
            buffer.extend_from_slice(line.as_bytes());
            waiting.push(written);
            next = if buffer.len() < MAX_BATCH_BYTES {
                queue.try_recv().ok()
            } else {
                None
            };
        }
        let result = file.write_all(&buffer).map_err(|error| {
            tracing::error!(%error, "writing the ledger failed");
            error.kind()
        });
        buffer.clear();
        for written in waiting.drain(..) {
            // A handler that stopped waiting (shutdown) no longer cares.
            let _ = written.send(result);
        }
    }
}
