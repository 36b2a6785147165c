// Paged FP4 scorer for Hopper (sm_90a): wgmma with the decoded index keys as
// the register A operand and the index queries as the shared-memory B operand.
//
// Compiled at first use by NVRTC (ops/sm90.py), which prepends the compile-time
// configuration (#define NEXT_N, HEADS, STAGES, OUT_KIND, LENS_2D, MIN_CTAS) and
// the wgmma wrapper for N = HEADS. Semantics are those of ops.paged_logits
// (DESIGN section 5); the numerics are the "folded" form of that module:
//
// * Each key's group scales are folded into the e4m3 bytes relative to its
//   largest group scale s_max: for a group with A = s_g - s_max + 12 >= 1 the
//   E2M1 magnitude x becomes LUT_A[x] = e4m3(E2M1(x) * 2**(s_g - s_max + 6))
//   (LUT_A[0] = 0, LUT_A[1] = A << 3, LUT_A[x >= 2] = (x << 2) + (A << 3), all
//   exact); groups with A < 1 (more than 2**11 below the largest) are flushed
//   to zero. The LUT's eight bytes sit in two registers and one PRMT turns four
//   nibbles into four e4m3 bytes; a second PRMT places the four signs.
// * One K = 128 FP8 wgmma per 64-key page and next_n row (four k32 steps) with
//   fp32 accumulation: products of e4m3 values are exact.
// * Epilogue: relu, times the head weight, summed over heads in registers and
//   across the lane quad, times 2**-6 and 2**(s_max - 127) per key (relu(c x) =
//   c relu(x) for c > 0), -inf where the key is not visible.
//
// Which key element feeds which k slot is free as long as the index query's
// element sits in the same slot: thread (lane % 4 = c) holds group c of its two
// rows (16 payload bytes, one 128-bit shared load each), and k step s takes
// payload word s of that group. The queries are permuted to match when they
// are written to shared memory (with the 128-byte swizzle wgmma reads).
//
// Threads: warps 0-3 are one math warpgroup; warp 4 is the producer, which walks
// the same job list and copies each page (4352 bytes: payload plane then scale
// plane) into a STAGES-deep ring with one bulk copy (cp.async.bulk) that
// completes on the stage's mbarrier. Several CTAs share an SM (MIN_CTAS).

typedef unsigned int u32;
typedef unsigned long long u64;
typedef long long i64;

#ifndef SPLIT_SIGN
#define SPLIT_SIGN 1  // 1, 2: signs by two sign-split PRMT decodes and a negated wgmma (7 ALU ops per word,
                      // not 12); 2 decodes in two halves of two k steps (16 A registers live, two waits)
#endif
#ifndef PROBE
#define PROBE 0  // measurement builds only: 1 = loads only (no compute), 2 = compute only (no page copies)
#endif

#define PAGE 64
#define PAGE_BYTES (PAGE * 68)
#define PAYLOAD_BYTES (PAGE * 64)
#define MATH_THREADS 128
#define THREADS (MATH_THREADS + 32)
#define Q_BYTES (HEADS * 128)

__device__ __forceinline__ u32 smem_u32(const void* p) {
    return static_cast<u32>(__cvta_generic_to_shared(p));
}

__device__ __forceinline__ void mbar_init(u32 bar, u32 count) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(bar), "r"(count) : "memory");
}

__device__ __forceinline__ void mbar_arrive(u32 bar) {
    asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" ::"r"(bar) : "memory");
}

__device__ __forceinline__ void mbar_arrive_tx(u32 bar, u32 bytes) {
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(bar), "r"(bytes) : "memory");
}

__device__ __forceinline__ void mbar_wait(u32 bar, u32 parity) {
    u32 done;
    do {
        asm volatile(
            "{\n.reg .pred p;\nmbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\nselp.u32 %0, 1, 0, p;\n}\n"
            : "=r"(done)
            : "r"(bar), "r"(parity)
            : "memory");
    } while (!done);
}

__device__ __forceinline__ void bulk_copy(u32 dst, const void* src, u32 bytes, u32 bar) {
    asm volatile(
        "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];" ::"r"(dst),
        "l"(src), "r"(bytes), "r"(bar)
        : "memory");
}

__device__ __forceinline__ void math_barrier() { asm volatile("bar.sync 1, 128;" ::: "memory"); }

