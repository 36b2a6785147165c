// Host launcher of DeepGEMM's SM90 FP8 paged MQA-logits kernel, the newer form that takes next_n 4 on a
// cluster of two CTAs (template parameter kNumKVMulticast), for the benchmark peer
// "deepgemm-fp8-sm90-multicast" only (nothing the plugin serves with uses it).
//
// The kernel itself is DeepGEMM's header deep_gemm/impls/sm90_fp8_paged_mqa_logits.cuh as the vLLM 0.34.0
// wheel ships it; it is not in this repository: scripts/pack_deepgemm_multicast.sh packs its include tree,
// scripts/gpu_run.sh unpacks it and names it in $SGLANG_FP4_INDEXER_DEEPGEMM_SM90_INCLUDE. This file is the
// project's own launcher, written from the header's template parameters and kernel signature:
// ops/deepgemm_sm90_paged.py compiles it with nvcc into one shared library per (next_n, heads) (-DDGMC_NEXT_N,
// -DDGMC_HEADS) and calls it through ctypes with a flat array of 64-bit arguments (enum Arg below; the Python
// module's ARG_NAMES lists the same names in the same order, and a test compares the two).
//
// What the kernel assumes and this file checks, at compile time (static_assert) or per call (an error
// message, returned; never a launch that could hang on a transaction count):
//   * 128-dim e4m3 queries and keys, 64-token pages in SGLang's FP8 index layout (per page 64 x 128 e4m3
//     bytes, then 64 fp32 scales: 132 B per token), 2-D context lengths int32 [B, next_n] (the kernel
//     reads the last row's), int32 block table, fp32 weights [B * next_n, H], fp32 logits;
//   * 4 math warpgroups of 64-token compute blocks (SPLIT_KV = 256 tokens per schedule unit), one TMA
//     warpgroup, 3 query and 3 KV pipeline stages, registers 104 (math) / 64 (TMA) after setmaxnreg;
//   * a cluster of kNumKVMulticast CTAs per schedule entry (2 at next_n 4, else 1): each CTA scores
//     next_n / kNumKVMulticast query rows of the same request against the same pages; grid = clusters x
//     kNumKVMulticast CTAs; schedule int32 [clusters + 1, 2] (ops/deepgemm_sm90_paged.plan_schedule);
//   * TMA boxes whose bytes equal the transaction counts the kernel expects per stage (checked below),
//     128-byte swizzle on the query and key tiles (the WGMMA descriptors' B128 layout), none on the
//     scales and weights; shared memory laid out as the header lays it out (kSmemBytes);
//   * logits rows padded to a multiple of 256 columns at least as wide as the longest context rounded up
//     to 256 (the kernel writes whole 64-token blocks of every 256-token split it visits).

#include <cuda.h>
#include <cuda_runtime.h>

#include <cstdarg>
#include <cstdint>
#include <cstdio>

#include <deep_gemm/impls/sm90_fp8_paged_mqa_logits.cuh>

#ifndef DGMC_NEXT_N
#error "DGMC_NEXT_N (query rows per request: 1, 2 or 4) must be defined"
#endif
#ifndef DGMC_HEADS
#error "DGMC_HEADS (index heads: 32 or 64) must be defined"
#endif
#ifndef DGMC_KV_MULTICAST
#define DGMC_KV_MULTICAST (DGMC_NEXT_N == 4 ? 2 : 1)
#endif

