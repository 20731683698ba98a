// softmax over each row of x (rows x cols, element strides sr, sc) into y (C-contiguous rows x cols).
//
// softmax_warp: one warp per row, three passes (max, sum of exp, normalize) with warp shuffles.
// softmax_online: one warp per row, a single pass keeping a running (max, rescaled sum) per lane, merged across
//   the warp, then the normalizing pass.
// softmax_block<BS>: one block of BS threads per row, block-wide reductions through shared memory (long rows).

#define SOFTMAX_PARAMS(T) const T* __restrict__ x, T* __restrict__ y, int rows, int cols, long long sr, long long sc
#define SOFTMAX_ARGS x, y, rows, cols, sr, sc

template <typename T>
__device__ __forceinline__ void softmax_warp(SOFTMAX_PARAMS(T)) {
    const int row = (int)((blockIdx.x * (long long)blockDim.x + threadIdx.x) >> 5);
    const int lane = threadIdx.x & 31;
    if (row >= rows) return;  // uniform across the warp: blockDim.x is a multiple of 32
    const T* xr = x + row * sr;
    T* yr = y + (long long)row * cols;
    float mx = neg_inf();
    for (int j = lane; j < cols; j += 32) mx = fmaxf(mx, load_f(xr + j * sc));
    mx = warp_max(mx);
    float sum = 0.0f;
    for (int j = lane; j < cols; j += 32) sum += expf(load_f(xr + j * sc) - mx);
    sum = warp_sum(sum);
    const float inv = 1.0f / sum;
    for (int j = lane; j < cols; j += 32) store_f(yr + j, expf(load_f(xr + j * sc) - mx) * inv);
}

// Merge running (max, sum) pairs; a lane that saw no element holds (-inf, 0).
__device__ __forceinline__ void online_merge(float& mx, float& sum, float mx2, float sum2) {
    const float top = fmaxf(mx, mx2);
    if (top == neg_inf()) return;
    const float a = mx == neg_inf() ? 0.0f : sum * expf(mx - top);
    const float b = mx2 == neg_inf() ? 0.0f : sum2 * expf(mx2 - top);
    mx = top;
    sum = a + b;
}

template <typename T>
__device__ __forceinline__ void softmax_online(SOFTMAX_PARAMS(T)) {
    const int row = (int)((blockIdx.x * (long long)blockDim.x + threadIdx.x) >> 5);
    const int lane = threadIdx.x & 31;
    if (row >= rows) return;
    const T* xr = x + row * sr;
    T* yr = y + (long long)row * cols;
    float mx = neg_inf(), sum = 0.0f;
    for (int j = lane; j < cols; j += 32) {
        const float v = load_f(xr + j * sc);
        if (v > mx) {
            sum = sum * expf(mx - v) + 1.0f;
            mx = v;
        } else {
            sum += expf(v - mx);
        }
    }
    for (int offset = 16; offset > 0; offset >>= 1) {
        const float mx2 = __shfl_xor_sync(0xffffffffu, mx, offset);
        const float sum2 = __shfl_xor_sync(0xffffffffu, sum, offset);
        online_merge(mx, sum, mx2, sum2);
    }
    const float inv = 1.0f / sum;
    for (int j = lane; j < cols; j += 32) store_f(yr + j, expf(load_f(xr + j * sc) - mx) * inv);
}

template <typename T, int BS>
__device__ __forceinline__ void softmax_block(SOFTMAX_PARAMS(T)) {
    __shared__ float scratch[33];
    const int row = blockIdx.x;
    if (row >= rows) return;  // uniform across the block
    const T* xr = x + row * sr;
    T* yr = y + (long long)row * cols;
    float mx = neg_inf();
    for (int j = threadIdx.x; j < cols; j += BS) mx = fmaxf(mx, load_f(xr + j * sc));
    mx = block_reduce<true>(mx, scratch);
    float sum = 0.0f;
    for (int j = threadIdx.x; j < cols; j += BS) sum += expf(load_f(xr + j * sc) - mx);
    sum = block_reduce<false>(sum, scratch);
    const float inv = 1.0f / sum;
    for (int j = threadIdx.x; j < cols; j += BS) store_f(yr + j, expf(load_f(xr + j * sc) - mx) * inv);
}

#define SOFTMAX(NAME, CALL, THREADS)                                                                       \
    extern "C" __global__ void __launch_bounds__(THREADS) NAME##_f32(SOFTMAX_PARAMS(float)) {               \
        CALL<float>(SOFTMAX_ARGS);                                                                         \
    }                                                                                                      \
    extern "C" __global__ void __launch_bounds__(THREADS) NAME##_f16(SOFTMAX_PARAMS(half_t)) {              \
        CALL<half_t>(SOFTMAX_ARGS);                                                                        \
    }

#define SOFTMAX_BLOCK(NAME, BS)                                                                            \
    extern "C" __global__ void __launch_bounds__(BS) NAME##_f32(SOFTMAX_PARAMS(float)) {                    \
        softmax_block<float, BS>(SOFTMAX_ARGS);                                                            \
    }                                                                                                      \
    extern "C" __global__ void __launch_bounds__(BS) NAME##_f16(SOFTMAX_PARAMS(half_t)) {                   \
        softmax_block<half_t, BS>(SOFTMAX_ARGS);                                                           \
    }

#ifndef SOFTMAX_BS  // a space variant compiles only its own entry points
SOFTMAX(softmax_warp, softmax_warp, 1024)
SOFTMAX(softmax_online, softmax_online, 1024)
SOFTMAX_BLOCK(softmax_block128, 128)
SOFTMAX_BLOCK(softmax_block256, 256)
SOFTMAX_BLOCK(softmax_block512, 512)
#else
// The block space: -DSOFTMAX_BS=threads per row (a multiple of 32). No __launch_bounds__: the compile stage
// judges the cubin's resources.
extern "C" __global__ void softmax_space_f32(SOFTMAX_PARAMS(float)) { softmax_block<float, SOFTMAX_BS>(SOFTMAX_ARGS); }
extern "C" __global__ void softmax_space_f16(SOFTMAX_PARAMS(half_t)) { softmax_block<half_t, SOFTMAX_BS>(SOFTMAX_ARGS); }
#endif
