//! Tile decode on the GPU: the compute kernel `kernels/trellis_decode.metal`, driven through
//! `objc2-metal` (cargo feature `metal`, macOS).
//!
//! * The kernel source is embedded and compiled when the backend starts (`newLibraryWithSource`,
//!   math mode Safe), so users need no Xcode. One GPU thread decodes 8 trellis positions, 32
//!   threads per tile, 8 tiles per threadgroup.
//! * Codes reach the GPU without a copy where possible: the whole pages around the caller's slice
//!   (the memory-mapped checkpoint, in a conversion) are wrapped in a shared no-copy buffer, which
//!   needs a page-aligned pointer and length (16 KiB pages on Apple silicon), and the kernel starts
//!   at the slice's word offset inside it. The GPU only reads that buffer. Where wrapping is not
//!   possible (the slice is not 4-byte aligned, the range exceeds `maxBufferLength`, Metal refuses
//!   the memory), the codes are copied once into a pooled shared buffer.
//! * Values come back as f32 in a pooled shared buffer and are copied into the caller's slice.
//! * A call is split into dispatches of at most [`CHUNK_TILES`] tiles (and never more than
//!   `maxBufferLength` per buffer). Two dispatches are in flight: while the GPU decodes chunk n+1,
//!   the calling thread copies out chunk n. Across calls, rayon's workers overlap the GPU with the
//!   CPU: while one worker waits for its tiles, the others run their Hadamard transforms.
//! * [`TileDecoder::decode_tiles`] is synchronous, and a GPU round trip costs tens of
//!   microseconds, so calls of fewer than `min_gpu_tiles` tiles (default
//!   [`DEFAULT_MIN_GPU_TILES`], or `ESCHA_METAL_MIN_TILES`) are decoded by the best CPU decoder
//!   instead. Both paths are bit-identical to the scalar reference, so the choice never changes a
//!   value. (Today's conversion engine asks for 8 tiles per call, one tile row of a 128-wide
//!   block, so it stays on the CPU until it batches a whole block per call; see docs/METAL.md.)
//! * Should the GPU report an error, or the kernel answer with its unknown-codebook NaN (the host
//!   only sends ids it knows, so kernel and host disagree), the affected tiles are decoded on the
//!   CPU, a warning is printed once, and the rest of the run stays on the CPU.

use super::BackendError;
use crate::codec::{best_decoder, bytes_per_tile, Codebook, TileDecoder, K_RANGE, TILE_LEN};
use objc2::rc::{autoreleasepool, Retained};
use objc2::runtime::{NSObjectProtocol, ProtocolObject};
use objc2::sel;
use objc2_foundation::{NSError, NSString};
use objc2_metal::{
    MTLBuffer, MTLCommandBuffer, MTLCommandBufferStatus, MTLCommandEncoder, MTLCommandQueue, MTLCompileOptions,
    MTLComputeCommandEncoder, MTLComputePipelineState, MTLCreateSystemDefaultDevice, MTLDevice, MTLLibrary,
    MTLMathMode, MTLResourceOptions, MTLSize,
};
use std::collections::VecDeque;
use std::ffi::c_void;
use std::ptr::NonNull;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;

// `MTLCreateSystemDefaultDevice` lives in CoreGraphics on macOS.
#[cfg(target_os = "macos")]
#[link(name = "CoreGraphics", kind = "framework")]
extern "C" {}

/// Whether this build can use Metal at all.
pub const COMPILED: bool = true;

/// The kernel source, compiled at run time.
pub const KERNEL_SOURCE: &str = include_str!("../../kernels/trellis_decode.metal");
const KERNEL_NAME: &str = "trellis_decode";

