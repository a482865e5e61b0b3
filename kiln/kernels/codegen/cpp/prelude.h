
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <algorithm>
#include <type_traits>
#include <sys/mman.h>
#if defined(__AVX__)
#include <immintrin.h>
#endif

#if defined(KILN_MVEC)
// Vector math: glibc's libmvec has SIMD variants (AVX2 / AVX-512, documented <= 4 ulp,
// special values as the scalar functions) of these. Declaring them `simd` lets GCC call
// those variants from `#pragma omp simd` loops; the header does so itself only under
// -ffast-math, whose NaN / inf / signed-zero rules kiln cannot take. The build links
// -lmvec and defines KILN_MVEC only when toolchain/cxx_vecmath.py finds that it works.
#define KILN_SIMD __attribute__((simd("notinbranch")))
#define KILN_VEC1(g) KILN_SIMD float g##f(float) noexcept; KILN_SIMD double g(double) noexcept;
#define KILN_VEC2(g) KILN_SIMD float g##f(float, float) noexcept; \
                     KILN_SIMD double g(double, double) noexcept;
extern "C" {
KILN_VEC1(sin) KILN_VEC1(cos) KILN_VEC1(tan) KILN_VEC1(asin) KILN_VEC1(acos) KILN_VEC1(atan)
KILN_VEC1(sinh) KILN_VEC1(cosh) KILN_VEC1(tanh) KILN_VEC1(asinh) KILN_VEC1(acosh)
KILN_VEC1(atanh) KILN_VEC1(erf) KILN_VEC1(erfc) KILN_VEC1(exp) KILN_VEC1(exp2)
KILN_VEC1(expm1) KILN_VEC1(log) KILN_VEC1(log2) KILN_VEC1(log10) KILN_VEC1(log1p)
KILN_VEC1(cbrt) KILN_VEC2(pow) KILN_VEC2(atan2) KILN_VEC2(hypot)
}
#undef KILN_VEC1
#undef KILN_VEC2
#undef KILN_SIMD
#endif

