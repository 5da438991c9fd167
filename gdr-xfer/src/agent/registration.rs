//! Segments: registering host, GPU and staged memory through the registration cache, and
//! deregistering it.

use super::*;

impl Agent {
    // ----- segments -----

    /// Registers host memory the segment will own (`Vec<u8>`, gdr's `AlignedBuffer`, ...).
    ///
    /// # Errors
    /// [`Error::TooLarge`] for a name over 64 bytes; gdr's registration errors.
    pub fn register_host(
        &self,
        memory: impl HostMemory,
        name: &str,
        location: Location,
    ) -> Result<Segment> {
        self.shared.check_open()?;
        check_name(name)?;
        let first =
            MemoryRegion::register(&self.shared.rails[0].pd, Box::new(memory), SEGMENT_ACCESS)?;
        let len = gdr::mr::Registered::len(&*first) as u64;
        let mut regions = vec![first.clone()];
        for rail in &self.shared.rails[1..] {
            regions.push(first.register_again(&rail.pd, SEGMENT_ACCESS)?);
        }
        self.add_segment(
            name,
            location,
            Backing::Host(Arc::new(regions)),
            0,
            len,
            None,
        )
    }

    /// Allocates `len` zeroed, page-aligned bytes of host memory and registers them.
    ///
    /// # Errors
    /// As [`Agent::register_host`].
    pub fn alloc_host(&self, len: usize, name: &str) -> Result<Segment> {
        self.register_host(
            AlignedBuffer::zeroed(len)?,
            name,
            Location::Cpu { numa: None },
        )
    }

    /// Registers `range` of a GPU buffer, through the registration cache: a range an earlier
    /// registration of the same buffer covers costs no verbs call (see [`Agent::cache_stats`]).
    /// The path (dma-buf or peer memory) is gdr's choice ([`RegistrationPath::Auto`]).
    ///
    /// When gdr finds no direct path (no peer-memory module, no dma-buf support) and
    /// [`AgentConfig::gpu_staging`] is [`GpuStaging::Fallback`] (the default), the segment is
    /// *staged* instead: its transfers go through pinned host bounce buffers
    /// ([`crate::staging`]); a warning says so and [`Segment::path`] tells. A staged segment is
    /// the local side of transfers only: peers cannot address it.
    ///
    /// # Errors
    /// gdr's pointer checks and registration errors (with the doctor's hints); with staging,
    /// the errors of making the bounce buffers (pinned memory, `ibv_reg_mr`).
    pub fn register_gpu(
        &self,
        buffer: &Arc<DeviceBuffer>,
        range: impl RangeBounds<usize>,
        name: &str,
    ) -> Result<Segment> {
        self.shared.check_open()?;
        check_name(name)?;
        let (offset, len) = resolve(range, buffer.len())?;
        let location = Location::Cuda {
            ordinal: buffer.ordinal().max(0) as u32,
        };
        let staged = StagedDevice::Cuda(buffer.clone());
        if self.shared.config.gpu_staging == GpuStaging::Always {
            return self.add_staged(name, location, staged, offset, len, "staging is forced");
        }
        let pds: Vec<_> = self.shared.rails.iter().map(|r| r.pd.clone()).collect();
        let registered = self.lock_cache().register_gpu(
            &pds,
            buffer,
            offset,
            len,
            SEGMENT_ACCESS,
            RegistrationPath::Auto,
        );
        match registered {
            Ok((mr, base)) => {
                self.add_segment(name, location, Backing::Gpu(mr), base, len as u64, None)
            }
            Err(e)
                if self.shared.config.gpu_staging == GpuStaging::Fallback && no_direct_path(&e) =>
            {
                let why = e.to_string();
                self.add_staged(name, location, staged, offset, len, &why)
            }
            Err(e) => Err(e),
        }
    }

