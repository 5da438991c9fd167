//! Cheap timestamps for the measurement loops.
//!
//! `Instant::now()` costs a system call where the kernel's clocksource cannot be read from user
//! space (HPET or ACPI PM timers, common in VMs: the Soft-RoCE VM uses HPET). perftest reads the
//! time-stamp counter directly; so does this module on x86-64, and converts ticks to seconds
//! with a rate measured against `Instant` over the run. Elsewhere it falls back to `Instant`.

#[cfg(not(target_arch = "x86_64"))]
use std::sync::OnceLock;
use std::time::{Duration, Instant};

/// A timestamp in clock ticks (TSC cycles on x86-64, nanoseconds elsewhere).
#[inline]
pub fn ticks() -> u64 {
    #[cfg(target_arch = "x86_64")]
    {
        // SAFETY: RDTSC only reads the time-stamp counter: it takes no pointers and touches no
        // memory. The intrinsic is `unsafe` because every `core::arch` function is, not because
        // of a precondition (RDTSC exists on every x86-64 CPU).
        unsafe { core::arch::x86_64::_rdtsc() }
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        static BASE: OnceLock<Instant> = OnceLock::new();
        BASE.get_or_init(Instant::now).elapsed().as_nanos() as u64
    }
}

/// Calibration of ticks against `Instant`, from a start point to the time it is read.
#[derive(Debug, Clone, Copy)]
pub struct Calibration {
    instant: Instant,
    ticks: u64,
}

/// The shortest window a rate is measured over (shorter runs wait the rest).
const MIN_WINDOW: Duration = Duration::from_millis(20);

impl Calibration {
    /// Starts measuring.
    pub fn start() -> Self {
        Calibration {
            instant: Instant::now(),
            ticks: ticks(),
        }
    }

    /// The tick count at the start.
    pub fn start_ticks(&self) -> u64 {
        self.ticks
    }

    /// Seconds per tick over the window since [`Calibration::start`] (at least 20 ms).
    pub fn secs_per_tick(&self) -> f64 {
        let spent = self.instant.elapsed();
        if spent < MIN_WINDOW {
            std::thread::sleep(MIN_WINDOW - spent);
        }
        let (secs, t) = (self.instant.elapsed().as_secs_f64(), ticks());
        let dt = t.saturating_sub(self.ticks).max(1);
        secs / dt as f64
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ticks_advance_and_convert_to_seconds() {
        let cal = Calibration::start();
        let a = ticks();
        std::thread::sleep(Duration::from_millis(30));
        let b = ticks();
        assert!(b > a);
        let spt = cal.secs_per_tick();
        let secs = (b - a) as f64 * spt;
        assert!((0.025..0.5).contains(&secs), "30 ms measured as {secs} s");
    }
}
