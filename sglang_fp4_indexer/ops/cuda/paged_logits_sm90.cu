// Paged FP4 scorer for Hopper (sm_90a): wgmma with the decoded index keys as
// the register A operand and the index queries as the shared-memory B operand.
//
// Compiled at first use by NVRTC (ops/sm90.py), which prepends the configuration of
// the call (#define NEXT_N, HEADS, OUT_KIND, LENS_2D, MMA_ROWS), the fixed build
// constants (STAGES, WGS, PRODUCER_REGS, MATH_REGS, THREADS) and the shared-memory
// layout of one math warpgroup (Q_BYTES, HS_BYTES, W_STRIDE, HS_OFF, RING_OFF,
// W_OFF, INFO_OFF, BAR_OFF, WG_BYTES: sm90.layout() is its one source; this file
// only checks it), and inserts the wgmma wrappers for N = MMA_ROWS x HEADS before
// the kernel. Semantics are those of ops.paged_logits; the numerics are the
// "folded" form of that module:
//
// * Each key's group scales are folded into the e4m3 bytes relative to its
//   largest group scale s_max, the key's largest group at 2**-3 x E2M1: group g
//   has the exponent field A = s_g - s_max + 3 (<= 3) and its E2M1 magnitude x
//   becomes LUT_A[x] = e4m3(E2M1(x) * 2**(A - 6)), rounded to nearest. For
//   A >= 1 (groups up to 2**2 below the largest) LUT_A[0] = 0, LUT_A[1] = A << 3,
//   LUT_A[x >= 2] = (x << 2) + (A << 3), all exact; for -6 <= A <= 0 the LUT is
//   a row of sm90.keyfold_table() (e4m3 subnormals, exact down to
//   A = -2, i.e. groups up to 2**5 below the largest, rounded to the 2**-9 grid
//   below that); for A < -6 it is zero. The LUT's eight bytes sit in two
//   registers and one PRMT turns four nibbles into four e4m3 bytes; the signs
//   are spread by PRMT's sign-replicate mode (7 ALU ops and 2 IMADs per payload
//   word).
// * One K = 128 FP8 wgmma per 64-key page and MMA_ROWS next_n rows (four k32
//   steps) with f16 accumulation (.f16.e4m3.e4m3: half the accumulator registers
//   of fp32). Products of e4m3 values are exact in f16, and with |q| <= 448 and
//   |k'| <= 6 x 2**-3 no partial sum of a head score exceeds 4 x 32 x 448 x 0.75
//   = 43008 < 65504, for any index query and any stored key.
// * Epilogue: relu, times the head weight, summed over heads, times
//   2**(s_max - 128) and the row's weight scale per key (relu(c x) = c relu(x)
//   for c > 0), -inf where the key is not visible. The head sum runs on the
//   tensor cores as an f16 m64n8k16 wgmma: relu(S) is max.f16x2 of the
//   accumulator registers as they stand (the f16 accumulator fragment is the
//   f16 A fragment; no rounding), the weights as hi + lo f16 columns of B after
//   a power of two that puts the row's largest |weight| in [2**14, 2**15)
//   (hi + lo = w to 2**-22 relative), fp32 accumulation.
//
// The other variants measured (sign handling, fp32 and tf32 head sums, a software
// pipeline, one warpgroup per CTA, probe builds) are in experiments/cuda/.
//
// Which key element feeds which k slot is free as long as the index query's
// element sits in the same slot: thread (lane % 4 = c) holds group c of its two
// rows (16 payload bytes, one 128-bit shared load each), and k step s takes
// payload word s of that group. The queries are permuted to match when they
// are written to shared memory (with the 128-byte swizzle wgmma reads).
//
// Threads: WGS math warpgroups (warps 4g .. 4g + 3), then one producer warpgroup
// whose warp g serves math warpgroup g. The producer warpgroup gives its registers
// to the math warpgroups (setmaxnreg) and one CTA fills an SM. Each math warpgroup
// has its own entry of the CTA schedule (blockIdx.x * WGS + g), its own shared
// memory (WG_BYTES) and named barrier. Its producer walks that entry's jobs (the
// (request, key block) tiles of the CTA schedule, each split into its pages; a
// request with no visible key is one job without a page), and for each job fills
// one slot of a STAGES-deep ring: the job's description (cache page, request,
// page within the request, tail) and, when there is a page, the page itself (4352
// bytes: payload plane then scale plane) by one bulk copy (cp.async.bulk) that
// completes on the slot's mbarrier. After the last job it fills one slot with an
// end marker. The math warpgroup only reads slots: it keeps no job walker of its own.

typedef unsigned int u32;
typedef unsigned long long u64;
typedef long long i64;

#define MMA_N (MMA_ROWS * HEADS)  // the rows' queries are adjacent in shared memory
#define WSEG (HEADS < 32 ? HEADS : 32)  // lanes whose weights (of one k) belong to one row
static_assert(NEXT_N % MMA_ROWS == 0 && MMA_N <= 256, "MMA_ROWS must divide NEXT_N, N = MMA_ROWS x HEADS <= 256");

