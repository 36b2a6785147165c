// Quantize index keys to MXFP4 and store them into the paged FP4 cache (ops/quantize.py,
// DESIGN section 3). Bit-exact with format.quantize_index_k on finite input and with the
// Triton kernel's documented NaN/Inf handling; built by NVRTC (ops/nvrtc.py), any NVIDIA GPU.
//
// 16 lanes per token, 8 elements per lane (one 16-byte load of bf16/fp16, two of fp32),
// four lanes per 32-element group. Method, as the Triton kernel's:
// * a = bits(|x|) (NaN -> 0, +-Inf -> 1.5 * 2**127); the group amax is an integer max
//   (for non-negative floats the bit order is the value order, subnormals included).
// * UE8M0 code = biased_exp(amax) - 2 + (mantissa(amax) > mantissa(1.5)), clamped to
//   [1, 254]: the smallest scale 2**e with amax <= 6 * 2**e.
// * The E2M1 code counts the midpoints 0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5 (times 2**e)
//   below |x|; a value on a midpoint goes to the even mantissa (>= for 0.75, 1.75, 3.5).
//   The scaled midpoints are fp32 products of a 3-significant-bit constant and a power
//   of two: exact (subnormal or normal), or +Inf where above every finite |x|. Compared
//   as floats without flush-to-zero, which orders like the bit patterns.
//
// Compile-time: K_KIND (0 bf16, 1 fp16, 2 fp32), SLOT64 (int64 slots), PAGE_SIZE (tokens per
// page: a constant, so the slot -> (page, row) split is a shift, not a 64-bit division).

typedef unsigned int u32;
typedef long long i64;

#define TOKENS_PER_BLOCK 16  // 256 threads

__device__ __forceinline__ u32 to_bits(unsigned short h) {
#if K_KIND == 0
    return static_cast<u32>(h) << 16;  // bf16 -> fp32 bits: exact
#else
    float f;
    asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(h));  // exact (fp16 subnormals included)
    return __float_as_uint(f);
#endif
}

extern "C" __global__ void __launch_bounds__(256) store_index_k(
    const unsigned char* __restrict__ k, unsigned char* __restrict__ cache, const void* __restrict__ slots_ptr,
    long long n_tokens, long long stride_k_bytes, long long num_slots) {
    const int lane16 = threadIdx.x & 15;
    const i64 t = static_cast<i64>(blockIdx.x) * TOKENS_PER_BLOCK + (threadIdx.x >> 4);
    const bool in_batch = t < n_tokens;
#if SLOT64
    const i64 slot = in_batch ? __ldg(static_cast<const i64*>(slots_ptr) + t) : -1;
#else
    const i64 slot = in_batch ? static_cast<i64>(__ldg(static_cast<const int*>(slots_ptr) + t)) : -1;
#endif
    // Slots < 0 are skipped; so are slots past the cache: nothing is written out of bounds.
    const bool valid = slot >= 0 && slot < num_slots;

    u32 bits[8];
    if (valid) {
        const unsigned char* row = k + t * stride_k_bytes;
#if K_KIND == 2
        const uint4 v0 = __ldg(reinterpret_cast<const uint4*>(row) + 2 * lane16);
        const uint4 v1 = __ldg(reinterpret_cast<const uint4*>(row) + 2 * lane16 + 1);
        bits[0] = v0.x; bits[1] = v0.y; bits[2] = v0.z; bits[3] = v0.w;
        bits[4] = v1.x; bits[5] = v1.y; bits[6] = v1.z; bits[7] = v1.w;
#else
        const uint4 v = __ldg(reinterpret_cast<const uint4*>(row) + lane16);
        const u32 w[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
        for (int j = 0; j < 4; ++j) {
            bits[2 * j] = to_bits(static_cast<unsigned short>(w[j] & 0xFFFFu));
            bits[2 * j + 1] = to_bits(static_cast<unsigned short>(w[j] >> 16));
        }
#endif
    } else {
#pragma unroll
        for (int j = 0; j < 8; ++j) bits[j] = 0;
    }

    u32 a[8];
    u32 amax = 0;
#pragma unroll
    for (int j = 0; j < 8; ++j) {
        u32 m = bits[j] & 0x7FFFFFFFu;
        m = m > 0x7F800000u ? 0u : m;                 // NaN -> +0
        m = m == 0x7F800000u ? 0x7F400000u : m;       // +-Inf -> +-1.5 * 2**127
        a[j] = m;
        amax = max(amax, m);
    }
    amax = max(amax, __shfl_xor_sync(0xffffffffu, amax, 1));
    amax = max(amax, __shfl_xor_sync(0xffffffffu, amax, 2));
    int code = static_cast<int>(amax >> 23) - 2 + ((amax & 0x7FFFFFu) > 0x400000u ? 1 : 0);
    code = min(max(code, 1), 254);
    const float scale = __uint_as_float(static_cast<u32>(code) << 23);  // 2**(code - 127), normal
    const float t0 = 0.25f * scale, t1 = 0.75f * scale, t2 = 1.25f * scale, t3 = 1.75f * scale;
    const float t4 = 2.5f * scale, t5 = 3.5f * scale, t6 = 5.0f * scale;

    u32 packed = 0;
#pragma unroll
    for (int j = 0; j < 8; ++j) {
        const float x = __uint_as_float(a[j]);
        u32 q = (x > t0) + (x >= t1) + (x > t2) + (x >= t3) + (x > t4) + (x >= t5) + (x > t6);
        q |= (static_cast<int>(bits[j]) < 0 && q > 0) ? 8u : 0u;  // sign kept; -0 stored as +0
        packed |= q << (4 * j);
    }
    // Codes of the token's four groups, from the first lane of each group.
    const int base = threadIdx.x & 16;
    const u32 c0 = __shfl_sync(0xffffffffu, code, base + 0), c1 = __shfl_sync(0xffffffffu, code, base + 4);
    const u32 c2 = __shfl_sync(0xffffffffu, code, base + 8), c3 = __shfl_sync(0xffffffffu, code, base + 12);
    if (valid) {
        const i64 page = slot / PAGE_SIZE, row = slot % PAGE_SIZE;
        unsigned char* page_base = cache + page * (static_cast<i64>(PAGE_SIZE) * 68);
        // Payload plane row: 64 bytes, 4 per lane (elements 8 lane .. 8 lane + 7, low nibble first).
        reinterpret_cast<u32*>(page_base + row * 64)[lane16] = packed;
        // Scale plane at pool.scale_row(row) = row (the NVIDIA layout; ops/quantize.py checks it).
        if (lane16 == 0)
            *reinterpret_cast<u32*>(page_base + static_cast<i64>(PAGE_SIZE) * 64 + row * 4) =
                c0 | (c1 << 8) | (c2 << 16) | (c3 << 24);
    }
}
