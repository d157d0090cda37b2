// Weight-only quantized matrix products with float32 activations, for decoding on x86 CPUs.
//
//   int8:  y (M, N) = x (M, K) @ (q (N, K) int8 * scale (N,))^T + bias
//   int4:  y (M, N) = x (M, K) @ W^T + bias,  W[n, k] = (c[n, k] - 8) * scale[n, g] + zero[n, g]
//          with c the 4-bit codes in attnlab's canonical nibble layout (N, K/2) uint8 (input 2i in
//          the low nibble of byte i, 2i+1 in the high one) and g = k / group_size.
//
// Why this file exists: PyTorch's own CPU kernels for these formats (aten::_weight_int8pack_mm,
// aten::_weight_int4pack_mm_for_cpu) vectorise only bfloat16 activations; with float32 ones they
// run a scalar loop. At batch 1 a token's cost should be the bytes of the weights; here every
// weight byte is loaded once, widened to float32 in registers and multiplied in float32, so the
// activations are never rounded and the weights are never written back dequantized.
//
// The int4 product uses that a dot product does not care about the order of its terms: the
// activations are first rearranged in blocks (16 for AVX2, 32 for AVX-512: even inputs, then odd
// inputs), so that packed bytes widened to int32 lanes give the even codes in their low nibble
// and the odd ones after a shift, without a byte shuffle. The AVX2 loop masks and converts the
// codes and scales each group's sum; the AVX-512 loop looks the dequantized weights up in a
// 16-entry table per group (int4_rows512) and walks four output rows at once.
//
// Each output row's codes are walked once, front to back, with a software prefetch a few KiB
// ahead: on the 2-core Xeon this was written on, the same loop read 12-16 GB/s of int8 codes on
// hardware prefetch alone and 25-27 GB/s with it. Rows of x go two at a time over a row of codes
// (it stays in L1 for the second pass). The file is compiled for AVX2 + FMA; the AVX-512 loops
// are selected at run time where the CPU has AVX-512F. The Python side loads the extension only
// where torch reports AVX2 or better and uses PyTorch's kernels or the reference path otherwise.
// Work is split over output rows with at::parallel_for (torch's own OpenMP pool).

#include <immintrin.h>

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include "decode_ops.h"

#include <algorithm>
#include <cstdint>
#include <vector>

namespace {

inline float hsum(__m256 v) {
  __m128 lo = _mm256_castps256_ps128(v);
  __m128 hi = _mm256_extractf128_ps(v, 1);
  lo = _mm_add_ps(lo, hi);
  lo = _mm_add_ps(lo, _mm_movehl_ps(lo, lo));
  lo = _mm_add_ss(lo, _mm_movehdup_ps(lo));
  return _mm_cvtss_f32(lo);
}

inline __m256 widen_int8(const int8_t* p) {  // 8 int8 -> 8 float32
  __m128i b = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(p));
  return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(b));
}

// Software prefetch distance in bytes of weight codes (see the head of this file). The int8 loop
// runs near the memory's speed, and asks for its codes further ahead, into L2 (T1), than the
// int4 loop, which is bound by its arithmetic (2 KiB ahead, into L1). Measured on a 2-core AMD
// EPYC (Zen 4) in one process, GPT-2-small's 49 products of a token with q/k/v joined, weights
// streamed from memory: int8 6.51 ms with the int4 setting, 4.33 ms with this one; int4 3.78 ms
// with its own, 3.95 ms with int8's.
constexpr int64_t PREFETCH = 2048;
constexpr int64_t PREFETCH_INT8 = 4096;

inline void prefetch(const void* p) { _mm_prefetch(static_cast<const char*>(p), _MM_HINT_T0); }
inline void prefetch_l2(const void* p) {
  _mm_prefetch(static_cast<const char*>(p), _MM_HINT_T1);
}