/// GPU threads per tile: each decodes 8 of the 256 trellis positions.
const THREADS_PER_TILE: usize = 32;
/// Threads per threadgroup (8 tiles), if the pipeline allows that many.
const THREADGROUP: usize = 256;
/// Most tiles in one dispatch: 8 MiB of f32 output.
pub const CHUNK_TILES: usize = 8192;
/// Calls smaller than this stay on the CPU by default (see the module notes).
pub const DEFAULT_MIN_GPU_TILES: usize = 1024;
/// Environment variable that overrides [`DEFAULT_MIN_GPU_TILES`] (1 sends every call to the GPU).
pub const MIN_GPU_TILES_ENV: &str = "ESCHA_METAL_MIN_TILES";
/// Dispatches in flight per call: the GPU works on one while the CPU copies out the other.
const IN_FLIGHT: usize = 2;
/// Smallest pooled buffer, in tiles.
const MIN_SLOT_TILES: usize = 256;

/// The kernel's `DecodeParams`, field for field.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
struct DecodeParams {
    k: u32,
    /// Only ever a known codebook's id (see [`DecodeParams::new`]): the kernel answers any other
    /// with [`UNKNOWN_CODEBOOK`].
    codebook: u32,
    tiles: u32,
    word_offset: u32,
}

impl DecodeParams {
    fn new(k: u32, cb: Codebook, tiles: usize, word_offset: u32) -> DecodeParams {
        DecodeParams { k, codebook: u32::from(cb.id()), tiles: tiles as u32, word_offset }
    }
}

/// The kernel's `UNKNOWN_CODEBOOK`: a quiet NaN, which no codebook value is.
const UNKNOWN_CODEBOOK: u32 = 0x7FC0_0000;

type Buffer = Retained<ProtocolObject<dyn MTLBuffer>>;

/// A reusable pair of shared buffers for one dispatch.
struct Slot {
    /// Capacity in tiles.
    tiles: usize,
    /// `tiles · 256` f32 values.
    out: Buffer,
    /// `tiles · bytes_per_tile(8)` bytes for copied codes, made on first need.
    staging: Option<Buffer>,
}

// SAFETY: Metal buffers may be used from any thread; a slot is used by one thread at a time (it is
// taken out of the pool for the duration of one dispatch).
unsafe impl Send for Slot {}

/// One dispatch in flight, and where its values go.
struct InFlight<'a> {
    /// None if nothing could be dispatched (no GPU memory or command buffer).
    cmd: Option<Retained<ProtocolObject<dyn MTLCommandBuffer>>>,
    slot: Option<Slot>,
    /// The codes buffer (no-copy or staging), alive until the GPU is done with it.
    input: Option<Buffer>,
    src: &'a [u8],
    dst: &'a mut [f32],
}

impl Drop for InFlight<'_> {
    /// A dispatch still running reads `src` (wrapped without a copy) and writes into its slot:
    /// neither may be freed before the GPU is done, also when a panic unwinds past it.
    fn drop(&mut self) {
        if let Some(cmd) = &self.cmd {
            cmd.waitUntilCompleted();
        }
    }
}

/// The Metal tile decoder. Create it once; it is shared by all worker threads.
pub struct MetalDecoder {
    device: Retained<ProtocolObject<dyn MTLDevice>>,
    queue: Retained<ProtocolObject<dyn MTLCommandQueue>>,
    pipeline: Retained<ProtocolObject<dyn MTLComputePipelineState>>,
    threadgroup: usize,
    chunk_tiles: usize,
    max_buffer: usize,
    page: usize,
    min_gpu_tiles: usize,
    slots: Mutex<Vec<Slot>>,
    cpu: &'static dyn TileDecoder,
    gpu_failed: AtomicBool,
}

impl std::fmt::Debug for MetalDecoder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MetalDecoder")
            .field("device", &self.device_name())
            .field("threadgroup", &self.threadgroup)
            .field("chunk_tiles", &self.chunk_tiles)
            .field("min_gpu_tiles", &self.min_gpu_tiles)
            .finish()
    }
}

fn describe(what: &str, e: &NSError) -> BackendError {
    BackendError::MetalSetup(format!("{what}: {}", e.localizedDescription()))
}

