//! NVML health snapshot: NVLink links and their error counters, PCIe link, XID events seen
//! during the check, uncorrectable ECC, remapped rows, throttle reasons, temperature, power.

use gpufabric_api::product::{ProductFamily, family, normalize};
use gpufabric_api::result::{GpuHealth, HealthSnapshot};
use nvml_wrapper::Nvml;
use nvml_wrapper::bitmasks::device::ThrottleReasons;
use nvml_wrapper::bitmasks::event::EventTypes;
use nvml_wrapper::enum_wrappers::device::{
    Clock, ComputeMode, EccCounter, MemoryError, TemperatureSensor,
};
use nvml_wrapper::enum_wrappers::nv_link::ErrorCounter;
use nvml_wrapper::enums::device::UsedGpuMemory;
use nvml_wrapper::error::NvmlError;
use std::collections::BTreeMap;

/// NVLink links per GPU of products whose NVML reports fewer links than the board has, by
/// the product's [`family`]: not the PCIe H100, the A100 other than SXM, nor the NVL cards.
pub(crate) fn expected_links(product: &str) -> Option<u32> {
    let n = normalize(product);
    let says = |word: &str| n.contains(word);
    match family(product)? {
        ProductFamily::H100 if !says("PCIE") && !says("NVL") => Some(18),
        ProductFamily::H200 if !says("NVL") => Some(18),
        ProductFamily::H20 => Some(18),
        ProductFamily::A100 if says("SXM") => Some(12),
        ProductFamily::B200 | ProductFamily::B300 => Some(18),
        _ => None,
    }
}

