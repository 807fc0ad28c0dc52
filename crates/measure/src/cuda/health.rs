//! NVML health snapshot: NVLink links and their error counters, PCIe link, XID events seen
//! during the check, uncorrectable ECC, remapped rows, throttle reasons, temperature, power.

use gpufabric_api::result::{GpuHealth, HealthSnapshot};
use nvml_wrapper::Nvml;
use nvml_wrapper::bitmasks::device::ThrottleReasons;
use nvml_wrapper::bitmasks::event::EventTypes;
use nvml_wrapper::enum_wrappers::device::{EccCounter, MemoryError, TemperatureSensor};
use nvml_wrapper::enum_wrappers::nv_link::ErrorCounter;
use nvml_wrapper::error::NvmlError;
use std::collections::BTreeMap;

/// NVLink links per GPU of products whose NVML reports fewer links than the board has.
fn expected_links(product: &str) -> Option<u32> {
    let p = product.to_ascii_uppercase();
    if p.contains("H100") && !p.contains("PCIE") && !p.contains("NVL") {
        return Some(18);
    }
    if p.contains("H200") && !p.contains("NVL") {
        return Some(18);
    }
    if p.contains("H20") && !p.contains("H200") {
        return Some(18);
    }
    if p.contains("A100") && p.contains("SXM") {
        return Some(12);
    }
    if p.contains("B200") || p.contains("B300") || p.contains("GB200") {
        return Some(18);
    }
    None
}

/// Names of throttle reasons that matter (idle and application clock settings excluded).
pub fn throttle_names(r: ThrottleReasons) -> Vec<String> {
    let table = [
        (ThrottleReasons::SW_POWER_CAP, "swPowerCap"),
        (ThrottleReasons::HW_SLOWDOWN, "hwSlowdown"),
        (ThrottleReasons::SYNC_BOOST, "syncBoost"),
        (ThrottleReasons::SW_THERMAL_SLOWDOWN, "swThermal"),
        (ThrottleReasons::HW_THERMAL_SLOWDOWN, "hwThermal"),
        (ThrottleReasons::HW_POWER_BRAKE_SLOWDOWN, "hwPowerBrake"),
        (ThrottleReasons::DISPLAY_CLOCK_SETTING, "displayClock"),
    ];
    table
        .iter()
        .filter(|(bit, _)| r.contains(*bit))
        .map(|(_, n)| n.to_string())
        .collect()
}

/// An open NVML session watching for XID events from the start of the check.
pub struct Monitor {
    nvml: Nvml,
    /// PCI bus ids (NVML form) of the GPUs, by CUDA index.
    buses: Vec<(u32, String)>,
}

/// Normalises a PCI bus id ("0000:1B:00.0" or "00000000:1b:00.0") for comparison.
pub fn norm_bus(id: &str) -> String {
    let id = id.trim().to_ascii_lowercase();
    let mut parts = id.splitn(2, ':');
    let domain = parts.next().unwrap_or("");
    let rest = parts.next().unwrap_or("");
    let domain = u32::from_str_radix(domain, 16).unwrap_or(0);
    format!("{domain:04x}:{rest}")
}

impl Monitor {
    /// Opens NVML; `buses` maps CUDA index to the PCI bus id CUDA reports.
    pub fn open(buses: Vec<(u32, String)>) -> Result<Monitor, NvmlError> {
        let nvml = Nvml::init()?;
        Ok(Monitor { nvml, buses })
    }

    pub fn driver_version(&self) -> Option<String> {
        self.nvml.sys_driver_version().ok()
    }