namespace {

constexpr uint32_t kNextN = DGMC_NEXT_N;
constexpr uint32_t kHeads = DGMC_HEADS;
constexpr uint32_t kKVMulticast = DGMC_KV_MULTICAST;
constexpr uint32_t kHeadDim = 128;
constexpr uint32_t kPageTokens = 64;       // BLOCK_KV: tokens per cache page
constexpr uint32_t kComputeBlockKV = 64;   // the kernel's fixed compute block (one WGMMA M)
constexpr uint32_t kMathWarpGroups = 4;
constexpr uint32_t kSplitKV = kComputeBlockKV * kMathWarpGroups;  // tokens per schedule unit
constexpr uint32_t kQStages = 3, kKVStages = 3;
constexpr uint32_t kTMAThreads = 128, kMathThreads = 128 * kMathWarpGroups;
constexpr uint32_t kThreads = kTMAThreads + kMathThreads;
constexpr uint32_t kNextNPerCTA = kNextN / kKVMulticast;
constexpr uint32_t kTokenBytes = kHeadDim + 4;      // e4m3 values + one fp32 scale
constexpr uint32_t kPageValueBytes = kPageTokens * kHeadDim;  // the scales follow at this offset in a page
constexpr uint32_t kPageBytes = kPageTokens * kTokenBytes;    // 8448

static_assert(kNextN == 1 or kNextN == 2 or kNextN == 4, "the SM90 kernel takes next_n 1, 2 or 4");
static_assert(kKVMulticast == 1 or kKVMulticast == 2, "clusters of 1 or 2 CTAs");
static_assert(kNextN % kKVMulticast == 0, "each CTA of a cluster takes a whole share of the next_n rows");
static_assert(kHeads % 8 == 0 and 128 % kHeads == 0, "heads: 8, 16, 32, 64 or 128");
static_assert(kNextNPerCTA * kHeads <= 128,
              "WGMMA N = rows per CTA x heads above 128 does not fit the math threads' 104 registers");
static_assert(kComputeBlockKV % kPageTokens == 0 and kComputeBlockKV / kPageTokens == 1,
              "one page per compute block (the kernel's TMA byte count assumes BLOCK_KV = 64)");

constexpr uint32_t align_up(uint32_t x, uint32_t a) { return (x + a - 1) / a * a; }
constexpr uint64_t align_up64(uint64_t x, uint64_t a) { return (x + a - 1) / a * a; }

// The header's shared-memory layout, recomputed from its formulas (sm90_fp8_paged_mqa_logits.cuh,
// "Shared memory configs"): the query pipe (stages of queries and weights, then the query barriers), then
// one KV pipe per math warpgroup (stages of keys and scales, then the KV barriers).
constexpr uint32_t kSwizzleAlign = kHeadDim * 8;                         // 1024
constexpr uint32_t kSmemQStage = kNextNPerCTA * kHeads * kHeadDim;        // e4m3 bytes
constexpr uint32_t kSmemWeightStage = kNextNPerCTA * kHeads * 4;          // fp32 bytes
constexpr uint32_t kSmemQPipe = kQStages * (kSmemQStage + align_up(kSmemWeightStage, kSwizzleAlign)) +
                                align_up(kQStages * 8 * 2, kSwizzleAlign);
constexpr uint32_t kSmemKVStage = kComputeBlockKV * kHeadDim;
constexpr uint32_t kSmemScaleStage = kComputeBlockKV * 4;
constexpr uint32_t kSmemKVPipe = kKVStages * (kSmemKVStage + align_up(kSmemScaleStage, kSwizzleAlign)) +
                                 align_up(kKVStages * 8 * 2, kSwizzleAlign);
constexpr uint32_t kSmemBytes = kSmemQPipe + kMathWarpGroups * kSmemKVPipe;
static_assert(kSmemQStage % kSwizzleAlign == 0 and kSmemKVStage % kSwizzleAlign == 0 and
              kSmemQPipe % kSwizzleAlign == 0 and kSmemKVPipe % kSwizzleAlign == 0,
              "every swizzled tile starts on a 1024-byte atom");
static_assert(kSmemBytes <= 227 * 1024, "above Hopper's 227 KB of shared memory per CTA");

// TMA boxes (innermost first) and their bytes against the transaction counts the kernel expects.
constexpr uint32_t kQBox[2] = {kHeadDim, kNextNPerCTA * kHeads};         // e4m3
constexpr uint32_t kWeightBox[2] = {kHeads, kNextNPerCTA};               // fp32
constexpr uint32_t kKVBox[3] = {kHeadDim, kPageTokens, 1};               // e4m3
constexpr uint32_t kScaleBox[2] = {kPageTokens, 1};                      // fp32
static_assert(kQBox[0] * kQBox[1] == kSmemQStage, "query box != the query stage's bytes");
static_assert(kWeightBox[0] * kWeightBox[1] * 4 == kSmemWeightStage, "weight box != the weight stage's bytes");
static_assert(kKVBox[0] * kKVBox[1] * kKVBox[2] == kSmemKVStage, "key box != the KV stage's bytes");
static_assert(kScaleBox[0] * kScaleBox[1] * 4 == kSmemScaleStage, "scale box != the scale stage's bytes");
static_assert(kQBox[1] <= 256 and kWeightBox[0] <= 256 and kKVBox[1] <= 256 and kScaleBox[0] <= 256,
              "a TMA box side is at most 256 elements");
static_assert(kHeadDim == 128, "128-byte swizzle: the query and key rows are exactly 128 bytes");
static_assert((kWeightBox[0] * 4) % 16 == 0 and (kScaleBox[0] * 4) % 16 == 0,
              "an unswizzled box's inner side is a multiple of 16 bytes");

constexpr auto kKernel = &deep_gemm::sm90_fp8_paged_mqa_logits<
    kNextN, kHeads, kHeadDim, kPageTokens,
    /*kIsContextLens2D=*/true, /*kIsVarlen=*/false,
    kQStages, kKVStages, kSplitKV,
    kTMAThreads, kMathThreads,
    kKVMulticast, float>;

// The call's arguments, one uint64 each, in this order (ops/deepgemm_sm90_paged.py ARG_NAMES).
enum Arg : int {
    kArgVersion = 0,      // ARG_VERSION of the Python side
    kArgNextN,            // query rows per request
    kArgHeads,            // index heads
    kArgBatch,            // requests
    kArgQ,                // e4m3 [batch * next_n * heads, 128], rows 128 bytes apart
    kArgKVCache,          // uint8 [num_pages, page_stride_bytes]: per page 64 x 128 e4m3, then 64 fp32 scales
    kArgNumPages,
    kArgPageStrideBytes,
    kArgWeights,          // fp32 [batch * next_n, heads]
    kArgWeightsRowStride, // in floats
    kArgContextLens,      // int32 [batch, next_n], contiguous
    kArgBlockTable,       // int32 [batch, block_table_cols]
    kArgBlockTableStride, // in int32
    kArgBlockTableCols,
    kArgSchedule,         // int32 [num_clusters + 1, 2], contiguous
    kArgNumClusters,
    kArgLogits,           // fp32 [batch * next_n, logits_stride]
    kArgLogitsStride,     // in floats, a multiple of 256
    kArgMaxContext,       // the longest context length (the last row's), in tokens
    kArgStream,           // cudaStream_t
    kArgSmemBytes,        // the Python side's smem_bytes(next_n, heads), compared with kSmemBytes
    kArgCount
};
constexpr uint64_t kArgVersionValue = 1;

// Info fields (dgmc_info), in this order (ops/deepgemm_sm90_paged.py INFO_NAMES).
enum Info : int {
    kInfoNextN = 0, kInfoHeads, kInfoKVMulticast, kInfoSmemBytes, kInfoThreads, kInfoSplitKV,
    kInfoNumRegs, kInfoStaticSmem, kInfoLocalBytes, kInfoMaxActiveClusters, kInfoCount
};

int fail(char* err, int err_len, const char* fmt, ...) {
    if (err != nullptr and err_len > 0) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(err, static_cast<size_t>(err_len), fmt, ap);
        va_end(ap);
    }
    return 1;
}

