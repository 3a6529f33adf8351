#include <math.h>
#include <omp.h>
#include <stddef.h>
#include <string.h>

/* Kernels are seen by the driver in another translation unit (the cache compiles the units at
   the same time), never outside the library. */
#define LUMOS_KERNEL __attribute__((visibility("hidden")))
/* A kernel whose schedule asks gcc to vectorize its loops in 16-float vectors (KernelSchedule.wide). */
#if defined(__GNUC__) && !defined(__clang__)
#define LUMOS_WIDE __attribute__((target("prefer-vector-width=512")))
#else
#define LUMOS_WIDE
#endif

/* 2^x without a library call, so that loops over it vectorize: x = n + f with n = rint(x) and
   |f| <= 1/2, 2^f by its degree-7 Taylor polynomial (relative error < 1e-7), 2^n by building
   the exponent bits. Results below 2^-126 flush to 0 (as masked attention scores should). */
static inline float lumos_max(float a, float b) { return (b > a || b != b) ? b : a; }

static inline float lumos_exp2f(float x) {
  const float c = x < -127.0f ? -127.0f : (x > 128.0f ? 128.0f : x);  /* no libm calls: they stop vectorizing */
  const float n = rintf(c);
  const float f = c - n;
  float p = 1.525273380405984e-05f;
  p = p * f + 1.5403530393381608e-04f;
  p = p * f + 1.3333558146428443e-03f;
  p = p * f + 9.618129107628477e-03f;
  p = p * f + 5.550410866482158e-02f;
  p = p * f + 2.402265069591007e-01f;
  p = p * f + 6.931471805599453e-01f;
  p = p * f + 1.0f;
  const int bits = ((int)n + 127) << 23;
  float scale;
  memcpy(&scale, &bits, sizeof scale);
  float result = n <= -127.0f ? 0.0f : (n >= 128.0f ? INFINITY : p * scale);
  return x != x ? x : result;
}

/* 2^x for x <= 0 or NaN only: a softmax's scores less their running max, times log2(e). Half the
   instructions of lumos_exp2f, which is a third of a fused attention kernel at head size 16: no
   upper clamp and no NaN test (NaN flows through the polynomial), rounding by adding 1.5 * 2^23
   (c's integer part lands in t's low bits, so the exponent is built without a float-to-int
   conversion), and a degree-5 polynomial fitted for relative error (2.4e-7 on |f| <= 1/2, at
   most 2 ulp). Below 2^-127 it returns 0, as lumos_exp2f does. */
static inline float lumos_exp2f_nonpositive(float x) {
  const float c = x < -127.0f ? -127.0f : x;
  const float t = c + 12582912.0f;
  const float f = c - (t - 12582912.0f);
  float p = 1.3276358367875218e-03f;
  p = p * f + 9.67550277709961e-03f;
  p = p * f + 5.550713092088699e-02f;
  p = p * f + 2.4022120237350464e-01f;
  p = p * f + 6.931469440460205e-01f;
  p = p * f + 1.0000001192092896f;
  unsigned bits;
  memcpy(&bits, &t, sizeof bits);
  bits = (bits - 0x4B400000u + 127u) << 23;  /* t's bits hold 0x4B400000 + n: 2^n's exponent */
  float scale;
  memcpy(&scale, &bits, sizeof scale);
  return p * scale;
}

/* The register-blocked matmul's vectors: 8 floats, one AVX2 register. GCC's vector extension
   lowers them to what the target has (two SSE registers, or scalars), so the code stays portable;
   memcpy is how an unaligned vector load or store is spelled without intrinsics (it compiles to
   one vmovups). a * w + c on them becomes one FMA where the target has it. */
