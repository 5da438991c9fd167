//! The least-time cut of a range for a NIC of known rate: piece sizes from a model of the copy
//! engine ([`CopyModel`]) and the rate the chunks leave or arrive at
//! ([`super::PipelineConfig::nic_rate`]).
//!
//! Each copy costs the engine a fixed time besides its bytes (about 1.5 us device to host and
//! 2.3 us host to device on an H200, with or without an event after it), so a short piece copies
//! slower than a fast NIC sends it, while a long first piece keeps the NIC waiting. Device to
//! host, piece k reaches the NIC once the copies of pieces 1..=k are done, and the NIC still has
//! pieces k.. to send, so for every k a run takes at least
//!
//! `latency + sum(i <= k)(per_copy + p_i / rate) + sum(i >= k) p_i / nic`
//! `= latency + len / nic + per_copy + p_k / rate + sum(i < k) g(p_i)`,
//! with `g(p) = per_copy + p / rate - p / nic`.
//!
//! Host to device is the same bound read from the end (the NIC reads pieces 1..=k before the
//! copies of pieces k.. can start). The cut that keeps the largest of these terms least takes,
//! for a bound `b`, each piece as long as `b` allows, `p_k = rate * (b - per_copy - sum(i < k)
//! g(p_i))`; the least `b` whose pieces cover the range is found by bisection. Against a NIC
//! slower than the copies, pieces grow from a short first one (the copies pull ahead); against
//! one about as fast, they stay near the length whose fixed cost the rate difference pays back.

use super::chunk::Direction;

/// The copy engine's costs as the cut sees them: its rate for long copies, and its fixed time
/// per copy.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct CopyModel {
    /// Bytes per microsecond of a long copy.
    pub rate: f64,
    /// Microseconds the engine spends on each copy besides its bytes.
    pub per_copy_us: f64,
}

impl CopyModel {
    /// Device to host on a PCIe Gen5 GPU (an H200: 53.8 GB/s, 1.5 us per copy, measured by
    /// the `gpu_staging` benchmark's `copy_costs`).
    pub const DEVICE_TO_HOST: CopyModel = CopyModel {
        rate: 53_800.0,
        per_copy_us: 1.5,
    };
    /// Host to device on the same GPU (53.3 GB/s, 2.3 us per copy).
    pub const HOST_TO_DEVICE: CopyModel = CopyModel {
        rate: 53_300.0,
        per_copy_us: 2.3,
    };

    /// The model for `direction`.
    pub fn of(direction: Direction) -> CopyModel {
        match direction {
            Direction::DeviceToHost => Self::DEVICE_TO_HOST,
            Direction::HostToDevice => Self::HOST_TO_DEVICE,
        }
    }
}

/// The most pieces a cut may have; a cut that needs more is not made (the caller falls back to
/// its fixed cut).
pub const MAX_PIECES: usize = 4096;