#define DGMC_CHECK(cond, ...) do { if (not (cond)) return fail(err, err_len, __VA_ARGS__); } while (0)
#define DGMC_CUDA(call) do { const cudaError_t e_ = (call); \
    if (e_ != cudaSuccess) return fail(err, err_len, "%s failed: %s", #call, cudaGetErrorString(e_)); } while (0)

using EncodeTiled = CUresult (*)(CUtensorMap*, CUtensorMapDataType, cuuint32_t, void*, const cuuint64_t*,
                                 const cuuint64_t*, const cuuint32_t*, const cuuint32_t*, CUtensorMapInterleave,
                                 CUtensorMapSwizzle, CUtensorMapL2promotion, CUtensorMapFloatOOBfill);

int encode_tiled(char* err, int err_len, CUtensorMap* map, CUtensorMapDataType dtype, uint32_t rank,
                 const void* base, const uint64_t* dims, const uint64_t* strides_bytes, const uint32_t* box,
                 CUtensorMapSwizzle swizzle, const char* what) {
    static EncodeTiled encode = nullptr;
    if (encode == nullptr) {
        void* fn = nullptr;
        cudaDriverEntryPointQueryResult found = cudaDriverEntryPointSymbolNotFound;
        DGMC_CUDA(cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &fn, 12000, cudaEnableDefault, &found));
        DGMC_CHECK(fn != nullptr and found == cudaDriverEntryPointSuccess,
                   "the driver has no cuTensorMapEncodeTiled (CUDA 12.0 or later is needed)");
        encode = reinterpret_cast<EncodeTiled>(fn);
    }
    DGMC_CHECK(reinterpret_cast<uintptr_t>(base) % 16 == 0, "%s: base address not 16-byte aligned", what);
    for (uint32_t i = 0; i + 1 < rank; ++i)
        DGMC_CHECK(strides_bytes[i] % 16 == 0 and strides_bytes[i] < (1ull << 40),
                   "%s: stride %u (%llu bytes) not a multiple of 16 below 2**40", what, i,
                   static_cast<unsigned long long>(strides_bytes[i]));
    for (uint32_t i = 0; i < rank; ++i)
        DGMC_CHECK(dims[i] >= 1 and dims[i] <= (1ull << 32) and box[i] >= 1 and box[i] <= 256 and box[i] <= dims[i],
                   "%s: dimension %u is %llu with a box of %u (need 1 <= box <= min(256, dim), dim <= 2**32)",
                   what, i, static_cast<unsigned long long>(dims[i]), box[i]);
    cuuint64_t d[5], s[4];
    cuuint32_t b[5], e[5];
    for (uint32_t i = 0; i < rank; ++i) d[i] = dims[i], b[i] = box[i], e[i] = 1;
    for (uint32_t i = 0; i + 1 < rank; ++i) s[i] = strides_bytes[i];
    const CUresult r = encode(map, dtype, rank, const_cast<void*>(base), d, s, b, e, CU_TENSOR_MAP_INTERLEAVE_NONE,
                              swizzle, CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
    DGMC_CHECK(r == CUDA_SUCCESS, "cuTensorMapEncodeTiled(%s) failed with CUresult %d", what, static_cast<int>(r));
    return 0;
}

// A launch of `clusters` clusters of kKVMulticast CTAs on `stream`; `attr` holds the cluster dimension.
cudaLaunchConfig_t launch_config(cudaLaunchAttribute* attr, uint64_t clusters, cudaStream_t stream) {
    attr[0].id = cudaLaunchAttributeClusterDimension;
    attr[0].val.clusterDim.x = kKVMulticast, attr[0].val.clusterDim.y = 1, attr[0].val.clusterDim.z = 1;
    cudaLaunchConfig_t config{};
    config.gridDim = dim3(static_cast<unsigned>(clusters * kKVMulticast), 1, 1);
    config.blockDim = dim3(kThreads, 1, 1);
    config.dynamicSmemBytes = kSmemBytes;
    config.stream = stream;
    config.attrs = attr, config.numAttrs = 1;
    return config;
}

// Per-device set-up, once: the device is sm_90, the kernel's shared memory is allowed, a cluster fits.
constexpr int kMaxDevices = 64;
int g_ready[kMaxDevices] = {0};
int g_max_active_clusters[kMaxDevices] = {0};

int prepare_device(char* err, int err_len, int* device_out) {
    int device = 0;
    DGMC_CUDA(cudaGetDevice(&device));
    DGMC_CHECK(device >= 0 and device < kMaxDevices, "device %d: above the launcher's %d devices", device, kMaxDevices);
    *device_out = device;
    if (g_ready[device])
        return 0;
    int major = 0, minor = 0, optin = 0;
    DGMC_CUDA(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device));
    DGMC_CUDA(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device));
    DGMC_CHECK(major == 9 and minor == 0, "device %d is sm_%d%d; this kernel is built for sm_90a", device, major,
               minor);
    DGMC_CUDA(cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, device));
    DGMC_CUDA(cudaFuncSetAttribute(kKernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(kSmemBytes)));
    cudaFuncAttributes attrs{};
    DGMC_CUDA(cudaFuncGetAttributes(&attrs, kKernel));
    DGMC_CHECK(attrs.sharedSizeBytes + kSmemBytes <= static_cast<size_t>(optin),
               "%zu B static + %u B dynamic shared memory exceed the device's %d B per block", attrs.sharedSizeBytes,
               kSmemBytes, optin);
    DGMC_CHECK(attrs.maxThreadsPerBlock >= static_cast<int>(kThreads),
               "the kernel can run only %d threads per block (%d registers each); it needs %u",
               attrs.maxThreadsPerBlock, attrs.numRegs, kThreads);
    cudaLaunchAttribute attr[1];
    const cudaLaunchConfig_t config = launch_config(attr, 1, nullptr);
    int clusters = 0;
    DGMC_CUDA(cudaOccupancyMaxActiveClusters(&clusters, kKernel, &config));
    DGMC_CHECK(clusters >= 1, "no cluster of %u CTAs of %u threads and %u B shared memory fits the device",
               kKVMulticast, kThreads, kSmemBytes);
    g_max_active_clusters[device] = clusters;
    g_ready[device] = 1;
    return 0;
}

}  // namespace