#define PAGE 64
#define PAGE_BYTES (PAGE * 68)
#define PAYLOAD_BYTES (PAGE * 64)
#define MATH_THREADS 128
// THREADS (sm90.THREADS): WGS math warpgroups and one producer warpgroup whose warp k serves
// math warpgroup k (setmaxnreg works on whole warpgroups). PRODUCER_REGS and MATH_REGS are the
// setmaxnreg budgets: setmaxnreg moves registers only within the CTA's allocation at launch
// (65536 / THREADS rounded down to 8): what the math warpgroups gain the producer warpgroup must
// give up first, or setmaxnreg.inc waits forever (sm90.math_regs).
static_assert(THREADS == MATH_THREADS * WGS + 128, "THREADS does not match WGS");
// The layout sm90.layout() passes: queries NEXT_N x Q_BYTES (e4m3, swizzled; 1024-byte aligned
// for the swizzle), head-sum B tiles NEXT_N x HS_BYTES, the page ring STAGES x PAGE_BYTES, the
// permuted weights NEXT_N x 4 x W_STRIDE floats, STAGES int4 job slots, 2 x STAGES mbarriers.
static_assert(Q_BYTES == HEADS * 128 && HS_BYTES == HEADS * 16 && W_STRIDE == HEADS / 4 + 4, "row sizes");
static_assert(HS_OFF == NEXT_N * Q_BYTES && RING_OFF == HS_OFF + NEXT_N * HS_BYTES &&
              W_OFF == RING_OFF + STAGES * PAGE_BYTES && INFO_OFF == W_OFF + NEXT_N * 4 * W_STRIDE * 4 &&
              BAR_OFF == INFO_OFF + 16 * STAGES, "the regions of one math warpgroup follow each other");
static_assert(RING_OFF % 16 == 0 && INFO_OFF % 16 == 0 && BAR_OFF % 8 == 0, "bulk copies, int4 slots, mbarriers");
static_assert(BAR_OFF + 16 * STAGES <= WG_BYTES && WG_BYTES % 1024 == 0, "WG_BYTES does not hold the layout");

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

// Barrier of one math warpgroup: named barrier 1 + its index, as an immediate (a barrier id in a
// register makes ptxas reserve all 16 named barriers, which caps CTAs per SM at 4).
__device__ __forceinline__ void math_barrier(int wg) {
#define MATH_BARRIER(id) asm volatile("bar.sync " #id ", 128;" ::: "memory")
    static_assert(WGS == 4, "one named barrier per math warpgroup");
    switch (wg) {
        case 0: MATH_BARRIER(1); break;
        case 1: MATH_BARRIER(2); break;
        case 2: MATH_BARRIER(3); break;
        case 3: MATH_BARRIER(4); break;
    }
#undef MATH_BARRIER
}

__device__ __forceinline__ u32 prmt(u32 a, u32 b, u32 sel) {
    u32 r;
    asm("prmt.b32 %0, %1, %2, %3;" : "=r"(r) : "r"(a), "r"(b), "r"(sel));
    return r;
}

__device__ __forceinline__ uint4 lds128(u32 addr) {
    uint4 v;
    asm volatile("ld.shared.v4.u32 {%0, %1, %2, %3}, [%4];" : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "r"(addr));
    return v;
}

__device__ __forceinline__ u32 lds32(u32 addr) {
    u32 v;
    asm volatile("ld.shared.u32 %0, [%1];" : "=r"(v) : "r"(addr));
    return v;
}

__device__ __forceinline__ int4 lds128_i(u32 addr) {
    int4 v;
    asm volatile("ld.shared.v4.s32 {%0, %1, %2, %3}, [%4];" : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "r"(addr));
    return v;
}

// Decode with the signs by PRMT's sign-replicate mode: a selector nibble with bit 3
// set yields 0xFF or 0x00 by the msb of the byte it selects, and the msb of byte j of w (w << 4) is
// the sign of nibble 2j + 1 (2j), so one PRMT with a constant selector spreads four signs into
// four bytes. Per word: 7 ALU operations (the mask, 2 magnitude PRMTs, 2 sign PRMTs, 2 merges)
// and 2 IMADs (w << 4, and m >> 16 as a high multiply: the FMA pipe); k16 and k65536 are 16 and
// 65536 derived from a kernel argument, so ptxas keeps them multiplies.
__device__ __forceinline__ void decode_word_rep(u32 w, u32 lut_lo, u32 lut_hi, u32 k16, u32 k65536, u32& out0,
                                                u32& out1) {
    const u32 m = w & 0x77777777u;
    const u32 mh = __umulhi(m, k65536);
    const u32 mag0 = prmt(lut_lo, lut_hi, m);
    const u32 mag1 = prmt(lut_lo, lut_hi, mh);
    const u32 w4 = w * k16;
    const u32 s0 = prmt(w, w4, 0x9D8Cu);  // nibbles 0..3: bytes 0 of w4, 0 of w, 1 of w4, 1 of w
    const u32 s1 = prmt(w, w4, 0xBFAEu);  // nibbles 4..7: bytes 2 of w4, 2 of w, 3 of w4, 3 of w
    out0 = mag0 | (s0 & 0x80808080u);
    out1 = mag1 | (s1 & 0x80808080u);
}

