// Quantize index keys to MXFP4 and store them into the paged FP4 cache (ops/quantize.py,
// docs/format.md). Bit-exact with format.quantize_index_k on finite input and with the
// Triton kernel's documented NaN/Inf handling; built by NVRTC (ops/nvrtc.py), any NVIDIA GPU.
//
// 8 lanes per token, 16 elements per lane (two 16-byte loads of bf16/fp16, four of fp32),
// two lanes per 32-element group. Method (exact; replayed in numpy by tests/test_quantize_op.py):
// * a = bits(|x|); the group amax is an integer max (for non-negative floats the bit order
//   is the value order, subnormals included). NaN -> 0, +-Inf -> 1.5 * 2**127, fixed up only
//   on lanes whose max has an all-ones exponent (rare: off the hot path).
// * UE8M0 code = biased_exp(amax) - 2 + (mantissa(amax) > mantissa(1.5)), clamped to [1, 254]:
//   the smallest scale 2**e, e = code - 127, with amax <= 6 * 2**e.
// * Element: y = |x| / 2**e lies in [0, 6]. Its E2M1 binade k = clamp(exp(y), 0, 2) =
//   clamp(biased_exp(x) - code, 0, 2) has step 2**(k - 1); z = y * 2**(1 - k) =
//   |x| * 2**(128 - k - code) is exact (the multiplier's exponent field 255 - code - k lies in
//   [1, 254] for finite x; a subnormal z is below 0.5 and rounds to 0 either way), and
//   bits(z + 2**23) & 7 is z rounded to the nearest integer, ties to even -- exactly E2M1's
//   round-to-nearest-even. The E2M1 code is that integer + 2k.
// * Sign: negative and |x| > 0.25 * 2**e, i.e. not rounded to 0 (-0 is stored as +0).
//
// Compile-time: K_KIND (0 bf16, 1 fp16, 2 fp32), SLOT64 (int64 slots), PAGE_SIZE (tokens per
// page: a constant, so the slot -> (page, row) split is a shift, not a 64-bit division).

typedef unsigned int u32;
typedef long long i64;

#ifndef TOKENS_PER_GROUP
#define TOKENS_PER_GROUP 2  // tokens per 8 lanes, all loaded before any is quantized
#endif
#define LANES 8  // per token
#define TOKENS_PER_BLOCK (32 * TOKENS_PER_GROUP)

__device__ __forceinline__ u32 to_bits(unsigned short h) {
#if K_KIND == 0
    return static_cast<u32>(h) << 16;  // bf16 -> fp32 bits: exact
#else
    float f;
    asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(h));  // exact (fp16 subnormals included)
    return __float_as_uint(f);
#endif
}

// One token: this lane's 16 elements' fp32 bits -> its 8 payload bytes, and the token's four
// UE8M0 codes (lane 0 of the token's 8 stores them).
__device__ __forceinline__ void quantize_store(const u32 (&bits)[16], i64 slot, bool valid, int lane8,
                                               unsigned char* __restrict__ cache) {
    u32 a[16];
    u32 amax = 0, negative = 0;  // bit j: element j's sign
#pragma unroll
    for (int j = 0; j < 16; ++j) {
        a[j] = bits[j] & 0x7FFFFFFFu;
        negative |= (bits[j] >> 31) << j;
        amax = max(amax, a[j]);
    }
    if (amax >= 0x7F800000u) {  // NaN -> +0, +-Inf -> +-1.5 * 2**127 (rare)
        amax = 0;
#pragma unroll
        for (int j = 0; j < 16; ++j) {
            a[j] = a[j] > 0x7F800000u ? 0u : (a[j] == 0x7F800000u ? 0x7F400000u : a[j]);
            amax = max(amax, a[j]);
        }
    }
    amax = max(amax, __shfl_xor_sync(0xffffffffu, amax, 1));
    int code = static_cast<int>(amax >> 23) - 2 + ((amax & 0x7FFFFFu) > 0x400000u ? 1 : 0);
    code = min(max(code, 1), 254);
    const float t0 = 0.25f * __uint_as_float(static_cast<u32>(code) << 23);  // exact

    u32 packed[2] = {0u, 0u};
#pragma unroll
    for (int j = 0; j < 16; ++j) {
        const int kb = min(max(static_cast<int>(a[j] >> 23) - code, 0), 2);
        const float mult = __uint_as_float(static_cast<u32>(255 - code - kb) << 23);
        const float zb = __fmaf_rn(__uint_as_float(a[j]), mult, 8388608.0f);  // exact product, one rounding
        u32 q = (__float_as_uint(zb) & 7u) + 2u * kb;
        q += ((negative >> j) & 1u) && __uint_as_float(a[j]) > t0 ? 8u : 0u;  // sign (NaN: a = 0)
        packed[j >> 3] += q << (4 * (j & 7));
    }
    // Codes of the token's four groups, from the first lane of each group.
    const int base = threadIdx.x & 24;
    const u32 c0 = __shfl_sync(0xffffffffu, code, base + 0), c1 = __shfl_sync(0xffffffffu, code, base + 2);
    const u32 c2 = __shfl_sync(0xffffffffu, code, base + 4), c3 = __shfl_sync(0xffffffffu, code, base + 6);
    if (valid) {
        const i64 page = slot / PAGE_SIZE, row = slot % PAGE_SIZE;
        unsigned char* page_base = cache + page * (static_cast<i64>(PAGE_SIZE) * 68);
        // Payload plane row: 64 bytes, 8 per lane (elements 16 lane .. 16 lane + 15, low nibble first).
        reinterpret_cast<uint2*>(page_base + row * 64)[lane8] = make_uint2(packed[0], packed[1]);
        // Scale plane at pool.scale_row(row) = row (the NVIDIA layout; ops/quantize.py checks it).
        if (lane8 == 0)
            *reinterpret_cast<u32*>(page_base + static_cast<i64>(PAGE_SIZE) * 64 + row * 4) =
                c0 | (c1 << 8) | (c2 << 16) | (c3 << 24);
    }
}

