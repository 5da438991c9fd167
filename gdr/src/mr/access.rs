//! Access flags and memory kinds of a registration.

use bitflags::bitflags;

bitflags! {
    /// What the local NIC and remote peers may do with a region (`ibv_access_flags`).
    /// The default is [`AccessFlags::LOCAL_WRITE`] only: least privilege.
    #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
    pub struct AccessFlags: u32 {
        /// The local NIC may write (receives, RDMA read results, atomic results).
        const LOCAL_WRITE = 1;
        /// Peers may RDMA-write into the region (implies LOCAL_WRITE).
        const REMOTE_WRITE = 1 << 1;
        /// Peers may RDMA-read from the region.
        const REMOTE_READ = 1 << 2;
        /// Peers may run atomics on the region (implies LOCAL_WRITE).
        const REMOTE_ATOMIC = 1 << 3;
        /// The NIC may reorder PCIe writes (faster on many platforms; ignored where unsupported).
        const RELAXED_ORDERING = 1 << 20;
    }
}

impl Default for AccessFlags {
    fn default() -> Self {
        AccessFlags::LOCAL_WRITE
    }
}

impl AccessFlags {
    /// Local write plus remote read and write: a typical RDMA target.
    #[must_use]
    pub fn remote_rw() -> Self {
        AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE | AccessFlags::REMOTE_READ
    }

    /// Adds LOCAL_WRITE where the verbs specification requires it (remote write or atomic).
    #[must_use]
    pub fn normalized(self) -> Self {
        if self.intersects(AccessFlags::REMOTE_WRITE | AccessFlags::REMOTE_ATOMIC) {
            self | AccessFlags::LOCAL_WRITE
        } else {
            self
        }
    }

    /// The `ibv_access_flags` value (normalized).
    #[must_use]
    pub fn raw(self) -> u32 {
        self.normalized().bits()
    }
}

/// Where a region's bytes live.
///
/// Non-exhaustive: other kinds of device memory may be added; match with a `_` arm.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum MemoryKind {
    /// Host memory: the CPU may read and write it.
    Host,
    /// GPU device memory: the CPU must never touch it (no inline sends, no CPU views).
    Gpu {
        /// CUDA device ordinal.
        ordinal: i32,
    },
}

#[cfg(test)]
mod tests {
    use super::*;
    use gdr_sys::ibv;

    #[test]
    fn access_defaults_to_least_privilege_and_normalizes() {
        assert_eq!(AccessFlags::default(), AccessFlags::LOCAL_WRITE);
        assert_eq!(
            AccessFlags::REMOTE_WRITE.normalized(),
            AccessFlags::REMOTE_WRITE | AccessFlags::LOCAL_WRITE
        );
        assert_eq!(
            AccessFlags::REMOTE_READ.normalized(),
            AccessFlags::REMOTE_READ
        );
        assert_eq!(AccessFlags::REMOTE_ATOMIC.raw(), 0b1001);
        assert_eq!(
            AccessFlags::RELAXED_ORDERING.bits(),
            ibv::ibv_access_flags::IBV_ACCESS_RELAXED_ORDERING.0
        );
        assert_eq!(
            AccessFlags::REMOTE_ATOMIC.bits(),
            ibv::ibv_access_flags::IBV_ACCESS_REMOTE_ATOMIC.0
        );
    }
}
