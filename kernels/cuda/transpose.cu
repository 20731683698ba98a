// transpose: out (C-contiguous cols x rows) = in^T, for in (rows x cols, element strides s0, s1). A pure copy,
// so elements are moved as their storage type: no conversion, bit-exact.
//
// transpose_naive: one thread per element; reads coalesced, writes strided by rows.
// transpose_tiled<TILE, ROWS, PAD>: a TILE x TILE tile staged in shared memory by a TILE x ROWS block, so both the
//   read and the write are coalesced. PAD = 1 shifts each tile row by one bank, so the column-wise read of the
//   tile is free of bank conflicts; PAD = 0 keeps the conflicts (a real, slower variant).

#define TRANSPOSE_PARAMS(T) const T* __restrict__ in, T* __restrict__ out, int rows, int cols, long long s0, long long s1
#define TRANSPOSE_ARGS in, out, rows, cols, s0, s1

template <typename T>
__device__ __forceinline__ void transpose_naive(TRANSPOSE_PARAMS(T)) {
    const int c = blockIdx.x * blockDim.x + threadIdx.x;
    const int r = blockIdx.y * blockDim.y + threadIdx.y;
    if (r < rows && c < cols) out[(long long)c * rows + r] = in[r * s0 + c * s1];
}

template <typename T, int TILE, int ROWS, int PAD>
__device__ __forceinline__ void transpose_tiled(TRANSPOSE_PARAMS(T)) {
    __shared__ T tile[TILE][TILE + PAD];
    const int c0 = blockIdx.x * TILE, r0 = blockIdx.y * TILE;
    const int tx = threadIdx.x, ty = threadIdx.y;
    for (int j = ty; j < TILE; j += ROWS) {
        const int r = r0 + j, c = c0 + tx;
        if (r < rows && c < cols) tile[j][tx] = in[r * s0 + c * s1];
    }
    __syncthreads();
    for (int j = ty; j < TILE; j += ROWS) {
        const int c = c0 + j, r = r0 + tx;  // output row c, output column r
        if (c < cols && r < rows) out[(long long)c * rows + r] = tile[tx][j];
    }
}

#define TRANSPOSE_NAIVE(NAME)                                                                              \
    extern "C" __global__ void NAME##_f16(TRANSPOSE_PARAMS(half_t)) { transpose_naive<half_t>(TRANSPOSE_ARGS); } \
    extern "C" __global__ void NAME##_f32(TRANSPOSE_PARAMS(float)) { transpose_naive<float>(TRANSPOSE_ARGS); }    \
    extern "C" __global__ void NAME##_f64(TRANSPOSE_PARAMS(double)) { transpose_naive<double>(TRANSPOSE_ARGS); }

#define TRANSPOSE_TILED(NAME, TILE, ROWS, PAD)                                                             \
    extern "C" __global__ void __launch_bounds__(TILE * ROWS) NAME##_f16(TRANSPOSE_PARAMS(half_t)) {        \
        transpose_tiled<half_t, TILE, ROWS, PAD>(TRANSPOSE_ARGS);                                          \
    }                                                                                                      \
    extern "C" __global__ void __launch_bounds__(TILE * ROWS) NAME##_f32(TRANSPOSE_PARAMS(float)) {         \
        transpose_tiled<float, TILE, ROWS, PAD>(TRANSPOSE_ARGS);                                           \
    }                                                                                                      \
    extern "C" __global__ void __launch_bounds__(TILE * ROWS) NAME##_f64(TRANSPOSE_PARAMS(double)) {        \
        transpose_tiled<double, TILE, ROWS, PAD>(TRANSPOSE_ARGS);                                          \
    }

#ifndef TRANSPOSE_TILE  // a space variant compiles only its own entry points
TRANSPOSE_NAIVE(transpose_naive)
TRANSPOSE_TILED(transpose_tiled32, 32, 8, 1)
TRANSPOSE_TILED(transpose_tiled32_nopad, 32, 8, 0)
TRANSPOSE_TILED(transpose_tiled16, 16, 16, 1)
TRANSPOSE_TILED(transpose_tiled64, 64, 8, 1)
#else
// The tiles space: -DTRANSPOSE_TILE=T -DTRANSPOSE_ROWS=R -DTRANSPOSE_PAD=P, block T x R. No __launch_bounds__:
// the compile stage judges registers and shared memory from the cubin.
extern "C" __global__ void transpose_space_f16(TRANSPOSE_PARAMS(half_t)) {
    transpose_tiled<half_t, TRANSPOSE_TILE, TRANSPOSE_ROWS, TRANSPOSE_PAD>(TRANSPOSE_ARGS);
}
extern "C" __global__ void transpose_space_f32(TRANSPOSE_PARAMS(float)) {
    transpose_tiled<float, TRANSPOSE_TILE, TRANSPOSE_ROWS, TRANSPOSE_PAD>(TRANSPOSE_ARGS);
}
extern "C" __global__ void transpose_space_f64(TRANSPOSE_PARAMS(double)) {
    transpose_tiled<double, TRANSPOSE_TILE, TRANSPOSE_ROWS, TRANSPOSE_PAD>(TRANSPOSE_ARGS);
}
#endif