// Largest of the four UE8M0 codes of one key (byte extracts by PRMT with a zero source).
__device__ __forceinline__ u32 max_byte(u32 w) {
    const u32 b1 = prmt(w, 0u, 0x4441u), b2 = prmt(w, 0u, 0x4442u);
    return max(max(w & 0xFFu, b1), max(b2, w >> 24));
}

// The LUTs of A = KEYFOLD_LOW .. 0 (row A - KEYFOLD_LOW of sm90.keyfold_table(), the array
// KEYFOLD_TABLE that sm90.py inserts before the kernel), then a row of zeros for A < KEYFOLD_LOW:
// copied once per CTA into shared memory (one 8-byte shared load per (key, group) and thread; a
// constant-memory load would serialize on the lanes' different rows).
#define KEYFOLD_LOW (-6)  // sm90.KEYFOLD_LOW
__shared__ uint2 keyfold_lut[8];

// The LUT of one (key, group) from the group's code and the key's largest: bytes LUT_A[0..3] and
// LUT_A[4..7].
__device__ __forceinline__ void group_lut(u32 code, u32 s_max, u32& lut_lo, u32& lut_hi) {
    const int a = static_cast<int>(code) - static_cast<int>(s_max) + 3;
    const u32 ua = static_cast<u32>(a);
    const uint2 t = keyfold_lut[static_cast<u32>(a - KEYFOLD_LOW) <= static_cast<u32>(-KEYFOLD_LOW)
                                    ? a - KEYFOLD_LOW : 7];
    lut_lo = a >= 1 ? ua * 0x08080800u + 0x0C080000u : t.x;
    lut_hi = a >= 1 ? ua * 0x08080808u + 0x1C181410u : t.y;
}

// Shared-memory matrix descriptor: K-major, 128-byte swizzle, 8-row atoms 1024 bytes apart.
__device__ __forceinline__ u64 q_desc(u32 addr) {
    return static_cast<u64>((addr & 0x3FFFFu) >> 4) | (static_cast<u64>(1) << 16) |
           (static_cast<u64>(1024 >> 4) << 32) | (static_cast<u64>(1) << 62);
}