/// The pieces of a `len`-byte range moved in `direction` against a NIC of `nic_rate` bytes per
/// second, for least time under `model`: each at least `floor` bytes (but one, what is left
/// when a longer piece would pass `cap`: the last device to host, the first host to device) and
/// at most `cap`, multiples of `align` where possible, in the
/// order they are moved, summing to `len`. `None` when there is nothing to cut (`len == 0`),
/// the rate is zero, or the cut would need more than [`MAX_PIECES`] pieces.
pub fn least_time(
    len: usize,
    direction: Direction,
    nic_rate: u64,
    model: CopyModel,
    floor: usize,
    cap: usize,
) -> Option<Vec<usize>> {
    const ALIGN: usize = 4096;
    let usable = model.rate.is_finite()
        && model.rate > 0.0
        && model.per_copy_us.is_finite()
        && model.per_copy_us >= 0.0;
    if len == 0 || nic_rate == 0 || !usable {
        return None;
    }
    let cap = cap.max(1);
    let floor = floor.clamp(1, cap);
    let nic = nic_rate as f64 / 1e6; // bytes per microsecond
                                     // Walks the cut for bound `b`: whether every piece stays at or above the floor, collecting
                                     // the pieces into `out` when given.
    let walk = |b: f64, mut out: Option<&mut Vec<usize>>| -> bool {
        let mut owed = 0.0f64;
        let mut left = len;
        let mut n = 0usize;
        while left > 0 {
            if n >= MAX_PIECES {
                return false;
            }
            let want = model.rate * (b - model.per_copy_us - owed);
            // NaN (never, with a usable model) counts as too short.
            if want.is_nan() || want < floor as f64 {
                return false;
            }
            // Within [floor, cap], aligned down where that keeps it >= floor.
            let mut p = if want >= cap as f64 {
                cap
            } else {
                want as usize
            };
            if p / ALIGN * ALIGN >= floor {
                p = p / ALIGN * ALIGN;
            }
            p = p.min(left);
            // No remainder shorter than the floor: it joins this piece when that fits.
            if left - p < floor && left <= cap {
                p = left;
            }
            if let Some(out) = out.as_deref_mut() {
                out.push(p);
            }
            n += 1;
            left -= p;
            let p = p as f64;
            owed += model.per_copy_us + p / model.rate - p / nic;
        }
        true
    };
    // A bound high enough for any cut: every piece the floor, each copy's whole time owed.
    let per_piece = model.per_copy_us + cap as f64 / model.rate;
    // (In floating point: `len / floor + 2` overflows usize for len = usize::MAX, floor = 1.)
    let mut hi = model.per_copy_us + ((len / floor) as f64 + 2.0) * per_piece + 1.0;
    if !walk(hi, None) {
        return None;
    }
    let mut lo = 0.0f64;
    for _ in 0..48 {
        let mid = (lo + hi) / 2.0;
        if walk(mid, None) {
            hi = mid;
        } else {
            lo = mid;
        }
    }
    let mut best = Vec::new();
    if !walk(hi, Some(&mut best)) {
        return None;
    }
    if direction == Direction::HostToDevice {
        best.reverse();
    }
    Some(best)
}

/// The model's least time (us) for moving `pieces` (in the order they are moved) in `direction`
/// against a NIC of `nic_rate` bytes per second, beyond `len / nic` and the first copy's
/// latency: the largest of the bound's terms (see the module documentation).
pub fn time_over_nic(
    pieces: &[usize],
    direction: Direction,
    nic_rate: u64,
    model: CopyModel,
) -> f64 {
    let nic = nic_rate as f64 / 1e6;
    let mut order = pieces.to_vec();
    if direction == Direction::HostToDevice {
        order.reverse();
    }
    let mut owed = 0.0;
    let mut worst = 0.0f64;
    for &p in &order {
        let p = p as f64;
        worst = worst.max(model.per_copy_us + p / model.rate + owed);
        owed += model.per_copy_us + p / model.rate - p / nic;
    }
    worst
}

#[cfg(test)]
mod tests {
    use super::*;

    const K: usize = 1 << 10;
    const M: usize = 1 << 20;
    const GBPS: u64 = 1_000_000_000;

    fn check(len: usize, pieces: &[usize], floor: usize, cap: usize) {
        assert_eq!(pieces.iter().sum::<usize>(), len, "{pieces:?}");
        assert!(pieces.len() <= MAX_PIECES);
        for (i, &p) in pieces.iter().enumerate() {
            assert!(p > 0 && p <= cap, "piece {i} of {pieces:?}");
        }
        // At most one piece shorter than the floor (what is left past a full piece: the last
        // one moved device to host, the first host to device).
        let short = pieces.iter().filter(|&&p| p < floor.min(len)).count();
        assert!(short <= 1, "{pieces:?}");
    }

    /// The model's time for `pieces` (us, less the latency).
    fn model_time(pieces: &[usize], direction: Direction, nic_gbps: f64) -> f64 {
        let len: usize = pieces.iter().sum();
        let m = CopyModel::of(direction);
        len as f64 / (nic_gbps * 1e3) + time_over_nic(pieces, direction, (nic_gbps * 1e9) as u64, m)
    }

