// Runs ggml's reference encoders (no importance matrix, or with one: WEIGHTED below) over a row read from stdin, so
// tests/it/kquants_ref.rs can compare the Rust encoders byte for byte: the K-quants
// (quantize_row_q{2,3,4,5,6}_K_ref, 256 values a block), the legacy types
// (quantize_row_q{4,5}_{0,1}_ref, 32 values a block), Q8_0 (quantize_row_q8_0_ref) and the IQ4
// types as llama-quantize encodes them without an importance matrix (quantize_iq4_nl, whose 7
// trial scales the _ref function leaves out, and quantize_row_iq4_xs_ref).
//
// One process serves any number of requests, one after another, until stdin ends (one spawn per test:
// forking from a multi-threaded test binary under qemu-user can hang, so the tests fork rarely).
//
// request:  u32 type (2 = Q4_0, 3 = Q4_1, 6 = Q5_0, 7 = Q5_1, 8 = Q8_0, 10 = Q2_K, 11 = Q3_K,
//         12 = Q4_K, 13 = Q5_K, 14 = Q6_K, 20 = IQ4_NL, 23 = IQ4_XS),
//         u32 n (a multiple of the type's block length), then n f32; all little-endian.
// response: u64 length of what follows, then the blocks as ggml lays them out in memory.
//
// With 512 added to the type, the values are followed by u32 n_per_row and n_per_row f32
// importance weights, and the rows are encoded as llama-quantize encodes them with an importance
// matrix (quantize_<type>(..., quant_weights)).
// The IQ2/IQ3 types (16 = IQ2_XXS, 17 = IQ2_XS, 18 = IQ3_XXS, 21 = IQ3_S, 22 = IQ2_S) always go
// through llama-quantize's entry points quantize_iq*(src, dst, nrow, n_per_row, imatrix), the
// imatrix NULL without 512 (IQ2_XXS and IQ2_XS need one). With 1024 added, the run is timed too:
// the response starts with the u64 nanoseconds of encoding (after the grids' one-time set-up).
//
// With 256 added to the type, the request holds the blocks of n values instead of the f32 values and
// the response the n f32 that ggml's dequantize_row_<type> makes of them (little-endian).
//
// Built together with ggml/src/ggml-quants.c alone (from the llama.cpp directory):
//   cc -O2 -ffp-contract=off -std=c11 -DNDEBUG -Iggml/include -Iggml/src
//      tests/c/ggml_quants_ref.c ggml/src/ggml-quants.c -lm -o ggml_quants_ref
// -DNDEBUG as in ggml's release builds: nearest_int() asserts |x| <= 4194303, which rows of
// subnormals (and some huge ones) break in the Q4_K/Q5_K paths; release builds carry on with the
// bit pattern arithmetic, and the Rust encoders reproduce that.
// The legacy encoders convert floats to int8_t/uint8_t, undefined in C where the value does not
// fit (1/d overflowing for blocks of tiny subnormals, max - min overflowing, non-finite input);
// x86-64 builds give the low byte of cvttss2si/cvttps2dq, which src/quant/legacy.rs reproduces.
// The few ggml symbols that file references outside the reference encoders are stubbed below.

#define _POSIX_C_SOURCE 199309L

#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "ggml-quants.h"

// Stubs: ggml-quants.c links against these, but the reference encoders never call them.
void ggml_abort(const char * file, int line, const char * fmt, ...) {
    va_list args;
    fprintf(stderr, "ggml_abort at %s:%d: ", file, line);
    va_start(args, fmt);
    vfprintf(stderr, fmt, args);
    va_end(args);
    fputc('\n', stderr);
    abort();
}

static void unexpected(const char * what) {
    fprintf(stderr, "ggml_quants_ref: unexpected call to %s\n", what);
    abort();
}

size_t ggml_type_size(enum ggml_type type) {
    (void) type;
    unexpected("ggml_type_size");
    return 0;
}

