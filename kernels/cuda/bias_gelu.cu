// bias_gelu_fusion: out (C-contiguous rows x cols) = gelu(x + bias), x (rows x cols, element strides sr, sc),
// bias (cols, element stride sb); GELU in its tanh form, evaluated in float. One kernel replaces the unfused
// reference's chain of elementwise kernels and their temporaries.
//
// bias_gelu_flat: one element per thread (grid-stride loop over the flattened output).
// bias_gelu_vec4: four consecutive elements of a row per thread (coarsened, more work in flight per thread).
// bias_gelu_rows: one block per row; the threads sweep the row.
// bias_gelu_tile: 32 x 32 tiles by a 32 x 8 block; the tile's 32 bias values are read once into shared memory.

#define GELU_PARAMS(T) \
    const T* __restrict__ x, const T* __restrict__ bias, T* __restrict__ out, int rows, int cols, \
    long long sr, long long sc, long long sb
#define GELU_ARGS x, bias, out, rows, cols, sr, sc, sb

__device__ __forceinline__ float gelu_tanh(float v) {
    const float k0 = 0.7978845608028654f;  // sqrt(2 / pi)
    const float k1 = 0.044715f;
    return 0.5f * v * (1.0f + tanhf(k0 * (v + k1 * v * v * v)));
}

template <typename T>
__device__ __forceinline__ void bias_gelu_flat(GELU_PARAMS(T)) {
    const long long total = (long long)rows * cols;
    const long long step = (long long)gridDim.x * blockDim.x;
    for (long long idx = blockIdx.x * (long long)blockDim.x + threadIdx.x; idx < total; idx += step) {
        const int r = (int)(idx / cols);
        const int c = (int)(idx - (long long)r * cols);
        store_f(out + idx, gelu_tanh(load_f(x + r * sr + c * sc) + load_f(bias + c * sb)));
    }
}

template <typename T>
__device__ __forceinline__ void bias_gelu_vec4(GELU_PARAMS(T)) {
    const int groups = (cols + 3) / 4;
    const long long total = (long long)rows * groups;
    const long long step = (long long)gridDim.x * blockDim.x;
    for (long long g = blockIdx.x * (long long)blockDim.x + threadIdx.x; g < total; g += step) {
        const int r = (int)(g / groups);
        const int c0 = (int)(g - (long long)r * groups) * 4;
#pragma unroll
        for (int u = 0; u < 4; ++u) {
            const int c = c0 + u;
            if (c < cols) {
                store_f(out + (long long)r * cols + c, gelu_tanh(load_f(x + r * sr + c * sc) + load_f(bias + c * sb)));
            }
        }
    }
}

template <typename T>
__device__ __forceinline__ void bias_gelu_rows(GELU_PARAMS(T)) {
    const int r = blockIdx.x;
    if (r >= rows) return;
    for (int c = threadIdx.x; c < cols; c += blockDim.x) {
        store_f(out + (long long)r * cols + c, gelu_tanh(load_f(x + r * sr + c * sc) + load_f(bias + c * sb)));
    }
}

template <typename T>
__device__ __forceinline__ void bias_gelu_tile(GELU_PARAMS(T)) {
    __shared__ float b[32];
    const int c = blockIdx.x * 32 + threadIdx.x;
    const int r0 = blockIdx.y * 32;
    if (threadIdx.y == 0) b[threadIdx.x] = c < cols ? load_f(bias + c * sb) : 0.0f;
    __syncthreads();
    if (c >= cols) return;
    for (int j = threadIdx.y; j < 32; j += blockDim.y) {
        const int r = r0 + j;
        if (r < rows) store_f(out + (long long)r * cols + c, gelu_tanh(load_f(x + r * sr + c * sc) + b[threadIdx.x]));
    }
}

#define BIAS_GELU(NAME, CALL)                                                                              \
    extern "C" __global__ void NAME##_f32(GELU_PARAMS(float)) { CALL<float>(GELU_ARGS); }                   \
    extern "C" __global__ void NAME##_f16(GELU_PARAMS(half_t)) { CALL<half_t>(GELU_ARGS); }

BIAS_GELU(bias_gelu_flat, bias_gelu_flat)
BIAS_GELU(bias_gelu_vec4, bias_gelu_vec4)
BIAS_GELU(bias_gelu_rows, bias_gelu_rows)
BIAS_GELU(bias_gelu_tile, bias_gelu_tile)
