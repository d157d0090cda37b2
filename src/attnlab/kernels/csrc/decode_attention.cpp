// Attention of one new query per sequence over its cached keys, for decoding on x86 CPUs:
//
//   out[b, h, 0, :] = softmax(scale · q[b, h, 0, :] · k[b, h / r, :S, :]^T) · v[b, h / r, :S, :]
//
// with q (B, H, 1, D), k (B, H_kv, S, D), v (B, H_kv, S, Dv), r = H / H_kv (grouped-query
// attention reads each key/value head once per query head that shares it, without repeating it).
// Any strides, as long as the last dimension is contiguous (the KV cache's buffers and the heads'
// views of a joined q/k/v projection are).
//
// Why this file exists: at one query, PyTorch's CPU scaled_dot_product_attention (the flash
// kernel) spends most of its time outside the arithmetic: GPT-2-small's 12 heads over 120 keys
// are 0.18 M multiply-adds, a few microseconds, but the call took 40-68 us inside a decoding step
// (its worker threads woken after the matrix products, its blocked layout set up for one row).
// Here each head is one pass over its keys on one thread (scores, a max, exp, a weighted sum of
// the values), and the threads are used only when there are enough keys to pay for waking them.
//
// Non-finite inputs, as in attnlab's sdpa and math backends: a query holding NaN or an
// infinity, or a score that is NaN or +inf, gives a NaN output row; a -inf score is a key with
// weight 0 (a masked key).

#include <immintrin.h>

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include "decode_ops.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

namespace {

using attnlab::exp_nonpositive;

inline float hsum8(__m256 v) {
  __m128 lo = _mm256_castps256_ps128(v);
  __m128 hi = _mm256_extractf128_ps(v, 1);
  lo = _mm_add_ps(lo, hi);
  lo = _mm_add_ps(lo, _mm_movehl_ps(lo, lo));
  lo = _mm_add_ss(lo, _mm_movehdup_ps(lo));
  return _mm_cvtss_f32(lo);
}

inline float dot(const float* a, const float* b, int64_t D) {
  __m256 acc0 = _mm256_setzero_ps(), acc1 = _mm256_setzero_ps();
  int64_t d = 0;
  for (; d + 16 <= D; d += 16) {
    acc0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + d), _mm256_loadu_ps(b + d), acc0);
    acc1 = _mm256_fmadd_ps(_mm256_loadu_ps(a + d + 8), _mm256_loadu_ps(b + d + 8), acc1);
  }
  for (; d + 8 <= D; d += 8)
    acc0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + d), _mm256_loadu_ps(b + d), acc0);
  float s = hsum8(_mm256_add_ps(acc0, acc1));
  for (; d < D; ++d) s += a[d] * b[d];
  return s;
}

// 8 vectors -> one vector of their 8 horizontal sums (lane j = sum of a[j]).
inline __m256 hsum_8x8(const __m256* a) {
  const __m256 s01 = _mm256_hadd_ps(a[0], a[1]), s23 = _mm256_hadd_ps(a[2], a[3]);
  const __m256 s45 = _mm256_hadd_ps(a[4], a[5]), s67 = _mm256_hadd_ps(a[6], a[7]);
  const __m256 s0123 = _mm256_hadd_ps(s01, s23), s4567 = _mm256_hadd_ps(s45, s67);
  // lanes: s0123 = (0 1 2 3 | 0 1 2 3) halves, s4567 likewise
  const __m256 lo = _mm256_permute2f128_ps(s0123, s4567, 0x20);
  const __m256 hi = _mm256_permute2f128_ps(s0123, s4567, 0x31);
  return _mm256_add_ps(lo, hi);
}

// scores p[s] = scale · q · k[s] for all S keys. NV > 0: D = 8·NV, q held in registers and 8
// keys in flight (independent accumulators); NV = 0: any D, one key at a time.
template <int NV>
void scores(const float* q, const float* k, int64_t ks, int64_t S, int64_t D, float scale,
            float* p) {
  int64_t s = 0;
  if constexpr (NV > 0) {
    __m256 qv[NV];
    ATTNLAB_UNROLL for (int u = 0; u < NV; ++u) qv[u] = _mm256_loadu_ps(q + 8 * u);
    const __m256 sc = _mm256_set1_ps(scale);
    for (; s + 8 <= S; s += 8) {
      __m256 acc[8];
      ATTNLAB_UNROLL for (int j = 0; j < 8; ++j) {
        const float* kr = k + (s + j) * ks;
        acc[j] = _mm256_mul_ps(qv[0], _mm256_loadu_ps(kr));
        ATTNLAB_UNROLL for (int u = 1; u < NV; ++u) acc[j] = _mm256_fmadd_ps(qv[u], _mm256_loadu_ps(kr + 8 * u), acc[j]);
      }
      _mm256_storeu_ps(p + s, _mm256_mul_ps(hsum_8x8(acc), sc));
    }
  }
  for (; s < S; ++s) p[s] = dot(q, k + s * ks, D) * scale;
}