// One output row n of the int8 product for MB rows of x starting at m0: the weight row is walked
// once, front to back (a single sequential stream the prefetcher can run ahead of), 32 codes per
// step into 4 independent accumulators per row of x.
template <int MB>
void int8_row(const float* x, int64_t K, const int8_t* r, float scale, float bias, float* y,
              int64_t N, int64_t m0, int64_t n) {
  __m256 acc[MB][4];
  ATTNLAB_UNROLL for (int i = 0; i < MB; ++i)
    ATTNLAB_UNROLL for (int u = 0; u < 4; ++u) acc[i][u] = _mm256_setzero_ps();
  const int64_t K32 = K & ~int64_t(31), K8 = K & ~int64_t(7);
  int64_t k = 0;
  for (; k < K32; k += 32) {
    prefetch_l2(r + k + PREFETCH_INT8);
    __m256 w[4];
    ATTNLAB_UNROLL for (int u = 0; u < 4; ++u) w[u] = widen_int8(r + k + 8 * u);
    ATTNLAB_UNROLL for (int i = 0; i < MB; ++i) {
      const float* xr = x + (m0 + i) * K + k;
      ATTNLAB_UNROLL for (int u = 0; u < 4; ++u) acc[i][u] = _mm256_fmadd_ps(_mm256_loadu_ps(xr + 8 * u), w[u], acc[i][u]);
    }
  }
  for (; k < K8; k += 8) {
    const __m256 w = widen_int8(r + k);
    ATTNLAB_UNROLL for (int i = 0; i < MB; ++i)
      acc[i][0] = _mm256_fmadd_ps(_mm256_loadu_ps(x + (m0 + i) * K + k), w, acc[i][0]);
  }
  ATTNLAB_UNROLL for (int i = 0; i < MB; ++i) {
    float s = hsum(_mm256_add_ps(_mm256_add_ps(acc[i][0], acc[i][1]),
                                 _mm256_add_ps(acc[i][2], acc[i][3])));
    for (int64_t t = K8; t < K; ++t) s += x[(m0 + i) * K + t] * float(r[t]);
    y[(m0 + i) * N + n] = s * scale + bias;
  }
}

// x rearranged for the int4 loop: in each block of B inputs (16 for AVX2, 32 for AVX-512), the
// B/2 even ones, then the B/2 odd ones.
std::vector<float> split_even_odd(const float* x, int64_t M, int64_t K, int64_t B) {
  std::vector<float> out(static_cast<size_t>(M * K));
  for (int64_t m = 0; m < M; ++m) {
    const float* src = x + m * K;
    float* dst = out.data() + m * K;
    for (int64_t b = 0; b < K; b += B)
      for (int64_t i = 0; i < B / 2; ++i) {
        dst[b + i] = src[b + 2 * i];
        dst[b + B / 2 + i] = src[b + 2 * i + 1];
      }
  }
  return out;
}

