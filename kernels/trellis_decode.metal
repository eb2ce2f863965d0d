// EXL3 trellis tile decode: stored tile words -> exact codebook values, in trellis order.
//
// One thread decodes 8 consecutive trellis positions of one tile (32 threads per tile, the lane
// form of the reference CUDA decoder). Output is f32, 256 values per tile, trellis order: the same
// contract as the crate's `TileDecoder::decode_tiles`, and bit-identical to its scalar decoder.
//
// Format reference: escha-w2-format.md §3 (codebooks) and §4 (tile bit layout).
//
// This file is also compiled as C++20 on the CPU for tests, through kernels/shim/metal_shim.h
// (included before this file). Keep to the subset the shim provides: scalar uint/ushort/half/float
// arithmetic, as_type<T>, the kernel/device/constant qualifiers and [[...]] attributes.

#ifdef __METAL_VERSION__
#include <metal_stdlib>
using namespace metal;
#endif

// Host-side twin: `DecodeParams` in src/backend/metal.rs and tests/metal_kernel_shim.rs.
struct DecodeParams {
    uint k;           // bits per weight, 1..8
    uint codebook;    // 0 = 3INST, 1 = MCG, 2 = MUL1 (exllamav3 ids); any other: UNKNOWN_CODEBOOK
    uint tiles;       // tiles in this dispatch
    uint word_offset; // u32 words from the start of the codes buffer to the first tile
};

// Codebook constants (format §3).
constant uint INST_MUL = 89226354u;   // 0x05517C72
constant uint INST_ADD = 64248484u;   // 0x03D45AA4
constant uint MCG_MUL = 0xCBAC1FEDu;
constant uint MUL1_MUL = 0x83DCD12Du;
constant uint HALVES_MASK = 0x8FFF8FFFu;
constant uint HALVES_XOR = 0x3B603B60u;
constant float MUL1_SCALE = 0.00676727294921875f; // fp16 0x1EEE
constant float MUL1_BIAS = -10.3828125f;          // fp16 0xC931
// What an id no codebook has decodes to: a quiet NaN, which no codebook value is (every one is a
// finite fp16). The host sends only the ids of codebooks it knows (`Codebook::id()`) and refuses a
// dispatch whose first value is NaN, as the CPU decoders refuse an unknown id.
constant uint UNKNOWN_CODEBOOK = 0x7FC00000u;

// The value of a 16-bit trellis state, rounded once to fp16 (RNE), returned as f32 (exact).
static inline float codebook_value(uint x, uint codebook)
{
    if (codebook == 2u) {
        // MUL1: byte sum of the hash; (1024 + b) * scale is exact in f32, so adding the bias in
        // f32 and converting once to half is the single rounding of the reference FMA.
        uint y = x * MUL1_MUL;
        uint b = (y & 0xFFu) + ((y >> 8) & 0xFFu) + ((y >> 16) & 0xFFu) + (y >> 24);
        float v = float(1024u + b) * MUL1_SCALE + MUL1_BIAS;
        return float(half(v));
    }
    if (codebook > 1u) {
        return as_type<float>(UNKNOWN_CODEBOOK);
    }
    // 3INST / MCG: two fp16 halves with exponents forced into 12..15, summed exactly in f32,
    // then one round-to-nearest-even conversion to half.
    uint y = codebook == 0u ? x * INST_MUL + INST_ADD : x * MCG_MUL;
    y = (y & HALVES_MASK) ^ HALVES_XOR;
    half lo = as_type<half>(ushort(y & 0xFFFFu));
    half hi = as_type<half>(ushort(y >> 16));
    float sum = float(lo) + float(hi);
    return float(half(sum));
}

kernel void trellis_decode(device const uint* codes [[buffer(0)]],
                           device float* out [[buffer(1)]],
                           constant DecodeParams& p [[buffer(2)]],
                           uint gid [[thread_position_in_grid]])
{
    const uint tile = gid >> 5;
    if (tile >= p.tiles) {
        return;
    }
    const uint lane = gid & 31u;
    const uint k = p.k;
    const uint words = 8u * k;       // u32 stream words per tile
    const uint total = 256u * k;     // stream bits per tile
    device const uint* u = codes + p.word_offset + tile * words;
    device float* o = out + tile * 256u + lane * 8u;

    for (uint j = 0; j < 8u; ++j) {
        const uint t = lane * 8u + j;
        // The state of position t is the 16-bit window ending at stream bit (t+1)K, circular
        // within the tile; stream bit 32m is bit 31 of word m (format §4.2).
        uint start = (t + 1u) * k + total - 16u;
        if (start >= total) {
            start -= total;
        }
        const uint a = start >> 5;
        const uint off = start & 31u;
        const uint next = a + 1u == words ? 0u : a + 1u;
        const uint hi = u[a];
        const uint lo = u[next];
        const uint window = off == 0u ? hi : (hi << off) | (lo >> (32u - off));
        o[j] = codebook_value(window >> 16, p.codebook);
    }
}
