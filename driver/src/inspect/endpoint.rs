//! The device's registration with the debug endpoint: the source the
//! endpoint's thread serves, and the queue sets' publication slots.

use std::fmt;
use std::sync::{Arc, Mutex, RwLock, Weak};

use debug_endpoint::{Publisher, Query, Registration, Slot, Source};
use serde_json::Value;

use crate::device::{Device, Inner};
use crate::hw::HwBackend;

use super::report::{eq_view, mac_string, query_objects, report};
use super::{DeviceView, QueueIds, QueueSetRaw, QueueSetView, compare_queue_set};

struct QsEntry {
    udp_port: u16,
    ids: QueueIds,
    slot: Arc<Slot<QueueSetRaw>>,
}

/// The device's source, served by the endpoint thread.
struct DeviceSource<B: HwBackend> {
    /// The device; `None` once `Device::close` detached it.
    inner: RwLock<Option<Weak<Inner<B>>>>,
    name: String,
    mac: String,
    queue_sets: Mutex<Vec<QsEntry>>,
}

impl<B: HwBackend> DeviceSource<B> {
    fn entries(&self) -> Vec<(u16, QueueIds, Arc<Slot<QueueSetRaw>>)> {
        let mut q = self.queue_sets.lock().unwrap_or_else(|p| p.into_inner());
        q.retain(|e| !e.slot.is_closed());
        q.iter()
            .map(|e| (e.udp_port, e.ids, e.slot.clone()))
            .collect()
    }
}

impl<B: HwBackend> Source for DeviceSource<B> {
    fn kind(&self) -> &'static str {
        "devices"
    }

    fn summary(&self) -> Value {
        serde_json::json!({
            "name": self.name,
            "mac": self.mac,
            "queue_sets": self.entries().len(),
        })
    }

    fn pending(&self, generation: u64) -> bool {
        self.entries().iter().any(|(_, _, s)| s.pending(generation))
    }

    fn render(&self, q: &Query) -> Value {
        // Hold the read lock while using the device, so that
        // `Device::close` (which detaches under the write lock) never finds
        // this thread holding a handle.
        let guard = self.inner.read().unwrap_or_else(|p| p.into_inner());
        let Some(inner) = guard.as_ref().and_then(Weak::upgrade) else {
            return Value::Null; // being closed
        };
        let dev = Device { inner };
        let (eq, cq_errors) = eq_view(&dev);
        let queue_sets = self
            .entries()
            .into_iter()
            .map(|(udp_port, ids, slot)| {
                let latest = slot.latest();
                let mut software = latest.as_ref().map(|l| l.value.view());
                if !q.rings
                    && let Some(s) = software.as_mut()
                {
                    s.rings = None;
                }
                let (firmware, firmware_error) = match query_objects(&dev.inner, &ids) {
                    Ok(f) => (Some(f), None),
                    Err(e) => (None, Some(e.to_string())),
                };
                let compare = match (&software, &firmware) {
                    (Some(s), Some(f)) => compare_queue_set(s, f),
                    _ => Vec::new(),
                };
                QueueSetView {
                    udp_port,
                    ids,
                    published: latest.map(|l| l.info(q.generation)),
                    software,
                    firmware,
                    firmware_error,
                    compare,
                }
            })
            .collect();
        let view = DeviceView {
            report: report(&dev),
            eq,
            cq_errors,
            queue_sets,
        };
        drop(dev);
        drop(guard);
        serde_json::to_value(view).unwrap_or_else(|e| serde_json::json!({ "error": e.to_string() }))
    }
}

/// A device's registration with the endpoint (kept in the device).
pub(crate) struct DeviceInspect<B: HwBackend> {
    source: Arc<DeviceSource<B>>,
    _registration: Registration,
}

impl<B: HwBackend> DeviceInspect<B> {
    /// Registers the device being built (`weak` upgrades once it is).
    /// A failure to start the endpoint is logged, not fatal: the device
    /// works without it.
    pub(crate) fn register(weak: Weak<Inner<B>>, name: &str, mac: [u8; 6]) -> Option<Self> {
        let source = Arc::new(DeviceSource {
            inner: RwLock::new(Some(weak)),
            name: name.to_string(),
            mac: mac_string(mac),
            queue_sets: Mutex::new(Vec::new()),
        });
        match debug_endpoint::register(source.clone()) {
            Ok(r) => {
                tracing::debug!(device = %name, socket = %r.socket().display(), "device exposed on the debug endpoint");
                Some(DeviceInspect {
                    source,
                    _registration: r,
                })
            }
            Err(e) => {
                tracing::warn!(device = %name, error = %e, "debug endpoint not available");
                None
            }
        }
    }

    /// A publisher for a new queue set.
    pub(crate) fn add_queue_set(&self, udp_port: u16, ids: QueueIds) -> Publisher<QueueSetRaw> {
        let (p, slot) = Publisher::new();
        let mut q = self
            .source
            .queue_sets
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        q.retain(|e| !e.slot.is_closed());
        q.push(QsEntry {
            udp_port,
            ids,
            slot,
        });
        p
    }

    /// Stops the endpoint thread from using the device, waiting for a
    /// render in progress to finish.
    pub(crate) fn detach(&self) {
        *self.source.inner.write().unwrap_or_else(|p| p.into_inner()) = None;
    }

    /// Undoes [`DeviceInspect::detach`] (a `close` that did not happen).
    pub(crate) fn attach(&self, weak: Weak<Inner<B>>) {
        *self.source.inner.write().unwrap_or_else(|p| p.into_inner()) = Some(weak);
    }
}

impl<B: HwBackend> fmt::Debug for DeviceInspect<B> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "DeviceInspect({})", self.source.name)
    }
}