typedef float lumos_f8 __attribute__((vector_size(32)));
static inline lumos_f8 lumos_load8(const float* p) { lumos_f8 v; memcpy(&v, p, sizeof v); return v; }
static inline void lumos_store8(float* p, lumos_f8 v) { memcpy(p, &v, sizeof v); }
/* 16 floats, one AVX-512 register: the register block's wider vectors (offered on AVX-512 hosts). */
typedef float lumos_f16 __attribute__((vector_size(64)));
static inline lumos_f16 lumos_load16(const float* p) { lumos_f16 v; memcpy(&v, p, sizeof v); return v; }
static inline void lumos_store16(float* p, lumos_f16 v) { memcpy(p, &v, sizeof v); }
typedef int lumos_i8 __attribute__((vector_size(32)));
typedef int lumos_i16 __attribute__((vector_size(64)));
/* For vectors of N floats (8, or 16 for the fused attention on AVX-512 hosts), given the
   log2(N) shuffles that pair each lane with another (halves, then quarters, ...):
   - lumos_maxN: lumos_max lane by lane (NaN wins): b where b > a or b is NaN, else a;
   - lumos_max_lanesN / lumos_sum_lanesN: the largest (NaN wins) / the sum of v's lanes, in
     log2(N) shuffle steps rather than a chain of N - 1 (gcc's reduction epilogue was that chain
     of scalar adds per query, a fifth of the attention kernel at head size 16);
   - lumos_exp2_nonpositiveN: lumos_exp2f_nonpositive lane by lane (the same steps; a select for
     the clamp): the fused attention's softmax in whole vectors, with no scalar remainder loop. */
#define LUMOS_VECTOR_LANES(N, ...)                                                           static const lumos_i##N lumos_lane_pairs##N[] = {__VA_ARGS__};                             static inline lumos_f##N lumos_max##N(lumos_f##N a, lumos_f##N b) {                          const lumos_i##N take = (b > a) | (b != b);                                                return (lumos_f##N)(((lumos_i##N)b & take) | ((lumos_i##N)a & ~take));                   }                                                                                          static inline float lumos_max_lanes##N(lumos_f##N v) {                                       for (int k = 0; k < (int)(sizeof lumos_lane_pairs##N / sizeof lumos_lane_pairs##N[0]); k++)       v = lumos_max##N(v, __builtin_shuffle(v, lumos_lane_pairs##N[k]));                       return v[0];                                                                             }                                                                                          static inline float lumos_sum_lanes##N(lumos_f##N v) {                                       for (int k = 0; k < (int)(sizeof lumos_lane_pairs##N / sizeof lumos_lane_pairs##N[0]); k++)       v += __builtin_shuffle(v, lumos_lane_pairs##N[k]);                                       return v[0];                                                                             }                                                                                          typedef unsigned lumos_u##N __attribute__((vector_size(4 * N)));                          static inline lumos_f##N lumos_exp2_nonpositive##N(lumos_f##N x) {                          const lumos_i##N low = x < (lumos_f##N){} - 127.0f;                                        const lumos_f##N c = (lumos_f##N)((low & (lumos_i##N)((lumos_f##N){} - 127.0f)) | (~low & (lumos_i##N)x));     const lumos_f##N t = c + 12582912.0f;                                                      const lumos_f##N f = c - (t - 12582912.0f);                                                lumos_f##N p = f * 1.3276358367875218e-03f + 9.67550277709961e-03f;                        p = p * f + 5.550713092088699e-02f;                                                        p = p * f + 2.4022120237350464e-01f;                                                       p = p * f + 6.931469440460205e-01f;                                                        p = p * f + 1.0000001192092896f;                                                           const lumos_u##N bits = ((lumos_u##N)t - 0x4B400000u + 127u) << 23;                        return p * (lumos_f##N)bits;                                                             }
LUMOS_VECTOR_LANES(8, {4, 5, 6, 7, 0, 1, 2, 3}, {2, 3, 0, 1, 6, 7, 4, 5}, {1, 0, 3, 2, 5, 4, 7, 6})
LUMOS_VECTOR_LANES(16, {8, 9, 10, 11, 12, 13, 14, 15, 0, 1, 2, 3, 4, 5, 6, 7},
                   {4, 5, 6, 7, 0, 1, 2, 3, 12, 13, 14, 15, 8, 9, 10, 11},
                   {2, 3, 0, 1, 6, 7, 4, 5, 10, 11, 8, 9, 14, 15, 12, 13},
                   {1, 0, 3, 2, 5, 4, 7, 6, 9, 8, 11, 10, 13, 12, 15, 14})
/* The first n (0 < n < lanes) floats at p and zeros, reading nothing past p + n - 1 (a masked load
   where the target has one), and v's first n lanes with `fill` in the rest: the fused attention's
   last keys, fewer than a vector. */
