//! The Metal kernel `kernels/trellis_decode.metal`, compiled as C++20 through
//! `kernels/shim/metal_shim.h` (see build.rs), run on the CPU thread by thread and compared bit for
//! bit with the scalar decoder: golden tiles, random tiles for every K × codebook, every state of
//! every codebook. This runs everywhere, so a kernel change that breaks decoding fails CI on Linux.

#[cfg(escha_kernel_shim)]
mod shim {
    use crate::kernel_cases::{self, TileSet};
    use escha_convert::codec::TILE_LEN;

    /// The kernel's `DecodeParams`, field for field.
    #[repr(C)]
    struct DecodeParams {
        k: u32,
        codebook: u32,
        tiles: u32,
        word_offset: u32,
    }

    extern "C" {
        /// `kernel void trellis_decode(device const uint*, device float*, constant DecodeParams&, uint gid)`.
        fn trellis_decode(codes: *const u32, out: *mut f32, p: *const DecodeParams, gid: u32);
    }

    const THREADS_PER_TILE: u32 = 32;
    /// Sentinel written around the output to catch stray stores.
    const GUARD: u32 = 0x7FC0_DEAD;

    /// Runs the kernel as a GPU would, one thread index at a time, over a grid rounded up to whole
    /// threadgroups of 256 (so the out-of-range guard runs too), with the tiles placed
    /// `word_offset` words into the codes buffer.
    fn run_kernel(set: &TileSet, word_offset: usize) -> Vec<f32> {
        run_kernel_as(set, word_offset, u32::from(set.cb.id()))
    }

    /// [`run_kernel`] with `codebook` as the id the kernel is given.
    fn run_kernel_as(set: &TileSet, word_offset: usize, codebook: u32) -> Vec<f32> {
        let tiles = set.tiles();
        let mut codes = vec![0xA5A5_A5A5u32; word_offset];
        codes.extend(set.bytes.chunks_exact(4).map(|w| u32::from_le_bytes([w[0], w[1], w[2], w[3]])));
        codes.extend([0x5A5A_5A5Au32; 4]);
        let pad = 64;
        let mut out = vec![f32::from_bits(GUARD); pad + tiles * TILE_LEN + pad];
        let p = DecodeParams { k: set.k, codebook, tiles: tiles as u32, word_offset: word_offset as u32 };
        let threads = (tiles as u32 * THREADS_PER_TILE).div_ceil(256) * 256;
        for gid in 0..threads {
            // SAFETY: the buffers hold `word_offset + tiles·8K` words and `tiles·256` floats past
            // `pad`, which is all the kernel touches for these parameters (checked below).
            unsafe { trellis_decode(codes.as_ptr(), out.as_mut_ptr().add(pad), &raw const p, gid) };
        }
        let (head, rest) = out.split_at(pad);
        let (body, tail) = rest.split_at(tiles * TILE_LEN);
        assert!(
            head.iter().chain(tail).all(|v| v.to_bits() == GUARD),
            "{}: the kernel wrote outside its output",
            set.label
        );
        body.to_vec()
    }

    #[test]
    fn golden_tiles_decode_bit_exactly() {
        for set in kernel_cases::golden() {
            kernel_cases::assert_bit_exact(&set, &run_kernel(&set, 0), "kernel (C++ shim)");
        }
    }

    #[test]
    fn random_tiles_decode_bit_exactly_for_every_k_and_codebook() {
        for set in kernel_cases::random(40) {
            kernel_cases::assert_bit_exact(&set, &run_kernel(&set, 0), "kernel (C++ shim)");
        }
    }

    #[test]
    fn every_state_of_every_codebook_decodes_bit_exactly() {
        for set in kernel_cases::all_states() {
            kernel_cases::assert_bit_exact(&set, &run_kernel(&set, 0), "kernel (C++ shim)");
        }
    }

    /// An id no codebook has decodes to the kernel's NaN, never to some codebook's values (the CPU
    /// decoders refuse such an id; the Metal host refuses a dispatch that returns NaN).
    #[test]
    fn an_unknown_codebook_id_decodes_to_nan() {
        let set = &kernel_cases::random(2)[0];
        for id in [3, 4, 255, u32::MAX] {
            let out = run_kernel_as(set, 0, id);
            assert!(out.iter().all(|v| v.to_bits() == 0x7FC0_0000), "codebook id {id}");
        }
    }

    #[test]
    fn constant_tiles_and_word_offsets() {
        for set in kernel_cases::constant_tiles() {
            kernel_cases::assert_bit_exact(&set, &run_kernel(&set, 0), "kernel (C++ shim)");
        }
        for set in kernel_cases::random(3) {
            for offset in [1, 5, 4096] {
                kernel_cases::assert_bit_exact(&set, &run_kernel(&set, offset), "kernel (C++ shim), word offset");
            }
        }
    }
}

#[cfg(not(escha_kernel_shim))]
#[test]
fn kernel_shim_was_built() {
    panic!(
        "build.rs could not compile kernels/trellis_decode.metal as C++20 (see the cargo warning): \
         it needs a C++ compiler with _Float16 (g++ >= 12 on x86_64, or clang >= 15)"
    );
}