// One output row of the int4 product for MB rows of x: U blocks of 16 inputs (8 packed bytes)
// per step, even and odd codes into separate accumulators (2·U chains per row of x); each group's
// partial sum is scaled once at the group's end, its zero times the group's sum of x added.
template <int MB, int U>
void int4_row(const float* xs, const float* xsum, int64_t K, int64_t g, const uint8_t* r,
              const float* scale, const float* zero, float bias, float* y, int64_t N, int64_t m0,
              int64_t n) {
  const int64_t G = K / g;
  const __m256i low4 = _mm256_set1_epi32(0x0F);
  __m256 total[MB];
  float ztotal[MB];
  ATTNLAB_UNROLL for (int i = 0; i < MB; ++i) total[i] = _mm256_setzero_ps(), ztotal[i] = 0.f;
  for (int64_t gi = 0; gi < G; ++gi) {
    __m256 acc[MB][2 * U];
    ATTNLAB_UNROLL for (int i = 0; i < MB; ++i)
      ATTNLAB_UNROLL for (int u = 0; u < 2 * U; ++u) acc[i][u] = _mm256_setzero_ps();
    for (int64_t k = gi * g; k < (gi + 1) * g; k += 16 * U) {
      prefetch(r + k / 2 + PREFETCH);
      __m256 w[2 * U];
      ATTNLAB_UNROLL for (int u = 0; u < U; ++u) {
        const __m128i b = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(r + k / 2 + 8 * u));
        const __m256i v = _mm256_cvtepu8_epi32(b);
        w[2 * u] = _mm256_cvtepi32_ps(_mm256_and_si256(v, low4));
        w[2 * u + 1] = _mm256_cvtepi32_ps(_mm256_srli_epi32(v, 4));
      }
      ATTNLAB_UNROLL for (int i = 0; i < MB; ++i) {
        const float* xr = xs + (m0 + i) * K + k;
        ATTNLAB_UNROLL for (int u = 0; u < 2 * U; ++u)
          acc[i][u] = _mm256_fmadd_ps(_mm256_loadu_ps(xr + 8 * u), w[u], acc[i][u]);
      }
    }
    const __m256 sv = _mm256_set1_ps(scale[gi]);
    ATTNLAB_UNROLL for (int i = 0; i < MB; ++i) {
      __m256 part = acc[i][0];
      ATTNLAB_UNROLL for (int u = 1; u < 2 * U; ++u) part = _mm256_add_ps(part, acc[i][u]);
      total[i] = _mm256_fmadd_ps(sv, part, total[i]);
      ztotal[i] += (zero[gi] - 8.f * scale[gi]) * xsum[(m0 + i) * G + gi];
    }
  }
  ATTNLAB_UNROLL for (int i = 0; i < MB; ++i) y[(m0 + i) * N + n] = hsum(total[i]) + ztotal[i] + bias;
}

// -- AVX-512 (where the CPU has it): 16 lanes per instruction, half the instructions ----------

#define ATTNLAB_AVX512 __attribute__((target("avx512f")))

// Output rows per thread at least: small products stay on one thread (waking the pool costs more
// than they do), large ones split evenly.
int64_t grain(int64_t M, int64_t K) { return std::max<int64_t>(16, (int64_t(1) << 16) / (M * K + 1)); }

bool cpu_has_avx512() {
  static const bool has = __builtin_cpu_supports("avx512f");
  return has;
}

template <int MB>
ATTNLAB_AVX512 void int8_row512(const float* x, int64_t K, const int8_t* r, float scale,
                                float bias, float* y, int64_t N, int64_t m0, int64_t n) {
  __m512 acc[MB][4];
  __m256 tail[MB];
  ATTNLAB_UNROLL for (int i = 0; i < MB; ++i) {
    ATTNLAB_UNROLL for (int u = 0; u < 4; ++u) acc[i][u] = _mm512_setzero_ps();
    tail[i] = _mm256_setzero_ps();
  }
  const int64_t K64 = K & ~int64_t(63), K8 = K & ~int64_t(7);
  int64_t k = 0;
  for (; k < K64; k += 64) {
    prefetch_l2(r + k + PREFETCH_INT8);
    __m512 w[4];
    ATTNLAB_UNROLL for (int u = 0; u < 4; ++u) {
      const __m128i b = _mm_loadu_si128(reinterpret_cast<const __m128i*>(r + k + 16 * u));
      w[u] = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(b));
    }
    ATTNLAB_UNROLL for (int i = 0; i < MB; ++i) {
      const float* xr = x + (m0 + i) * K + k;
      ATTNLAB_UNROLL for (int u = 0; u < 4; ++u)
        acc[i][u] = _mm512_fmadd_ps(_mm512_loadu_ps(xr + 16 * u), w[u], acc[i][u]);
    }
  }
  for (; k < K8; k += 8) {
    const __m256 w = widen_int8(r + k);
    ATTNLAB_UNROLL for (int i = 0; i < MB; ++i)
      tail[i] = _mm256_fmadd_ps(_mm256_loadu_ps(x + (m0 + i) * K + k), w, tail[i]);
  }
  ATTNLAB_UNROLL for (int i = 0; i < MB; ++i) {
    const __m512 a = _mm512_add_ps(_mm512_add_ps(acc[i][0], acc[i][1]),
                                   _mm512_add_ps(acc[i][2], acc[i][3]));
    float s = _mm512_reduce_add_ps(a) + hsum(tail[i]);
    for (int64_t t = K8; t < K; ++t) s += x[(m0 + i) * K + t] * float(r[t]);
    y[(m0 + i) * N + n] = s * scale + bias;
  }
}