#if defined(__AVX512F__)
#include <immintrin.h>
static inline lumos_f16 lumos_load16_first(const float* p, int n) {
  return (lumos_f16)_mm512_maskz_loadu_ps((__mmask16)((1u << n) - 1u), p);
}
#else
static inline lumos_f16 lumos_load16_first(const float* p, int n) {
  lumos_f16 v = {0};
  for (int k = 0; k < n; k++) v[k] = p[k];
  return v;
}
#endif
#if defined(__AVX512F__) && defined(__AVX512VL__)
static inline lumos_f8 lumos_load8_first(const float* p, int n) {
  return (lumos_f8)_mm256_maskz_loadu_ps((__mmask8)((1u << n) - 1u), p);
}
#else
static inline lumos_f8 lumos_load8_first(const float* p, int n) {
  lumos_f8 v = {0};
  for (int k = 0; k < n; k++) v[k] = p[k];
  return v;
}
#endif
static inline lumos_f8 lumos_first8(lumos_f8 v, int n, float fill) {
  const lumos_i8 keep = (lumos_i8){0, 1, 2, 3, 4, 5, 6, 7} < n;
  return (lumos_f8)(((lumos_i8)v & keep) | ((lumos_i8)((lumos_f8){} + fill) & ~keep));
}
static inline lumos_f16 lumos_first16(lumos_f16 v, int n, float fill) {
  const lumos_i16 keep = (lumos_i16){0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15} < n;
  return (lumos_f16)(((lumos_i16)v & keep) | ((lumos_i16)((lumos_f16){} + fill) & ~keep));
}
/* n vectors of n floats transposed in place: the fused attention's staged keys (render_attention). */
static const lumos_i8 lumos_transpose_masks8[3][2] = {
  {{0, 1, 2, 3, 8, 9, 10, 11}, {4, 5, 6, 7, 12, 13, 14, 15}},
  {{0, 1, 8, 9, 4, 5, 12, 13}, {2, 3, 10, 11, 6, 7, 14, 15}},
  {{0, 8, 2, 10, 4, 12, 6, 14}, {1, 9, 3, 11, 5, 13, 7, 15}},
};
static inline void lumos_transpose8(lumos_f8* t) {
  #pragma GCC unroll 3
  for (int s = 0; s < 3; s++) {
    const int b = 4 >> s;
    #pragma GCC unroll 8
    for (int i = 0; i < 8; i++) {
      if (i & b) continue;
      const lumos_f8 a = t[i], c = t[i + b];
      t[i] = __builtin_shuffle(a, c, lumos_transpose_masks8[s][0]);
      t[i + b] = __builtin_shuffle(a, c, lumos_transpose_masks8[s][1]);
    }
  }
}
static const lumos_i16 lumos_transpose_masks16[4][2] = {
  {{0, 1, 2, 3, 4, 5, 6, 7, 16, 17, 18, 19, 20, 21, 22, 23}, {8, 9, 10, 11, 12, 13, 14, 15, 24, 25, 26, 27, 28, 29, 30, 31}},
  {{0, 1, 2, 3, 16, 17, 18, 19, 8, 9, 10, 11, 24, 25, 26, 27}, {4, 5, 6, 7, 20, 21, 22, 23, 12, 13, 14, 15, 28, 29, 30, 31}},
  {{0, 1, 16, 17, 4, 5, 20, 21, 8, 9, 24, 25, 12, 13, 28, 29}, {2, 3, 18, 19, 6, 7, 22, 23, 10, 11, 26, 27, 14, 15, 30, 31}},
  {{0, 16, 2, 18, 4, 20, 6, 22, 8, 24, 10, 26, 12, 28, 14, 30}, {1, 17, 3, 19, 5, 21, 7, 23, 9, 25, 11, 27, 13, 29, 15, 31}},
};
static inline void lumos_transpose16(lumos_f16* t) {
  #pragma GCC unroll 4
  for (int s = 0; s < 4; s++) {
    const int b = 8 >> s;
    #pragma GCC unroll 16
    for (int i = 0; i < 16; i++) {
      if (i & b) continue;
      const lumos_f16 a = t[i], c = t[i + b];
      t[i] = __builtin_shuffle(a, c, lumos_transpose_masks16[s][0]);
      t[i + b] = __builtin_shuffle(a, c, lumos_transpose_masks16[s][1]);
    }
  }
}