impl MetalDecoder {
    /// Finds the system's default GPU and compiles the kernel for it.
    pub fn new() -> Result<Self, BackendError> {
        if !cfg!(target_os = "macos") {
            return Err(BackendError::MetalNotMacos);
        }
        autoreleasepool(|_| {
            let device = MTLCreateSystemDefaultDevice().ok_or(BackendError::NoMetalDevice)?;
            let options = MTLCompileOptions::new();
            // IEEE arithmetic: the decode must be bit-identical to the CPU reference.
            if options.respondsToSelector(sel!(setMathMode:)) {
                options.setMathMode(MTLMathMode::Safe); // macOS 15 and later
            } else {
                #[allow(deprecated)]
                options.setFastMathEnabled(false);
            }
            let library = device
                .newLibraryWithSource_options_error(&NSString::from_str(KERNEL_SOURCE), Some(&options))
                .map_err(|e| describe("compiling kernels/trellis_decode.metal", &e))?;
            let function = library
                .newFunctionWithName(&NSString::from_str(KERNEL_NAME))
                .ok_or_else(|| BackendError::MetalSetup(format!("the Metal library has no function {KERNEL_NAME}")))?;
            let pipeline = device
                .newComputePipelineStateWithFunction_error(&function)
                .map_err(|e| describe("building the compute pipeline", &e))?;
            let queue = device
                .newCommandQueue()
                .ok_or_else(|| BackendError::MetalSetup("the device gave no command queue".into()))?;
            let threadgroup =
                THREADGROUP.min(pipeline.maxTotalThreadsPerThreadgroup()) / THREADS_PER_TILE * THREADS_PER_TILE;
            if threadgroup == 0 {
                return Err(BackendError::MetalSetup(
                    "the pipeline allows fewer than 32 threads per threadgroup".into(),
                ));
            }
            let max_buffer = device.maxBufferLength();
            let chunk_tiles = CHUNK_TILES.min(max_buffer / (TILE_LEN * 4)).max(1);
            // SAFETY: sysconf has no preconditions.
            let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
            let page = if page > 0 { page as usize } else { 16384 };
            Ok(Self {
                device,
                queue,
                pipeline,
                threadgroup,
                chunk_tiles,
                max_buffer,
                page,
                min_gpu_tiles: std::env::var(MIN_GPU_TILES_ENV)
                    .ok()
                    .and_then(|v| v.trim().parse::<usize>().ok())
                    .unwrap_or(DEFAULT_MIN_GPU_TILES)
                    .max(1),
                slots: Mutex::new(Vec::new()),
                cpu: best_decoder(),
                gpu_failed: AtomicBool::new(false),
            })
        })
    }

    /// Calls with fewer tiles than this are decoded on the CPU (1 sends everything to the GPU).
    pub fn with_min_gpu_tiles(mut self, tiles: usize) -> Self {
        self.min_gpu_tiles = tiles.max(1);
        self
    }

    /// The GPU's name, as Metal reports it.
    pub fn device_name(&self) -> String {
        autoreleasepool(|_| self.device.name().to_string())
    }

    /// Whether every call so far that went to the GPU completed there.
    pub fn gpu_ok(&self) -> bool {
        !self.gpu_failed.load(Ordering::Relaxed)
    }

    fn decode_on_gpu(&self, bytes: &[u8], k: u32, cb: Codebook, out: &mut [f32]) {
        let tb = bytes_per_tile(k);
        let mut in_flight: VecDeque<InFlight<'_>> = VecDeque::with_capacity(IN_FLIGHT);
        for (src, dst) in bytes.chunks(self.chunk_tiles * tb).zip(out.chunks_mut(self.chunk_tiles * TILE_LEN)) {
            if in_flight.len() == IN_FLIGHT {
                let done = in_flight.pop_front().expect("non-empty");
                self.finish(done, k, cb);
            }
            in_flight.push_back(self.submit(src, dst, k, cb));
        }
        while let Some(done) = in_flight.pop_front() {
            self.finish(done, k, cb);
        }
    }