// int4 on AVX-512: R output rows of codes at once (R independent streams; the rows of x are
// loaded once for all R) for MB rows of x, 32 inputs (16 packed bytes, x split in blocks of 32:
// 16 even, 16 odd) per step. Instead of widening each code to float32 and scaling per group,
// the 16 values a code can stand for in a group, (c - 8) * scale + zero, are made once per group
// (a multiply, then an add: exactly the reference's dequantized weights) and each code is looked
// up in them by one permute (vpermps reads the low 4 bits of each 32-bit lane, so the low nibble
// needs no mask and the high one a shift): per 32 codes one widening, one shift, two permutes
// and two FMAs, against the widening, mask, shift, two conversions and two FMAs (plus a scaling
// at every group's end) of the AVX-512 version of the AVX2 loop above, which this replaced: 1.6x
// the codes per second on a 2-core Xeon (Sapphire Rapids class, 2026-12-05), in L2 (GPT-2's
// 3072x768 and 768x3072, 56-57 us against 88-90 us). One prefetch per 64-byte line, PREFETCH
// bytes ahead of the R rows' codes (which lie one after another).
template <int R, int MB>
ATTNLAB_AVX512 void int4_rows512(const float* xs, int64_t K, int64_t g, const uint8_t* c,
                                 const float* scale, const float* zero, const float* bias,
                                 float* y, int64_t N, int64_t m0, int64_t n0) {
  const int64_t G = K / g, half = K / 2;
  const __m512 levels = _mm512_setr_ps(-8, -7, -6, -5, -4, -3, -2, -1, 0, 1, 2, 3, 4, 5, 6, 7);
  const uint8_t* base = c + n0 * half;
  __m512 acc[MB][R][2];
  ATTNLAB_UNROLL for (int i = 0; i < MB; ++i)
    ATTNLAB_UNROLL for (int j = 0; j < R; ++j) acc[i][j][0] = acc[i][j][1] = _mm512_setzero_ps();
  for (int64_t gi = 0; gi < G; ++gi) {
    __m512 table[R];
    ATTNLAB_UNROLL for (int j = 0; j < R; ++j) {
      const int64_t at = (n0 + j) * G + gi;
      table[j] = _mm512_add_ps(_mm512_mul_ps(levels, _mm512_set1_ps(scale[at])),
                               _mm512_set1_ps(zero[at]));
    }
    for (int64_t o = 0; o < R * g / 2; o += 64) prefetch(base + gi * R * g / 2 + o + PREFETCH);
    for (int64_t k = gi * g; k < (gi + 1) * g; k += 32) {
      __m512 x0[MB], x1[MB];
      ATTNLAB_UNROLL for (int i = 0; i < MB; ++i) {
        x0[i] = _mm512_loadu_ps(xs + (m0 + i) * K + k);
        x1[i] = _mm512_loadu_ps(xs + (m0 + i) * K + k + 16);
      }
      ATTNLAB_UNROLL for (int j = 0; j < R; ++j) {
        const __m128i b = _mm_loadu_si128(reinterpret_cast<const __m128i*>(base + j * half + k / 2));
        const __m512i v = _mm512_cvtepu8_epi32(b);
        const __m512 w0 = _mm512_permutexvar_ps(v, table[j]);
        const __m512 w1 = _mm512_permutexvar_ps(_mm512_srli_epi32(v, 4), table[j]);
        ATTNLAB_UNROLL for (int i = 0; i < MB; ++i) {
          acc[i][j][0] = _mm512_fmadd_ps(x0[i], w0, acc[i][j][0]);
          acc[i][j][1] = _mm512_fmadd_ps(x1[i], w1, acc[i][j][1]);
        }
      }
    }
  }
  ATTNLAB_UNROLL for (int i = 0; i < MB; ++i)
    ATTNLAB_UNROLL for (int j = 0; j < R; ++j)
      y[(m0 + i) * N + n0 + j] = _mm512_reduce_add_ps(_mm512_add_ps(acc[i][j][0], acc[i][j][1])) +
                                 (bias ? bias[n0 + j] : 0.f);
}

