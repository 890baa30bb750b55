//! raft-rs logs through `slog`; this drain hands its records to `tracing`
//! (target `raft`), so `RUST_LOG=raft=debug` shows elections and log
//! decisions next to eRPC's events. Formatting happens only for records a
//! subscriber wants.

use std::fmt::{self, Write as _};

use slog::{Drain, KV as _, Level, OwnedKVList, Record, Serializer};

/// The drain. Build a logger with [`logger`].
#[derive(Debug, Clone, Copy, Default)]
pub struct TracingDrain;

struct Fields(String);

impl Serializer for Fields {
    fn emit_arguments(&mut self, key: slog::Key, val: &fmt::Arguments<'_>) -> slog::Result {
        let _ = write!(self.0, " {key}={val}");
        Ok(())
    }
}

fn enabled(level: Level) -> bool {
    match level {
        Level::Critical | Level::Error => tracing::enabled!(target: "raft", tracing::Level::ERROR),
        Level::Warning => tracing::enabled!(target: "raft", tracing::Level::WARN),
        Level::Info => tracing::enabled!(target: "raft", tracing::Level::INFO),
        Level::Debug => tracing::enabled!(target: "raft", tracing::Level::DEBUG),
        Level::Trace => tracing::enabled!(target: "raft", tracing::Level::TRACE),
    }
}

impl Drain for TracingDrain {
    type Ok = ();
    type Err = slog::Never;

    fn log(&self, record: &Record<'_>, values: &OwnedKVList) -> Result<(), slog::Never> {
        if !enabled(record.level()) {
            return Ok(());
        }
        let mut f = Fields(String::new());
        let _ = record.kv().serialize(record, &mut f);
        let _ = values.serialize(record, &mut f);
        let msg = record.msg();
        let kv = f.0;
        match record.level() {
            Level::Critical | Level::Error => tracing::error!(target: "raft", "{msg}{kv}"),
            Level::Warning => tracing::warn!(target: "raft", "{msg}{kv}"),
            Level::Info => tracing::info!(target: "raft", "{msg}{kv}"),
            Level::Debug => tracing::debug!(target: "raft", "{msg}{kv}"),
            Level::Trace => tracing::trace!(target: "raft", "{msg}{kv}"),
        }
        Ok(())
    }
}

/// A logger for replica `id` that writes to `tracing`.
pub fn logger(id: u64) -> slog::Logger {
    slog::Logger::root(TracingDrain, slog::o!("raft_id" => id))
}
