// Lets a Metal Shading Language kernel compile as C++20 so tests can run it on the CPU.
//
// Included (with -include) before a .metal file. It maps the few MSL features the kernels use onto
// plain C++:
//   * address-space qualifiers: `device`, `thread`, `threadgroup` vanish, `constant` becomes const;
//   * `kernel` becomes `extern "C"`, so each kernel is a C function the test calls once per thread
//     (its `[[thread_position_in_grid]]` argument is the thread index);
//   * `[[buffer(n)]]`-style attributes are unknown C++ attributes, ignored (-Wno-attributes);
//   * `half` is `_Float16` (or `__fp16` on AArch64, see below): float -> half conversion rounds to
//     nearest even, as in Metal;
//   * `as_type<T>(x)` is `__builtin_bit_cast`;
//   * threadgroup barriers are no-ops (threads run one after another).
// Nothing here may change a kernel's arithmetic: the point is to test the kernel as written.

#ifndef ESCHA_METAL_SHIM_H
#define ESCHA_METAL_SHIM_H

#include <cstdint>

typedef unsigned char uchar;
typedef unsigned short ushort;
typedef unsigned int uint;
typedef unsigned long ulong;

#if defined(__aarch64__) && !defined(__clang__) && defined(__GNUC__) && __GNUC__ < 13
// g++ before 13 has no _Float16 in C++ on AArch64. Its __fp16 (ACLE, IEEE format) converts to and
// from float with the same round-to-nearest-even; it is a storage type (arithmetic promotes to
// float), which is all the kernels need: they widen halves to float before any arithmetic.
typedef __fp16 half;
#elif defined(__FLT16_MAX__)
typedef _Float16 half;
#else
#error "metal_shim.h needs a C++ compiler with _Float16 (g++ >= 12 on x86_64, any g++ on aarch64, clang >= 15)"
#endif

static_assert(sizeof(half) == 2, "half is 16 bits");
static_assert(sizeof(uint) == 4 && sizeof(ushort) == 2, "Metal integer widths");

template <typename T, typename U>
static inline T as_type(U x)
{
    static_assert(sizeof(T) == sizeof(U), "as_type needs equal sizes");
    return __builtin_bit_cast(T, x);
}

namespace metal {
enum class mem_flags { mem_none = 0, mem_device = 1, mem_threadgroup = 2, mem_texture = 4 };
}
using metal::mem_flags;
static inline void threadgroup_barrier(metal::mem_flags) {}
static inline void simdgroup_barrier(metal::mem_flags) {}

#define kernel extern "C"
#define device
#define thread
#define threadgroup
#define constant const

#endif