/// Names of throttle reasons that matter (idle and application clock settings excluded).
pub(crate) fn throttle_names(r: ThrottleReasons) -> Vec<String> {
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
pub(crate) struct Monitor {
    nvml: Nvml,
    /// PCI bus ids (NVML form) of the GPUs, by CUDA index.
    buses: Vec<(u32, String)>,
}

/// Normalises a PCI bus id ("0000:1B:00.0" or "00000000:1b:00.0") for comparison.
pub(crate) fn norm_bus(id: &str) -> String {
    let id = id.trim().to_ascii_lowercase();
    let mut parts = id.splitn(2, ':');
    let domain = parts.next().unwrap_or("");
    let rest = parts.next().unwrap_or("");
    let domain = u32::from_str_radix(domain, 16).unwrap_or(0);
    format!("{domain:04x}:{rest}")
}

impl Monitor {
    /// Opens NVML; `buses` maps CUDA index to the PCI bus id CUDA reports.
    pub(crate) fn open(buses: Vec<(u32, String)>) -> Result<Monitor, NvmlError> {
        let nvml = Nvml::init()?;
        Ok(Monitor { nvml, buses })
    }

    pub(crate) fn driver_version(&self) -> Option<String> {
        self.nvml.sys_driver_version().ok()
    }

    /// The VBIOS version of each GPU, by CUDA index; empty unless NVML read every GPU's.
    pub(crate) fn vbios_versions(&self) -> Vec<String> {
        let read: Option<Vec<String>> = self
            .buses
            .iter()
            .map(|(i, bus)| self.device(*i, bus).and_then(|d| d.vbios_version()).ok())
            .collect();
        read.unwrap_or_default()
    }

    /// The GPUs' NVSwitch fabric state ([`super::software::fabric_words`]), if NVML read
    /// every GPU's.
    pub(crate) fn fabric_manager(&self) -> Option<String> {
        let states: Option<Vec<super::software::FabricState>> = self
            .buses
            .iter()
            .map(|(i, bus)| {
                let dev = self.device(*i, bus).ok()?;
                super::software::fabric_state(&self.nvml, &dev)
            })
            .collect();
        super::software::fabric_words(&states?)
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
    pub(crate) fn watch_xids<T>(&self, f: impl FnOnce() -> T) -> (T, BTreeMap<u32, Vec<u64>>) {
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

    /// What each GPU has in use, and the processes NVML lists on it; read before this
    /// process creates its contexts, all of it is other work's ([`crate::gpu_use`]). A GPU
    /// NVML cannot read is left out (the health snapshot reports it).
    pub(crate) fn gpu_use(&self) -> Vec<crate::gpu_use::GpuUse> {
        let mut out = Vec::new();
        for (idx, bus) in &self.buses {
            let Ok(dev) = self.device(*idx, bus) else {
                continue;
            };
            let Ok(mem) = dev.memory_info() else {
                continue;
            };
            let mut processes = Vec::new();
            for list in [
                dev.running_compute_processes(),
                dev.running_graphics_processes(),
            ]
            .into_iter()
            .flatten()
            {
                for p in list {
                    let bytes = match p.used_gpu_memory {
                        UsedGpuMemory::Used(b) => Some(b),
                        UsedGpuMemory::Unavailable => None,
                    };
                    if !processes.iter().any(|(pid, _)| *pid == p.pid) {
                        processes.push((p.pid, bytes));
                    }
                }
            }
            out.push(crate::gpu_use::GpuUse {
                gpu: *idx,
                used_bytes: mem.used,
                total_bytes: mem.total,
                processes,
                prohibited: matches!(dev.compute_mode(), Ok(ComputeMode::Prohibited)),
            });
        }
        out
    }

    /// The GPUs as NVML describes them, read without a CUDA context (product, PCI bus id,
    /// memory); a GPU NVML cannot read is described by its bus id alone.
    pub(crate) fn gpu_infos(&self) -> Vec<gpufabric_api::result::GpuInfo> {
        self.buses
            .iter()
            .map(|(idx, bus)| {
                let dev = self.device(*idx, bus).ok();
                gpufabric_api::result::GpuInfo {
                    index: *idx,
                    product: dev
                        .as_ref()
                        .and_then(|d| d.name().ok())
                        .unwrap_or_else(|| "unknown".into()),
                    uuid: dev.as_ref().and_then(|d| d.uuid().ok()),
                    pci_bus_id: (!bus.is_empty()).then(|| bus.clone()),
                    memory_bytes: dev
                        .as_ref()
                        .and_then(|d| d.memory_info().ok())
                        .map_or(0, |m| m.total),
                }
            })
            .collect()
    }

    /// Reads the snapshot of every GPU.
    pub(crate) fn snapshot(&self, xids: &BTreeMap<u32, Vec<u64>>) -> HealthSnapshot {
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
                            // The counters nvidia-smi nvlink -e reports. Not the data CRC
                            // (or ECC) counter: on Hopper it counts data corrected in flight
                            // and grows with traffic on healthy links (an H200 pair: about
                            // 400 per link after a few checks while these three read 0).
                            for c in [
                                ErrorCounter::DlReplay,
                                ErrorCounter::DlRecovery,
                                ErrorCounter::DlCrcFlit,
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
            if active > 0 {
                h.nvlink_link_gbps = dev
                    .cuda_compute_capability()
                    .ok()
                    .and_then(|cc| nvlink_link_gbps(cc.major))
                    .unwrap_or(0.0);
                h.nvlink_switch = links_to_switch(&self.nvml, &dev);
            }
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

    /// GPU `cuda_index`'s SM clock and its maximum, temperature, power and its limit, and
    /// throttle reasons now (read while it computes); None without an NVML device for it.
    pub(crate) fn load_reading(
        &self,
        cuda_index: u32,
    ) -> Option<gpufabric_api::result::LoadReading> {
        let (_, bus) = self.buses.iter().find(|(i, _)| *i == cuda_index)?;
        let dev = self.device(cuda_index, bus).ok()?;
        Some(gpufabric_api::result::LoadReading {
            sm_clock_mhz: dev.clock_info(Clock::SM).unwrap_or(0),
            max_sm_clock_mhz: dev.max_clock_info(Clock::SM).unwrap_or(0),
            temperature_c: f64::from(dev.temperature(TemperatureSensor::Gpu).unwrap_or(0)),
            power_w: f64::from(dev.power_usage().unwrap_or(0)) / 1000.0,
            power_limit_w: f64::from(dev.enforced_power_limit().unwrap_or(0)) / 1000.0,
            throttle: dev
                .current_throttle_reasons()
                .map(throttle_names)
                .unwrap_or_default(),
        })
    }

    /// Whether NVML reports the two GPUs (CUDA indices) connected by NVLink.
    pub(crate) fn nvlink_between(&self, a: u32, b: u32) -> Option<bool> {
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

/// One-direction GB/s of one NVLink link, by the generation a GPU architecture carries
/// (compute capability major): NVLink 1 on Pascal 20 GB/s, NVLink 2-4 on Volta, Ampere and
/// Hopper 25 GB/s, NVLink 5 on Blackwell 50 GB/s (NVIDIA's architecture whitepapers:
/// P100 160, V100 300, A100 600, H100 900, B200 1800 GB/s both ways over 4, 6, 12, 18, 18
/// links).
pub(crate) fn nvlink_link_gbps(major: i32) -> Option<f64> {
    match major {
        6 => Some(20.0),
        7..=9 => Some(25.0),
        10 => Some(50.0),
        _ => None,
    }
}

/// NVML's code for an NVLink peer that is an NVSwitch, and one that is a GPU.
const NVLINK_PEER_SWITCH: u32 = 2;
const NVLINK_PEER_GPU: u32 = 0;

/// What a set of link peer types says: every active link to an NVSwitch, every one to a
/// GPU, or mixed or unknown.
pub(crate) fn switch_verdict(peers: &[u32]) -> Option<bool> {
    if peers.is_empty() {
        None
    } else if peers.iter().all(|p| *p == NVLINK_PEER_SWITCH) {
        Some(true)
    } else if peers.iter().all(|p| *p == NVLINK_PEER_GPU) {
        Some(false)
    } else {
        None
    }
}

/// Whether the GPU's active NVLink links go to NVSwitches (true) or to GPUs (false), from
/// NVML's remote device type of each active link; `None` when NVML cannot say.
fn links_to_switch(nvml: &Nvml, dev: &nvml_wrapper::Device<'_>) -> Option<bool> {
    let f = nvml
        .lib()
        .nvmlDeviceGetNvLinkRemoteDeviceType
        .as_ref()
        .ok()?;
    let mut peers = Vec::new();
    for link in 0..18u32 {
        if !dev.link_wrapper_for(link).is_active().unwrap_or(false) {
            continue;
        }
        let mut kind: u32 = u32::MAX;
        // SAFETY: the handle belongs to a live device of this NVML session; valid
        // out-pointer.
        let r = unsafe { f(dev.handle(), link, &mut kind) };
        if r != 0 {
            return None;
        }
        peers.push(kind);
    }
    switch_verdict(&peers)
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
    fn link_speed_follows_the_nvlink_generation() {
        // H100/H200: 18 links x 25 GB/s = 450 GB/s one way; B200: 18 x 50 = 900.
        assert_eq!(nvlink_link_gbps(9), Some(25.0));
        assert_eq!(nvlink_link_gbps(8), Some(25.0));
        assert_eq!(nvlink_link_gbps(10), Some(50.0));
        assert_eq!(nvlink_link_gbps(12), None);
    }

    #[test]
    fn links_all_to_switches_or_all_to_gpus_or_unknown() {
        assert_eq!(switch_verdict(&[2; 18]), Some(true));
        assert_eq!(switch_verdict(&[0; 12]), Some(false));
        assert_eq!(switch_verdict(&[0, 2]), None);
        assert_eq!(switch_verdict(&[255]), None);
        assert_eq!(switch_verdict(&[]), None);
    }

    #[test]
    fn idle_and_application_clocks_are_not_reported_as_throttling() {
        let r = ThrottleReasons::GPU_IDLE
            | ThrottleReasons::APPLICATIONS_CLOCKS_SETTING
            | ThrottleReasons::HW_THERMAL_SLOWDOWN;
        assert_eq!(throttle_names(r), vec!["hwThermal".to_string()]);
    }
}
