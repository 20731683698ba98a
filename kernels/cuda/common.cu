// Device helpers shared by every builtin kernel. kernels/cuda/__init__.py prepends this file to each program,
// so a program is one self-contained text (NVRTC needs no include path, and the text is the code identity).
//
// float16 is stored as unsigned short and converted with PTX cvt instructions: no cuda_fp16.h, whose location
// NVRTC would otherwise have to be told. Every arithmetic kernel loads to float and accumulates in float.

typedef unsigned short half_t;

__device__ __forceinline__ float load_f(const float* p) { return *p; }

__device__ __forceinline__ float load_f(const half_t* p) {
    float f;
    asm("{ cvt.f32.f16 %0, %1; }" : "=f"(f) : "h"(*p));
    return f;
}

__device__ __forceinline__ void store_f(float* p, float v) { *p = v; }

__device__ __forceinline__ void store_f(half_t* p, float v) {
    half_t h;
    asm("{ cvt.rn.f16.f32 %0, %1; }" : "=h"(h) : "f"(v));
    *p = h;
}

__device__ __forceinline__ float neg_inf() { return -__int_as_float(0x7f800000); }

__device__ __forceinline__ float warp_sum(float v) {
    for (int offset = 16; offset > 0; offset >>= 1) v += __shfl_xor_sync(0xffffffffu, v, offset);
    return v;
}

__device__ __forceinline__ float warp_max(float v) {
    for (int offset = 16; offset > 0; offset >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, offset));
    return v;
}

// Block-wide sum (MAX false) or max (MAX true) of one value per thread; every thread gets the result.
// blockDim.x must be a multiple of 32 (at most 1024); scratch is __shared__ float[33] owned by the caller.
template <bool MAX>
__device__ __forceinline__ float block_reduce(float v, float* scratch) {
    const int lane = threadIdx.x & 31;
    const int warp = threadIdx.x >> 5;
    const int warps = blockDim.x >> 5;
    v = MAX ? warp_max(v) : warp_sum(v);
    if (lane == 0) scratch[warp] = v;
    __syncthreads();
    if (warp == 0) {
        float w = lane < warps ? scratch[lane] : (MAX ? neg_inf() : 0.0f);
        w = MAX ? warp_max(w) : warp_sum(w);
        if (lane == 0) scratch[32] = w;
    }
    __syncthreads();
    const float result = scratch[32];
    __syncthreads();  // the caller may reuse scratch for its next reduction
    return result;
}