// out = sum_t p[t] · v[t] / sum. NV > 0: Dv = 8·NV, the sum held in registers.
template <int NV>
void weighted_values(const float* p, const float* v, int64_t vs, int64_t S, int64_t Dv,
                     float inv, float* out) {
  if constexpr (NV > 0) {
    __m256 acc[2][NV];
    ATTNLAB_UNROLL for (int u = 0; u < NV; ++u) acc[0][u] = acc[1][u] = _mm256_setzero_ps();
    int64_t t = 0;
    for (; t + 2 <= S; t += 2)
      ATTNLAB_UNROLL for (int j = 0; j < 2; ++j) {
        const __m256 w = _mm256_set1_ps(p[t + j]);
        const float* vr = v + (t + j) * vs;
        ATTNLAB_UNROLL for (int u = 0; u < NV; ++u) acc[j][u] = _mm256_fmadd_ps(w, _mm256_loadu_ps(vr + 8 * u), acc[j][u]);
      }
    if (t < S) {
      const __m256 w = _mm256_set1_ps(p[t]);
      ATTNLAB_UNROLL for (int u = 0; u < NV; ++u) acc[0][u] = _mm256_fmadd_ps(w, _mm256_loadu_ps(v + t * vs + 8 * u), acc[0][u]);
    }
    const __m256 iv = _mm256_set1_ps(inv);
    ATTNLAB_UNROLL for (int u = 0; u < NV; ++u) _mm256_storeu_ps(out + 8 * u, _mm256_mul_ps(_mm256_add_ps(acc[0][u], acc[1][u]), iv));
  } else {
    std::fill(out, out + Dv, 0.f);
    for (int64_t t = 0; t < S; ++t) {
      const float* vr = v + t * vs;
      for (int64_t d = 0; d < Dv; ++d) out[d] += p[t] * vr[d];
    }
    for (int64_t d = 0; d < Dv; ++d) out[d] *= inv;
  }
}

// One (batch, head): p (S floats of scratch) holds the scores, then their exponentials.
template <int NQ, int NV>
void one_head(const float* q, const float* k, const float* v, int64_t ks, int64_t vs, int64_t S,
              int64_t D, int64_t Dv, float scale, float* p, float* out) {
  float qsum = 0.f;
  for (int64_t d = 0; d < D; ++d) qsum += q[d];
  scores<NQ>(q, k, ks, S, D, scale, p);
  float m = -std::numeric_limits<float>::infinity();
  for (int64_t s = 0; s < S; ++s) m = std::max(m, p[s]);
  bool finite = std::isfinite(qsum) && std::isfinite(m);
  const __m256 mv = _mm256_set1_ps(m);
  __m256 total = _mm256_setzero_ps();
  int64_t s = 0;
  for (; s + 8 <= S; s += 8) {
    const __m256 x = _mm256_loadu_ps(p + s);
    // a NaN score fails every comparison with the maximum; it makes the row NaN
    finite = finite && _mm256_movemask_ps(_mm256_cmp_ps(x, mv, _CMP_LE_OQ)) == 0xFF;
    const __m256 e = exp_nonpositive(_mm256_sub_ps(x, mv));
    _mm256_storeu_ps(p + s, e);
    total = _mm256_add_ps(total, e);
  }
  float sum = hsum8(total);
  for (; s < S; ++s) {
    finite = finite && p[s] <= m;
    p[s] = exp_nonpositive(p[s] - m);
    sum += p[s];
  }
  if (!finite || S == 0) {
    std::fill(out, out + Dv, std::numeric_limits<float>::quiet_NaN());
    return;
  }
  weighted_values<NV>(p, v, vs, S, Dv, 1.f / sum, out);
}