// Block: 256 threads = 32 groups of 8 lanes; group g stores tokens
// block * TOKENS_PER_BLOCK + g + 32 u for u < TOKENS_PER_GROUP, loading all of them first.
extern "C" __global__ void __launch_bounds__(256) store_index_k(
    const unsigned char* __restrict__ k, unsigned char* __restrict__ cache, const void* __restrict__ slots_ptr,
    long long n_tokens, long long stride_k_bytes, long long num_slots) {
    const int lane8 = threadIdx.x & (LANES - 1);
    i64 slot[TOKENS_PER_GROUP];
    bool valid[TOKENS_PER_GROUP];
    uint4 raw[TOKENS_PER_GROUP][K_KIND == 2 ? 4 : 2];
#pragma unroll
    for (int u = 0; u < TOKENS_PER_GROUP; ++u) {
        const i64 t = static_cast<i64>(blockIdx.x) * TOKENS_PER_BLOCK + (threadIdx.x >> 3) + 32 * u;
        const bool in_batch = t < n_tokens;
#if SLOT64
        slot[u] = in_batch ? __ldg(static_cast<const i64*>(slots_ptr) + t) : -1;
#else
        slot[u] = in_batch ? static_cast<i64>(__ldg(static_cast<const int*>(slots_ptr) + t)) : -1;
#endif
        // Slots < 0 are skipped; so are slots past the cache: nothing is written out of bounds.
        valid[u] = slot[u] >= 0 && slot[u] < num_slots;
        const uint4* row = reinterpret_cast<const uint4*>(k + t * stride_k_bytes);
#pragma unroll
        for (int v = 0; v < (K_KIND == 2 ? 4 : 2); ++v)
            raw[u][v] = valid[u] ? __ldg(row + (K_KIND == 2 ? 4 : 2) * lane8 + v) : make_uint4(0, 0, 0, 0);
    }
#pragma unroll
    for (int u = 0; u < TOKENS_PER_GROUP; ++u) {
        u32 bits[16];
#if K_KIND == 2
#pragma unroll
        for (int v = 0; v < 4; ++v) {
            bits[4 * v] = raw[u][v].x; bits[4 * v + 1] = raw[u][v].y;
            bits[4 * v + 2] = raw[u][v].z; bits[4 * v + 3] = raw[u][v].w;
        }
#else
#pragma unroll
        for (int v = 0; v < 2; ++v) {
            const u32 w[4] = {raw[u][v].x, raw[u][v].y, raw[u][v].z, raw[u][v].w};
#pragma unroll
            for (int j = 0; j < 4; ++j) {
                bits[8 * v + 2 * j] = to_bits(static_cast<unsigned short>(w[j] & 0xFFFFu));
                bits[8 * v + 2 * j + 1] = to_bits(static_cast<unsigned short>(w[j] >> 16));
            }
        }
#endif
        quantize_store(bits, slot[u], valid[u], lane8, cache);
    }
}
