//! Thin, owned wrappers over the CUDA driver API (contexts, memory, streams, events) with
//! errors as values; everything the measurements need and nothing more. `error.rs` the
//! error and how a failed allocation is judged, `device.rs` the driver and a device,
//! `memory.rs` device and host buffers, `stream.rs` streams and events, `pattern.rs` the
//! pattern copies are checked against.

mod device;
mod error;
mod memory;
mod pattern;
mod stream;

pub(crate) use device::{Gpu, device_bus_id, driver_cuda_version, driver_present, init_and_count};
pub(crate) use error::{GpuError, GpuResult, check, joined};
pub(crate) use memory::{DevBuf, HostBuf};
pub(crate) use pattern::{count_pattern_mismatch, fill_pattern, pattern_word};
pub(crate) use stream::{Event, Stream};
