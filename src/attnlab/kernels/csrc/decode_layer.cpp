// One decoding step of a whole decoder layer (self-attention + FFN, each in its residual
// sublayer) in one call, for the quantized decoders of attnlab.transforms.decode_layout:
//
//   pre-norm:  x = x + Attn(Norm1(x));  x = x + FFN(Norm2(x))
//   post-norm: x = Norm1(x + Attn(x));  x = Norm2(x + FFN(x))
//   Attn(h) = softmax(scale · q K^T) V W_out (+ b),  q, k, v = h W_q, h W_k, h W_v (+ b) split
//             into heads, the new k, v written into the KV cache at position `length` first
//   FFN(h)  = act(h W_up) W_down,  or  (act(h W_gate) * h W_up) W_down (gated variants)
//
// and (stack_step, decode_step) a whole GPT stack's step, with the token and position look-ups
// before it and the final norm after it.
//
// Why this file exists: at one token per sequence, GPT-2 small's twelve layers are ~70 matrix
// products of a few hundred microseconds each and ~250 small operations (norms, views, the
// cache write, the residual adds, the activation) of a few microseconds each, and every one of
// those went through Python and PyTorch's dispatcher: measured on issue 27's 2-core Xeon, a
// quantized GPT-2 token spent 3.3 ms outside the products (with them stubbed out), as much as
// the int4 products themselves. Inside a step even a dispatcher call from C++ is slow: its code
// and data are evicted by the weights streamed before it (after an 8 MB sweep, at::layer_norm
// of 768 floats took 29-31 us, at::gelu of 3072 floats 66-72 us, an at::empty 15 us). So the
// products are attnlab's kernels (woq_gemm.cpp) and the attention decode_attention.cpp's,
// writing into a reused workspace; LayerNorm is ATen's own kernel called through its dispatch
// stub; GELU, the adds and the look-ups are computed here. The step is bit for bit what the
// modules compute (tests/transforms/test_decode_layer.py holds it to torch.equal), except the
// exact (erf) GELU: F.gelu's (oneDNN's) and this file's differ in the last bits (within 1e-5 of
// the modules).
//
// What it takes (decode_layer.py checks all of it and otherwise leaves the layer to its
// modules): one query per sequence (x (B, 1, E) float32 contiguous on the CPU), no mask, RoPE
// or no rotary positions (cos and sin of the step come from Python, computed as the rotary
// module computes them), a plain (unwindowed) cache with room for one more position, every
// projection an int8 or int4 layer run by attnlab's kernels, LayerNorm or RMSNorm, and relu /
// gelu / gelu_tanh / silu (plain or gated).

// The stub of ATen's LayerNorm kernel declares its per-instruction-set kernels only where these
// are defined (they are for the x86 builds of torch; nothing else in ATen's headers reads them).
#define HAVE_AVX512_CPU_DEFINITION
#define HAVE_AVX2_CPU_DEFINITION
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <ATen/native/Activation.h>
#include <ATen/native/layer_norm.h>
#include <torch/custom_class.h>
#include <torch/library.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "decode_ops.h"

