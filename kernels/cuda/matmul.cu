// matmul: C[m, n] = A[m, k] @ B[k, n], float accumulation. Operands are addressed with element strides
// (sa_m, sa_k, sb_k, sb_n, sc_m, sc_n), so transposed and strided views run without a copy.
//
// gemm_tiled<TILE>: block TILE x TILE, one output per thread; TILE x TILE tiles of A and B staged in shared memory.
// gemm_coarse<TILE, CO>: block TILE x (TILE / CO); each thread computes CO outputs of one column (thread
// coarsening: each B value read from shared memory feeds CO multiply-adds).

#define GEMM_PARAMS(T) \
    const T* __restrict__ A, const T* __restrict__ B, T* __restrict__ C, int m, int n, int k, \
    long long sa_m, long long sa_k, long long sb_k, long long sb_n, long long sc_m, long long sc_n
#define GEMM_ARGS A, B, C, m, n, k, sa_m, sa_k, sb_k, sb_n, sc_m, sc_n

template <typename T, int TILE>
__device__ __forceinline__ void gemm_tiled(GEMM_PARAMS(T)) {
    __shared__ float As[TILE][TILE];
    __shared__ float Bs[TILE][TILE + 1];
    const int tx = threadIdx.x, ty = threadIdx.y;
    const int row = blockIdx.y * TILE + ty;
    const int col = blockIdx.x * TILE + tx;
    float acc = 0.0f;
    for (int t = 0; t < k; t += TILE) {
        const int ak = t + tx, bk = t + ty;
        As[ty][tx] = (row < m && ak < k) ? load_f(A + row * sa_m + ak * sa_k) : 0.0f;
        Bs[ty][tx] = (bk < k && col < n) ? load_f(B + bk * sb_k + col * sb_n) : 0.0f;
        __syncthreads();
#pragma unroll
        for (int i = 0; i < TILE; ++i) acc += As[ty][i] * Bs[i][tx];
        __syncthreads();
    }
    if (row < m && col < n) store_f(C + row * sc_m + col * sc_n, acc);
}

template <typename T, int TILE, int CO>
__device__ __forceinline__ void gemm_coarse(GEMM_PARAMS(T)) {
    constexpr int ROWS = TILE / CO;  // blockDim.y
    __shared__ float As[TILE][TILE];
    __shared__ float Bs[TILE][TILE + 1];
    const int tx = threadIdx.x, ty = threadIdx.y;
    const int row0 = blockIdx.y * TILE + ty;
    const int col = blockIdx.x * TILE + tx;
    float acc[CO];
#pragma unroll
    for (int j = 0; j < CO; ++j) acc[j] = 0.0f;
    for (int t = 0; t < k; t += TILE) {
#pragma unroll
        for (int j = 0; j < CO; ++j) {
            const int tr = ty + j * ROWS;  // row of the tile this thread stages
            const int r = row0 + j * ROWS;
            const int ak = t + tx, bk = t + tr;
            As[tr][tx] = (r < m && ak < k) ? load_f(A + r * sa_m + ak * sa_k) : 0.0f;
            Bs[tr][tx] = (bk < k && col < n) ? load_f(B + bk * sb_k + col * sb_n) : 0.0f;
        }
        __syncthreads();
#pragma unroll 8
        for (int i = 0; i < TILE; ++i) {
            const float b = Bs[i][tx];
#pragma unroll
            for (int j = 0; j < CO; ++j) acc[j] += As[ty + j * ROWS][i] * b;
        }
        __syncthreads();
    }
#pragma unroll
    for (int j = 0; j < CO; ++j) {
        const int r = row0 + j * ROWS;
        if (r < m && col < n) store_f(C + r * sc_m + col * sc_n, acc[j]);
    }
}

#define TILED(NAME, TILE)                                                                                  \
    extern "C" __global__ void __launch_bounds__(TILE * TILE) NAME##_f32(GEMM_PARAMS(float)) {               \
        gemm_tiled<float, TILE>(GEMM_ARGS);                                                                \
    }                                                                                                      \
    extern "C" __global__ void __launch_bounds__(TILE * TILE) NAME##_f16(GEMM_PARAMS(half_t)) {              \
        gemm_tiled<half_t, TILE>(GEMM_ARGS);                                                               \
    }

#define COARSE(NAME, TILE, CO)                                                                             \
    extern "C" __global__ void __launch_bounds__(TILE * TILE / CO) NAME##_f32(GEMM_PARAMS(float)) {          \
        gemm_coarse<float, TILE, CO>(GEMM_ARGS);                                                           \
    }                                                                                                      \
    extern "C" __global__ void __launch_bounds__(TILE * TILE / CO) NAME##_f16(GEMM_PARAMS(half_t)) {         \
        gemm_coarse<half_t, TILE, CO>(GEMM_ARGS);                                                          \
    }

#ifndef GEMM_TILE  // a space variant compiles only its own entry points
TILED(gemm_tiled16, 16)
TILED(gemm_tiled32, 32)
COARSE(gemm_coarse32x4, 32, 4)
COARSE(gemm_coarse64x4, 64, 4)
COARSE(gemm_coarse64x8, 64, 8)
#endif

// The GEMM space: one entry point pair, its tile and outputs per thread fixed at compile time by NVRTC defines
// (-DGEMM_TILE=T -DGEMM_CO=C; block T x (T / C)). Without the defines (the fixed candidates above) it is absent.
// No __launch_bounds__: the compiler allocates registers freely, and the compile stage prunes a config whose
// registers x threads exceed the block's register file (kernels/cuda/compile.py), not a hand-written restriction.
#ifdef GEMM_TILE
extern "C" __global__ void gemm_space_f32(GEMM_PARAMS(float)) { gemm_coarse<float, GEMM_TILE, GEMM_CO>(GEMM_ARGS); }
extern "C" __global__ void gemm_space_f16(GEMM_PARAMS(half_t)) { gemm_coarse<half_t, GEMM_TILE, GEMM_CO>(GEMM_ARGS); }
#endif