static int block_shape(uint32_t type, size_t * block_size, uint32_t * block_len) {
    switch (type) {
        case GGML_TYPE_Q4_0: *block_size = sizeof(block_q4_0); *block_len = QK4_0; break;
        case GGML_TYPE_Q4_1: *block_size = sizeof(block_q4_1); *block_len = QK4_1; break;
        case GGML_TYPE_Q5_0: *block_size = sizeof(block_q5_0); *block_len = QK5_0; break;
        case GGML_TYPE_Q5_1: *block_size = sizeof(block_q5_1); *block_len = QK5_1; break;
        case GGML_TYPE_Q8_0: *block_size = sizeof(block_q8_0); *block_len = QK8_0; break;
        case GGML_TYPE_Q2_K: *block_size = sizeof(block_q2_K); *block_len = QK_K; break;
        case GGML_TYPE_Q3_K: *block_size = sizeof(block_q3_K); *block_len = QK_K; break;
        case GGML_TYPE_Q4_K: *block_size = sizeof(block_q4_K); *block_len = QK_K; break;
        case GGML_TYPE_Q5_K: *block_size = sizeof(block_q5_K); *block_len = QK_K; break;
        case GGML_TYPE_Q6_K: *block_size = sizeof(block_q6_K); *block_len = QK_K; break;
        case GGML_TYPE_IQ4_NL: *block_size = sizeof(block_iq4_nl); *block_len = QK4_NL; break;
        case GGML_TYPE_IQ4_XS: *block_size = sizeof(block_iq4_xs); *block_len = QK_K; break;
        case GGML_TYPE_IQ2_XXS: *block_size = sizeof(block_iq2_xxs); *block_len = QK_K; break;
        case GGML_TYPE_IQ2_XS: *block_size = sizeof(block_iq2_xs); *block_len = QK_K; break;
        case GGML_TYPE_IQ2_S: *block_size = sizeof(block_iq2_s); *block_len = QK_K; break;
        case GGML_TYPE_IQ3_XXS: *block_size = sizeof(block_iq3_xxs); *block_len = QK_K; break;
        case GGML_TYPE_IQ3_S: *block_size = sizeof(block_iq3_s); *block_len = QK_K; break;
        default: return 0;
    }
    return 1;
}

// The weighted encoders (quantize_q4_0 and friends with quant_weights) step rows by it.
size_t ggml_row_size(enum ggml_type type, int64_t ne) {
    size_t block_size;
    uint32_t block_len;
    if (!block_shape((uint32_t) type, &block_size, &block_len)) {
        unexpected("ggml_row_size");
    }
    return block_size * (size_t) (ne / block_len);
}

const char * ggml_type_name(enum ggml_type type) {
    (void) type;
    unexpected("ggml_type_name");
    return "";
}

static int read_exact(void * buf, size_t len) {
    return fread(buf, 1, len, stdin) == len;
}

static uint32_t le_u32(const unsigned char b[4]) {
    return (uint32_t) b[0] | (uint32_t) b[1] << 8 | (uint32_t) b[2] << 16 | (uint32_t) b[3] << 24;
}

static void put_le_u32(unsigned char b[4], uint32_t v) {
    b[0] = (unsigned char) v;
    b[1] = (unsigned char) (v >> 8);
    b[2] = (unsigned char) (v >> 16);
    b[3] = (unsigned char) (v >> 24);
}

static int write_all(const void * buf, size_t len) {
    return fwrite(buf, 1, len, stdout) == len && fflush(stdout) == 0;
}

#define DECODE 256u
#define WEIGHTED 512u
#define TIMED 1024u

static int write_length(uint64_t len) {
    unsigned char b[8];
    put_le_u32(b, (uint32_t) len);
    put_le_u32(b + 4, (uint32_t) (len >> 32));
    return fwrite(b, 1, sizeof b, stdout) == sizeof b;
}