    fn device(&self, cuda_index: u32, bus: &str) -> Result<nvml_wrapper::Device<'_>, NvmlError> {
        match self.nvml.device_by_pci_bus_id(bus) {
            Ok(d) => Ok(d),
            Err(_) => {
                // Fall back to matching by normalised bus id, then by index.
                let count = self.nvml.device_count()?;
                for i in 0..count {
                    let d = self.nvml.device_by_index(i)?;
                    if let Ok(p) = d.pci_info()
                        && norm_bus(&p.bus_id) == norm_bus(bus)
                    {
                        return Ok(d);
                    }
                }
                self.nvml.device_by_index(cuda_index)
            }
        }
    }

    /// Runs `f` while listening for critical XID events on every GPU; returns f's value and
    /// the XIDs seen, by CUDA index.
    pub fn watch_xids<T>(&self, f: impl FnOnce() -> T) -> (T, BTreeMap<u32, Vec<u64>>) {
        let mut xids: BTreeMap<u32, Vec<u64>> = BTreeMap::new();
        let set = match self.nvml.create_event_set() {
            Ok(s) => Some(s),
            Err(e) => {
                tracing::warn!(error = %e, "NVML event set unavailable; XIDs not watched");
                None
            }
        };
        let mut set = set;
        let mut bus_of_uuid = BTreeMap::new();
        for (idx, bus) in &self.buses {
            let Ok(dev) = self.device(*idx, bus) else {
                continue;
            };
            if let Ok(u) = dev.uuid() {
                bus_of_uuid.insert(u, *idx);
            }
            if let Some(s) = set.take() {
                match dev.register_events(EventTypes::CRITICAL_XID_ERROR, s) {
                    Ok(s) => set = Some(s),
                    Err(e) => {
                        tracing::warn!(gpu = idx, error = %e.error, "XID events not available");
                        set = None;
                    }
                }
            }
        }
        let value = f();
        if let Some(s) = set {
            // Drain what arrived during f.
            for _ in 0..1000 {
                match s.wait(0) {
                    Ok(ev) => {
                        let idx = ev
                            .device
                            .uuid()
                            .ok()
                            .and_then(|u| bus_of_uuid.get(&u).copied())
                            .unwrap_or(u32::MAX);
                        if let Some(nvml_wrapper::enums::event::XidError::Value(x)) = ev.event_data
                        {
                            xids.entry(idx).or_default().push(x);
                        }
                    }
                    Err(_) => break,
                }
            }
        }
        (value, xids)
    }

    /// Reads the snapshot of every GPU.
    pub fn snapshot(&self, xids: &BTreeMap<u32, Vec<u64>>) -> HealthSnapshot {
        let mut gpus = Vec::new();
        for (idx, bus) in &self.buses {
            let mut h = GpuHealth {
                index: *idx,
                xids: xids.get(idx).cloned().unwrap_or_default(),
                ..GpuHealth::default()
            };
            let Ok(dev) = self.device(*idx, bus) else {
                tracing::warn!(gpu = idx, "NVML has no device for this GPU");
                gpus.push(h);
                continue;
            };
            let product = dev.name().unwrap_or_default();
            let (mut active, mut present) = (0u32, 0u32);
            for link in 0..18u32 {
                let l = dev.link_wrapper_for(link);
                match l.is_active() {
                    Ok(a) => {
                        present += 1;
                        if a {
                            active += 1;
                            for c in [
                                ErrorCounter::DlReplay,
                                ErrorCounter::DlRecovery,
                                ErrorCounter::DlCrcFlit,
                                ErrorCounter::DlCrcData,
                            ] {
                                h.nvlink_errors += l.error_counter(c).unwrap_or(0);
                            }
                        }
                    }
                    Err(_) => continue,
                }
            }
            h.nvlink_active = active;
            h.nvlink_expected = expected_links(&product).unwrap_or(present);
            h.pcie_gen = dev.current_pcie_link_gen().unwrap_or(0);
            h.pcie_gen_max = dev.max_pcie_link_gen().unwrap_or(0);
            h.pcie_width = dev.current_pcie_link_width().unwrap_or(0);
            h.pcie_width_max = dev.max_pcie_link_width().unwrap_or(0);
            h.ecc_uncorrected = dev
                .total_ecc_errors(MemoryError::Uncorrected, EccCounter::Volatile)
                .unwrap_or(0);
            if let Some((pending, failed)) = remapped_rows(&self.nvml, &dev) {
                h.remapped_pending = pending;
                h.remapped_failed = failed;
            }
            h.throttle = dev
                .current_throttle_reasons()
                .map(throttle_names)
                .unwrap_or_default();
            h.temperature_c = f64::from(dev.temperature(TemperatureSensor::Gpu).unwrap_or(0));
            h.power_w = f64::from(dev.power_usage().unwrap_or(0)) / 1000.0;
            gpus.push(h);
        }
        HealthSnapshot { gpus }
    }

    /// Whether NVML reports the two GPUs (CUDA indices) connected by NVLink.
    pub fn nvlink_between(&self, a: u32, b: u32) -> Option<bool> {
        let bus = |i: u32| {
            self.buses
                .iter()
                .find(|(x, _)| *x == i)
                .map(|(_, b)| b.clone())
        };
        let da = self.device(a, &bus(a)?).ok()?;
        let db = self.device(b, &bus(b)?).ok()?;
        let st = da
            .p2p_status(
                &db,
                nvml_wrapper::enum_wrappers::device::P2pCapabilitiesIndex::NvLink,
            )
            .ok()?;
        Some(matches!(
            st,
            nvml_wrapper::enum_wrappers::device::P2pStatus::Ok
        ))
    }
}

fn remapped_rows(nvml: &Nvml, dev: &nvml_wrapper::Device<'_>) -> Option<(bool, bool)> {
    let f = nvml.lib().nvmlDeviceGetRemappedRows.as_ref().ok()?;
    let (mut corr, mut unc, mut pending, mut failed) = (0u32, 0u32, 0u32, 0u32);
    // SAFETY: the handle belongs to a live device of this NVML session; out-pointers valid.
    let r = unsafe { f(dev.handle(), &mut corr, &mut unc, &mut pending, &mut failed) };
    (r == 0).then_some((pending != 0, failed != 0))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bus_ids_in_cuda_and_nvml_form_compare_equal() {
        assert_eq!(norm_bus("0000:1B:00.0"), norm_bus("00000000:1b:00.0"));
        assert_ne!(norm_bus("0000:1B:00.0"), norm_bus("0000:1C:00.0"));
    }

    #[test]
    fn hopper_sxm_expects_eighteen_links() {
        assert_eq!(expected_links("NVIDIA H200"), Some(18));
        assert_eq!(expected_links("NVIDIA H100 80GB HBM3"), Some(18));
        assert_eq!(expected_links("NVIDIA H100 PCIe"), None);
    }

    #[test]
    fn idle_and_application_clocks_are_not_reported_as_throttling() {
        let r = ThrottleReasons::GPU_IDLE
            | ThrottleReasons::APPLICATIONS_CLOCKS_SETTING
            | ThrottleReasons::HW_THERMAL_SLOWDOWN;
        assert_eq!(throttle_names(r), vec!["hwThermal".to_string()]);
    }
}