static inline float kiln_exp(float x) {
  // Cephes-style expf: exact range reduction, degree-6 polynomial, 2^n in two halves
  // so that denormal results stay right. NaN passes through the clamp and the arithmetic.
  float xc = std::min(std::max(x, -104.0f), 89.0f);
  float n = (xc * 1.44269504088896341f + 12582912.0f) - 12582912.0f;
  float r = xc - n * 0.693359375f + n * 2.12194440e-4f;
  float z = r * r;
  float p = 1.9875691500E-4f;
  p = p * r + 1.3981999507E-3f;
  p = p * r + 8.3334519073E-3f;
  p = p * r + 4.1665795894E-2f;
  p = p * r + 1.6666665459E-1f;
  p = p * r + 5.0000001201E-1f;
  p = p * z + r + 1.0f;
  int32_t ni = (int32_t)n;
  int32_t n1 = ni >> 1, n2 = ni - n1;
  int32_t b1 = (n1 + 127) << 23, b2 = (n2 + 127) << 23;
  float s1, s2;
  std::memcpy(&s1, &b1, 4);
  std::memcpy(&s2, &b2, 4);
  return p * s1 * s2;
}
static inline double kiln_exp(double x) { return std::exp(x); }
static inline float kiln_tanh(float x) {
  // Cephes tanhf: an odd polynomial below 0.625, 1 - 2 / (exp(2|x|) + 1) above.
  float z = x * x;
  float p = (((-5.70498872745E-3f * z + 2.06390887954E-2f) * z - 5.37397155531E-2f) * z
             + 1.33314422036E-1f) * z - 3.33332819422E-1f;
  float small = p * z * x + x;
  float a = std::min(std::fabs(x), 9.5f);
  float big = 1.0f - 2.0f / (kiln_exp(a + a) + 1.0f);
  return std::copysign(std::fabs(x) < 0.625f ? small : big, x);   // odd, and tanh(-0) = -0
}
static inline double kiln_tanh(double x) { return std::tanh(x); }
template <class T, class = std::enable_if_t<std::is_integral<T>::value>>
static inline double kiln_tanh(T x) { return std::tanh(double(x)); }
template <class T> static inline T kiln_sigmoid(T x) { return T(1) / (T(1) + kiln_exp(-x)); }
template <class T> static inline T kiln_abs(T a) {
  if constexpr (std::is_floating_point<T>::value) return std::fabs(a);
  else if constexpr (std::is_unsigned<T>::value) return a;
  else return a < 0 ? T(-a) : a;
}
// a tie (-0.0 and 0.0) gives the first operand, as eager's clamp, relu and max reductions
template <class T> static inline T kiln_maximum(T a, T b) {
  if constexpr (std::is_floating_point<T>::value) return a != a ? a : (b != b ? b : (b > a ? b : a));
  else return b > a ? b : a;
}
template <class T> static inline T kiln_minimum(T a, T b) {
  if constexpr (std::is_floating_point<T>::value) return a != a ? a : (b != b ? b : (b < a ? b : a));
  else return b < a ? b : a;
}
template <class T> static inline T kiln_fmod(T a, T b) {
  if constexpr (std::is_floating_point<T>::value) return std::fmod(a, b);
  else return b == 0 ? T(0) : T(a % b);
}
template <class T> static inline T kiln_remainder(T a, T b) {
  if constexpr (std::is_floating_point<T>::value) {
    T r = std::fmod(a, b);
    return (r != 0 && ((b < 0) != (r < 0))) ? r + b : r;
  } else {
    if (b == 0) return T(0);
    T r = a % b;
    return (r != 0 && ((b < 0) != (r < 0))) ? T(r + b) : r;
  }
}
template <class T> static inline T kiln_truncdiv(T a, T b) {
  if constexpr (std::is_floating_point<T>::value) return std::trunc(a / b);
  else return b == 0 ? T(0) : T(a / b);
}
template <class T> static inline T kiln_floordiv(T a, T b) {
  if constexpr (std::is_floating_point<T>::value) {
    if (b == 0) return a / b;
    T mod = std::fmod(a, b);
    T div = (a - mod) / b;
    if (mod != 0 && ((b < 0) != (mod < 0))) div -= T(1);
    if (div == 0) return std::copysign(T(0), a / b);
    T fl = std::floor(div);
    if (div - fl > T(0.5)) fl += T(1);
    return fl;
  } else {
    if (b == 0) return T(0);
    T q = a / b;
    if ((a % b != 0) && ((a < 0) != (b < 0))) q -= 1;
    return q;
  }
}
template <class T> static inline T kiln_pow(T a, T b) {
  if constexpr (std::is_floating_point<T>::value) return std::pow(a, b);
  else {
    if (b < 0) return a == 1 ? T(1) : (a == -1 ? T((b % 2) ? -1 : 1) : T(0));
    T r = 1;
    while (b) { if (b & 1) r *= a; a *= a; b >>= 1; }
    return r;
  }
}
template <class T> static inline T kiln_sign(T a) {
  return T((T(0) < a) - (a < T(0)));     // NaN: 0, as eager
}
template <class T> static inline bool kiln_isinf(T a) {
  return a == std::numeric_limits<T>::infinity() || a == -std::numeric_limits<T>::infinity();
}
template <class T> static inline T kiln_bitnot(T a) { return T(~a); }

static inline void kiln_stream(float* __restrict__ d, const float* __restrict__ s, int64_t n) {
  // Stores that bypass the cache (no read-for-ownership of lines about to be overwritten
  // whole) for outputs far larger than the caches; the caller fences.
#if defined(__AVX__)
  int64_t i = 0;
  for (; i < n && (reinterpret_cast<uintptr_t>(d + i) & 31); ++i) d[i] = s[i];
  for (; i + 8 <= n; i += 8) _mm256_stream_ps(d + i, _mm256_loadu_ps(s + i));
  for (; i < n; ++i) d[i] = s[i];
#else
  std::memcpy(d, s, n * sizeof(float));
#endif
}
static inline void kiln_sum_add(float& s, float& c, float v) {
  // A block's partial sum into a running total, the rounding error kept in c (Neumaier).
  float t = s + v;
  c += std::fabs(s) >= std::fabs(v) ? (s - t) + v : (v - t) + s;
  s = t;
}
static inline float kiln_sum_total(float s, float c) {
  return std::isfinite(s) ? s + c : s;    // an inf or NaN total stays as plain summing gives it
}
static inline void kiln_fence() {
#if defined(__AVX__)
  _mm_sfence();
#endif
}
static inline void kiln_hugepages(void* p, int64_t bytes) {
  // A large output is a fresh allocation (its own mmap) about to be written whole: let its
  // first touch take 2 MiB pages (one fault and one clear per 512 small pages).
#if defined(MADV_HUGEPAGE)
  const uintptr_t H = uintptr_t(2) << 20;
  uintptr_t a = (reinterpret_cast<uintptr_t>(p) + H - 1) & ~(H - 1);
  uintptr_t e = (reinterpret_cast<uintptr_t>(p) + uintptr_t(bytes)) & ~(H - 1);
  if (e > a) madvise(reinterpret_cast<void*>(a), e - a, MADV_HUGEPAGE);
#endif
}