    /// Registers `range` of GPU memory the application allocated itself (PyTorch's caching
    /// allocator, cudarc, a pool), through the registration cache, for the NIC to reach
    /// directly. `memory` is any owner implementing gdr's [`DeviceMemory`] (an `unsafe` trait:
    /// its implementation promises the range stays allocated and unchanged while the value
    /// lives); the segment and every request using it keep the `Arc`, so the memory outlives
    /// the NIC's use of it. Sub-ranges of one owner share registrations as for
    /// [`Agent::register_gpu`].
    ///
    /// gdr's pointer checks run (`cuPointerGetAttributes`: device memory, not managed or host
    /// memory, the range inside one allocation), and, as for
    /// [`Agent::register_gpu`], when gdr finds no direct path and
    /// [`AgentConfig::gpu_staging`] allows it, the segment is staged through bounce buffers
    /// (copies with the memory's GPU's primary context, the one PyTorch and the CUDA runtime
    /// use) and [`Segment::path`] says why.
    ///
    /// For an address from C or Python with no Rust owner, wrap it in
    /// [`gdr::cuda::ForeignDeviceMemory`]: `unsafe` to make (its contract: the range stays
    /// allocated until its `release` closure runs), and gdr calls `release` once the segment, the
    /// cache and every request are done with it. Host memory from such a caller is
    /// [`gdr::mr::ForeignHostMemory`], registered with [`Agent::register_host`].
    ///
    /// # Errors
    /// gdr's pointer checks ([`gdr::Error::NotGpuMemory`], [`gdr::Error::Unsupported`] for
    /// managed memory, [`gdr::Error::OutOfBounds`]); as [`Agent::register_gpu`];
    /// [`Error::InvalidArgument`] for a bad range or name.
    pub fn register_gpu_memory<M: DeviceMemory + Send + Sync + 'static>(
        &self,
        memory: Arc<M>,
        range: impl RangeBounds<usize>,
        name: &str,
    ) -> Result<Segment> {
        self.shared.check_open()?;
        check_name(name)?;
        let (offset, len) = resolve(range, memory.len())?;
        // The pointer checks, with the GPU's ordinal, for the staged path (a registration runs
        // them itself): managed or host memory is refused, never staged.
        let staged = || -> Result<(StagedDevice, Location)> {
            let start = memory
                .device_ptr()
                .checked_add(offset as u64)
                .ok_or_else(|| {
                    Error::invalid(
                        format!(
                            "device range {:#x} + {offset} overflows",
                            memory.device_ptr()
                        ),
                        "pass the memory's real address and length",
                    )
                })?;
            let ordinal = gdr::gpu_mr::check_gpu_range(start, len)?.gpu.ordinal;
            let device = StagedDevice::CudaForeign {
                memory: memory.clone(),
                ordinal,
            };
            let location = Location::Cuda {
                ordinal: ordinal.max(0) as u32,
            };
            Ok((device, location))
        };
        if self.shared.config.gpu_staging == GpuStaging::Always {
            let (device, location) = staged()?;
            return self.add_staged(name, location, device, offset, len, "staging is forced");
        }
        let pds: Vec<_> = self.shared.rails.iter().map(|r| r.pd.clone()).collect();
        let registered = self.lock_cache().register_gpu(
            &pds,
            &memory,
            offset,
            len,
            SEGMENT_ACCESS,
            RegistrationPath::Auto,
        );
        match registered {
            Ok((mr, base)) => {
                let location = Location::Cuda {
                    ordinal: mr[0].ordinal().max(0) as u32,
                };
                self.add_segment(name, location, Backing::Gpu(mr), base, len as u64, None)
            }
            Err(e)
                if self.shared.config.gpu_staging == GpuStaging::Fallback && no_direct_path(&e) =>
            {
                let (device, location) = staged()?;
                self.add_staged(name, location, device, offset, len, &e.to_string())
            }
            Err(e) => Err(e),
        }
    }

    /// Registers `range` of an emulated GPU's memory as a staged segment (feature
    /// `emulated-gpu`): every transfer from or to it takes the staging path, with `memcpy`
    /// copies, as GPU memory without GPUDirect does with `cuMemcpyAsync`.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for a bad range or name; the errors of making the bounce
    /// buffers (`ibv_reg_mr`).
    #[cfg(feature = "emulated-gpu")]
    pub fn register_emulated_gpu(
        &self,
        gpu: &Arc<crate::staging::EmulatedGpu>,
        range: impl RangeBounds<usize>,
        name: &str,
    ) -> Result<Segment> {
        self.shared.check_open()?;
        check_name(name)?;
        let (offset, len) = resolve(range, gpu.len())?;
        let location = Location::Cuda {
            ordinal: gpu.ordinal(),
        };
        let dev = StagedDevice::Emulated(gpu.clone());
        self.add_staged(name, location, dev, offset, len, "an emulated GPU")
    }

    pub(super) fn add_staged(
        &self,
        name: &str,
        location: Location,
        device: StagedDevice,
        offset: usize,
        len: usize,
        why: &str,
    ) -> Result<Segment> {
        let (bounce, how) = self
            .shared
            .intake
            .staging
            .bounce_for(&device, self.name())?;
        log::warn!("segment {name:?} ({len} bytes of GPU memory) is staged: {why}; {how}");
        let describe = format!("{how}; staged because {why}");
        let memory = Arc::new(StagedMemory {
            device,
            bounce,
            describe,
        });
        self.add_segment(
            name,
            location,
            Backing::Staged(memory),
            offset,
            len as u64,
            None,
        )
    }

    /// A new segment for `offset..offset + len` of an existing one: same registration, no verbs
    /// call (for many tensors in one allocation).
    ///
    /// # Errors
    /// [`Error::OutOfSegment`] for a range outside `parent`; [`Error::ForeignObject`] when
    /// `parent` is another agent's segment and [`Error::UnknownSegment`] when it was
    /// deregistered (nothing is registered or announced then).
    pub fn register_within(
        &self,
        parent: &Segment,
        offset: u64,
        len: u64,
        name: &str,
    ) -> Result<Segment> {
        const CALL: &str = "Agent::register_within";
        self.shared.check_open()?;
        self.shared
            .lock_endpoint()
            .segments()
            .admit(parent.inner.agent, parent.id(), |s| s.is(parent))
            .map_err(|e| refused(e, CALL, PARENT_GONE))?;
        check_name(name)?;
        crate::descriptor::check_local(None, parent, offset, len)?;
        self.add_segment(
            name,
            parent.location(),
            parent.inner.backing.clone(),
            parent.inner.base + offset as usize,
            len,
            Some(parent),
        )
    }

    pub(super) fn add_segment(
        &self,
        name: &str,
        location: Location,
        backing: Backing,
        base: usize,
        len: u64,
        parent: Option<&Segment>,
    ) -> Result<Segment> {
        let (addr, rkeys) = match &backing {
            Backing::Host(m) => (m[0].slice(..)?.addr(), m.iter().map(|r| r.rkey()).collect()),
            Backing::Gpu(m) => (m[0].slice(..)?.addr(), m.iter().map(|r| r.rkey()).collect()),
            // Never announced: no address or key a peer could use.
            Backing::Staged(_) => (0, Vec::new()),
        };
        let id = self
            .shared
            .lock_endpoint()
            .segments_mut()
            .next_id()
            .map_err(|e| refused(e, "Agent::register", "it was deregistered already"))?;
        let info = SegmentInfo {
            id,
            name: name.to_string(),
            addr: addr + base as u64,
            len,
            rkeys,
            location,
        };
        // Ranked now, once: no transfer from this memory pays for it.
        let rail_mask = self.shared.rail_mask(location);
        let seg = Segment::new(info.clone(), backing, base, self.shared.id(), rail_mask)?;
        let peers = {
            let mut endpoint = self.shared.lock_endpoint();
            let table = endpoint.segments_mut();
            match parent {
                // The parent's admission again, with the insertion: one deregistered since
                // `register_within` looked carves nothing.
                Some(p) => table
                    .insert_within(p.inner.agent, p.id(), |s| s.is(p), seg.id(), seg.clone())
                    .map_err(|e| refused(e, "Agent::register_within", PARENT_GONE))?,
                None => table.insert(seg.id(), seg.clone()),
            }
            // Under the same lock as the insertion: a connection admitted after it sends it in
            // its table, one admitted before is told here.
            connections(&endpoint)
        };
        if !seg.is_published() {
            return Ok(seg);
        }
        #[cfg(feature = "etcd")]
        if let Some(p) = self.shared.lock_published().as_ref() {
            p.put_segment(self.name(), &seg);
        }
        for p in peers {
            p.send_control(&Message::Segments(vec![info.clone()]));
        }
        Ok(seg)
    }

    /// What staging holds and did: the GPUs with bounce buffers, staged transfers, chunks moved,
    /// and chunks whose buffer waited for the NIC to let go ([`crate::staging`]).
    pub fn staging_stats(&self) -> crate::StagingStats {
        self.shared.intake.staging.stats()
    }

    /// Removes a segment from the table peers see (they are told at once; their new transfers
    /// to it fail with [`Error::UnknownSegment`]) and from this agent's own transfers (new ones
    /// with it as their local side fail the same way). Its memory is deregistered once no
    /// segment and no request in flight uses the registration any more.
    ///
    /// After [`Agent::shutdown`] it still lets go of the segment (no peer is connected to be
    /// told): memory is released as it would be.
    ///
    /// # Errors
    /// [`Error::ForeignObject`] for another agent's segment; [`Error::UnknownSegment`] when it
    /// is no longer registered.
    pub fn deregister(&self, segment: &Segment) -> Result<()> {
        let peers = {
            let mut endpoint = self.shared.lock_endpoint();
            endpoint
                .segments_mut()
                .remove(segment.inner.agent, segment.id(), |s| s.is(segment))
                .map_err(|e| refused(e, "Agent::deregister", "it was deregistered already"))?;
            segment.inner.set_deregistered();
            if !segment.is_published() {
                return Ok(());
            }
            connections(&endpoint)
        };
        #[cfg(feature = "etcd")]
        if let Some(p) = self.shared.lock_published().as_ref() {
            p.delete_segment(self.name(), segment.id());
        }
        for p in peers {
            p.send_control(&Message::Removed(vec![segment.id()]));
        }
        Ok(())
    }

    /// The registered segments, by id.
    pub fn segments(&self) -> Vec<Segment> {
        self.shared
            .lock_endpoint()
            .segments()
            .values()
            .cloned()
            .collect()
    }

    /// Counters of the GPU registration cache.
    pub fn cache_stats(&self) -> CacheStats {
        self.lock_cache().stats
    }

    pub(super) fn lock_cache(&self) -> MutexGuard<'_, RegistrationCache> {
        self.shared.cache.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// Whether a GPU registration failed because gdr found no direct path for the NIC (the cases