using HeadFn = void (*)(const float*, const float*, const float*, int64_t, int64_t, int64_t,
                        int64_t, int64_t, float, float*, float*);

template <int NQ>
HeadFn pick_v(int64_t Dv) {
  switch (Dv) {
    case 32: return one_head<NQ, 4>;
    case 64: return one_head<NQ, 8>;
    case 128: return one_head<NQ, 16>;
    default: return one_head<NQ, 0>;
  }
}

HeadFn pick(int64_t D, int64_t Dv) {
  switch (D) {
    case 32: return pick_v<4>(Dv);
    case 64: return pick_v<8>(Dv);
    case 128: return pick_v<16>(Dv);
    default: return pick_v<0>(Dv);
  }
}

}  // namespace

namespace attnlab {

void decode_attention_into(const AttentionOperand& q, const AttentionOperand& k,
                           const AttentionOperand& v, int64_t B, int64_t H, int64_t Hkv, int64_t S,
                           int64_t D, int64_t Dv, double scale, float* op) {
  const int64_t r = H / Hkv;
  const float sc = static_cast<float>(scale);
  // heads per task: about 32 K multiply-adds each, so that a cache of more than a few dozen
  // positions is read by both threads (inside a decoding step the cache comes from memory, not
  // from cache: GPT-2 small at 151 positions, 12 layers: 1.44 ms per token on one thread)
  const int64_t grain = std::max<int64_t>(1, (int64_t(1) << 15) / (S * (D + Dv) + 1));
  const HeadFn head = pick(D, Dv);
  at::parallel_for(0, B * H, grain, [&](int64_t i0, int64_t i1) {
    std::vector<float> scratch(static_cast<size_t>(std::max<int64_t>(S, 1)));
    for (int64_t i = i0; i < i1; ++i) {
      const int64_t b = i / H, h = i % H, hk = h / r;
      head(q.data + b * q.sb + h * q.sh, k.data + b * k.sb + hk * k.sh,
           v.data + b * v.sb + hk * v.sh, k.ss, v.ss, S, D, Dv, sc, scratch.data(), op + i * Dv);
    }
  });
}

at::Tensor decode_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                            double scale) {
  TORCH_CHECK(q.device().is_cpu() && k.device().is_cpu() && v.device().is_cpu(),
              "decode_attention: CPU tensors only");
  TORCH_CHECK(q.scalar_type() == at::kFloat && k.scalar_type() == at::kFloat &&
                  v.scalar_type() == at::kFloat,
              "decode_attention: q, k and v must be float32");
  TORCH_CHECK(q.dim() == 4 && k.dim() == 4 && v.dim() == 4, "decode_attention: 4-d q, k, v");
  const int64_t B = q.size(0), H = q.size(1), D = q.size(3);
  const int64_t Hkv = k.size(1), S = k.size(2), Dv = v.size(3);
  TORCH_CHECK(q.size(2) == 1, "decode_attention: one query per sequence (q.size(2) == 1), got ",
              q.size(2));
  TORCH_CHECK(k.size(0) == B && v.size(0) == B && v.size(1) == Hkv && v.size(2) == S &&
                  k.size(3) == D,
              "decode_attention: k (B, H_kv, S, D) and v (B, H_kv, S, Dv) must match q (B, H, 1, D)");
  TORCH_CHECK(Hkv > 0 && H % Hkv == 0, "decode_attention: H = ", H,
              " must be a multiple of H_kv = ", Hkv);
  TORCH_CHECK(q.stride(3) == 1 && k.stride(3) == 1 && v.stride(3) == 1,
              "decode_attention: the last dimension of q, k and v must be contiguous");
  at::Tensor out = at::empty({B, H, 1, Dv}, q.options());
  decode_attention_into({q.data_ptr<float>(), q.stride(0), q.stride(1), 0},
                        {k.data_ptr<float>(), k.stride(0), k.stride(1), k.stride(2)},
                        {v.data_ptr<float>(), v.stride(0), v.stride(1), v.stride(2)}, B, H, Hkv,
                        S, D, Dv, scale, out.data_ptr<float>());
  return out;
}

}  // namespace attnlab

TORCH_LIBRARY(attnlab_decode, m) {
  m.def("attention(Tensor q, Tensor k, Tensor v, float scale) -> Tensor");
}

TORCH_LIBRARY_IMPL(attnlab_decode, CPU, m) { m.impl("attention", &attnlab::decode_attention); }