namespace {

// Layout of the `config` list (see decode_layer.py, which writes it).
enum Config : int64_t {
  PRE_NORM, NORM_KIND, ACTIVATION, GATED, HEADS, KV_HEADS, HEAD_DIM,
  ROTARY,   // 0: none, 1: RoPE "half" layout (pairs i, i + D/2), 2: "interleaved" (2i, 2i + 1)
  LINEARS,  // then (bits, group size) for q, k, v, out, up, gate, down
};
enum Linear : int64_t { Q, K, V, OUT, UP, GATE, DOWN, N_LINEARS };
// Layout of the `tensors` list: norm 1 (weight, bias), norm 2 (weight, bias), then per linear
// (codes, scales, zeros, bias) in the order of `Linear`.
constexpr int64_t NORM1 = 0, NORM2 = 2, FIRST_LINEAR = 4;
constexpr int64_t TENSORS = FIRST_LINEAR + 4 * N_LINEARS, CONFIGS = LINEARS + 2 * N_LINEARS,
                  FLOATS = 3;  // per layer
enum Activation : int64_t { RELU, GELU, GELU_TANH, SILU };

using Opt = c10::optional<at::Tensor>;

// One int8 or int4 layer as raw pointers, checked against the input width K it is applied to.
struct QLinear {
  int64_t bits = 0, group = 0, N = 0, K = 0;
  const void* codes = nullptr;
  const float *scales = nullptr, *zeros = nullptr, *bias = nullptr;
};

bool float_vector(const at::Tensor& t, int64_t n) {
  return t.scalar_type() == at::kFloat && t.is_contiguous() && t.numel() == n && t.device().is_cpu();
}

QLinear linear(const Opt* t, const int64_t* config, int64_t which, int64_t K) {
  QLinear l;
  l.bits = config[LINEARS + 2 * which];
  l.group = config[LINEARS + 2 * which + 1];
  l.K = K;
  const int64_t at = FIRST_LINEAR + 4 * which;
  const Opt &codes = t[at], &scales = t[at + 1], &zeros = t[at + 2], &bias = t[at + 3];
  TORCH_CHECK(codes.has_value() && scales.has_value(), "decode_layer: linear ", which,
              " has no codes or scales");
  TORCH_CHECK(l.bits == 8 || (l.bits == 4 && zeros.has_value()), "decode_layer: linear ", which,
              " must be int8, or int4 with zeros; got bits ", l.bits);
  const at::Tensor& c = *codes;
  TORCH_CHECK(c.dim() == 2 && c.is_contiguous() && c.device().is_cpu(), "decode_layer: linear ",
              which, "'s codes must be a contiguous 2-d CPU tensor");
  l.N = c.size(0);
  if (l.bits == 8) {
    TORCH_CHECK(c.scalar_type() == at::kChar && c.size(1) == K && float_vector(*scales, l.N),
                "decode_layer: linear ", which, " must be int8 codes (N, ", K,
                ") and float32 scales (N,); got codes ", c.sizes());
  } else {
    TORCH_CHECK(l.group > 0 && l.group % 16 == 0 && K % l.group == 0, "decode_layer: linear ",
                which, "'s group size ", l.group, " must be a multiple of 16 dividing ", K);
    const int64_t G = K / l.group;
    TORCH_CHECK(c.scalar_type() == at::kByte && c.size(1) == K / 2 &&
                    float_vector(*scales, l.N * G) && float_vector(*zeros, l.N * G),
                "decode_layer: linear ", which, " must be int4 codes (N, ", K / 2,
                ") uint8 with float32 scales and zeros (N, ", G, "); got codes ", c.sizes());
    l.zeros = zeros->data_ptr<float>();
  }
  l.codes = c.data_ptr();
  l.scales = scales->data_ptr<float>();
  if (bias.has_value()) {
    TORCH_CHECK(float_vector(*bias, l.N), "decode_layer: linear ", which,
                "'s bias must be a contiguous float32 (", l.N, ",) tensor");
    l.bias = bias->data_ptr<float>();
  }
  return l;
}

// y (M, N) = x (M, K) through the layer; y's rows ldy floats apart (default N)
void apply(const QLinear& l, const float* x, int64_t M, float* y, int64_t ldy = 0) {
  if (ldy == 0) ldy = l.N;
  if (l.bits == 8)
    attnlab::int8_linear_into(x, M, l.K, static_cast<const int8_t*>(l.codes), l.scales, l.bias,
                              l.N, y, ldy, 0);
  else
    attnlab::int4_linear_into(x, M, l.K, static_cast<const uint8_t*>(l.codes), l.scales, l.zeros,
                              l.group, l.bias, l.N, y, ldy, 0);
}

// The rows a step works in, kept from call to call (one set per calling thread): a decoding
// step allocates only the tensor it returns. Why: inside a step every small ATen call (a norm,
// an add, an allocation, a view) runs with its code and data evicted by the megabytes of
// weights streamed before it; measured on issue 27's 2-core Xeon after an 8 MB sweep,
// at::layer_norm of 768 floats took 29-31 us, at::gelu of 3072 floats 66-72 us, an at::empty
// 15 us.
struct Workspace {
  at::Tensor h, p, a, o, y, f, up, gate, down, mean, rstd;
};
thread_local Workspace workspace;

// t as a (B, n) float32 buffer. The ATen calls that write into the workspace run in inference
// mode (allowed on its tensors whichever mode made them, and on the caller's normal tensors).
float* rows(at::Tensor& t, int64_t B, int64_t n) {
  if (!t.defined() || t.size(0) != B || t.size(1) != n) t = at::empty({B, n}, at::kFloat);
  return t.data_ptr<float>();
}

// ATen's own CPU LayerNorm kernel, for the instruction set ATen itself picks on this CPU (as
// its dispatch stub does: AVX-512 where registered, else AVX2), called without the dispatcher
// or an allocation: bit for bit at::layer_norm. nullptr where there is none (at::layer_norm).
using NormKernel = void (*)(const at::Tensor&, const at::Tensor&, const at::Tensor&, int64_t,
                            int64_t, double, at::Tensor*, at::Tensor*, at::Tensor*);
NormKernel layer_norm_kernel() {
  static const NormKernel kernel = []() -> NormKernel {
    using Stub = decltype(at::native::LayerNormKernel);
    const std::string cap = at::get_cpu_capability();
    if (cap == "AVX512") return Stub::AVX512 != nullptr ? Stub::AVX512 : Stub::AVX2;
    if (cap == "AVX2") return Stub::AVX2;
    return nullptr;
  }();
  return kernel;
}

// out (B, E) = norm(x) for x (B, E) contiguous (any view of it with that layout). LayerNorm as
// attnlab.layers.norm runs it (F.layer_norm); RMSNorm is x * rsqrt(mean(x^2) + eps) * w.
void norm_into(const at::Tensor& x, int64_t B, int64_t E, int64_t kind, const Opt& w,
               const Opt& b, double eps, at::Tensor& out) {
  Workspace& ws = workspace;
  if (kind == 0) {
    const NormKernel k = layer_norm_kernel();
    const bool plain = (!w.has_value() || float_vector(*w, E)) && (!b.has_value() || float_vector(*b, E));
    if (k != nullptr && plain) {
      rows(ws.mean, B, 1);
      rows(ws.rstd, B, 1);
      k(x, w.has_value() ? *w : at::Tensor(), b.has_value() ? *b : at::Tensor(), B, E, eps, &out,
        &ws.mean, &ws.rstd);
      return;
    }
    c10::InferenceMode guard;
    out.view({B, E}).copy_(at::layer_norm(x.view({B, E}), {E}, w, b, eps));
    return;
  }
  c10::InferenceMode guard;
  const at::Tensor v = x.view({B, E});
  out.view({B, E}).copy_(v * at::rsqrt(v.pow(2).mean(-1, true) + eps) * *w);
}

void add_into(const float* a, const float* b, float* out, int64_t n) {
  for (int64_t i = 0; i < n; ++i) out[i] = a[i] + b[i];
}

// GELU(x) = x/2 (1 + erf(x/sqrt 2)), in place, 8 lanes. erf(|z|) = 1 - t P(t) exp(-z^2) with
// t = 1 / (1 + p|z|) (Abramowitz and Stegun 7.1.26, absolute error below 1.5e-7); for z < 0,
// 1 + erf(z) is formed as t P(t) exp(-z^2) directly (no cancellation). Against float64 GELU on
// 10^7 normal draws (x 3) the largest absolute error is below 1e-6, about what F.gelu's own
// (oneDNN's) has; the two differ in the last bits, so a GELU layer's step is not bit for bit its
// modules' (tests/transforms/test_decode_layer.py holds it to 1e-5).
void gelu_inplace(float* x, int64_t n) {
  const __m256 c = _mm256_set1_ps(0.70710678118654752f), p = _mm256_set1_ps(0.3275911f);
  const __m256 a1 = _mm256_set1_ps(0.254829592f), a2 = _mm256_set1_ps(-0.284496736f);
  const __m256 a3 = _mm256_set1_ps(1.421413741f), a4 = _mm256_set1_ps(-1.453152027f);
  const __m256 a5 = _mm256_set1_ps(1.061405429f), one = _mm256_set1_ps(1.f);
  const __m256 two = _mm256_set1_ps(2.f), half = _mm256_set1_ps(0.5f);
  const __m256 sign = _mm256_set1_ps(-0.f);
  auto eight = [&](__m256 v) {
    const __m256 z = _mm256_mul_ps(v, c);
    const __m256 az = _mm256_andnot_ps(sign, z);
    const __m256 t = _mm256_div_ps(one, _mm256_fmadd_ps(p, az, one));
    __m256 q = _mm256_fmadd_ps(a5, t, a4);
    q = _mm256_fmadd_ps(q, t, a3);
    q = _mm256_fmadd_ps(q, t, a2);
    q = _mm256_fmadd_ps(q, t, a1);
    const __m256 e = attnlab::exp_nonpositive(_mm256_xor_ps(sign, _mm256_mul_ps(z, z)));
    const __m256 tail = _mm256_mul_ps(_mm256_mul_ps(q, t), e);  // 1 - erf(|z|)
    const __m256 neg = _mm256_cmp_ps(z, _mm256_setzero_ps(), _CMP_LT_OQ);
    const __m256 onep = _mm256_blendv_ps(_mm256_sub_ps(two, tail), tail, neg);  // 1 + erf(z)
    return _mm256_mul_ps(_mm256_mul_ps(v, half), onep);
  };
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) _mm256_storeu_ps(x + i, eight(_mm256_loadu_ps(x + i)));
  if (i < n) {
    float buf[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    std::memcpy(buf, x + i, sizeof(float) * static_cast<size_t>(n - i));
    _mm256_storeu_ps(buf, eight(_mm256_loadu_ps(buf)));
    std::memcpy(x + i, buf, sizeof(float) * static_cast<size_t>(n - i));
  }
}

// GELU's tanh form, 0.5 x (1 + tanh(b (x + k x^3))), as ATen's vectorized CPU kernel computes it
// (the same operations in the same order, with the same SLEEF tanh that torch ships; torch's
// build contracts x + k x^3 into one fused multiply-add), so bit for bit at::gelu(x, "tanh")
// (tests/transforms/test_decode_layer.py holds it to torch.equal) wherever ATen's kernel takes
// its vector path for every element: its instruction set's loop handles 2 vectors at a time and
// leaves the rest of each thread's chunk to a scalar tanh (gelu_tanh_inplace checks that there
// is no such rest).
extern "C" __m256 Sleef_tanhf8_u10(__m256);
constexpr float kGeluBeta = static_cast<float>(M_SQRT2 * M_2_SQRTPI * 0.5);
constexpr float kGeluKappa = static_cast<float>(0.044715);

void gelu_tanh8(float* x, int64_t n) {
  const __m256 half = _mm256_set1_ps(0.5f), one = _mm256_set1_ps(1.f);
  const __m256 beta = _mm256_set1_ps(kGeluBeta), kappa = _mm256_set1_ps(kGeluKappa);
  for (int64_t i = 0; i < n; i += 8) {
    const __m256 v = _mm256_loadu_ps(x + i);
    const __m256 cube = _mm256_mul_ps(_mm256_mul_ps(v, v), v);
    const __m256 inner = _mm256_mul_ps(beta, _mm256_fmadd_ps(kappa, cube, v));
    const __m256 t = Sleef_tanhf8_u10(inner);
    _mm256_storeu_ps(x + i, _mm256_mul_ps(_mm256_mul_ps(half, v), _mm256_add_ps(one, t)));
  }
}

#pragma GCC push_options
#pragma GCC target("avx512f")
extern "C" __m512 Sleef_tanhf16_u10(__m512);
void gelu_tanh16(float* x, int64_t n) {
  const __m512 half = _mm512_set1_ps(0.5f), one = _mm512_set1_ps(1.f);
  const __m512 beta = _mm512_set1_ps(kGeluBeta), kappa = _mm512_set1_ps(kGeluKappa);
  for (int64_t i = 0; i < n; i += 16) {
    const __m512 v = _mm512_loadu_ps(x + i);
    const __m512 cube = _mm512_mul_ps(_mm512_mul_ps(v, v), v);
    const __m512 inner = _mm512_mul_ps(beta, _mm512_fmadd_ps(kappa, cube, v));
    const __m512 t = Sleef_tanhf16_u10(inner);
    _mm512_storeu_ps(x + i, _mm512_mul_ps(_mm512_mul_ps(half, v), _mm512_add_ps(one, t)));
  }
}
#pragma GCC pop_options

// The vector width (floats) of ATen's GELU kernel on this CPU (as its dispatch stub picks it:
// AVX-512 where registered, else AVX2), 0 where it has neither.
int64_t gelu_lanes() {
  static const int64_t lanes = []() -> int64_t {
    using Stub = decltype(at::native::GeluKernel);
    const std::string cap = at::get_cpu_capability();
    if (cap == "AVX512" && Stub::AVX512 != nullptr) return 16;
    if ((cap == "AVX512" || cap == "AVX2") && Stub::AVX2 != nullptr) return 8;
    return 0;
  }();
  return lanes;
}

void gelu_tanh_inplace(at::Tensor& t, float* x, int64_t n) {
  // ATen's kernel runs n < 16385 elements as one chunk, more as one chunk per thread
  const int64_t lanes = gelu_lanes(), step = 2 * lanes, threads = at::get_num_threads();
  const bool whole = lanes > 0 && n % step == 0 && (n <= 16384 || n % (step * threads) == 0);
  if (whole && lanes == 16) return gelu_tanh16(x, n);
  if (whole) return gelu_tanh8(x, n);
  c10::InferenceMode guard;
  at::gelu_(t, "tanh");
}

// attnlab.layers.feedforward.ACTIVATIONS, in place on a workspace row block
void activate(at::Tensor& t, float* data, int64_t n, int64_t kind) {
  if (kind == GELU) return gelu_inplace(data, n);
  if (kind == GELU_TANH) return gelu_tanh_inplace(t, data, n);
  c10::InferenceMode guard;
  if (kind == RELU) at::relu_(t);
  else at::silu_(t);
}

// attnlab.layers.positional.RotaryEmbedding.rotate of x (B, H, 1, D) with the step's cos and
// sin (float32, broadcastable to (B, H, 1, D/2)), in its order of operations.
at::Tensor rotate(const at::Tensor& x, int64_t layout, const at::Tensor& cos,
                  const at::Tensor& sin) {
  if (layout == 1) {
    const auto halves = x.chunk(2, -1);
    const at::Tensor &x1 = halves[0], &x2 = halves[1];
    return at::cat({x1 * cos - x2 * sin, x2 * cos + x1 * sin}, -1);
  }
  const int64_t D = x.size(-1);
  const at::Tensor x1 = x.slice(-1, 0, D, 2), x2 = x.slice(-1, 1, D, 2);
  return at::stack({x1 * cos - x2 * sin, x2 * cos + x1 * sin}, -1).flatten(-2);
}

// cache[b, h, length, :] = p[b, offset + h D : offset + (h + 1) D] for every sequence b and
// head h (a plain copy of D floats each; ATen's strided copy costs more than the bytes here).
void write_position(const at::Tensor& cache, const float* src, int64_t row, int64_t offset,
                    int64_t Hkv, int64_t D, int64_t length) {
  float* dst = cache.data_ptr<float>();
  const int64_t B = cache.size(0), sb = cache.stride(0), sh = cache.stride(1),
                ss = cache.stride(2);
  for (int64_t b = 0; b < B; ++b)
    for (int64_t h = 0; h < Hkv; ++h)
      std::memcpy(dst + b * sb + h * sh + length * ss, src + b * row + offset + h * D,
                  sizeof(float) * static_cast<size_t>(D));
}

// One layer's step: t (TENSORS entries), config (CONFIGS), floats (FLOATS) as described above.
at::Tensor step(const at::Tensor& x, const Opt* t, const int64_t* config, const double* floats,
                const at::Tensor& cache_k, const at::Tensor& cache_v, int64_t length,
                const Opt& cos, const Opt& sin) {
  TORCH_CHECK(x.dim() == 3 && x.size(1) == 1 && x.scalar_type() == at::kFloat &&
                  x.is_contiguous() && x.device().is_cpu(),
              "decode_layer: x must be a contiguous float32 (B, 1, E) CPU tensor");
  const int64_t B = x.size(0), E = x.size(2);
  const int64_t H = config[HEADS], Hkv = config[KV_HEADS], D = config[HEAD_DIM];
  TORCH_CHECK(H > 0 && Hkv > 0 && D > 0 && H % Hkv == 0, "decode_layer: H = ", H, ", H_kv = ",
              Hkv, ", D = ", D, ": expected positive sizes with H a multiple of H_kv");
  TORCH_CHECK(cache_k.dim() == 4 && cache_v.dim() == 4 && cache_k.size(0) == B &&
                  cache_k.size(1) == Hkv && cache_k.size(3) == D && cache_v.size(0) == B &&
                  cache_v.size(1) == Hkv && cache_v.size(3) == D &&
                  cache_k.size(2) == cache_v.size(2),
              "decode_layer: caches must be (B, H_kv, L, D) for this layer");
  TORCH_CHECK(cache_k.scalar_type() == at::kFloat && cache_v.scalar_type() == at::kFloat &&
                  cache_k.stride(3) == 1 && cache_v.stride(3) == 1 && cache_k.device().is_cpu() &&
                  cache_v.device().is_cpu(),
              "decode_layer: caches must be float32 CPU tensors with a contiguous last dimension");
  TORCH_CHECK(length >= 0 && length < cache_k.size(2), "decode_layer: cache position ", length,
              " outside its ", cache_k.size(2), " slots");
  const bool pre = config[PRE_NORM] != 0, gated = config[GATED] != 0;
  const int64_t kind = config[NORM_KIND], P = (H + 2 * Hkv) * D;
  const Opt &w1 = t[NORM1], &b1 = t[NORM1 + 1], &w2 = t[NORM2], &b2 = t[NORM2 + 1];
  TORCH_CHECK(kind == 0 || (w1.has_value() && w2.has_value()),
              "decode_layer: RMSNorm needs its weights");
  const QLinear q_proj = linear(t, config, Q, E), k_proj = linear(t, config, K, E);
  const QLinear v_proj = linear(t, config, V, E), out = linear(t, config, OUT, H * D);
  const QLinear up = linear(t, config, UP, E);
  const QLinear gate = gated ? linear(t, config, GATE, E) : QLinear{};
  const QLinear down = linear(t, config, DOWN, up.N);
  const int64_t F = up.N;
  TORCH_CHECK(q_proj.N == H * D && k_proj.N == Hkv * D && v_proj.N == Hkv * D && out.N == E &&
                  down.N == E && (!gated || gate.N == F),
              "decode_layer: projections of the wrong sizes: q ", q_proj.N, ", k ", k_proj.N,
              ", v ", v_proj.N, " (expected ", H * D, ", ", Hkv * D, ", ", Hkv * D, "), out ",
              out.N, ", down ", down.N, " (expected ", E, ")");
  Workspace& ws = workspace;
  const float* xp = x.data_ptr<float>();
  at::Tensor result = at::empty({B, 1, E}, x.options());
  float* rp = result.data_ptr<float>();

  // self-attention sublayer: a = Attn(pre ? Norm1(x) : x)
  const float* h = xp;
  if (pre) {
    rows(ws.h, B, E);
    norm_into(x, B, E, kind, w1, b1, floats[0], ws.h);
    h = ws.h.data_ptr<float>();
  }
  float* pp = rows(ws.p, B, P);  // (B, (H + 2 H_kv) D): q, k, v side by side
  apply(q_proj, h, B, pp, P);
  apply(k_proj, h, B, pp + H * D, P);
  apply(v_proj, h, B, pp + (H + Hkv) * D, P);
  attnlab::AttentionOperand q{pp, P, D, 0};
  at::Tensor q_rotated;
  if (config[ROTARY] != 0) {
    TORCH_CHECK(cos.has_value() && sin.has_value(), "decode_layer: rotary layer without cos/sin");
    const at::Tensor p = ws.p;
    const at::Tensor qv = p.narrow(1, 0, H * D).view({B, 1, H, D}).transpose(1, 2);
    const at::Tensor k = p.narrow(1, H * D, Hkv * D).view({B, 1, Hkv, D}).transpose(1, 2);
    q_rotated = rotate(qv, config[ROTARY], *cos, *sin).contiguous();  // (B, H, 1, D)
    cache_k.narrow(2, length, 1).copy_(rotate(k, config[ROTARY], *cos, *sin));
    q = {q_rotated.data_ptr<float>(), H * D, D, 0};
  } else {
    write_position(cache_k, pp, P, H * D, Hkv, D, length);
  }
  write_position(cache_v, pp, P, (H + Hkv) * D, Hkv, D, length);
  const int64_t S = length + 1;
  float* ap = rows(ws.a, B, H * D);
  attnlab::decode_attention_into(
      q, {cache_k.data_ptr<float>(), cache_k.stride(0), cache_k.stride(1), cache_k.stride(2)},
      {cache_v.data_ptr<float>(), cache_v.stride(0), cache_v.stride(1), cache_v.stride(2)}, B, H,
      Hkv, S, D, D, floats[2], ap);
  float* op = rows(ws.o, B, E);
  apply(out, ap, B, op);
  // y = x + a (pre-norm), Norm1(x + a) (post-norm)
  float* yp = rows(ws.y, B, E);
  if (pre) {
    add_into(xp, op, yp, B * E);
  } else {
    add_into(xp, op, rows(ws.h, B, E), B * E);
    norm_into(ws.h, B, E, kind, w1, b1, floats[0], ws.y);
  }

  // feed-forward sublayer on f = pre ? Norm2(y) : y
  const float* fp = yp;
  if (pre) {
    rows(ws.f, B, E);
    norm_into(ws.y, B, E, kind, w2, b2, floats[1], ws.f);
    fp = ws.f.data_ptr<float>();
  }
  float* up_p = rows(ws.up, B, F);
  if (gated) {
    float* gp = rows(ws.gate, B, F);
    apply(gate, fp, B, gp);
    apply(up, fp, B, up_p);
    activate(ws.gate, gp, B * F, config[ACTIVATION]);
    for (int64_t i = 0; i < B * F; ++i) up_p[i] = gp[i] * up_p[i];
  } else {
    apply(up, fp, B, up_p);
    activate(ws.up, up_p, B * F, config[ACTIVATION]);
  }
  float* dp = rows(ws.down, B, E);
  apply(down, up_p, B, dp);
  if (pre) {
    add_into(yp, dp, rp, B * E);
  } else {
    add_into(yp, dp, rows(ws.h, B, E), B * E);
    norm_into(ws.h, B, E, kind, w2, b2, floats[1], result);
  }
  return result;
}

at::Tensor layer_step(const at::Tensor& x, const c10::List<Opt>& tensors,
                      std::vector<int64_t> config, std::vector<double> floats,
                      const at::Tensor& cache_k, const at::Tensor& cache_v, int64_t length,
                      const Opt& cos, const Opt& sin) {
  TORCH_CHECK(static_cast<int64_t>(config.size()) == CONFIGS &&
                  static_cast<int64_t>(tensors.size()) == TENSORS &&
                  static_cast<int64_t>(floats.size()) == FLOATS,
              "decode_layer: malformed layer description (", tensors.size(), " tensors, ",
              config.size(), " config entries, ", floats.size(), " floats; expected ", TENSORS,
              ", ", CONFIGS, ", ", FLOATS, ")");
  const std::vector<Opt> t(tensors.begin(), tensors.end());
  return step(x, t.data(), config.data(), floats.data(), cache_k, cache_v, length, cos, sin);
}

// A whole decoder stack's descriptions (the layers' `tensors`, `config` and `floats` one after
// another), made once per decoding call: stack_step then runs all the layers' steps in one call,
// without converting some thirty tensors per layer from Python at every token.
struct DecodeStack : torch::CustomClassHolder {
  std::vector<Opt> tensors;
  std::vector<int64_t> config;
  std::vector<double> floats;
  int64_t layers = 0;

