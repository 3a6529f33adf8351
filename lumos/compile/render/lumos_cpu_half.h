/* Half-precision storage (a half-precision module's weights, inputs and outputs): loads widen to
   float, stores round to nearest even; all arithmetic stays float. Both types are structs around
   their 16 bits, so that a load or store that forgot to convert does not compile. Widening is
   integer work that gcc vectorizes in any loop: bfloat16's bits shifted into a float's top half;
   float16's exponent and mantissa shifted into place and rebased by 2^112 (exact, subnormals
   included), infinities and NaNs kept apart. (gcc 12 converts _Float16 one element at a time: a
   loop over them does not vectorize.) A float16 store rounds by _Float16's conversion, and the
   vector forms use F16C's / AVX-512's vcvtph2ps and vcvtps2ph where the target has them. */
#include <stdint.h>
#include <immintrin.h>
typedef struct { uint16_t bits; } lumos_bfloat16;
typedef struct { uint16_t bits; } lumos_float16;
static inline float lumos_from_bfloat16(lumos_bfloat16 h) {
  const uint32_t bits = (uint32_t)h.bits << 16;
  float f;
  memcpy(&f, &bits, sizeof f);
  return f;
}
/* Nearest, ties to even: add 0x7fff plus the kept part's last bit, then drop the low 16 bits. A
   NaN stays a quiet NaN (the addition could carry it into infinity). */
static inline lumos_bfloat16 lumos_to_bfloat16(float f) {
  uint32_t bits;
  memcpy(&bits, &f, sizeof bits);
  const uint32_t rounded = (bits + 0x7fffu + ((bits >> 16) & 1u)) >> 16;
  return (lumos_bfloat16){(uint16_t)((bits & 0x7fffffffu) > 0x7f800000u ? (bits >> 16) | 0x40u : rounded)};
}
static inline float lumos_from_float16(lumos_float16 h) {
  const uint32_t rest = (uint32_t)(h.bits & 0x7fffu) << 13, sign = (uint32_t)(h.bits & 0x8000u) << 16;
  float f;
  memcpy(&f, &rest, sizeof f);
  f *= 0x1p112f;  /* float16's exponent bias (15) to float's (127) */
  uint32_t bits;
  memcpy(&bits, &f, sizeof bits);
  bits = (rest >= (0x7c00u << 13) ? rest | 0x7f800000u : bits) | sign;  /* infinity, NaN */
  memcpy(&f, &bits, sizeof f);
  return f;
}
static inline lumos_float16 lumos_to_float16(float f) {
  const _Float16 h = (_Float16)f;
  lumos_float16 stored;
  memcpy(&stored, &h, sizeof stored);
  return stored;
}
/* The vector forms, for N = 8 and 16 floats: the same conversions lane by lane in GCC's vector
   extension (a widening move and a shift for bfloat16 loads). */
#define LUMOS_HALF_VECTORS(N)                                                                     \
  typedef uint16_t lumos_h##N __attribute__((vector_size(2 * N)));                                 \
  static inline lumos_f##N lumos_load##N##_bfloat16(const lumos_bfloat16* p) {                     \
    lumos_h##N h;                                                                                  \
    memcpy(&h, p, sizeof h);                                                                       \
    return (lumos_f##N)(__builtin_convertvector(h, lumos_u##N) << 16);                             \
  }                                                                                                \
  static inline void lumos_store##N##_bfloat16(lumos_bfloat16* p, lumos_f##N v) {                 \
    const lumos_u##N bits = (lumos_u##N)v;                                                         \
    const lumos_u##N rounded = (bits + 0x7fffu + ((bits >> 16) & 1u)) >> 16;                       \
    const lumos_i##N nan = (bits & 0x7fffffffu) > 0x7f800000u;                                     \
    const lumos_u##N kept = (lumos_u##N)((nan & (lumos_i##N)((bits >> 16) | 0x40u)) | (~nan & (lumos_i##N)rounded)); \
    const lumos_h##N h = __builtin_convertvector(kept, lumos_h##N);                                \
    memcpy(p, &h, sizeof h);                                                                       \
  }                                                                                                \
  static inline lumos_f##N lumos_load##N##_first_bfloat16(const lumos_bfloat16* p, int n) {       \
    lumos_f##N v = {0};                                                                            \
    for (int k = 0; k < n; k++) v[k] = lumos_from_bfloat16(p[k]);                                  \
    return v;                                                                                      \
  }                                                                                                \
  static inline lumos_f##N lumos_load##N##_first_float16(const lumos_float16* p, int n) {         \
    lumos_f##N v = {0};                                                                            \
    for (int k = 0; k < n; k++) v[k] = lumos_from_float16(p[k]);                                   \
    return v;                                                                                      \
  }