// Rows [n0, n1) of the AVX-512 int4 product: blocks of 4 output rows, the rest one at a time;
// rows of x two at a time, the last one alone. From 4 rows of x on, blocks of 2 output rows
// take the rows of x four at a time: the lookups of a block's codes serve 4 rows of x instead
// of 2 (per 32 codes and output row, 4 shared operations + 2 FMAs per row of x), and 2 x 4 x 2
// accumulators still fit the 32 registers.
ATTNLAB_AVX512 void int4_range512(const float* xs, int64_t M, int64_t K, int64_t g,
                                  const uint8_t* c, const float* scale, const float* zero,
                                  const float* bias, float* y, int64_t N, int64_t n0, int64_t n1) {
  int64_t n = n0;
  for (; M >= 4 && n + 2 <= n1; n += 2) {
    int64_t m = 0;
    for (; m + 4 <= M; m += 4) int4_rows512<2, 4>(xs, K, g, c, scale, zero, bias, y, N, m, n);
    for (; m + 2 <= M; m += 2) int4_rows512<2, 2>(xs, K, g, c, scale, zero, bias, y, N, m, n);
    if (m < M) int4_rows512<2, 1>(xs, K, g, c, scale, zero, bias, y, N, m, n);
  }
  for (; n + 4 <= n1; n += 4) {
    int64_t m = 0;
    for (; m + 2 <= M; m += 2) int4_rows512<4, 2>(xs, K, g, c, scale, zero, bias, y, N, m, n);
    if (m < M) int4_rows512<4, 1>(xs, K, g, c, scale, zero, bias, y, N, m, n);
  }
  for (; n < n1; ++n) {
    int64_t m = 0;
    for (; m + 2 <= M; m += 2) int4_rows512<1, 2>(xs, K, g, c, scale, zero, bias, y, N, m, n);
    if (m < M) int4_rows512<1, 1>(xs, K, g, c, scale, zero, bias, y, N, m, n);
  }
}

// -- rows [n0, n1) of a product, for either instruction set's row kernels ------------------

using Int8Row = void (*)(const float*, int64_t, const int8_t*, float, float, float*, int64_t,
                         int64_t, int64_t);
using Int4Row = void (*)(const float*, const float*, int64_t, int64_t, const uint8_t*,
                         const float*, const float*, float, float*, int64_t, int64_t, int64_t);

// Rows of x four at a time (Row4, where Four), then two (Row2), the last one alone (Row1); the
// weight row is in L1 after the first pass. (Row4 widens each code once for 4 rows of x instead
// of 2; the AVX2 loop has no Row4: 16 accumulators would not leave it registers for the codes.)
template <Int8Row Row4, Int8Row Row2, Int8Row Row1, bool Four>
void int8_range(const float* x, int64_t M, int64_t K, const int8_t* q, const float* scale,
                const float* bias, float* y, int64_t N, int64_t n0, int64_t n1) {
  for (int64_t n = n0; n < n1; ++n) {
    const int8_t* r = q + n * K;
    const float b = bias ? bias[n] : 0.f;
    int64_t m = 0;
    for (; Four && m + 4 <= M; m += 4) Row4(x, K, r, scale[n], b, y, N, m, n);
    for (; m + 2 <= M; m += 2) Row2(x, K, r, scale[n], b, y, N, m, n);
    for (; m < M; ++m) Row1(x, K, r, scale[n], b, y, N, m, n);
  }
}

