// CTA-schedule planner (ops/schedule.py; format in its module docstring), one CTA.
//
// Tiles of request b: nb(b) = max(1, cdiv(max(len(b), 0), block_kv)), len(b) the
// largest of its next_n rows. An inclusive scan of nb over the requests goes to
// shared memory; CTA boundary i starts at flat tile s = floor(i * T / num_ctas)
// (T the total), in request #{b : incl[b] <= s} at key block s - incl[that - 1].
// The prefix is strictly increasing (nb >= 1), so each boundary is one binary
// search. Built by NVRTC for the device's own architecture (ops/nvrtc.py).

typedef long long i64;

#define THREADS 1024

extern "C" __global__ void __launch_bounds__(THREADS) plan_paged_schedule(
    const int* __restrict__ lens, long long stride_b, long long stride_n, int batch, int next_n, int block_kv,
    int* __restrict__ out, int num_ctas) {
    extern __shared__ i64 incl[];  // [batch]
    __shared__ int warp_sums[THREADS / 32];
    __shared__ i64 carry;
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    if (tid == 0) carry = 0;
    __syncthreads();
    for (int base = 0; base < batch; base += THREADS) {
        const int b = base + tid;
        i64 v = 0;
        if (b < batch) {
            int m = 0;
            for (int i = 0; i < next_n; ++i) m = max(m, __ldg(lens + b * stride_b + i * stride_n));
            v = max(static_cast<i64>(1), (static_cast<i64>(m) + block_kv - 1) / block_kv);
        }
#pragma unroll
        for (int o = 1; o < 32; o <<= 1) {
            const i64 y = __shfl_up_sync(0xffffffffu, v, o);
            if (lane >= o) v += y;
        }
        if (lane == 31) warp_sums[warp] = static_cast<int>(v);  // a chunk's tiles fit in int
        __syncthreads();
        if (warp == 0) {
            int w = warp_sums[lane];
#pragma unroll
            for (int o = 1; o < 32; o <<= 1) {
                const int y = __shfl_up_sync(0xffffffffu, w, o);
                if (lane >= o) w += y;
            }
            warp_sums[lane] = w;  // inclusive over warps
        }
        __syncthreads();
        v += carry + (warp > 0 ? warp_sums[warp - 1] : 0);
        if (b < batch) incl[b] = v;
        __syncthreads();
        if (tid == THREADS - 1) carry = v;  // the last thread holds the running total (padding adds 0)
        __syncthreads();
    }
    const i64 total = carry;
    for (int i = tid; i <= num_ctas; i += THREADS) {
        const i64 s = (static_cast<i64>(i) * total) / num_ctas;
        int lo = 0, hi = batch;  // first b with incl[b] > s
        while (lo < hi) {
            const int mid = (lo + hi) >> 1;
            if (incl[mid] <= s) lo = mid + 1;
            else hi = mid;
        }
        out[2 * i] = lo;
        out[2 * i + 1] = static_cast<int>(s - (lo > 0 ? incl[lo - 1] : 0));
    }
}
