// One decoding step of a whole decoder layer (self-attention + FFN, each in its residual
// sublayer) in one call, for the quantized decoders of attnlab.transforms.decode_layout:
//
//   pre-norm:  x = x + Attn(Norm1(x));  x = x + FFN(Norm2(x))
//   post-norm: x = Norm1(x + Attn(x));  x = Norm2(x + FFN(x))
//   Attn(h) = softmax(scale · q K^T) V W_out (+ b),  q, k, v = h W_qkv (+ b) split into heads,
//             the new k, v written into the KV cache at position `length` first
//   FFN(h)  = act(h W_up) W_down,  or  (act(h W_gate) * h W_up) W_down (gated variants)
//
// Why this file exists: at one token per sequence, GPT-2 small's twelve layers are ~50 matrix
// products of a few hundred microseconds each and ~250 small operations (norms, views, the
// cache write, the residual adds, the activation) of a few microseconds each, and every one of
// those goes through Python and PyTorch's dispatcher: measured on issue 27's 2-core Xeon, a
// quantized GPT-2 token spent 3.3 ms outside the products (with them stubbed out), as much as
// the int4 products themselves. Here a layer is one call: the products are attnlab's kernels
// (woq_gemm.cpp), the attention is decode_attention.cpp's, and everything else is the same ATen
// function the Python modules call (at::layer_norm, at::gelu, ...), in the same order, on the
// same operands, so the step is bit for bit what the modules compute (tests/transforms/
// test_decode_layer.py holds it to torch.equal).
//
// What it takes (decode_layer.py checks all of it and otherwise leaves the layer to its
// modules): one query per sequence (x (B, 1, E) float32 contiguous on the CPU), no mask, RoPE
// or no rotary positions (cos and sin of the step come from Python, computed as the rotary
// module computes them), a plain (unwindowed) cache with room for one more position, every
// projection an int8 or int4 layer run by attnlab's kernels (q/k/v joined into one), LayerNorm
// or RMSNorm, and relu / gelu / gelu_tanh / silu (plain or gated).

#include <ATen/ATen.h>
#include <torch/library.h>

#include <cstring>
#include <vector>

#include "decode_ops.h"