template <Int4Row Row2, Int4Row Row1>
void int4_range(const float* xs, const float* xsum, int64_t M, int64_t K, int64_t g,
                const uint8_t* c, const float* scale, const float* zero, const float* bias,
                float* y, int64_t N, int64_t n0, int64_t n1) {
  const int64_t G = K / g, half = K / 2;
  for (int64_t n = n0; n < n1; ++n) {
    const uint8_t* r = c + n * half;
    const float b = bias ? bias[n] : 0.f;
    const float *s = scale + n * G, *z = zero + n * G;
    int64_t m = 0;
    for (; m + 2 <= M; m += 2) Row2(xs, xsum, K, g, r, s, z, b, y, N, m, n);
    for (; m < M; ++m) Row1(xs, xsum, K, g, r, s, z, b, y, N, m, n);
  }
}

void check_common(const at::Tensor& x, const at::Tensor& w, const c10::optional<at::Tensor>& bias,
                  int64_t N) {
  TORCH_CHECK(x.device().is_cpu() && w.device().is_cpu(), "woq_gemm: CPU tensors only");
  TORCH_CHECK(x.dim() == 2 && x.scalar_type() == at::kFloat && x.is_contiguous(),
              "woq_gemm: x must be a contiguous float32 (M, K) tensor");
  TORCH_CHECK(w.dim() == 2 && w.is_contiguous(), "woq_gemm: weight codes must be contiguous 2-d");
  if (bias.has_value()) {
    TORCH_CHECK(bias->scalar_type() == at::kFloat && bias->is_contiguous() &&
                    bias->numel() == N,
                "woq_gemm: bias must be a contiguous float32 (N,) tensor");
  }
}

}  // namespace