// Shared-memory matrix descriptor of one head-sum B tile (n8 x k16 f16): K-major, no swizzle, two
// 8 x 16-byte core matrices 128 bytes apart along K (both offsets 128: N = 8 has one along N).
__device__ __forceinline__ u64 hs_desc(u32 addr) {
    return static_cast<u64>((addr & 0x3FFFFu) >> 4) | (static_cast<u64>(128 >> 4) << 16) |
           (static_cast<u64>(128 >> 4) << 32);
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

// Four e4m3 query bytes with each NaN (magnitude byte 0x7F) made 0: a NaN element of q is read as 0
// (paged_logits' check=False contract). Adding 1 to the 7-bit magnitudes sets bit 7 exactly in those
// bytes (no carry leaves a byte); that bit, spread over its byte, masks it.
__device__ __forceinline__ u32 zero_nan_e4m3(u32 w) {
    const u32 nan = ((w & 0x7F7F7F7Fu) + 0x01010101u) & 0x80808080u;
    return w & ~((nan >> 7) * 0xFFu);
}

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

// One CTA per SM (the producer warpgroup's registers go to the math warpgroups by setmaxnreg).
extern "C" __global__ void __launch_bounds__(THREADS, 1) fp4_paged_logits_sm90(
    const unsigned char* __restrict__ q, const float* __restrict__ weights, const unsigned char* __restrict__ cache,
    const int* __restrict__ block_table, const int* __restrict__ lens, const int* __restrict__ schedule,
    out_t* __restrict__ out, int batch, int num_pages, int max_pages, int width, long long stride_q_row,
    long long stride_q_head, long long stride_w_row, long long stride_bt, long long stride_out, int block_kv,
    int num_ctas, int clean_tail) {
    extern __shared__ unsigned char smem_raw[];
    // Align the dynamic window to the 1024-byte swizzle atom (the launch asks for 1 KB extra).
    unsigned char* smem_base = smem_raw + ((1024 - (smem_u32(smem_raw) & 1023)) & 1023);
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    if (threadIdx.x == 0) {
        for (int g = 0; g < WGS; ++g) {
            const u32 bars = smem_u32(smem_base + g * WG_BYTES + BAR_OFF);
            for (int s = 0; s < STAGES; ++s) {
                mbar_init(bars + 8 * s, 1);
                mbar_init(bars + 8 * (STAGES + s), MATH_THREADS);
            }
        }
        asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
    }
    if (threadIdx.x < 8) keyfold_lut[threadIdx.x] = KEYFOLD_TABLE[threadIdx.x];
    __syncthreads();

    // This thread's math warpgroup (a producer warp: the one it serves) and its shared memory:
    // queries NEXT_N x [HEADS, 128] e4m3 (swizzled), head-sum tiles, the page ring
    // STAGES x PAGE_BYTES, the weights region (NEXT_N x HEADS / WSEG lane groups' largest |weight|), STAGES int4 job slots,
    // mbarriers full[STAGES] and empty[STAGES].
    const bool producer = warp >= 4 * WGS;
    // Broadcast from lane 0: ptxas then treats it as warp-uniform (the wgmma descriptors built
    // from it can stay in uniform registers).
    const int wg = __shfl_sync(0xffffffffu, producer ? warp - 4 * WGS : warp >> 2, 0);
    unsigned char* smem = smem_base + wg * WG_BYTES;
    unsigned char* q_smem = smem;
    unsigned char* hs_smem = smem + HS_OFF;
    unsigned char* stage_smem = smem + RING_OFF;
    u32* wmax_smem = reinterpret_cast<u32*>(smem + W_OFF);
    int* info = reinterpret_cast<int*>(smem + INFO_OFF);
    const u32 full0 = smem_u32(smem + BAR_OFF), empty0 = full0 + 8 * STAGES;
    const int vcta = blockIdx.x * WGS + wg;  // this warpgroup's entry of the CTA schedule

    if (producer) {
        // The producer warpgroup gives registers to the math warpgroups (each role's code is
        // dominated by its own setmaxnreg, so ptxas allocates it within that budget).
        asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;" ::"n"(PRODUCER_REGS));
        if (wg >= WGS) return;
        // Producer: one slot per job (its description, and its page by one bulk copy), then the end
        // marker. The jobs of a schedule entry (one math warpgroup's):
        // the (request, key block) tiles from schedule[entry] up to schedule[entry + 1], each split into
        // its pages, walked a request at a time so that a request's pages are one tight loop; a
        // request with no visible key is one job with no page. Block-table entries are read 32 at a
        // time across the warp, the request's first ones alongside its length (both need only the
        // schedule entry: one dependent global load fewer before its first page copy).
        int stage = 0, parity = 1;  // the next slot, and the parity of its empty barrier's phase to wait for
        int b = batch, blk_lo = 0, b_end = 0, blk_end = 0;  // an entry past the schedule's end: no job
        if (vcta < num_ctas) {  // clamped at 0: a corrupt entry never names a negative request or block
            b = max(__ldg(schedule + 2 * vcta), 0);
            blk_lo = max(__ldg(schedule + 2 * vcta + 1), 0);
            b_end = __ldg(schedule + 2 * vcta + 2);
            blk_end = __ldg(schedule + 2 * vcta + 3);
        }
        const int pages_per_block = block_kv / PAGE;
        for (; b < batch && (b < b_end || (b == b_end && blk_lo < blk_end)); ++b, blk_lo = 0) {
            int p = blk_lo * pages_per_block;
            int cached_p0 = p;
            int cached = p + lane < max_pages ? __ldg(block_table + b * stride_bt + p + lane) : -1;
            const int len = request_len(lens, b);
            const int npages = (len + PAGE - 1) / PAGE;
            const int nblocks = max(1, (len + block_kv - 1) / block_kv);
            const int blk_hi = b < b_end ? nblocks : min(blk_end, nblocks);
            const int p_end = npages == 0 ? p + 1 : min(blk_hi * pages_per_block, npages);
            for (; p < p_end; ++p) {
                int page = -1;
                if (npages > 0) {
                    if (static_cast<u32>(p - cached_p0) >= 32u) {
                        cached_p0 = p;
                        cached = p + lane < max_pages ? __ldg(block_table + b * stride_bt + p + lane) : -1;
                    }
                    // Past max_pages the cached entry is -1 already.
                    page = __shfl_sync(0xffffffffu, cached, p - cached_p0);
                    if (page >= num_pages) page = -1;
                }
                if (lane == 0) {
                    mbar_wait(empty0 + 8 * stage, parity);
                    const bool last = p == npages - 1 || npages == 0;  // the request's last job
                    *reinterpret_cast<int4*>(info + 4 * stage) =
                        make_int4(page, b, npages == 0 ? -1 : p, last ? npages * PAGE : -1);
                    if (page >= 0) {
                        mbar_arrive_tx(full0 + 8 * stage, PAGE_BYTES);
                        bulk_copy(smem_u32(stage_smem + stage * PAGE_BYTES), cache + static_cast<i64>(page) * PAGE_BYTES,
                                  PAGE_BYTES, full0 + 8 * stage);
                    } else {
                        mbar_arrive(full0 + 8 * stage);
                    }
                }
                __syncwarp();
                if (++stage == STAGES) {
                    stage = 0;
                    parity ^= 1;
                }
            }
        }
        if (lane == 0) {
            mbar_wait(empty0 + 8 * stage, parity);
            *reinterpret_cast<int4*>(info + 4 * stage) = make_int4(-1, -1, -1, -1);
            mbar_arrive(full0 + 8 * stage);
        }
        return;
    }

    // Math warpgroup. Thread: rows r0 = 16 * warp + lane / 4 and r1 = r0 + 8 of
    // the page, group c = lane % 4 of each (payload bytes 16c .. 16c + 15).
    asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;" ::"n"(MATH_REGS));
    const int tid = threadIdx.x & (MATH_THREADS - 1);  // thread within the math warpgroup
    const int c = lane & 3;
    const int r0 = 16 * (warp & 3) + (lane >> 2);
    const u32 ring = smem_u32(stage_smem);
    const u32 pay_off = r0 * 64 + 16 * c;            // + 512: row r1
    const u32 sc_off = PAYLOAD_BYTES + 4 * r0;       // + 32: row r1
    const u32 code_sel = 0x4440u + c;                // PRMT selector: byte c, zero-extended
    // The queries' wgmma descriptor; row i, k step s add (i * Q_BYTES + 32 s) / 16 to its address field
    // (which cannot carry out: shared memory addresses stay below 2**18).
    const u64 q_desc0 = q_desc(smem_u32(q_smem));
    const bool mine1 = c == 1;                       // lane c = 0 stores row r0, c = 1 row r1
    const int my_row = mine1 ? r0 + 8 : r0;
    int cur_b = -1;
    int row_len[NEXT_N];
    float row_g[NEXT_N];  // 2**(e_r - 138): undoes the row's weight scale 2**(141 - e_r)
    // 16 and 65536 from a kernel argument (block_kv >= 64): ptxas cannot fold them, so the decode's
    // w << 4 and m >> 16 stay IMADs (the FMA pipe).
    const u32 k16 = static_cast<u32>(block_kv >> 31) + 16u, k65536 = static_cast<u32>(block_kv >> 31) + 65536u;
    out_t* row_out = out;

    // New request: its index queries (permuted, swizzled), weights and row lengths. Every global
    // load of a chunk is issued before the first shared store that needs one, so a request costs one
    // global round trip per Q_CHUNK uint4 per thread, not one per load. Up to next_n 4 at <= 64 heads
    // (what MTP serves) one chunk: every load in flight at once (next_n 4 at 64 heads: 12 bytes of spills,
    // and 1 x 128K next_n 4 6-8 % faster on an H100 than in two chunks of 8, docs/perf-notes.md); above,
    // chunks of up to 8 (one chunk spills more there: 20 bytes at next_n 8, H 32; 36 at next_n 2, H 128).
    auto load_request = [&](int b) {
        constexpr int QV = NEXT_N * HEADS * 8 / MATH_THREADS;             // uint4 of queries per thread
        constexpr int WV = (NEXT_N * HEADS + MATH_THREADS - 1) / MATH_THREADS;  // weights per thread
        // QV = next_n x heads / 16 (e.g. 12 at next_n 3, H 64): one chunk up to next_n 4 at <= 64 heads,
        // else its largest divisor up to 8.
        constexpr int Q_CHUNK = NEXT_N <= 4 && HEADS <= 64 ? QV : QV % 8 == 0 ? 8 : QV % 7 == 0 ? 7 : QV % 6 == 0 ? 6 : QV % 5 == 0 ? 5 : QV % 4 == 0 ? 4 : QV % 3 == 0 ? 3 : QV % 2 == 0 ? 2 : 1;
        static_assert(QV * MATH_THREADS == NEXT_N * HEADS * 8 && QV % Q_CHUNK == 0, "queries per thread");
        float wv[WV];
#pragma unroll
        for (int i = 0; i < NEXT_N; ++i) {
#if LENS_2D
            row_len[i] = __ldg(lens + b * NEXT_N + i);
#else
            row_len[i] = __ldg(lens + b) - NEXT_N + 1 + i;
#endif
        }
#pragma unroll
        for (int k = 0; k < WV; ++k) {
            const int idx = tid + k * MATH_THREADS, i = idx / HEADS, h = idx % HEADS;
            wv[k] = idx < NEXT_N * HEADS ? __ldg(weights + static_cast<i64>(b * NEXT_N + i) * stride_w_row + h) : 0.f;
        }
        uint4 v[Q_CHUNK];
        auto load_chunk = [&](int k0) {
#pragma unroll
            for (int k = 0; k < Q_CHUNK; ++k) {
                const int idx = tid + (k0 + k) * MATH_THREADS;
                const int i = idx / (HEADS * 8), h = (idx >> 3) % HEADS, m = idx & 7;
                v[k] = __ldg(reinterpret_cast<const uint4*>(
                    q + static_cast<i64>(b * NEXT_N + i) * stride_q_row + h * stride_q_head + 16 * m));
            }
        };
        load_chunk(0);     // in flight across the barrier
        math_barrier(wg);  // every wgmma reading the previous queries has completed
        // The rows' largest |weight|: for each k, WSEG consecutive lanes hold weights of one row, and the
        // first of them publishes their largest (fp32 bits: the order of non-negative floats) to slot
        // idx / WSEG; row i's slots are i x HEADS / WSEG onwards.
#pragma unroll
        for (int k = 0; k < WV; ++k) {
            const int idx = tid + k * MATH_THREADS;
            u32 wmax = idx < NEXT_N * HEADS ? __float_as_uint(fabsf(wv[k])) : 0u;
#if HEADS >= 32
            wmax = __reduce_max_sync(0xffffffffu, wmax);
#else
#pragma unroll
            for (int o = WSEG / 2; o > 0; o >>= 1) wmax = max(wmax, __shfl_xor_sync(0xffffffffu, wmax, o));
#endif
            if (idx < NEXT_N * HEADS && idx % WSEG == 0) wmax_smem[idx / WSEG] = wmax;
        }
#pragma unroll
        for (int k0 = 0; k0 < QV; k0 += Q_CHUNK) {
            if (k0 > 0) load_chunk(k0);
#pragma unroll
            for (int k = 0; k < Q_CHUNK; ++k) {
                const int idx = tid + (k0 + k) * MATH_THREADS;
                const int i = idx / (HEADS * 8), h = (idx >> 3) % HEADS, m = idx & 7;
                unsigned char* row = q_smem + i * Q_BYTES + h * 128;
                const u32 words[4] = {zero_nan_e4m3(v[k].x), zero_nan_e4m3(v[k].y), zero_nan_e4m3(v[k].z),
                                      zero_nan_e4m3(v[k].w)};
#pragma unroll
                for (int kk = 0; kk < 4; ++kk) {
                    // Source word wi = 8 cc + 2 s + hi holds elements 32 cc + 8 s + 4 hi + 0..3: k step s,
                    // slots 16 hi + 4 cc + 0..3, i.e. byte column 32 s + 16 hi + 4 cc.
                    const int wi = 4 * m + kk, cc = wi >> 3, s = (wi >> 1) & 3, hi = wi & 1;
                    const int chunk = 2 * s + hi;
                    *reinterpret_cast<u32*>(row + ((chunk ^ (h & 7)) << 4) + 4 * cc) = words[kk];
                }
            }
        }
        math_barrier(wg);  // the warps' largest weights
        // Row i's weight exponent e_r: the fp32 exponent field of its largest |weight|, clamped to
        // [12, 254]; its weights are scaled by 2**(141 - e_r) (largest in [2**14, 2**15): f16 holds it,
        // and times relu(S) <= 43008 the fp32 head sum cannot overflow), undone by row_g at the store.
        auto row_exp = [&](int i) {
            u32 m = 0;
#pragma unroll
            for (int s = 0; s < HEADS / WSEG; ++s) m = max(m, wmax_smem[i * (HEADS / WSEG) + s]);
            return min(max(static_cast<int>(m >> 23), 12), 254);
        };
#pragma unroll
        for (int i = 0; i < NEXT_N; ++i) row_g[i] = __int_as_float((row_exp(i) - 11) << 23);
#pragma unroll
        for (int k = 0; k < WV; ++k) {
            const int idx = tid + k * MATH_THREADS, i = idx / HEADS, h = idx % HEADS;
            if (idx >= NEXT_N * HEADS) break;
            // f16 head sum, tile t = h / 16 (k = h % 16): B[k][n] = hi = f16(w') for n = 0, 2 and
            // lo = f16(w' - hi) for n = 1, 3 (w' = w 2**(141 - e_r); hi + lo = w' to 2**-22); core matrix
            // k / 8 at byte 128 (k / 8) + 16 n + 2 (k % 8).
            const float ws = ldexpf(wv[k], 141 - row_exp(i));
            unsigned short hi16, lo16;
            float hif;
            asm("cvt.rn.f16.f32 %0, %1;" : "=h"(hi16) : "f"(ws));
            asm("cvt.f32.f16 %0, %1;" : "=f"(hif) : "h"(hi16));
            asm("cvt.rn.f16.f32 %0, %1;" : "=h"(lo16) : "f"(ws - hif));
            unsigned short* tile =
                reinterpret_cast<unsigned short*>(hs_smem + i * HS_BYTES + 256 * (h >> 4) + 128 * ((h >> 3) & 1)) + (h & 7);
            tile[0] = hi16;
            tile[8] = lo16;
            tile[16] = hi16;
            tile[24] = lo16;
        }
        asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
        math_barrier(wg);
        row_out = out + static_cast<i64>(b) * NEXT_N * stride_out;
    };

    // One job's slot, read: its description and, with a page, this thread's payload words and scales.
    struct Slot {
        int4 job;  // cache page (< 0: none/invalid), request (-1: end marker), page within it (-1: none), tail
        uint4 p0, p1;
        u32 sc0, sc1;
    };
    // The columns of each head-sum tile that hold no weights (4 .. 7) stay zero (written once; the
    // first load_request's proxy fence and barrier publish them to wgmma).
    for (int idx = tid; idx < NEXT_N * HS_BYTES / 16; idx += MATH_THREADS) {
        const int n = idx & 7;
        if (n >= 4) reinterpret_cast<uint4*>(hs_smem)[idx] = make_uint4(0, 0, 0, 0);
    }
    u32 stage = 0, phase = 0;
    // Wait for the next slot, read it and release it (the page stays only in registers).
    auto acquire = [&](Slot& sl) {
        mbar_wait(full0 + 8 * stage, phase);
        sl.job = lds128_i(smem_u32(info + 4 * stage));
        // Read whether or not the job has a (valid) page: without one the slot holds stale bytes,
        // whose scores finish_row masks to -inf.
        const u32 slot = ring + stage * PAGE_BYTES;
        sl.p0 = lds128(slot + pay_off);
        sl.p1 = lds128(slot + pay_off + 512);
        sl.sc0 = lds32(slot + sc_off);
        sl.sc1 = lds32(slot + sc_off + 32);
        if (sl.job.y >= 0) mbar_arrive(empty0 + 8 * stage);  // the end marker's slot is not refilled
        if (++stage == STAGES) {
            stage = 0;
            phase ^= 1;
        }
    };

    // The first job's request is the schedule entry's first request: its queries and weights are
    // loaded while the producer fetches the first page, not after it arrives.
    if (vcta < num_ctas) {
        const int b0 = max(__ldg(schedule + 2 * vcta), 0), blk0 = max(__ldg(schedule + 2 * vcta + 1), 0);  // as the producer
        const int b1 = __ldg(schedule + 2 * vcta + 2), blk1 = __ldg(schedule + 2 * vcta + 3);
        if (b0 < batch && (b0 < b1 || (b0 == b1 && blk0 < blk1))) {  // the producer's loop condition: a non-empty entry
            cur_b = b0;
            load_request(b0);
        }
    }
    // The A fragments of one page (reg 0/1: rows r0/r1 at k 4c .. 4c + 3 of k step s, reg 2/3 the
    // same at k + 16).
    struct Frag {
        u32 a[4][4];
    };
    u32 acc[MMA_N / 4];  // MMA_ROWS rows' accumulators (f16x2), row k of the group at acc[k * HEADS / 4 ..]

    // A slot's page -> A fragments, and f: 2**(s_max - 128) of the row this lane stores (the fold's
    // 2**(124 - s_max) and the head sum's 2**-3 and x 2 undone). Needs no query: it may run for the next request before its queries load.
    auto decode = [&](const Slot& sl, Frag& fr, float& f) {
        const u32 smax0 = max_byte(sl.sc0), smax1 = max_byte(sl.sc1);
        u32 lo0, hi0, lo1, hi1;
        group_lut(prmt(sl.sc0, 0u, code_sel), smax0, lo0, hi0);
        group_lut(prmt(sl.sc1, 0u, code_sel), smax1, lo1, hi1);
        const u32 w0[4] = {sl.p0.x, sl.p0.y, sl.p0.z, sl.p0.w};
        const u32 w1[4] = {sl.p1.x, sl.p1.y, sl.p1.z, sl.p1.w};
#pragma unroll
        for (int s = 0; s < 4; ++s) {
            decode_word_rep(w0[s], lo0, hi0, k16, k65536, fr.a[s][0], fr.a[s][2]);
            decode_word_rep(w1[s], lo1, hi1, k16, k65536, fr.a[s][1], fr.a[s][3]);
        }
        f = __int_as_float(static_cast<int>((mine1 ? smax1 : smax0) << 23)) * 0.5f;
    };

    // wgmma of next_n rows i .. i + MMA_ROWS - 1 (N = MMA_ROWS x HEADS: their queries are adjacent):
    // acc = A B over the page's 128 k (four k32 steps), committed, not waited.
    auto issue_row = [&](int i, const Frag& fr) {
        asm volatile("wgmma.fence.sync.aligned;" ::: "memory");
#pragma unroll
        for (int s = 0; s < 4; ++s) wgmma_f8(acc, fr.a[s], q_desc0 + (i * Q_BYTES + 32 * s) / 16, s > 0);
        asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory");
    };

    // Epilogue of next_n row i of a job (its wgmma issued and committed): relu, weights, head sum, store.
    // A page outside the cache or the block table (check=False) is written -inf: not visible.
    auto finish_row = [&](int i, const int4& job, float f) {
        const bool mma = job.z >= 0 && job.x >= 0;
        const int col = job.z * PAGE + my_row;
        u32* acc_i = acc + (i % MMA_ROWS) * (HEADS / 4);  // this row's accumulators (i is a constant)
        if (i % MMA_ROWS == 0) {  // the first row of a wgmma group waits for it
            asm volatile("wgmma.wait_group.sync.aligned 0;" ::: "memory");
#pragma unroll
            for (int j = 0; j < MMA_N / 4; ++j) asm volatile("" : "+r"(acc[j])::"memory");
        }
        // f16 head sum on the tensor cores: relu(S), max.f16x2 of the accumulator registers (exact), is
        // the f16 A fragment of m64n8k16 as it stands (the f16 accumulator fragment's layout); the
        // weights are B as hi + lo f16 columns, fp32 accumulation.
        float hs[4];
        u32 ra[HEADS / 4];
#pragma unroll
        for (int j = 0; j < HEADS / 4; ++j)
            asm("max.f16x2 %0, %1, %2;" : "=r"(ra[j]) : "r"(acc_i[j]), "r"(0u));
        const u32 hb = smem_u32(hs_smem) + i * HS_BYTES;
        asm volatile("wgmma.fence.sync.aligned;" ::: "memory");
#pragma unroll
        for (int t = 0; t < HEADS / 16; ++t) wgmma_f16_n8(hs, ra + 4 * t, hs_desc(hb + 256 * t), t > 0);
        asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory");
        asm volatile("wgmma.wait_group.sync.aligned 0;" ::: "memory");
#pragma unroll
        for (int j = 0; j < 4; ++j) asm volatile("" : "+f"(hs[j])::"memory");
        // Lane c = 0 holds columns 0, 1 (row r0 and r1 by hi and lo), lane c = 1 columns 2, 3 (the same).
        float v = 2.f * (mine1 ? hs[2] + hs[3] : hs[0] + hs[1]);
        v = mma && col < row_len[i] ? v * f * row_g[i] : -__int_as_float(0x7f800000);
        if (job.z >= 0 && c < 2 && col < width) store_logit(row_out + i * stride_out + col, v);
    };

#if MMA_ROWS > 1
    // Epilogue of next_n rows i0 .. i0 + MMA_ROWS - 1 (one wgmma group): each row's relu(S) (f16x2) and
    // its head-sum wgmma issued, all rows' head sums under one commit and one wait (finish_row waits twice
    // per row). Same numerics as finish_row.
    auto finish_group = [&](int i0, const int4& job, float f) {
        const bool mma = job.z >= 0 && job.x >= 0;
        const int col = job.z * PAGE + my_row;
        asm volatile("wgmma.wait_group.sync.aligned 0;" ::: "memory");
#pragma unroll
        for (int j = 0; j < MMA_N / 4; ++j) asm volatile("" : "+r"(acc[j])::"memory");
        float hs[MMA_ROWS][4];
        u32 ra[MMA_ROWS][HEADS / 4];
#pragma unroll
        for (int k = 0; k < MMA_ROWS; ++k)
#pragma unroll
            for (int j = 0; j < HEADS / 4; ++j)
                asm("max.f16x2 %0, %1, %2;" : "=r"(ra[k][j]) : "r"(acc[k * (HEADS / 4) + j]), "r"(0u));
        asm volatile("wgmma.fence.sync.aligned;" ::: "memory");
#pragma unroll
        for (int k = 0; k < MMA_ROWS; ++k) {
            const u32 hb = smem_u32(hs_smem) + (i0 + k) * HS_BYTES;
#pragma unroll
            for (int t = 0; t < HEADS / 16; ++t) wgmma_f16_n8(hs[k], ra[k] + 4 * t, hs_desc(hb + 256 * t), t > 0);
        }
        asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory");
        asm volatile("wgmma.wait_group.sync.aligned 0;" ::: "memory");
#pragma unroll
        for (int k = 0; k < MMA_ROWS; ++k) {
#pragma unroll
            for (int j = 0; j < 4; ++j) asm volatile("" : "+f"(hs[k][j])::"memory");
            float v = 2.f * (mine1 ? hs[k][2] + hs[k][3] : hs[k][0] + hs[k][1]);
            v = mma && col < row_len[i0 + k] ? v * f * row_g[i0 + k] : -__int_as_float(0x7f800000);
            if (job.z >= 0 && c < 2 && col < width) store_logit(row_out + (i0 + k) * stride_out + col, v);
        }
    };
#define FINISH_GROUP(i0) finish_group(i0, job, f)
#else
#define FINISH_GROUP(i0)                                                       \
    _Pragma("unroll") for (int k = 0; k < MMA_ROWS; ++k) finish_row((i0) + k, job, f)
#endif

    // The request's last job writes -inf over the rest of its rows.
    auto fill_tail = [&](const int4& job) {
        if (job.w < 0 || !clean_tail) return;
        const float ninf = -__int_as_float(0x7f800000);
        for (int i = 0; i < NEXT_N; ++i) {
            out_t* row = row_out + i * stride_out;
            for (int cc = job.w + tid; cc < width; cc += MATH_THREADS) store_logit(row + cc, ninf);
        }
    };

    // Every job goes through the same wgmma code, valid page or not (the stores are masked instead): a
    // wgmma under a branch makes ptxas serialize all of them (its warning C7518). Job n + 1's slot is
    // read after job n's last wgmma and epilogue.
    Slot next;
    acquire(next);
    while (next.job.y >= 0) {
        const int4 job = next.job;
        if (job.y != cur_b) {
            cur_b = job.y;
            load_request(cur_b);  // no wgmma is in flight here
        }
        Frag fr;
        float f;
        decode(next, fr, f);
#pragma unroll
        for (int i = 0; i + MMA_ROWS < NEXT_N; i += MMA_ROWS) {
            issue_row(i, fr);
            FINISH_GROUP(i);
        }
        issue_row(NEXT_N - MMA_ROWS, fr);
        FINISH_GROUP(NEXT_N - MMA_ROWS);
        acquire(next);
        fill_tail(job);
    }
}