namespace {

// Layout of the `config` list (see decode_layer.py, which writes it).
enum Config : int64_t {
  PRE_NORM, NORM_KIND, ACTIVATION, GATED, HEADS, KV_HEADS, HEAD_DIM,
  ROTARY,   // 0: none, 1: RoPE "half" layout (pairs i, i + D/2), 2: "interleaved" (2i, 2i + 1)
  LINEARS,  // then (bits, group size) for qkv, out, up, gate, down
};
enum Linear : int64_t { QKV, OUT, UP, GATE, DOWN, N_LINEARS };
// Layout of the `tensors` list: norm 1 (weight, bias), norm 2 (weight, bias), then per linear
// (codes, scales, zeros, bias) in the order of `Linear`.
constexpr int64_t NORM1 = 0, NORM2 = 2, FIRST_LINEAR = 4;

using Opt = c10::optional<at::Tensor>;

struct QLinear {
  int64_t bits = 0, group = 0;
  at::Tensor codes, scales, zeros;
  Opt bias;
};

QLinear linear(const c10::List<Opt>& t, const std::vector<int64_t>& config, int64_t which) {
  QLinear l;
  l.bits = config[LINEARS + 2 * which];
  l.group = config[LINEARS + 2 * which + 1];
  const int64_t at = FIRST_LINEAR + 4 * which;
  const Opt codes = t.get(at), scales = t.get(at + 1), zeros = t.get(at + 2);
  TORCH_CHECK(codes.has_value() && scales.has_value(), "decode_layer: linear ", which,
              " has no codes or scales");
  l.codes = *codes;
  l.scales = *scales;
  if (zeros.has_value()) l.zeros = *zeros;
  l.bias = t.get(at + 3);
  TORCH_CHECK(l.bits == 8 || (l.bits == 4 && l.zeros.defined()), "decode_layer: linear ", which,
              " must be int8, or int4 with zeros; got bits ", l.bits);
  return l;
}

at::Tensor apply(const QLinear& l, const at::Tensor& x) {  // x (M, K) -> (M, N)
  if (l.bits == 8) return attnlab::int8_linear(x, l.codes, l.scales, l.bias, 0);
  return attnlab::int4_linear(x, l.codes, l.scales, l.zeros, l.group, l.bias, 0);
}

// attnlab.layers.norm: LayerNorm is F.layer_norm; RMSNorm is x * rsqrt(mean(x^2) + eps) * w
// (float32 inputs: its .float() and .to() are no-ops).
at::Tensor norm(const at::Tensor& x, int64_t kind, const Opt& w, const Opt& b, double eps) {
  const int64_t E = x.size(-1);
  if (kind == 0) return at::layer_norm(x, {E}, w, b, eps);
  return x * at::rsqrt(x.pow(2).mean(-1, true) + eps) * *w;
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

// cache[b, h, length, :] = k[b, h, 0, :] for a (B, H_kv, 1, D) tensor of any strides.
void write_rotated(const at::Tensor& cache, const at::Tensor& k, int64_t length) {
  cache.narrow(2, length, 1).copy_(k);
}

// attnlab.layers.feedforward.ACTIVATIONS
at::Tensor activate(const at::Tensor& x, int64_t kind) {
  switch (kind) {
    case 0: return at::relu(x);
    case 1: return at::gelu(x);
    case 2: return at::gelu(x, "tanh");
    default: return at::silu(x);
  }
}

// cache[b, h, length, :] = p[b, offset + h D : offset + (h + 1) D] for every sequence b and
// head h (a plain copy of D floats each; ATen's strided copy costs more than the bytes here).
void write_position(const at::Tensor& cache, const at::Tensor& p, int64_t offset, int64_t Hkv,
                    int64_t D, int64_t length) {
  float* dst = cache.data_ptr<float>();
  const float* src = p.data_ptr<float>();
  const int64_t B = cache.size(0), sb = cache.stride(0), sh = cache.stride(1),
                ss = cache.stride(2), row = p.size(1);
  for (int64_t b = 0; b < B; ++b)
    for (int64_t h = 0; h < Hkv; ++h)
      std::memcpy(dst + b * sb + h * sh + length * ss, src + b * row + offset + h * D,
                  sizeof(float) * static_cast<size_t>(D));
}

at::Tensor layer_step(const at::Tensor& x, const c10::List<Opt>& tensors,
                      std::vector<int64_t> config, std::vector<double> floats,
                      const at::Tensor& cache_k, const at::Tensor& cache_v, int64_t length,
                      const Opt& cos, const Opt& sin) {
  TORCH_CHECK(x.dim() == 3 && x.size(1) == 1 && x.scalar_type() == at::kFloat &&
                  x.is_contiguous() && x.device().is_cpu(),
              "decode_layer: x must be a contiguous float32 (B, 1, E) CPU tensor");
  TORCH_CHECK(static_cast<int64_t>(config.size()) == LINEARS + 2 * N_LINEARS &&
                  tensors.size() == static_cast<size_t>(FIRST_LINEAR + 4 * N_LINEARS) &&
                  floats.size() == 3,
              "decode_layer: malformed layer description");
  const int64_t B = x.size(0), E = x.size(2);
  const int64_t H = config[HEADS], Hkv = config[KV_HEADS], D = config[HEAD_DIM];
  TORCH_CHECK(cache_k.dim() == 4 && cache_v.dim() == 4 && cache_k.size(0) == B &&
                  cache_k.size(1) == Hkv && cache_k.size(3) == D && cache_v.size(0) == B &&
                  cache_v.size(1) == Hkv && cache_v.size(3) == D &&
                  cache_k.size(2) == cache_v.size(2),
              "decode_layer: caches must be (B, H_kv, L, D) for this layer");
  TORCH_CHECK(cache_k.scalar_type() == at::kFloat && cache_v.scalar_type() == at::kFloat &&
                  cache_k.stride(3) == 1 && cache_v.stride(3) == 1,
              "decode_layer: caches must be float32 with a contiguous last dimension");
  TORCH_CHECK(length >= 0 && length < cache_k.size(2), "decode_layer: cache position ", length,
              " outside its ", cache_k.size(2), " slots");
  const bool pre = config[PRE_NORM] != 0, gated = config[GATED] != 0;
  const int64_t kind = config[NORM_KIND];
  const Opt w1 = tensors.get(NORM1), b1 = tensors.get(NORM1 + 1);
  const Opt w2 = tensors.get(NORM2), b2 = tensors.get(NORM2 + 1);
  const QLinear qkv = linear(tensors, config, QKV), out = linear(tensors, config, OUT);
  const QLinear up = linear(tensors, config, UP), down = linear(tensors, config, DOWN);

  // self-attention sublayer
  const at::Tensor h = pre ? norm(x, kind, w1, b1, floats[0]) : x;  // (B, 1, E)
  const at::Tensor p = apply(qkv, h.view({B, E}));                     // (B, (H + 2 H_kv) D)
  at::Tensor q = p.narrow(1, 0, H * D).view({B, 1, H, D}).transpose(1, 2);  // (B, H, 1, D)
  if (config[ROTARY] != 0) {
    TORCH_CHECK(cos.has_value() && sin.has_value(), "decode_layer: rotary layer without cos/sin");
    const at::Tensor k = p.narrow(1, H * D, Hkv * D).view({B, 1, Hkv, D}).transpose(1, 2);
    q = rotate(q, config[ROTARY], *cos, *sin);
    write_rotated(cache_k, rotate(k, config[ROTARY], *cos, *sin), length);
  } else {
    write_position(cache_k, p, (H * D), Hkv, D, length);
  }
  write_position(cache_v, p, (H + Hkv) * D, Hkv, D, length);
  const at::Tensor a = attnlab::decode_attention(q, cache_k.narrow(2, 0, length + 1),
                                                 cache_v.narrow(2, 0, length + 1), floats[2]);
  const at::Tensor o = apply(out, a.view({B, H * D})).view({B, 1, E});  // (B, 1, E)
  at::Tensor y = x + o;
  if (!pre) y = norm(y, kind, w1, b1, floats[0]);

  // feed-forward sublayer
  const at::Tensor f_in = (pre ? norm(y, kind, w2, b2, floats[1]) : y).view({B, E});
  at::Tensor hidden;
  if (gated) {
    const QLinear gate = linear(tensors, config, GATE);
    hidden = activate(apply(gate, f_in), config[ACTIVATION]) * apply(up, f_in);
  } else {
    hidden = activate(apply(up, f_in), config[ACTIVATION]);
  }
  y = y + apply(down, hidden).view({B, 1, E});
  return pre ? y : norm(y, kind, w2, b2, floats[1]);
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(attnlab_decode, m) {
  m.def(
      "layer_step(Tensor x, Tensor?[] tensors, int[] config, float[] floats, Tensor cache_k, "
      "Tensor cache_v, int length, Tensor? cos=None, Tensor? sin=None) -> Tensor");
}

TORCH_LIBRARY_IMPL(attnlab_decode, CPU, m) { m.impl("layer_step", &layer_step); }
