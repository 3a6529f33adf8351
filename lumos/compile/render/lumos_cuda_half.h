/* Half-precision storage (added to programs with half buffers): loads widen to float, stores
   round to nearest even; all arithmetic stays float. The types are structs around the 16 bits, so
   that a load or store that forgot to convert does not compile, and so that no header is needed:
   NVRTC has no include path to cuda_bf16.h / cuda_fp16.h. They have __nv_bfloat16's and __half's
   layout, and the conversions are what those headers' __bfloat162float / __float2bfloat16_rn and
   __half2float / __float2half_rn do (float16 by the same PTX cvt instructions; bfloat16 by its bits,
   which every architecture has). */
struct lumos_bfloat16 { unsigned short bits; };
struct lumos_float16 { unsigned short bits; };
__device__ __forceinline__ float lumos_from_bfloat16(lumos_bfloat16 h) { return __uint_as_float((unsigned)h.bits << 16); }
/* Nearest, ties to even; a NaN stays a quiet NaN. */
__device__ __forceinline__ lumos_bfloat16 lumos_to_bfloat16(float f) {
  const unsigned bits = __float_as_uint(f);
  const unsigned rounded = (bits + 0x7fffu + ((bits >> 16) & 1u)) >> 16;
  return {(unsigned short)((bits & 0x7fffffffu) > 0x7f800000u ? (bits >> 16) | 0x40u : rounded)};
}
#if defined(__CUDA_ARCH__)
__device__ __forceinline__ float lumos_from_float16(lumos_float16 h) {
  float f;
  asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(h.bits));
  return f;
}
__device__ __forceinline__ lumos_float16 lumos_to_float16(float f) {
  unsigned short h;
  asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(f));
  return {h};
}
#else  /* the kernels run on a CPU (tests/unit/compile/cuda_on_cpu.py): F16C */
__device__ __forceinline__ float lumos_from_float16(lumos_float16 h) { return _cvtsh_ss(h.bits); }
__device__ __forceinline__ lumos_float16 lumos_to_float16(float f) { return {(unsigned short)_cvtss_sh(f, 0)}; }
#endif
