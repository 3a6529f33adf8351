/* Half-precision storage (a half-precision module's weights, inputs and outputs): loads widen to
   float, stores round to nearest even; all arithmetic stays float. bfloat16 is a struct around
   its bits, so that a load or store that forgot to convert does not compile; widening is the bits
   shifted into a float's top half (exact). float16 is _Float16, converted by the compiler (F16C's
   vcvtph2ps / vcvtps2ph where the target has them). */
#include <stdint.h>
typedef struct { uint16_t bits; } lumos_bfloat16;
typedef _Float16 lumos_float16;
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
static inline float lumos_from_float16(lumos_float16 h) { return (float)h; }
static inline lumos_float16 lumos_to_float16(float f) { return (lumos_float16)f; }
/* The vector forms, for N = 8 and 16 floats: the same conversions lane by lane in GCC's vector
   extension (a widening move and a shift for bfloat16 loads). */
#define LUMOS_HALF_VECTORS(N)                                                                     \
  typedef uint16_t lumos_h##N __attribute__((vector_size(2 * N)));                                 \
  typedef _Float16 lumos_fh##N __attribute__((vector_size(2 * N)));                                \
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
  static inline lumos_f##N lumos_load##N##_float16(const lumos_float16* p) {                       \
    lumos_fh##N h;                                                                                 \
    memcpy(&h, p, sizeof h);                                                                       \
    return __builtin_convertvector(h, lumos_f##N);                                                 \
  }                                                                                                \
  static inline void lumos_store##N##_float16(lumos_float16* p, lumos_f##N v) {                   \
    const lumos_fh##N h = __builtin_convertvector(v, lumos_fh##N);                                 \
    memcpy(p, &h, sizeof h);                                                                       \
  }                                                                                                \
  static inline lumos_f##N lumos_load##N##_first_float16(const lumos_float16* p, int n) {         \
    lumos_f##N v = {0};                                                                            \
    for (int k = 0; k < n; k++) v[k] = p[k];                                                       \
    return v;                                                                                      \
  }
LUMOS_HALF_VECTORS(8)
LUMOS_HALF_VECTORS(16)
