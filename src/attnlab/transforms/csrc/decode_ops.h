// attnlab's CPU decoding kernels, as C++ functions: the operators of woq_gemm.cpp and
// decode_attention.cpp, declared here so that decode_layer.cpp calls them directly (no trip
// through Python or the dispatcher between the steps of a layer).
#pragma once

#include <ATen/ATen.h>

// Put before a loop of a fixed, small trip count over an array of vector registers (rows of x,
// output rows, unrolled steps). GCC 12 otherwise keeps such arrays in memory when they hold more
// than a few registers: the int4 AVX-512 loop stored and reloaded its eight accumulators on every
// step, a chain through memory that cost it a quarter of its speed (in L2, one thread, 2-core
// Xeon, 2026-12-06: 21 cycles per 64-byte line of codes before, 15-16 after).
#define ATTNLAB_UNROLL _Pragma("GCC unroll 16")

namespace attnlab {

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

}  // namespace attnlab