extern "C" {

// Fills out[0 .. kInfoCount) (Info order) for the current device, after its one-time set-up.
// Returns 0, or 1 with a message in err.
int dgmc_info(uint64_t* out, int count, char* err, int err_len) {
    DGMC_CHECK(out != nullptr and count == kInfoCount, "info: expected %d fields, got %d", kInfoCount, count);
    int device = 0;
    if (prepare_device(err, err_len, &device) != 0)
        return 1;
    cudaFuncAttributes attrs{};
    DGMC_CUDA(cudaFuncGetAttributes(&attrs, kKernel));
    out[kInfoNextN] = kNextN, out[kInfoHeads] = kHeads, out[kInfoKVMulticast] = kKVMulticast;
    out[kInfoSmemBytes] = kSmemBytes, out[kInfoThreads] = kThreads, out[kInfoSplitKV] = kSplitKV;
    out[kInfoNumRegs] = static_cast<uint64_t>(attrs.numRegs);
    out[kInfoStaticSmem] = attrs.sharedSizeBytes, out[kInfoLocalBytes] = attrs.localSizeBytes;
    out[kInfoMaxActiveClusters] = static_cast<uint64_t>(g_max_active_clusters[device]);
    return 0;
}

// Launches the kernel once on args[kArgStream] (Arg order). Returns 0, or 1 with a message in err and
// nothing launched. Reads no device memory (capturable in a CUDA graph).
int dgmc_launch(const uint64_t* args, int count, char* err, int err_len) {
    DGMC_CHECK(args != nullptr and count == kArgCount, "launch: expected %d arguments, got %d", kArgCount, count);
    DGMC_CHECK(args[kArgVersion] == kArgVersionValue, "launch: argument layout %llu, this library has %llu",
               static_cast<unsigned long long>(args[kArgVersion]), static_cast<unsigned long long>(kArgVersionValue));
    DGMC_CHECK(args[kArgNextN] == kNextN and args[kArgHeads] == kHeads,
               "launch: next_n %llu, heads %llu given to the library built for next_n %u, heads %u",
               static_cast<unsigned long long>(args[kArgNextN]), static_cast<unsigned long long>(args[kArgHeads]),
               kNextN, kHeads);
    DGMC_CHECK(args[kArgSmemBytes] == kSmemBytes, "launch: the Python layout says %llu B of shared memory, the "
               "header's formulas %u B", static_cast<unsigned long long>(args[kArgSmemBytes]), kSmemBytes);
    const uint64_t batch = args[kArgBatch], num_pages = args[kArgNumPages];
    const uint64_t rows = batch * kNextN;
    DGMC_CHECK(batch >= 1 and rows * kHeads < (1ull << 31), "launch: batch %llu (need 1 <= batch x next_n x heads "
               "< 2**31)", static_cast<unsigned long long>(batch));
    DGMC_CHECK(num_pages >= 1 and num_pages < (1ull << 31), "launch: %llu cache pages",
               static_cast<unsigned long long>(num_pages));
    const uint64_t page_stride = args[kArgPageStrideBytes];
    DGMC_CHECK(page_stride >= kPageBytes and page_stride % 16 == 0,
               "launch: a page stride of %llu bytes (need >= %u and a multiple of 16)",
               static_cast<unsigned long long>(page_stride), kPageBytes);
    const uint64_t w_stride = args[kArgWeightsRowStride];
    DGMC_CHECK(w_stride >= kHeads and (w_stride * 4) % 16 == 0, "launch: a weights row stride of %llu floats",
               static_cast<unsigned long long>(w_stride));
    const uint64_t bt_stride = args[kArgBlockTableStride], bt_cols = args[kArgBlockTableCols];
    DGMC_CHECK(bt_cols >= 1 and bt_stride >= bt_cols and bt_stride < (1ull << 32),
               "launch: block table of %llu columns, row stride %llu", static_cast<unsigned long long>(bt_cols),
               static_cast<unsigned long long>(bt_stride));
    const uint64_t logits_stride = args[kArgLogitsStride], max_context = args[kArgMaxContext];
    DGMC_CHECK(max_context >= 1 and max_context <= bt_cols * kPageTokens,
               "launch: longest context %llu tokens, the block table holds %llu",
               static_cast<unsigned long long>(max_context), static_cast<unsigned long long>(bt_cols * kPageTokens));
    DGMC_CHECK(logits_stride % kSplitKV == 0 and logits_stride >= align_up64(max_context, kSplitKV)
               and logits_stride < (1ull << 32),
               "launch: logits row stride %llu (need a multiple of %u, at least the longest context %llu rounded up "
               "to it)", static_cast<unsigned long long>(logits_stride), kSplitKV,
               static_cast<unsigned long long>(max_context));
    const uint64_t clusters = args[kArgNumClusters];
    DGMC_CHECK(clusters >= 1 and clusters * kKVMulticast < (1ull << 31), "launch: %llu clusters",
               static_cast<unsigned long long>(clusters));
    const void* q = reinterpret_cast<const void*>(args[kArgQ]);
    const uint8_t* kv = reinterpret_cast<const uint8_t*>(args[kArgKVCache]);
    const void* weights = reinterpret_cast<const void*>(args[kArgWeights]);
    const uint32_t* lens = reinterpret_cast<const uint32_t*>(args[kArgContextLens]);
    const uint32_t* table = reinterpret_cast<const uint32_t*>(args[kArgBlockTable]);
    const uint32_t* schedule = reinterpret_cast<const uint32_t*>(args[kArgSchedule]);
    float* logits = reinterpret_cast<float*>(args[kArgLogits]);
    DGMC_CHECK(q and kv and weights and lens and table and schedule and logits, "launch: a null pointer");
    DGMC_CHECK(reinterpret_cast<uintptr_t>(lens) % 4 == 0 and reinterpret_cast<uintptr_t>(table) % 4 == 0 and
               reinterpret_cast<uintptr_t>(logits) % 4 == 0 and reinterpret_cast<uintptr_t>(schedule) % 8 == 0,
               "launch: context lengths, block table and logits need 4-byte, the schedule 8-byte alignment");

    int device = 0;
    if (prepare_device(err, err_len, &device) != 0)
        return 1;

    CUtensorMap map_q, map_kv, map_scales, map_weights;
    {
        const uint64_t dims[2] = {kHeadDim, rows * kHeads}, strides[1] = {kHeadDim};
        if (encode_tiled(err, err_len, &map_q, CU_TENSOR_MAP_DATA_TYPE_UINT8, 2, q, dims, strides, kQBox,
                         CU_TENSOR_MAP_SWIZZLE_128B, "queries")) return 1;
    }
    {
        const uint64_t dims[3] = {kHeadDim, kPageTokens, num_pages}, strides[2] = {kHeadDim, page_stride};
        if (encode_tiled(err, err_len, &map_kv, CU_TENSOR_MAP_DATA_TYPE_UINT8, 3, kv, dims, strides, kKVBox,
                         CU_TENSOR_MAP_SWIZZLE_128B, "keys")) return 1;
    }
    {
        const uint64_t dims[2] = {kPageTokens, num_pages}, strides[1] = {page_stride};
        if (encode_tiled(err, err_len, &map_scales, CU_TENSOR_MAP_DATA_TYPE_FLOAT32, 2, kv + kPageValueBytes, dims,
                         strides, kScaleBox, CU_TENSOR_MAP_SWIZZLE_NONE, "key scales")) return 1;
    }
    {
        const uint64_t dims[2] = {kHeads, rows}, strides[1] = {w_stride * 4};
        if (encode_tiled(err, err_len, &map_weights, CU_TENSOR_MAP_DATA_TYPE_FLOAT32, 2, weights, dims, strides,
                         kWeightBox, CU_TENSOR_MAP_SWIZZLE_NONE, "weights")) return 1;
    }

    cudaLaunchAttribute attr[1];
    const cudaLaunchConfig_t config = launch_config(attr, clusters, reinterpret_cast<cudaStream_t>(args[kArgStream]));
    DGMC_CUDA(cudaLaunchKernelEx(&config, kKernel,
                                 static_cast<uint32_t>(batch), static_cast<uint32_t>(logits_stride),
                                 static_cast<uint32_t>(bt_stride), lens, logits, table,
                                 static_cast<const uint32_t*>(nullptr), schedule,
                                 map_q, map_kv, map_scales, map_weights));
    return 0;
}

}  // extern "C"