  DecodeStack(const c10::List<Opt>& t, std::vector<int64_t> c, std::vector<double> f)
      : tensors(t.begin(), t.end()), config(std::move(c)), floats(std::move(f)) {
    layers = static_cast<int64_t>(config.size()) / CONFIGS;
    TORCH_CHECK(layers > 0 && static_cast<int64_t>(config.size()) == layers * CONFIGS &&
                    static_cast<int64_t>(tensors.size()) == layers * TENSORS &&
                    static_cast<int64_t>(floats.size()) == layers * FLOATS,
                "decode_layer: malformed stack description (", tensors.size(), " tensors, ",
                config.size(), " config entries, ", floats.size(), " floats for whole layers of ",
                TENSORS, ", ", CONFIGS, ", ", FLOATS, ")");
  }
  int64_t size() const { return layers; }

  // The model's norm after the last layer (decode_step applies it): kind 0 LayerNorm, 1 RMSNorm.
  Opt final_w, final_b;
  int64_t final_kind = -1;
  double final_eps = 0;
  void set_final_norm(const Opt& w, const Opt& b, int64_t kind, double eps) {
    TORCH_CHECK(kind == 0 || (kind == 1 && w.has_value()), "decode_layer: final norm kind ",
                kind, ": expected 0 (LayerNorm) or 1 (RMSNorm, with its weight)");
    final_w = w;
    final_b = b;
    final_kind = kind;
    final_eps = eps;
  }
};

at::Tensor run_stack(at::Tensor h, const DecodeStack& stack, const std::vector<at::Tensor>& cache_k,
                     const std::vector<at::Tensor>& cache_v, const std::vector<int64_t>& lengths,
                     const Opt& cos, const Opt& sin) {
  const int64_t L = stack.layers;
  TORCH_CHECK(static_cast<int64_t>(cache_k.size()) == L &&
                  static_cast<int64_t>(cache_v.size()) == L &&
                  static_cast<int64_t>(lengths.size()) == L,
              "decode_layer: ", L, " layers need ", L, " key caches, value caches and lengths; got ",
              cache_k.size(), ", ", cache_v.size(), ", ", lengths.size());
  for (int64_t i = 0; i < L; ++i)
    h = step(h, stack.tensors.data() + i * TENSORS, stack.config.data() + i * CONFIGS,
             stack.floats.data() + i * FLOATS, cache_k[i], cache_v[i], lengths[i], cos, sin);
  return h;
}

at::Tensor stack_step(const at::Tensor& x, const c10::intrusive_ptr<DecodeStack>& stack,
                      const std::vector<at::Tensor>& cache_k, const std::vector<at::Tensor>& cache_v,
                      const std::vector<int64_t>& lengths, const Opt& cos, const Opt& sin) {
  return run_stack(x, *stack, cache_k, cache_v, lengths, cos, sin);
}

// A GPT's whole decoding step up to its final norm, for one new token per sequence:
//   x = tok_embed(ids) (* scale) (+ pos_table[position]);  x = layers(x);  x = final_norm(x)
// ids (B, 1) int64 (any strides); tok (V, E) and pos (P, E) float32 contiguous. The ids and the
// position are checked as TokenEmbedding and LearnedPositionalEmbedding check them (ValueError).
at::Tensor decode_step(const at::Tensor& ids, const at::Tensor& tok, double scale, const Opt& pos,
                       int64_t position, const c10::intrusive_ptr<DecodeStack>& stack,
                       const std::vector<at::Tensor>& cache_k,
                       const std::vector<at::Tensor>& cache_v, const std::vector<int64_t>& lengths,
                       const Opt& cos, const Opt& sin) {
  TORCH_CHECK(ids.dim() == 2 && ids.size(1) == 1 && ids.scalar_type() == at::kLong &&
                  ids.device().is_cpu(),
              "decode_layer: ids must be a (B, 1) int64 CPU tensor");
  TORCH_CHECK(tok.dim() == 2 && tok.scalar_type() == at::kFloat && tok.is_contiguous() &&
                  tok.device().is_cpu(),
              "decode_layer: the token embedding must be a contiguous float32 (V, E) CPU tensor");
  const int64_t B = ids.size(0), V = tok.size(0), E = tok.size(1);
  const int64_t* id = ids.data_ptr<int64_t>();
  const int64_t sid = ids.stride(0);
  int64_t lo = id[0], hi = id[0];
  for (int64_t b = 1; b < B; ++b) {
    lo = std::min(lo, id[b * sid]);
    hi = std::max(hi, id[b * sid]);
  }
  TORCH_CHECK_VALUE(lo >= 0 && hi < V, "token id ", lo < 0 ? lo : hi,
                    " is outside the vocabulary [0, ", V, ")");
  const float* pe = nullptr;
  if (pos.has_value()) {
    TORCH_CHECK(pos->dim() == 2 && pos->size(1) == E && pos->scalar_type() == at::kFloat &&
                    pos->is_contiguous() && pos->device().is_cpu(),
                "decode_layer: the position table must be a contiguous float32 (P, E) CPU tensor");
    TORCH_CHECK_VALUE(position >= 0 && position < pos->size(0), "position ", position,
                      " is outside the learned table of max_seq_len=", pos->size(0));
    pe = pos->data_ptr<float>() + position * E;
  }
  at::Tensor x = at::empty({B, 1, E}, tok.options());
  float* xp = x.data_ptr<float>();
  const float* table = tok.data_ptr<float>();
  const float sc = static_cast<float>(scale);
  for (int64_t b = 0; b < B; ++b) {
    const float* row = table + id[b * sid] * E;
    float* out = xp + b * E;
    if (sc != 1.f)
      for (int64_t e = 0; e < E; ++e) out[e] = row[e] * sc;
    else
      std::memcpy(out, row, sizeof(float) * static_cast<size_t>(E));
    if (pe != nullptr) add_into(out, pe, out, E);
  }
  at::Tensor h = run_stack(x, *stack, cache_k, cache_v, lengths, cos, sin);
  if (stack->final_kind < 0) return h;
  at::Tensor y = at::empty({B, 1, E}, tok.options());
  norm_into(h, B, E, stack->final_kind, stack->final_w, stack->final_b, stack->final_eps, y);
  return y;
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(attnlab_decode, m) {
  m.class_<DecodeStack>("DecodeStack")
      .def(torch::init<const c10::List<Opt>&, std::vector<int64_t>, std::vector<double>>())
      .def("size", &DecodeStack::size)
      .def("set_final_norm", &DecodeStack::set_final_norm);
  m.def(
      "layer_step(Tensor x, Tensor?[] tensors, int[] config, float[] floats, Tensor cache_k, "
      "Tensor cache_v, int length, Tensor? cos=None, Tensor? sin=None) -> Tensor");
  m.def(
      "stack_step(Tensor x, __torch__.torch.classes.attnlab_decode.DecodeStack stack, "
      "Tensor[] cache_k, Tensor[] cache_v, int[] lengths, Tensor? cos=None, Tensor? sin=None) "
      "-> Tensor");
  m.def(
      "decode_step(Tensor ids, Tensor tok_embed, float scale, Tensor? pos_table, int position, "
      "__torch__.torch.classes.attnlab_decode.DecodeStack stack, Tensor[] cache_k, "
      "Tensor[] cache_v, int[] lengths, Tensor? cos=None, Tensor? sin=None) -> Tensor");
}

TORCH_LIBRARY_IMPL(attnlab_decode, CPU, m) {
  m.impl("layer_step", &layer_step);
  m.impl("stack_step", &stack_step);
  m.impl("decode_step", &decode_step);
}
