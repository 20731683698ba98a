// reduce_sum: y[o] = sum over i < len of x[o * s_out + i * s_in], for o < n_out (float accumulation).
// The Python side maps an axis of a 2-D array to (n_out, len, s_out, s_in) in element strides.
//
// reduce_tree<BS>: one block per output; per-thread partial sums, then a shared-memory tree (BS a power of 2).
// reduce_shuffle: one block of 256 per output; warp shuffles, then one warp combines the warps' sums.
// reduce_warp: one warp per output (short reductions, many outputs).
// reduce_serial: one thread per output, summing in order (coalesced when outputs are adjacent in memory).

#define REDUCE_PARAMS(T) const T* __restrict__ x, T* __restrict__ y, int n_out, int len, long long s_out, long long s_in
#define REDUCE_ARGS x, y, n_out, len, s_out, s_in

template <typename T, int BS>
__device__ __forceinline__ void reduce_tree(REDUCE_PARAMS(T)) {
    __shared__ float partial[BS];
    const int o = blockIdx.x;
    if (o >= n_out) return;  // uniform across the block
    const T* xo = x + o * s_out;
    float acc = 0.0f;
    for (int i = threadIdx.x; i < len; i += BS) acc += load_f(xo + i * s_in);
    partial[threadIdx.x] = acc;
    __syncthreads();
    for (int stride = BS / 2; stride > 0; stride >>= 1) {
        if (threadIdx.x < stride) partial[threadIdx.x] += partial[threadIdx.x + stride];
        __syncthreads();
    }
    if (threadIdx.x == 0) store_f(y + o, partial[0]);
}

template <typename T>
__device__ __forceinline__ void reduce_shuffle(REDUCE_PARAMS(T)) {
    __shared__ float scratch[33];
    const int o = blockIdx.x;
    if (o >= n_out) return;
    const T* xo = x + o * s_out;
    float acc = 0.0f;
    for (int i = threadIdx.x; i < len; i += blockDim.x) acc += load_f(xo + i * s_in);
    acc = block_reduce<false>(acc, scratch);
    if (threadIdx.x == 0) store_f(y + o, acc);
}

template <typename T>
__device__ __forceinline__ void reduce_warp(REDUCE_PARAMS(T)) {
    const int o = (int)((blockIdx.x * (long long)blockDim.x + threadIdx.x) >> 5);
    const int lane = threadIdx.x & 31;
    if (o >= n_out) return;  // uniform across the warp
    const T* xo = x + o * s_out;
    float acc = 0.0f;
    for (int i = lane; i < len; i += 32) acc += load_f(xo + i * s_in);
    acc = warp_sum(acc);
    if (lane == 0) store_f(y + o, acc);
}

template <typename T>
__device__ __forceinline__ void reduce_serial(REDUCE_PARAMS(T)) {
    const long long o = blockIdx.x * (long long)blockDim.x + threadIdx.x;
    if (o >= n_out) return;
    const T* xo = x + o * s_out;
    float acc = 0.0f;
    for (int i = 0; i < len; ++i) acc += load_f(xo + i * s_in);
    store_f(y + o, acc);
}

#define REDUCE(NAME, CALL, THREADS)                                                                        \
    extern "C" __global__ void __launch_bounds__(THREADS) NAME##_f32(REDUCE_PARAMS(float)) {                \
        CALL<float>(REDUCE_ARGS);                                                                          \
    }                                                                                                      \
    extern "C" __global__ void __launch_bounds__(THREADS) NAME##_f16(REDUCE_PARAMS(half_t)) {               \
        CALL<half_t>(REDUCE_ARGS);                                                                         \
    }

#define REDUCE_TREE(NAME, BS)                                                                              \
    extern "C" __global__ void __launch_bounds__(BS) NAME##_f32(REDUCE_PARAMS(float)) {                     \
        reduce_tree<float, BS>(REDUCE_ARGS);                                                               \
    }                                                                                                      \
    extern "C" __global__ void __launch_bounds__(BS) NAME##_f16(REDUCE_PARAMS(half_t)) {                    \
        reduce_tree<half_t, BS>(REDUCE_ARGS);                                                              \
    }

#ifndef REDUCE_BS  // a space variant compiles only its own entry points
REDUCE_TREE(reduce_tree128, 128)
REDUCE_TREE(reduce_tree256, 256)
REDUCE_TREE(reduce_tree512, 512)
REDUCE(reduce_shuffle, reduce_shuffle, 1024)
REDUCE(reduce_warp, reduce_warp, 1024)
REDUCE(reduce_serial, reduce_serial, 1024)
#else
// The tree space: -DREDUCE_BS=threads per block (a power of 2). No __launch_bounds__: the compile stage judges
// the cubin's resources.
extern "C" __global__ void reduce_space_f32(REDUCE_PARAMS(float)) { reduce_tree<float, REDUCE_BS>(REDUCE_ARGS); }
extern "C" __global__ void reduce_space_f16(REDUCE_PARAMS(half_t)) { reduce_tree<half_t, REDUCE_BS>(REDUCE_ARGS); }
#endif
