// attnlab's CPU decoding kernels, as C++ functions: the operators of woq_gemm.cpp and
// decode_attention.cpp, declared here so that decode_layer.cpp calls them directly (no trip
// through Python or the dispatcher between the steps of a layer).
#pragma once

#include <immintrin.h>

#include <ATen/ATen.h>

// Put before a loop of a fixed, small trip count over an array of vector registers (rows of x,
// output rows, unrolled steps). GCC 12 otherwise keeps such arrays in memory when they hold more
// than a few registers: the int4 AVX-512 loop stored and reloaded its eight accumulators on every
// step, a chain through memory that cost it a quarter of its speed (in L2, one thread, 2-core
// Xeon, 2026-12-06: 21 cycles per 64-byte line of codes before, 15-16 after).
#define ATTNLAB_UNROLL _Pragma("GCC unroll 16")

namespace attnlab {

// exp(x) for x <= 0 (attention scores minus their maximum, GELU's -x^2/2), 8 lanes: x = n ln2 + f with |f| <= ln2 / 2,
// exp(f) by its degree-6 Taylor polynomial (relative error below 2e-7 there), times 2^n built in
// the exponent bits. Below -87 the result is flushed to 0 (exp(-87) is 1.6e-38: a weight that
// small cannot move a float32 sum whose largest term is exp(0) = 1).
inline __m256 exp_nonpositive(__m256 x) {
  const __m256 lo = _mm256_set1_ps(-87.0f);
  const __m256 keep = _mm256_cmp_ps(x, lo, _CMP_GE_OQ);
  x = _mm256_max_ps(x, lo);
  const __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f)),
                                   _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m256 f = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693359375f), x);  // ln2 in two parts
  f = _mm256_fnmadd_ps(n, _mm256_set1_ps(-2.12194440e-4f), f);
  __m256 p = _mm256_set1_ps(1.0f / 720.0f);
  p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(1.0f / 120.0f));
  p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(1.0f / 24.0f));
  p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(1.0f / 6.0f));
  p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(0.5f));
  p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(1.0f));
  p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(1.0f));
  const __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
  return _mm256_and_ps(_mm256_mul_ps(p, _mm256_castsi256_ps(e)), keep);
}

inline float exp_nonpositive(float x) {  // the same function, one lane (the tails)
  float in[8] = {x, 0, 0, 0, 0, 0, 0, 0}, out[8];
  _mm256_storeu_ps(out, exp_nonpositive(_mm256_loadu_ps(in)));
  return out[0];
}

// y (M, N) = x (M, K) @ (q (N, K) int8 * scale (N,))^T + bias; isa 1 = AVX2 loops only.
at::Tensor int8_linear(const at::Tensor& x, const at::Tensor& q, const at::Tensor& scale,
                       const c10::optional<at::Tensor>& bias, int64_t isa);

// y (M, N) = x (M, K) @ W^T + bias, W[n, k] = (c[n, k] - 8) * scale[n, g] + zero[n, g], the
// codes c as nibbles (N, K/2) uint8, g = k / group_size.
at::Tensor int4_linear(const at::Tensor& x, const at::Tensor& codes, const at::Tensor& scale,
                       const at::Tensor& zero, int64_t group_size,
                       const c10::optional<at::Tensor>& bias, int64_t isa);

// softmax(scale · q k^T) v for one query per sequence: q (B, H, 1, D), k (B, H_kv, S, D),
// v (B, H_kv, S, Dv) -> (B, H, 1, Dv).
at::Tensor decode_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                            double scale);

// The same three operations on raw float32 pointers, writing into preallocated outputs (no
// checks: decode_layer.cpp's callers have checked the operands). x (M, K) row-major; y (M, N)
// with rows ldy >= N floats apart (a block of columns of a wider output).
void int8_linear_into(const float* x, int64_t M, int64_t K, const int8_t* q, const float* scale,
                      const float* bias, int64_t N, float* y, int64_t ldy, int64_t isa);
void int4_linear_into(const float* x, int64_t M, int64_t K, const uint8_t* codes,
                      const float* scale, const float* zero, int64_t group_size,
                      const float* bias, int64_t N, float* y, int64_t ldy, int64_t isa);

// One operand of decode_attention_into: its data and strides (batch, head, position; the last
// dimension contiguous).
struct AttentionOperand {
  const float* data;
  int64_t sb, sh, ss;
};
// out (B, H, Dv) contiguous; q (B, H, D) (ss unused), k (B, H_kv, S, D), v (B, H_kv, S, Dv).
void decode_attention_into(const AttentionOperand& q, const AttentionOperand& k,
                           const AttentionOperand& v, int64_t B, int64_t H, int64_t Hkv, int64_t S,
                           int64_t D, int64_t Dv, double scale, float* out);

}  // namespace attnlab