    /// Encodes and commits one dispatch; does not wait.
    fn submit<'a>(&self, src: &'a [u8], dst: &'a mut [f32], k: u32, cb: Codebook) -> InFlight<'a> {
        let tiles = src.len() / bytes_per_tile(k);
        let mut flight = InFlight { cmd: None, slot: None, input: None, src, dst };
        let Some(mut slot) = self.take_slot(tiles) else { return flight };
        let input = self.wrap_no_copy(src).or_else(|| {
            let staging = self.staging(&mut slot)?;
            // SAFETY: the staging buffer holds `slot.tiles · bytes_per_tile(8)` ≥ `src.len()` bytes
            // of shared memory that no dispatch is using (the slot was taken out of the pool).
            unsafe { std::ptr::copy_nonoverlapping(src.as_ptr(), staging.contents().as_ptr().cast::<u8>(), src.len()) };
            Some((staging, 0))
        });
        if let Some((input, word_offset)) = input {
            let params = DecodeParams::new(k, cb, tiles, word_offset);
            flight.cmd = self.encode(&input, &slot.out, &params, tiles);
            flight.input = Some(input);
        }
        flight.slot = Some(slot);
        flight
    }

    fn encode(
        &self,
        input: &ProtocolObject<dyn MTLBuffer>,
        out: &ProtocolObject<dyn MTLBuffer>,
        params: &DecodeParams,
        tiles: usize,
    ) -> Option<Retained<ProtocolObject<dyn MTLCommandBuffer>>> {
        let cmd = self.queue.commandBuffer()?;
        let encoder = cmd.computeCommandEncoder()?;
        encoder.setComputePipelineState(&self.pipeline);
        // SAFETY: the kernel reads `params.tiles · 8K` words from `params.word_offset` in `input`
        // (inside the caller's slice) and writes `params.tiles · 256` floats of `out`, which holds
        // at least that many; `params` matches the kernel's `DecodeParams`.
        unsafe {
            encoder.setBuffer_offset_atIndex(Some(input), 0, 0);
            encoder.setBuffer_offset_atIndex(Some(out), 0, 1);
            encoder.setBytes_length_atIndex(
                NonNull::from(params).cast::<c_void>(),
                std::mem::size_of::<DecodeParams>(),
                2,
            );
        }
        let groups = (tiles * THREADS_PER_TILE).div_ceil(self.threadgroup);
        encoder.dispatchThreadgroups_threadsPerThreadgroup(
            MTLSize { width: groups, height: 1, depth: 1 },
            MTLSize { width: self.threadgroup, height: 1, depth: 1 },
        );
        encoder.endEncoding();
        cmd.commit();
        Some(cmd)
    }

    /// Waits for a dispatch and copies its values out (or decodes on the CPU if it failed).
    fn finish(&self, mut flight: InFlight<'_>, k: u32, cb: Codebook) {
        let (cmd, slot) = (flight.cmd.take(), flight.slot.take());
        let done = match (&cmd, &slot) {
            (Some(cmd), Some(slot)) => {
                cmd.waitUntilCompleted();
                if cmd.status() == MTLCommandBufferStatus::Completed {
                    Some(slot)
                } else {
                    let why = cmd.error().map(|e| e.localizedDescription().to_string());
                    self.note_failure(why.as_deref().unwrap_or("the command buffer did not complete"));
                    None
                }
            }
            _ => {
                self.note_failure("no Metal buffer or command buffer could be allocated");
                None
            }
        };
        let values = done.map(|slot| {
            // SAFETY: the dispatch completed and wrote `dst.len()` f32 values at the start of the
            // slot's output buffer, shared memory the CPU may now read.
            unsafe { std::slice::from_raw_parts(slot.out.contents().as_ptr().cast::<f32>(), flight.dst.len()) }
        });
        // The kernel answers a codebook it does not know with its NaN: the CPU decodes instead.
        let unknown = values.and_then(|v| v.first()).is_some_and(|v| v.to_bits() == UNKNOWN_CODEBOOK);
        if unknown {
            self.note_failure(&format!("the kernel does not know codebook {} (id {})", cb.name(), cb.id()));
        }
        match values.filter(|_| !unknown) {
            Some(values) => flight.dst.copy_from_slice(values),
            None => self.cpu.decode_tiles(flight.src, k, cb, flight.dst),
        }
        drop((cmd, flight));
        if let Some(slot) = slot {
            self.slots.lock().unwrap_or_else(|e| e.into_inner()).push(slot);
        }
    }