    #[test]
    fn a_16_mib_run_against_a_50_gbps_nic_beats_the_fixed_cuts() {
        for direction in [Direction::DeviceToHost, Direction::HostToDevice] {
            let m = CopyModel::of(direction);
            let p = least_time(16 * M, direction, 50 * GBPS, m, 64 * K, 8 * M).unwrap();
            check(16 * M, &p, 64 * K, 8 * M);
            let best = model_time(&p, direction, 50.0);
            for fixed in [256 * K, 512 * K, M, 2 * M, 4 * M] {
                let f = vec![fixed; 16 * M / fixed];
                assert!(
                    best <= model_time(&f, direction, 50.0) + 1e-6,
                    "{direction:?}: {best} vs {fixed}: {}",
                    model_time(&f, direction, 50.0)
                );
            }
            // About 20-30 pieces near 1 MiB, the longest at the end the copies pay for.
            assert!((10..=40).contains(&p.len()), "{direction:?}: {p:?}");
            match direction {
                Direction::DeviceToHost => assert!(p[0] >= p[p.len() - 2], "{p:?}"),
                Direction::HostToDevice => assert!(p[p.len() - 1] >= p[1], "{p:?}"),
            }
        }
    }

    #[test]
    fn against_a_slow_nic_the_first_piece_is_short_and_pieces_grow() {
        let m = CopyModel::DEVICE_TO_HOST;
        let p = least_time(
            64 * M,
            Direction::DeviceToHost,
            25 * GBPS / 2,
            m,
            64 * K,
            8 * M,
        )
        .unwrap();
        check(64 * M, &p, 64 * K, 8 * M);
        assert!(p[0] < M, "{p:?}");
        assert!(p.iter().max() > Some(&(2 * M)), "{p:?}");
        // Mirrored host to device: the short piece is the last one (the copy after the last READ).
        let h = least_time(
            64 * M,
            Direction::HostToDevice,
            25 * GBPS / 2,
            m,
            64 * K,
            8 * M,
        )
        .unwrap();
        assert!(h[h.len() - 1] < M, "{h:?}");
    }

    #[test]
    fn odd_lengths_and_hostile_inputs_give_valid_cuts_or_none() {
        let m = CopyModel::DEVICE_TO_HOST;
        for len in [
            1,
            4095,
            64 * K - 1,
            64 * K + 1,
            3 * M + 17,
            16 * M + 4096 * 3 + 1,
        ] {
            for nic in [1, GBPS, 50 * GBPS, 400 * GBPS, u64::MAX] {
                for (floor, cap) in [(64 * K, 8 * M), (4096, 64 * K), (1, 1 << 20), (0, 0)] {
                    for d in [Direction::DeviceToHost, Direction::HostToDevice] {
                        if let Some(p) = least_time(len, d, nic, m, floor, cap) {
                            check(len, &p, floor.clamp(1, cap.max(1)), cap.max(1));
                        }
                    }
                }
            }
        }
        assert_eq!(least_time(0, Direction::DeviceToHost, GBPS, m, 1, 1), None);
        assert_eq!(least_time(M, Direction::DeviceToHost, 0, m, 1, M), None);
        // The longest length there is: no overflow, no panic; a valid cut or none.
        for d in [Direction::DeviceToHost, Direction::HostToDevice] {
            assert_eq!(least_time(usize::MAX, d, u64::MAX, m, 64 * K, 8 * M), None);
            // A NIC of 1 byte/s: a few huge pieces, covering the range exactly.
            if let Some(p) = least_time(usize::MAX, d, 1, m, 0, usize::MAX) {
                let sum = p.iter().try_fold(0usize, |a, &x| a.checked_add(x));
                assert_eq!(sum, Some(usize::MAX), "{p:?}");
            }
        }
        // Too many pieces: none (the caller keeps its fixed cut).
        assert_eq!(
            least_time(1 << 40, Direction::DeviceToHost, GBPS, m, 4096, 4096),
            None
        );
        let broken = CopyModel {
            rate: f64::NAN,
            per_copy_us: 1.0,
        };
        assert_eq!(
            least_time(M, Direction::DeviceToHost, GBPS, broken, 1, M),
            None
        );
    }
}