namespace attnlab {

void int8_linear_into(const float* xp, int64_t M, int64_t K, const int8_t* qp, const float* sp,
                      const float* bp, int64_t N, float* yp, int64_t ldy, int64_t isa) {
  const bool wide = isa != 1 && cpu_has_avx512();
  at::parallel_for(0, N, grain(M, K), [&](int64_t n0, int64_t n1) {
    if (wide)
      int8_range<int8_row512<4>, int8_row512<2>, int8_row512<1>, true>(xp, M, K, qp, sp, bp, yp, ldy, n0, n1);
    else
      int8_range<int8_row<2>, int8_row<2>, int8_row<1>, false>(xp, M, K, qp, sp, bp, yp, ldy, n0, n1);
  });
}

at::Tensor int8_linear(const at::Tensor& x, const at::Tensor& q, const at::Tensor& scale,
                       const c10::optional<at::Tensor>& bias, int64_t isa) {
  const int64_t M = x.size(0), K = x.size(1), N = q.size(0);
  check_common(x, q, bias, N);
  TORCH_CHECK(q.scalar_type() == at::kChar && q.size(1) == K,
              "woq_gemm: int8 codes must be (N, K) int8 with K = x.size(1)");
  TORCH_CHECK(scale.scalar_type() == at::kFloat && scale.is_contiguous() && scale.numel() == N,
              "woq_gemm: int8 scales must be a contiguous float32 (N,) tensor");
  at::Tensor y = at::empty({M, N}, x.options());
  int8_linear_into(x.data_ptr<float>(), M, K, q.data_ptr<int8_t>(), scale.data_ptr<float>(),
                   bias.has_value() ? bias->data_ptr<float>() : nullptr, N, y.data_ptr<float>(),
                   N, isa);
  return y;
}

void int4_linear_into(const float* xp, int64_t M, int64_t K, const uint8_t* cp, const float* sp,
                      const float* zp, int64_t group_size, const float* bp, int64_t N, float* yp,
                      int64_t ldy, int64_t isa) {
  const int64_t G = K / group_size;
  const bool wide = isa != 1 && cpu_has_avx512() && group_size % 32 == 0;
  std::vector<float> xs = split_even_odd(xp, M, K, wide ? 32 : 16);
  std::vector<float> xsum;  // per group sums of x, for the AVX2 loop's zero points
  if (!wide) {
    xsum.assign(static_cast<size_t>(M * G), 0.f);
    for (int64_t m = 0; m < M; ++m)
      for (int64_t k = 0; k < K; ++k) xsum[m * G + k / group_size] += xp[m * K + k];
  }
  const float* x2 = xs.data();
  const float* s2 = xsum.data();
  at::parallel_for(0, N, grain(M, K), [&](int64_t n0, int64_t n1) {
    if (wide)
      int4_range512(x2, M, K, group_size, cp, sp, zp, bp, yp, ldy, n0, n1);
    else if (group_size % 32 == 0)
      int4_range<int4_row<2, 2>, int4_row<1, 2>>(x2, s2, M, K, group_size, cp, sp, zp,
                 bp, yp, ldy, n0, n1);
    else
      int4_range<int4_row<2, 1>, int4_row<1, 1>>(x2, s2, M, K, group_size, cp, sp, zp,
                 bp, yp, ldy, n0, n1);
  });
}

at::Tensor int4_linear(const at::Tensor& x, const at::Tensor& codes, const at::Tensor& scale,
                       const at::Tensor& zero, int64_t group_size,
                       const c10::optional<at::Tensor>& bias, int64_t isa) {
  const int64_t M = x.size(0), K = x.size(1), N = codes.size(0);
  check_common(x, codes, bias, N);
  TORCH_CHECK(group_size > 0 && group_size % 16 == 0 && K % group_size == 0,
              "woq_gemm: int4 group_size must be a multiple of 16 dividing K");
  TORCH_CHECK(codes.scalar_type() == at::kByte && codes.size(1) == K / 2,
              "woq_gemm: int4 codes must be (N, K/2) uint8");
  const int64_t G = K / group_size;
  TORCH_CHECK(scale.scalar_type() == at::kFloat && zero.scalar_type() == at::kFloat &&
                  scale.is_contiguous() && zero.is_contiguous() && scale.numel() == N * G &&
                  zero.numel() == N * G,
              "woq_gemm: int4 scales and zeros must be contiguous float32 (N, K/group_size)");
  at::Tensor y = at::empty({M, N}, x.options());
  int4_linear_into(x.data_ptr<float>(), M, K, codes.data_ptr<uint8_t>(), scale.data_ptr<float>(),
                   zero.data_ptr<float>(), group_size,
                   bias.has_value() ? bias->data_ptr<float>() : nullptr, N, y.data_ptr<float>(),
                   N, isa);
  return y;
}

}  // namespace attnlab

TORCH_LIBRARY(attnlab_woq, m) {
  // isa: 0 = the widest this CPU has (AVX-512 or AVX2), 1 = AVX2 only (tests compare both)
  m.def("int8_linear(Tensor x, Tensor q, Tensor scale, Tensor? bias, int isa=0) -> Tensor");
  m.def(
      "int4_linear(Tensor x, Tensor codes, Tensor scale, Tensor zero, int group_size, "
      "Tensor? bias, int isa=0) -> Tensor");
}

TORCH_LIBRARY_IMPL(attnlab_woq, CPU, m) {
  m.impl("int8_linear", &attnlab::int8_linear);
  m.impl("int4_linear", &attnlab::int4_linear);
}