    fn note_failure(&self, why: &str) {
        if !self.gpu_failed.swap(true, Ordering::Relaxed) {
            eprintln!("escha-convert: warning: the Metal decode failed ({why}); decoding on the CPU from here on (same values)");
        }
    }

    /// Wraps the whole pages around `src` in a no-copy shared buffer; returns it and the word
    /// offset of `src` inside it.
    fn wrap_no_copy(&self, src: &[u8]) -> Option<(Buffer, u32)> {
        let addr = src.as_ptr() as usize;
        if src.is_empty() || addr % 4 != 0 {
            return None;
        }
        let base = addr & !(self.page - 1);
        let end = (addr + src.len()).next_multiple_of(self.page);
        let len = end - base;
        if len > self.max_buffer {
            return None;
        }
        let word_offset = u32::try_from((addr - base) / 4).ok()?;
        // SAFETY: `base..end` is made of whole pages, each holding at least one byte of `src`, so
        // all of it is mapped and readable. The buffer lives only until the dispatch that reads
        // it has completed (within this call, while `src` is borrowed); the GPU never writes it,
        // and no deallocator is installed, so Metal never frees the memory.
        unsafe {
            self.device.newBufferWithBytesNoCopy_length_options_deallocator(
                NonNull::new(base as *mut c_void)?,
                len,
                MTLResourceOptions::StorageModeShared,
                None,
            )
        }
        .map(|b| (b, word_offset))
    }

    /// A pooled slot with room for `tiles` tiles, or a new one (None if Metal has no memory).
    fn take_slot(&self, tiles: usize) -> Option<Slot> {
        let mut pool = self.slots.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(i) = pool.iter().position(|s| s.tiles >= tiles) {
            return Some(pool.swap_remove(i));
        }
        drop(pool);
        let cap = tiles.next_power_of_two().max(MIN_SLOT_TILES).min(self.chunk_tiles).max(tiles);
        let out = self.device.newBufferWithLength_options(cap * TILE_LEN * 4, MTLResourceOptions::StorageModeShared)?;
        Some(Slot { tiles: cap, out, staging: None })
    }

    /// The slot's staging buffer for copied codes, made on first need.
    fn staging(&self, slot: &mut Slot) -> Option<Buffer> {
        if slot.staging.is_none() {
            slot.staging = self
                .device
                .newBufferWithLength_options(slot.tiles * bytes_per_tile(8), MTLResourceOptions::StorageModeShared);
        }
        slot.staging.clone()
    }
}

impl TileDecoder for MetalDecoder {
    fn name(&self) -> &'static str {
        "metal"
    }

    fn prefers_large_batches(&self) -> bool {
        true
    }

    fn decode_tiles(&self, bytes: &[u8], k: u32, cb: Codebook, out: &mut [f32]) {
        let tb = bytes_per_tile(k);
        let tiles = bytes.len() / tb;
        let (bytes, out) = (&bytes[..tiles * tb], &mut out[..tiles * TILE_LEN]);
        if tiles == 0 || tiles < self.min_gpu_tiles || !K_RANGE.contains(&k) || !self.gpu_ok() {
            return self.cpu.decode_tiles(bytes, k, cb, out);
        }
        autoreleasepool(|_| self.decode_on_gpu(bytes, k, cb, out));
    }
}