// Serves the request whose header was read; 0 on success, 2 (after saying why) otherwise.
static int serve(const unsigned char header[8]) {
    const uint32_t mode = le_u32(header);
    const uint32_t n = le_u32(header + 4);
    const uint32_t type = mode & ~(DECODE | WEIGHTED | TIMED);
    const int decode = (mode & DECODE) != 0;
    const int weighted = (mode & WEIGHTED) != 0;
    const int timed = (mode & TIMED) != 0;
    size_t block_size;
    uint32_t block_len;
    if (!block_shape(type, &block_size, &block_len)) {
        fprintf(stderr, "ggml_quants_ref: unsupported type %u\n", type);
        return 2;
    }
    if (n % block_len != 0) {
        fprintf(stderr, "ggml_quants_ref: %u values is not a multiple of %u\n", n, block_len);
        return 2;
    }

    const size_t n_blocks = n / block_len;
    float * values = malloc((size_t) n * sizeof(float) + 1);
    float * importance = malloc((size_t) n * sizeof(float) + 1);
    unsigned char * raw = malloc((size_t) n * 4 + 1);
    void * blocks = malloc(n_blocks * block_size + 1);
    if (!values || !importance || !raw || !blocks) {
        fprintf(stderr, "ggml_quants_ref: out of memory\n");
        return 2;
    }

    if (decode) {
        if (!read_exact(blocks, n_blocks * block_size)) {
            fprintf(stderr, "ggml_quants_ref: short input (%zu blocks expected)\n", n_blocks);
            return 2;
        }
        switch (type) {
            case GGML_TYPE_Q4_0: dequantize_row_q4_0(blocks, values, n); break;
            case GGML_TYPE_Q4_1: dequantize_row_q4_1(blocks, values, n); break;
            case GGML_TYPE_Q5_0: dequantize_row_q5_0(blocks, values, n); break;
            case GGML_TYPE_Q5_1: dequantize_row_q5_1(blocks, values, n); break;
            case GGML_TYPE_Q8_0: dequantize_row_q8_0(blocks, values, n); break;
            case GGML_TYPE_Q2_K: dequantize_row_q2_K(blocks, values, n); break;
            case GGML_TYPE_Q3_K: dequantize_row_q3_K(blocks, values, n); break;
            case GGML_TYPE_IQ4_NL: dequantize_row_iq4_nl(blocks, values, n); break;
            case GGML_TYPE_IQ4_XS: dequantize_row_iq4_xs(blocks, values, n); break;
            case GGML_TYPE_IQ2_XXS: dequantize_row_iq2_xxs(blocks, values, n); break;
            case GGML_TYPE_IQ2_XS: dequantize_row_iq2_xs(blocks, values, n); break;
            case GGML_TYPE_IQ2_S: dequantize_row_iq2_s(blocks, values, n); break;
            case GGML_TYPE_IQ3_XXS: dequantize_row_iq3_xxs(blocks, values, n); break;
            case GGML_TYPE_IQ3_S: dequantize_row_iq3_s(blocks, values, n); break;
            case GGML_TYPE_Q4_K: dequantize_row_q4_K(blocks, values, n); break;
            case GGML_TYPE_Q5_K: dequantize_row_q5_K(blocks, values, n); break;
            default:             dequantize_row_q6_K(blocks, values, n); break;
        }
        for (size_t i = 0; i < n; ++i) {
            uint32_t bits;
            memcpy(&bits, &values[i], sizeof bits);
            put_le_u32(raw + 4 * i, bits);
        }
        if (!write_length((uint64_t) n * 4) || !write_all(raw, (size_t) n * 4)) {
            fprintf(stderr, "ggml_quants_ref: write failed\n");
            return 2;
        }
    } else {
        if (!read_exact(raw, (size_t) n * 4)) {
            fprintf(stderr, "ggml_quants_ref: short input (%u values expected)\n", n);
            return 2;
        }
        for (size_t i = 0; i < n; ++i) {
            const uint32_t bits = le_u32(raw + 4 * i);
            memcpy(&values[i], &bits, sizeof bits);
        }
        // One row of n values, unless the weights say how long a row is.
        uint32_t per_row = n;
        if (weighted) {
            unsigned char word[4];
            if (!read_exact(word, 4)) {
                fprintf(stderr, "ggml_quants_ref: no row length\n");
                return 2;
            }
            per_row = le_u32(word);
            if (per_row == 0 || per_row % block_len != 0 || n % per_row != 0) {
                fprintf(stderr, "ggml_quants_ref: bad row length %u\n", per_row);
                return 2;
            }
            if (!read_exact(raw, (size_t) per_row * 4)) {
                fprintf(stderr, "ggml_quants_ref: short weights\n");
                return 2;
            }
            for (size_t i = 0; i < per_row; ++i) {
                const uint32_t bits = le_u32(raw + 4 * i);
                memcpy(&importance[i], &bits, sizeof bits);
            }
        }
        const int64_t nrow = n / per_row;
        const float * imatrix = weighted ? importance : NULL;
        switch (type) {
            case GGML_TYPE_IQ2_XXS: case GGML_TYPE_IQ2_XS: case GGML_TYPE_IQ2_S: iq2xs_init_impl(type); break;
            case GGML_TYPE_IQ3_XXS: iq3xs_init_impl(256); break;
            case GGML_TYPE_IQ3_S: iq3xs_init_impl(512); break;
            default: break;
        }
        struct timespec t0, t1;
        clock_gettime(CLOCK_MONOTONIC, &t0);
        switch (type) {
            case GGML_TYPE_IQ2_XXS: quantize_iq2_xxs(values, blocks, nrow, per_row, imatrix); break;
            case GGML_TYPE_IQ2_XS: quantize_iq2_xs(values, blocks, nrow, per_row, imatrix); break;
            case GGML_TYPE_IQ2_S: quantize_iq2_s(values, blocks, nrow, per_row, imatrix); break;
            case GGML_TYPE_IQ3_XXS: quantize_iq3_xxs(values, blocks, nrow, per_row, imatrix); break;
            case GGML_TYPE_IQ3_S: quantize_iq3_s(values, blocks, nrow, per_row, imatrix); break;
            default: break;
        }
        if (weighted) switch (type) {
            case GGML_TYPE_Q4_0: quantize_q4_0(values, blocks, nrow, per_row, imatrix); break;
            case GGML_TYPE_Q4_1: quantize_q4_1(values, blocks, nrow, per_row, imatrix); break;
            case GGML_TYPE_Q5_0: quantize_q5_0(values, blocks, nrow, per_row, imatrix); break;
            case GGML_TYPE_Q5_1: quantize_q5_1(values, blocks, nrow, per_row, imatrix); break;
            case GGML_TYPE_Q8_0: quantize_q8_0(values, blocks, nrow, per_row, imatrix); break;
            case GGML_TYPE_Q2_K: quantize_q2_K(values, blocks, nrow, per_row, imatrix); break;
            case GGML_TYPE_Q3_K: quantize_q3_K(values, blocks, nrow, per_row, imatrix); break;
            case GGML_TYPE_Q4_K: quantize_q4_K(values, blocks, nrow, per_row, imatrix); break;
            case GGML_TYPE_Q5_K: quantize_q5_K(values, blocks, nrow, per_row, imatrix); break;
            case GGML_TYPE_Q6_K: quantize_q6_K(values, blocks, nrow, per_row, imatrix); break;
            case GGML_TYPE_IQ4_NL: quantize_iq4_nl(values, blocks, nrow, per_row, imatrix); break;
            case GGML_TYPE_IQ4_XS: quantize_iq4_xs(values, blocks, nrow, per_row, imatrix); break;
            default: break;
        } else switch (type) {
            case GGML_TYPE_Q4_0: quantize_row_q4_0_ref(values, blocks, n); break;
            case GGML_TYPE_Q4_1: quantize_row_q4_1_ref(values, blocks, n); break;
            case GGML_TYPE_Q5_0: quantize_row_q5_0_ref(values, blocks, n); break;
            case GGML_TYPE_Q5_1: quantize_row_q5_1_ref(values, blocks, n); break;
            case GGML_TYPE_Q8_0: quantize_row_q8_0_ref(values, blocks, n); break;
            case GGML_TYPE_Q2_K: quantize_row_q2_K_ref(values, blocks, n); break;
            case GGML_TYPE_Q3_K: quantize_row_q3_K_ref(values, blocks, n); break;
            case GGML_TYPE_IQ4_NL: quantize_iq4_nl(values, blocks, 1, n, NULL); break;
            case GGML_TYPE_IQ4_XS: quantize_row_iq4_xs_ref(values, blocks, n); break;
            case GGML_TYPE_Q4_K: quantize_row_q4_K_ref(values, blocks, n); break;
            case GGML_TYPE_Q5_K: quantize_row_q5_K_ref(values, blocks, n); break;
            case GGML_TYPE_Q6_K: quantize_row_q6_K_ref(values, blocks, n); break;
            default: break;
        }
        clock_gettime(CLOCK_MONOTONIC, &t1);
        const uint64_t ns = (uint64_t) (t1.tv_sec - t0.tv_sec) * 1000000000u + (uint64_t) t1.tv_nsec - (uint64_t) t0.tv_nsec;
        const size_t n_bytes = n_blocks * block_size;
        if (!write_length(n_bytes + (timed ? 8 : 0)) || (timed && !write_length(ns)) || !write_all(blocks, n_bytes)) {
            fprintf(stderr, "ggml_quants_ref: write failed\n");
            return 2;
        }
    }
    free(blocks);
    free(raw);
    free(importance);
    free(values);
    return 0;
}

int main(void) {
    unsigned char header[8];
    for (;;) {
        const size_t got = fread(header, 1, sizeof header, stdin);
        if (got == 0 && feof(stdin)) {
            return 0;
        }
        if (got != sizeof header) {
            fprintf(stderr, "ggml_quants_ref: short header\n");
            return 2;
        }
        const int status = serve(header);
        if (status != 0) {
            return status;
        }
    }
}