LUMOS_HALF_VECTORS(8)
LUMOS_HALF_VECTORS(16)
#if defined(__F16C__)
static inline lumos_f8 lumos_load8_float16(const lumos_float16* p) {
  return (lumos_f8)_mm256_cvtph_ps(_mm_loadu_si128((const __m128i*)p));
}
static inline void lumos_store8_float16(lumos_float16* p, lumos_f8 v) {
  _mm_storeu_si128((__m128i*)p, _mm256_cvtps_ph((__m256)v, _MM_FROUND_TO_NEAREST_INT));
}
#else
static inline lumos_f8 lumos_load8_float16(const lumos_float16* p) {
  lumos_f8 v;
  for (int k = 0; k < 8; k++) v[k] = lumos_from_float16(p[k]);
  return v;
}
static inline void lumos_store8_float16(lumos_float16* p, lumos_f8 v) {
  for (int k = 0; k < 8; k++) p[k] = lumos_to_float16(v[k]);
}
#endif
#if defined(__AVX512F__)
static inline lumos_f16 lumos_load16_float16(const lumos_float16* p) {
  return (lumos_f16)_mm512_cvtph_ps(_mm256_loadu_si256((const __m256i*)p));
}
static inline void lumos_store16_float16(lumos_float16* p, lumos_f16 v) {
  _mm256_storeu_si256((__m256i*)p, _mm512_cvtps_ph((__m512)v, _MM_FROUND_TO_NEAREST_INT));
}
#else
static inline lumos_f16 lumos_load16_float16(const lumos_float16* p) {
  lumos_f16 v;
  for (int k = 0; k < 16; k++) v[k] = lumos_from_float16(p[k]);
  return v;
}
static inline void lumos_store16_float16(lumos_float16* p, lumos_f16 v) {
  for (int k = 0; k < 16; k++) p[k] = lumos_to_float16(v[k]);
}
#endif
/* 2N bfloat16 at p as two vectors of N floats, the even-placed ones and the odd-placed ones: one
   load, a shift (element 2j sits in lane j's low half) and a mask (2j + 1 in its high half), and no
   shuffle (the register-blocked matmul's weights, kernel/tiles.py); lumos_storeN_interleaved puts
   the two back in order. */
#define LUMOS_BFLOAT16_PAIRS(N, ...)                                                              \
  static inline void lumos_load##N##_pair_bfloat16(const lumos_bfloat16* p, lumos_f##N* even, lumos_f##N* odd) { \
    lumos_u##N bits;                                                                               \
    memcpy(&bits, p, sizeof bits);                                                                 \
    *even = (lumos_f##N)(bits << 16);                                                              \
    *odd = (lumos_f##N)(bits & 0xffff0000u);                                                       \
  }                                                                                                \
  static const lumos_i##N lumos_interleave##N[2] = {__VA_ARGS__};                                  \
  static inline void lumos_store##N##_interleaved(float* p, lumos_f##N even, lumos_f##N odd) {    \
    const lumos_f##N low = __builtin_shuffle(even, odd, lumos_interleave##N[0]);                   \
    const lumos_f##N high = __builtin_shuffle(even, odd, lumos_interleave##N[1]);                  \
    memcpy(p, &low, sizeof low);                                                                   \
    memcpy(p + N, &high, sizeof high);                                                             \
  }
LUMOS_BFLOAT16_PAIRS(8, {0, 8, 1, 9, 2, 10, 3, 11}, {4, 12, 5, 13, 6, 14, 7, 15})
LUMOS_BFLOAT16_PAIRS(16, {0, 16, 1, 17, 2, 18, 3, 19, 4, 20, 5, 21, 6, 22, 7, 23},
                     {8, 24, 9, 25, 10, 26, 11, 27, 12, 28, 13, 29, 14, 30, 15, 31})