__device__ __forceinline__ u32 prmt(u32 a, u32 b, u32 sel) {
    u32 r;
    asm("prmt.b32 %0, %1, %2, %3;" : "=r"(r) : "r"(a), "r"(b), "r"(sel));
    return r;
}

// Eight E2M1 codes (one payload word, element order: low nibble first) -> two
// registers of four e4m3 bytes each, in element order, through the group's LUT.
__device__ __forceinline__ void decode_word(u32 w, u32 lut_lo, u32 lut_hi, u32& out0, u32& out1) {
    const u32 w_hi = w >> 16;
    const u32 mag0 = prmt(lut_lo, lut_hi, w & 0x7777u);
    const u32 mag1 = prmt(lut_lo, lut_hi, w_hi & 0x7777u);
    // Sign bit 3 of nibble i -> selector 4 (byte 0x80 of the second source) or 0 (zero).
    const u32 sel = (w >> 1) & 0x44444444u;
    const u32 sgn0 = prmt(0u, 0x80u, sel);
    const u32 sgn1 = prmt(0u, 0x80u, sel >> 16);
    out0 = mag0 + sgn0;  // disjoint bits: + lets ptxas pick IMAD (FMA pipe) over LOP3 (ALU pipe)
    out1 = mag1 + sgn1;
}

// Sign-split decode: PRMT with a nibble's bit 3 set returns the selected LUT byte's msb
// replicated, 0x00 (no LUT byte has its msb set). So the raw nibbles select the magnitudes of
// the non-negative elements (negatives -> 0), and the nibbles with bit 3 flipped select the
// magnitudes of the negative ones (non-negatives -> 0); the MMA adds the first and subtracts
// the second (imm-scale-a = -1).
__device__ __forceinline__ void decode_word_split(u32 w, u32 lut_lo, u32 lut_hi, u32& pos0, u32& pos1, u32& neg0,
                                                  u32& neg1) {
    const u32 wn = w ^ 0x88888888u;
    pos0 = prmt(lut_lo, lut_hi, w);
    pos1 = prmt(lut_lo, lut_hi, w >> 16);
    neg0 = prmt(lut_lo, lut_hi, wn);
    neg1 = prmt(lut_lo, lut_hi, wn >> 16);
}

// The LUT of one (key, group): bytes LUT_A[0..3] and LUT_A[4..7]; zero when flushed.
__device__ __forceinline__ void group_lut(u32 scales, u32 group, u32 s_max, u32& lut_lo, u32& lut_hi) {
    const int a = static_cast<int>((scales >> (8 * group)) & 0xFFu) - static_cast<int>(s_max) + 12;
    const u32 a8 = static_cast<u32>(a) << 3;
    lut_lo = a >= 1 ? a8 * 0x01010100u + 0x0C080000u : 0u;
    lut_hi = a >= 1 ? a8 * 0x01010101u + 0x1C181410u : 0u;
}

__device__ __forceinline__ u32 max_byte(u32 w) {
    const u32 m01 = max(w & 0xFFu, (w >> 8) & 0xFFu);
    const u32 m23 = max((w >> 16) & 0xFFu, w >> 24);
    return max(m01, m23);
}

// Shared-memory matrix descriptor: K-major, 128-byte swizzle, 8-row atoms 1024 bytes apart.
__device__ __forceinline__ u64 q_desc(u32 addr) {
    return static_cast<u64>((addr & 0x3FFFFu) >> 4) | (static_cast<u64>(1) << 16) |
           (static_cast<u64>(1024 >> 4) << 32) | (static_cast<u64>(1) << 62);
}

__device__ __forceinline__ void store_logit(float* p, float v) { *p = v; }
__device__ __forceinline__ void store_logit(unsigned short* p, float v) {
    unsigned short h;
#if OUT_KIND == 1
    asm("cvt.rn.bf16.f32 %0, %1;" : "=h"(h) : "f"(v));
#else
    asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(v));
#endif
    *p = h;
}

#if OUT_KIND == 0
typedef float out_t;
#else
typedef unsigned short out_t;
#endif

// Longest row of request b (the rows of [B] lengths see ctx - next_n + 1 + i keys).
__device__ __forceinline__ int request_len(const int* lens, int b) {
#if LENS_2D
    int m = 0;
#pragma unroll
    for (int i = 0; i < NEXT_N; ++i) m = max(m, __ldg(lens + b * NEXT_N + i));
    return m;
#else
    return max(__ldg(lens + b), 0);
#endif
}