/// staging serves), rather than for bad memory or exhausted resources.
pub(super) fn no_direct_path(e: &Error) -> bool {
    match e {
        Error::Gdr(gdr::Error::Unsupported { .. }) => true,
        Error::Gdr(g @ gdr::Error::Verbs { .. }) => matches!(
            g.errno(),
            Some(libc::EFAULT | libc::EOPNOTSUPP | libc::EPROTONOSUPPORT)
        ),
        _ => false,
    }
}

/// The hint of a parent segment deregistered before `register_within` carved it.
const PARENT_GONE: &str =
    "it was deregistered: register the memory again, then carve segments out of the new one";

/// The error of `call` for a segment the agent's table refused (`unknown`: the hint when the
/// segment is no longer registered).
fn refused(e: LocalError, call: &'static str, unknown: &'static str) -> Error {
    match e {
        LocalError::Foreign { segment, .. } => Error::ForeignObject {
            call,
            object: Foreign::Segment(segment),
            hint: "give each agent its own segments: register the memory with this agent (a registration of the same memory by two agents is allowed)".into(),
        },
        LocalError::Unknown { segment } => Error::UnknownSegment {
            owner: "local".into(),
            segment,
            hint: unknown.into(),
        },
        LocalError::Exhausted => Error::invalid(
            "segment ids are exhausted (2^32 - 2 registrations by this agent)",
            "restart the agent",
        ),
    }
}

pub(super) fn check_name(name: &str) -> Result<()> {
    if name.len() > MAX_NAME {
        return Err(Error::TooLarge {
            what: "segment name".into(),
            len: name.len() as u64,
            max: MAX_NAME as u64,
            hint: "use a shorter name".into(),
        });
    }
    Ok(())
}

pub(super) fn resolve(range: impl RangeBounds<usize>, len: usize) -> Result<(usize, usize)> {
    use std::ops::Bound::*;
    let start = match range.start_bound() {
        Included(&s) => Some(s),
        Excluded(&s) => s.checked_add(1),
        Unbounded => Some(0),
    };
    let end = match range.end_bound() {
        Included(&e) => e.checked_add(1),
        Excluded(&e) => Some(e),
        Unbounded => Some(len),
    };
    match (start, end) {
        (Some(s), Some(e)) if s < e && e <= len => Ok((s, e - s)),
        _ => Err(Error::invalid(
            format!("range {start:?}..{end:?} of a {len}-byte buffer"),
            "give a non-empty range inside the buffer",
        )),
    }
}