// The CTA's jobs: the (request, key block) tiles from schedule[cta] up to
// schedule[cta + 1], each split into its pages; a request with no visible key
// is one job with no page (it only writes the row's -inf fill).
struct Jobs {
    int b, blk, b_end, blk_end, batch, block_kv, pages_per_block;
    int len, nblocks, npages, p, p_hi;
    const int* lens;

    __device__ __forceinline__ void open_tile() {
        const int lo = blk * pages_per_block;
        p = lo;
        p_hi = npages == 0 ? lo + 1 : min(lo + pages_per_block, npages);
    }
    __device__ __forceinline__ void open_request() {
        len = request_len(lens, b);
        nblocks = max(1, (len + block_kv - 1) / block_kv);
        npages = (len + PAGE - 1) / PAGE;
    }
    __device__ __forceinline__ void init(const int* schedule, const int* lens_, int cta, int batch_, int block_kv_) {
        lens = lens_;
        batch = batch_;
        block_kv = block_kv_;
        pages_per_block = block_kv_ / PAGE;
        b = schedule[2 * cta];
        blk = schedule[2 * cta + 1];
        b_end = schedule[2 * cta + 2];
        blk_end = schedule[2 * cta + 3];
        if (valid()) {
            open_request();
            open_tile();
        }
    }
    __device__ __forceinline__ bool valid() const {
        return b < batch && (b < b_end || (b == b_end && blk < blk_end));
    }
    // The current job's page index within its request (-1: none); advance afterwards.
    __device__ __forceinline__ int page() const { return npages == 0 ? -1 : p; }
    __device__ __forceinline__ bool last_of_request() const {
        return blk == nblocks - 1 && p == p_hi - 1;
    }
    __device__ __forceinline__ void next() {
        if (++p < p_hi) return;
        if (++blk >= nblocks) {
            ++b;
            blk = 0;
            if (!valid()) return;
            open_request();
        } else if (!valid()) {
            return;
        }
        open_tile();
    }
};

// One job's decoded keys (wgmma A fragments for the four k steps) and what its epilogue needs.
struct Tile {
#if SPLIT_SIGN == 2
    u32 w0[4], w1[4];              // payload words of rows r0 and r1 (group c)
    u32 lo0, hi0, lo1, hi1;        // their LUTs
#else
    u32 a[4][4];  // A fragments per k step (SPLIT_SIGN: the non-negative elements' magnitudes)
#endif
#if SPLIT_SIGN == 1
    u32 an[4][4];  // SPLIT_SIGN: the negative elements' magnitudes
#endif
    float f0, f1;  // 2**-6 * 2**(s_max - 127) of rows r0 and r1
    int b, pg, page, npages;  // request, page within it (-1: none), cache page (-1: invalid)
    bool last;                // the request's last job
};

extern "C" __global__ void __launch_bounds__(THREADS, MIN_CTAS) fp4_paged_logits_sm90(
    const unsigned char* __restrict__ q, const float* __restrict__ weights, const unsigned char* __restrict__ cache,
    const int* __restrict__ block_table, const int* __restrict__ lens, const int* __restrict__ schedule,
    out_t* __restrict__ out, int batch, int num_pages, int max_pages, int width, long long stride_q_row,
    long long stride_q_head, long long stride_w_row, long long stride_bt, long long stride_out, int block_kv) {
    extern __shared__ unsigned char smem_raw[];
    // Align the dynamic window to the 1024-byte swizzle atom (the launch asks for 1 KB extra).
    unsigned char* smem = smem_raw + ((1024 - (smem_u32(smem_raw) & 1023)) & 1023);
    unsigned char* q_smem = smem;                                 // NEXT_N x [HEADS, 128] e4m3, swizzled
    unsigned char* stage_smem = q_smem + NEXT_N * Q_BYTES;        // STAGES x PAGE_BYTES
    float* w_smem = reinterpret_cast<float*>(stage_smem + STAGES * PAGE_BYTES);  // NEXT_N x HEADS
    int* len_smem = reinterpret_cast<int*>(w_smem + NEXT_N * HEADS);  // NEXT_N visible keys per row
    int* info = len_smem + NEXT_N;                                    // STAGES page indices
    u64* bars = reinterpret_cast<u64*>(info + STAGES + ((NEXT_N + STAGES) & 1));  // full[STAGES], empty[STAGES]
    const u32 full0 = smem_u32(bars), empty0 = smem_u32(bars + STAGES);

    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    if (threadIdx.x == 0) {
        for (int s = 0; s < STAGES; ++s) {
            mbar_init(full0 + 8 * s, 1);
            mbar_init(empty0 + 8 * s, MATH_THREADS);
        }
        asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
    }
    __syncthreads();

    Jobs jobs;
    jobs.init(schedule, lens, blockIdx.x, batch, block_kv);

    if (warp == 4) {
        // Producer: one bulk copy per page into the ring; block-table entries
        // are read 32 at a time across the warp.
        int n = 0, cached_b = -1, cached_p0 = 0, cached = 0;
        for (; jobs.valid(); jobs.next(), ++n) {
            const int stage = n % STAGES;
            const int pg = jobs.page();
            int page = -1;
            if (pg >= 0) {
                if (jobs.b != cached_b || pg < cached_p0 || pg >= cached_p0 + 32) {
                    cached_b = jobs.b;
                    cached_p0 = pg;
                    const int col = pg + lane;
                    cached = col < max_pages ? __ldg(block_table + jobs.b * stride_bt + col) : -1;
                }
                page = __shfl_sync(0xffffffffu, cached, pg - cached_p0);
                if (pg >= max_pages || page < 0 || page >= num_pages) page = -1;
            }
            if (lane == 0) {
                mbar_wait(empty0 + 8 * stage, ((n / STAGES) & 1) ^ 1);
                info[stage] = page;
                if (page >= 0 && PROBE != 2) {
                    mbar_arrive_tx(full0 + 8 * stage, PAGE_BYTES);
                    bulk_copy(smem_u32(stage_smem + stage * PAGE_BYTES), cache + static_cast<i64>(page) * PAGE_BYTES,
                              PAGE_BYTES, full0 + 8 * stage);
                } else {
                    mbar_arrive(full0 + 8 * stage);
                }
            }
            __syncwarp();
        }
        return;
    }

    // Math warpgroup. Thread: rows r0 = 16 * warp + lane / 4 and r0 + 8 of the
    // page, group c = lane % 4 of each (payload bytes 16c .. 16c + 15).
    const int c = lane & 3;
    const int r0 = 16 * warp + (lane >> 2);
    const int r1 = r0 + 8;
    int cur_b = -1;
#if NEXT_N == 1 && HEADS <= 32
    float2 wreg[HEADS / 8];
#endif
    int n = 0;  // jobs fetched so far (ring position)

    // Wait for job n's page, read this thread's bytes, release the stage, decode.
    auto fetch = [&](Tile& t) {
        t.b = jobs.b;
        t.pg = jobs.page();
        t.last = jobs.last_of_request();
        t.npages = jobs.npages;
        t.page = -1;
        const int stage = n % STAGES;
        mbar_wait(full0 + 8 * stage, (n / STAGES) & 1);
        if (t.pg < 0) {
            // A request with no visible key: the producer used this ring slot too (it arrived
            // without a copy), so the slot is released here to keep both sides' phases in step.
            mbar_arrive(empty0 + 8 * stage);
            return;
        }
        t.page = info[stage];
        uint4 p0 = make_uint4(0, 0, 0, 0), p1 = p0;
        u32 sc0 = 0x7F7F7F7Fu, sc1 = sc0;
        if (t.page >= 0) {
            const unsigned char* st = stage_smem + stage * PAGE_BYTES;
            p0 = *reinterpret_cast<const uint4*>(st + r0 * 64 + 16 * c);
            p1 = *reinterpret_cast<const uint4*>(st + r1 * 64 + 16 * c);
            sc0 = *reinterpret_cast<const u32*>(st + PAYLOAD_BYTES + 4 * r0);
            sc1 = *reinterpret_cast<const u32*>(st + PAYLOAD_BYTES + 4 * r1);
        }
        mbar_arrive(empty0 + 8 * stage);
#if PROBE == 1
        if ((p0.x ^ p1.y ^ sc0 ^ sc1) == 0x12345678u) out[0] = 0;  // keep the loads
        t.pg = -1;
        return;
#endif
        const u32 smax0 = max_byte(sc0), smax1 = max_byte(sc1);
        u32 lo0, hi0, lo1, hi1;
        group_lut(sc0, c, smax0, lo0, hi0);
        group_lut(sc1, c, smax1, lo1, hi1);
#if SPLIT_SIGN == 2
        t.w0[0] = p0.x; t.w0[1] = p0.y; t.w0[2] = p0.z; t.w0[3] = p0.w;
        t.w1[0] = p1.x; t.w1[1] = p1.y; t.w1[2] = p1.z; t.w1[3] = p1.w;
        t.lo0 = lo0; t.hi0 = hi0; t.lo1 = lo1; t.hi1 = hi1;
#else
        const u32 w0[4] = {p0.x, p0.y, p0.z, p0.w}, w1[4] = {p1.x, p1.y, p1.z, p1.w};
#pragma unroll
        for (int s = 0; s < 4; ++s) {
#if SPLIT_SIGN
            decode_word_split(w0[s], lo0, hi0, t.a[s][0], t.a[s][2], t.an[s][0], t.an[s][2]);
            decode_word_split(w1[s], lo1, hi1, t.a[s][1], t.a[s][3], t.an[s][1], t.an[s][3]);
#else
            decode_word(w0[s], lo0, hi0, t.a[s][0], t.a[s][2]);
            decode_word(w1[s], lo1, hi1, t.a[s][1], t.a[s][3]);
#endif
        }
#endif
        t.f0 = __int_as_float(static_cast<int>(smax0 << 23)) * 0.015625f;
        t.f1 = __int_as_float(static_cast<int>(smax1 << 23)) * 0.015625f;
    };

    // New request: its index queries (permuted, swizzled) and weights to shared memory.
    auto load_request = [&](int b) {
        math_barrier();  // every wgmma reading the previous queries has completed
        for (int idx = threadIdx.x; idx < NEXT_N * HEADS * 8; idx += MATH_THREADS) {
            const int i = idx / (HEADS * 8), h = (idx >> 3) % HEADS, m = idx & 7;
            const uint4 v = __ldg(reinterpret_cast<const uint4*>(
                q + static_cast<i64>(b * NEXT_N + i) * stride_q_row + h * stride_q_head + 16 * m));
            unsigned char* row = q_smem + i * Q_BYTES + h * 128;
            const u32 words[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
            for (int k = 0; k < 4; ++k) {
                // Source word wi = 8 cc + 2 s + hi holds elements 32 cc + 8 s + 4 hi + 0..3: k step s,
                // slots 16 hi + 4 cc + 0..3, i.e. byte column 32 s + 16 hi + 4 cc.
                const int wi = 4 * m + k, cc = wi >> 3, s = (wi >> 1) & 3, hi = wi & 1;
                const int chunk = 2 * s + hi;
                *reinterpret_cast<u32*>(row + ((chunk ^ (h & 7)) << 4) + 4 * cc) = words[k];
            }
        }
        for (int idx = threadIdx.x; idx < NEXT_N * HEADS; idx += MATH_THREADS) {
            const int i = idx / HEADS, h = idx % HEADS;
            w_smem[idx] = weights[static_cast<i64>(b * NEXT_N + i) * stride_w_row + h];
        }
        if (threadIdx.x < NEXT_N) {
#if LENS_2D
            len_smem[threadIdx.x] = __ldg(lens + b * NEXT_N + threadIdx.x);
#else
            len_smem[threadIdx.x] = __ldg(lens + b) - NEXT_N + 1 + threadIdx.x;
#endif
        }
        asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
        math_barrier();
#if NEXT_N == 1 && HEADS <= 32
#pragma unroll
        for (int j = 0; j < HEADS / 8; ++j) wreg[j] = *reinterpret_cast<const float2*>(w_smem + 8 * j + 2 * c);
#endif
    };

    // Score one fetched job: every next_n row against its page, then the request's -inf tail.
    auto score = [&](const Tile& cur) {
        if (cur.b != cur_b) {
            cur_b = cur.b;
            load_request(cur.b);
        }
        if (cur.pg >= 0) {
            const int col0 = cur.pg * PAGE + r0, col1 = cur.pg * PAGE + r1;
#pragma unroll
            for (int i = 0; i < NEXT_N; ++i) {
                float acc[HEADS / 2];
                const u32 qa = smem_u32(q_smem + i * Q_BYTES);
#if SPLIT_SIGN == 2
#pragma unroll
                for (int half = 0; half < 2; ++half) {
                    u32 pa[2][4], na[2][4];
#pragma unroll
                    for (int h = 0; h < 2; ++h) {
                        const int s = 2 * half + h;
                        decode_word_split(cur.w0[s], cur.lo0, cur.hi0, pa[h][0], pa[h][2], na[h][0], na[h][2]);
                        decode_word_split(cur.w1[s], cur.lo1, cur.hi1, pa[h][1], pa[h][3], na[h][1], na[h][3]);
                    }
                    asm volatile("wgmma.fence.sync.aligned;" ::: "memory");
#pragma unroll
                    for (int h = 0; h < 2; ++h) {
                        const int s = 2 * half + h;
                        wgmma_f8(acc, pa[h], q_desc(qa + 32 * s), s > 0);
                        wgmma_f8_neg(acc, na[h], q_desc(qa + 32 * s));
                    }
                    asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory");
                    if (half == 0) asm volatile("wgmma.wait_group.sync.aligned 0;" ::: "memory");
                }
#else
                asm volatile("wgmma.fence.sync.aligned;" ::: "memory");
#pragma unroll
                for (int s = 0; s < 4; ++s) wgmma_f8(acc, cur.a[s], q_desc(qa + 32 * s), s > 0);
#if SPLIT_SIGN
#pragma unroll
                for (int s = 0; s < 4; ++s) wgmma_f8_neg(acc, cur.an[s], q_desc(qa + 32 * s));
#endif
                asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory");
#endif
                asm volatile("wgmma.wait_group.sync.aligned 0;" ::: "memory");
#pragma unroll
                for (int j = 0; j < HEADS / 2; ++j) asm volatile("" : "+f"(acc[j])::"memory");

                // relu, weight, head sum: four independent chains, then across the lane quad.
                float s0a = 0.f, s0b = 0.f, s1a = 0.f, s1b = 0.f;
#pragma unroll
                for (int j = 0; j < HEADS / 8; ++j) {
#if NEXT_N == 1 && HEADS <= 32
                    const float2 wv = wreg[j];
#else
                    const float2 wv = *reinterpret_cast<const float2*>(w_smem + i * HEADS + 8 * j + 2 * c);
#endif
                    s0a = fmaf(fmaxf(acc[4 * j + 0], 0.f), wv.x, s0a);
                    s0b = fmaf(fmaxf(acc[4 * j + 1], 0.f), wv.y, s0b);
                    s1a = fmaf(fmaxf(acc[4 * j + 2], 0.f), wv.x, s1a);
                    s1b = fmaf(fmaxf(acc[4 * j + 3], 0.f), wv.y, s1b);
                }
                float sum0 = s0a + s0b, sum1 = s1a + s1b;
                sum0 += __shfl_xor_sync(0xffffffffu, sum0, 1);
                sum1 += __shfl_xor_sync(0xffffffffu, sum1, 1);
                sum0 += __shfl_xor_sync(0xffffffffu, sum0, 2);
                sum1 += __shfl_xor_sync(0xffffffffu, sum1, 2);
                // Lane c = 0 stores row r0, c = 1 row r1 (branch-free; one predicated store).
                const bool mine1 = c == 1;
                const int col = mine1 ? col1 : col0;
                float v = mine1 ? sum1 * cur.f1 : sum0 * cur.f0;
                const bool visible = cur.page >= 0 && col < len_smem[i];
                v = visible ? v : -__int_as_float(0x7f800000);
                if (c < 2 && col < width) store_logit(out + static_cast<i64>(cur.b * NEXT_N + i) * stride_out + col, v);
            }
        }
        if (cur.last) {
            // The request's last job writes -inf over the rest of its rows.
            const int start = cur.npages * PAGE;
            const float ninf = -__int_as_float(0x7f800000);
            for (int i = 0; i < NEXT_N; ++i) {
                out_t* row = out + static_cast<i64>(cur.b * NEXT_N + i) * stride_out;
                for (int col = start + threadIdx.x; col < width; col += MATH_THREADS) store_logit(row + col, ninf);
            }
        }
    };

    Tile t;
    for (; jobs.valid(); ++n) {
        fetch(t);
        jobs.next();
        score(t);
    }
}
