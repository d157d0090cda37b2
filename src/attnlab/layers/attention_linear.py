"""Linear attention: a kernel feature map instead of the softmax, O(n) in time and memory.

Replace ``exp(q·k)`` in eq. (1) of "Attention Is All You Need" by a dot product of positive
features ``φ(q)·φ(k)`` (Katharopoulos et al., 2020, "Transformers are RNNs"). Then

    out_i = Σ_j φ(q_i)ᵀφ(k_j) v_j / Σ_j φ(q_i)ᵀφ(k_j)
          = φ(q_i)ᵀ (Σ_j φ(k_j) v_jᵀ) / φ(q_i)ᵀ (Σ_j φ(k_j))

and the ``M x Dv`` matrix ``Σ_j φ(k_j) v_jᵀ`` is shared by all queries: O(n·M·Dv) time and no
``n x n`` matrix. Causal attention needs the *prefix* sums up to each query; we use the chunked
form: within a chunk of ``c`` positions the small ``c x c`` quadratic form with a causal mask, plus
the exclusive prefix sum of the chunks before it -- O(n·(c + M)·Dv) time, O(n·(c + M·Dv / c))
memory.

Feature maps (``feature_map=``):

- ``"elu"`` (default): ``φ(x) = elu(x) + 1`` (Katharopoulos et al.), M = D. It has no temperature,
  so ``scale`` is ignored. Inside :func:`linear_attention` each query's features are divided by
  their max and the keys' by one max over all keys (constants that cancel in the ratio), so the
  sums stay finite for arbitrarily large q and k.
- ``"favor"``: the Performer's positive orthogonal random features (Choromanski et al., 2021,
  FAVOR+): ``φ(x) = exp(ωᵀx - |x|²/2) / sqrt(M)`` with ``x`` scaled by ``sqrt(scale)``, so that
  ``E[φ(q)·φ(k)] = exp(scale · q·k)``: an unbiased estimate of softmax attention's kernel. ``ω``
  is an ``(M, D)`` matrix drawn once from a seeded generator (:func:`favor_projection`). For
  numerical range, each query's features are divided by their row max and the keys' by one max over
  all keys; both constants cancel in the ratio.

Shapes: B batch, H query heads, H_kv key/value heads, T queries, S keys, D head dim, Dv value dim,
M features, C chunks, c chunk size.
Masks: only *key padding* can be expressed without the ``T x S`` matrix: a mask broadcastable to
``(B, 1, 1, S)`` (bool True = may attend; float masks only as 0 / ``finfo.min`` or ``-inf``) zeroes
the masked keys' features. Anything else (a ``(T, S)`` mask, an additive bias) raises
``ValueError``. ``is_causal`` is bottom-right aligned when T != S. A query with no key to attend to
returns zeros; a NaN or inf in q, k or v makes the rows that see it non-finite, never zeros.

Deviations from softmax attention: the weights are not the softmax's (elu) or only approximate it
(favor). Dropout cannot drop entries of a matrix that is never built; we drop whole keys of the
numerator, ``v_j -> v_j · z_j / (1 - p)`` with ``z_j ~ Bernoulli(1 - p)`` per (batch, kv head, key),
and keep the denominator, which has the expectation of attention-weight dropout but one mask shared
by all queries.
"""

from __future__ import annotations

import math
from typing import Literal, cast

import torch
import torch.nn.functional as F
from torch import Tensor

from attnlab.layers.attention import check_qkv, scaled_dot_product_attention
from attnlab.layers.attention_backends import ATTENTION_BACKEND_FACTORIES, ATTENTION_BACKENDS
from attnlab.layers.masks import check_mask

FeatureMap = Literal["elu", "favor"]
FEATURE_MAPS: tuple[str, ...] = ("elu", "favor")
DEFAULT_CHUNK = 64


def favor_projection(
    d_head: int,
    n_features: int,
    *,
    seed: int = 0,
    orthogonal: bool = True,
    device: torch.device | str | None = None,
    dtype: torch.dtype = torch.float32,
) -> Tensor:
    """The Performer's random projection ω (FAVOR+), drawn from a seeded generator.

    With ``orthogonal``, rows come in blocks of ``d_head`` mutually orthogonal directions (lower
    variance), each rescaled to the norm of a Gaussian vector so that rows stay ``N(0, I)``
    marginally.

    Shapes:
        returns ``(n_features, d_head)``.

    Raises:
        ValueError: if ``d_head`` or ``n_features`` is not positive.
    """
    if d_head < 1 or n_features < 1:
        raise ValueError(f"d_head and n_features must be positive, got {d_head}, {n_features}")
    gen = torch.Generator().manual_seed(seed)
    if not orthogonal:
        w = torch.randn(n_features, d_head, generator=gen, dtype=torch.float64)
    else:
        blocks = []
        for _ in range(-(-n_features // d_head)):
            g = torch.randn(d_head, d_head, generator=gen, dtype=torch.float64)
            qmat, _ = torch.linalg.qr(g)  # columns orthonormal
            blocks.append(qmat.T)  # (D, D): rows orthonormal
        norms = torch.randn(n_features, d_head, generator=gen, dtype=torch.float64).norm(dim=1)
        w = torch.cat(blocks)[:n_features] * norms.unsqueeze(1)  # (M, D)
    return w.to(device=device, dtype=dtype)


def _key_padding(mask: Tensor | None, S: int) -> Tensor | None:
    """Turn a key-padding mask into a bool ``(B|1, 1, S)`` keep tensor.

    Raises:
        ValueError: if the mask is not a key-padding mask, or a float mask carries biases.
    """
    if mask is None:
        return None
    m = mask.reshape((1,) * (4 - mask.dim()) + tuple(mask.shape))  # (b, h, t, s)
    if m.shape[1] != 1 or m.shape[2] != 1:
        raise ValueError(
            "linear attention supports only key-padding masks broadcastable to (B, 1, 1, S), "
            f"got shape {tuple(mask.shape)}: a per-query or per-head mask needs the T x S "
            "matrix that linear attention never builds (use is_causal=True for causal masking)"
        )
    if m.dtype != torch.bool:
        masked = m <= torch.finfo(m.dtype).min  # includes -inf
        if not bool(((m == 0) | masked).all()):
            raise ValueError(
                "linear attention cannot add score biases; a float mask must hold only 0 (keep) "
                "and finfo.min or -inf (masked)"
            )
        m = ~masked
    return m[:, :, 0].expand(m.shape[0], 1, S)  # (b, 1, S)


def linear_attention_features(
    q: Tensor,
    k: Tensor,
    *,
    feature_map: FeatureMap = "elu",
    projection: Tensor | None = None,
    scale: float | None = None,
    key_keep: Tensor | None = None,
) -> tuple[Tensor, Tensor]:
    """The positive features ``(φ(q), φ(k))``; masked keys get all-zero features.

    Args:
        feature_map: ``"elu"`` or ``"favor"`` (then ``projection`` is required).
        projection: ω from :func:`favor_projection`.
        scale: score scale for ``"favor"``; default ``1 / sqrt(D)``.
        key_keep: bool, broadcastable to ``(B, H_kv, S)``, True = real key.

    Shapes:
        q ``(B, H, T, D)``, k ``(B, H_kv, S, D)`` -> ``(B, H, T, M)``, ``(B, H_kv, S, M)`` in
        float32 or wider.

    Raises:
        ValueError: for an unknown feature map or a missing / mis-shaped projection.
    """
    cdt = torch.promote_types(q.dtype, torch.float32)
    q, k = q.to(cdt), k.to(cdt)
    if feature_map == "elu":
        phi_q, phi_k = F.elu(q) + 1.0, F.elu(k) + 1.0
    elif feature_map == "favor":
        D = q.shape[-1]
        if projection is None or projection.dim() != 2 or projection.shape[1] != D:
            raise ValueError(f"favor features need a (M, {D}) projection, got {projection}")
        w = projection.to(device=q.device, dtype=cdt)
        root = math.sqrt(1.0 / math.sqrt(D) if scale is None else scale)
        q, k = q * root, k * root
        wq, wk = q @ w.T, k @ w.T  # (B, H, T, M), (B, H_kv, S, M)
        wq = wq - q.pow(2).sum(-1, keepdim=True) / 2
        wk = wk - k.pow(2).sum(-1, keepdim=True) / 2
        # Constant shifts that cancel in the ratio keep exp() in range (no gradient needed).
        wq = wq - wq.detach().amax(dim=-1, keepdim=True)
        wk_for_max = (
            wk.detach()
            if key_keep is None
            else wk.detach().masked_fill(~key_keep.unsqueeze(-1), -math.inf)
        )
        # finite entries only: an inf key must not shift every other key's features to 0
        wk_for_max = wk_for_max.masked_fill(~torch.isfinite(wk_for_max), -math.inf)
        k_max = wk_for_max.amax(dim=(-2, -1), keepdim=True)
        wk = wk - torch.where(torch.isneginf(k_max), 0.0, k_max)
        norm = 1.0 / math.sqrt(w.shape[0])
        phi_q, phi_k = torch.exp(wq) * norm, torch.exp(wk) * norm
    else:
        raise ValueError(f"unknown feature_map {feature_map!r}; valid: {', '.join(FEATURE_MAPS)}")
    if key_keep is not None:
        phi_k = phi_k * key_keep.unsqueeze(-1).to(phi_k.dtype)
    return phi_q, phi_k


def linear_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    *,
    mask: Tensor | None = None,
    is_causal: bool = False,
    dropout_p: float = 0.0,
    scale: float | None = None,
    feature_map: FeatureMap = "elu",
    projection: Tensor | None = None,
    chunk_size: int = DEFAULT_CHUNK,
) -> Tensor:
    """Kernelised attention ``φ(q)ᵀ Σ φ(k) vᵀ / φ(q)ᵀ Σ φ(k)``, linear in the sequence length.

    Args:
        q: queries. k: keys. v: values.
        mask: key padding only: bool (True = may attend) or float (0 / finfo.min / -inf),
            broadcastable to (B, 1, 1, S).
        is_causal: causal prefix sums, bottom-right aligned when T != S.
        dropout_p: drops whole keys of the numerator (see the module docstring).
        scale: score scale for the ``"favor"`` features (``"elu"`` has none and ignores it).
        feature_map: ``"elu"`` or ``"favor"``. projection: ω for ``"favor"``.
        chunk_size: positions per chunk of the causal form.

    Shapes:
        q ``(B, H, T, D)``, k ``(B, H_kv, S, D)``, v ``(B, H_kv, S, Dv)`` -> ``(B, H, T, Dv)``.

    Raises:
        ValueError / TypeError: on bad shapes, dtypes, ``dropout_p``, chunk size, feature maps, or
            masks that are not key-padding masks.
    """
    B, H, H_kv, T, S, _ = check_qkv(q, k, v, scale=scale)
    if not 0.0 <= dropout_p < 1.0:
        raise ValueError(f"dropout_p must be in [0, 1), got {dropout_p}")
    if chunk_size < 1:
        raise ValueError(f"chunk_size must be positive, got {chunk_size}")
    if mask is not None:
        check_mask(mask, B, H, T, S)
    keep = _key_padding(mask, S)  # (B|1, 1, S)
    if T == 0 or S == 0:  # no keys or no queries: zeros / an empty output, as the math path gives
        return cast(Tensor, scaled_dot_product_attention(q, k, v))
    n_rep, Dv = H // H_kv, v.shape[-1]
    phi_q, phi_k = linear_attention_features(
        q, k, feature_map=feature_map, projection=projection, scale=scale, key_keep=keep
    )
    if feature_map == "elu":
        # The ratio is unchanged by a constant per query and one over all keys: dividing by the
        # maxima keeps the sums from overflowing for huge q/k (FAVOR's features do it already).
        phi_q = phi_q / _positive_max(phi_q.detach(), (-1,))
        phi_k = phi_k / _positive_max(phi_k.detach(), (-2, -1))
    v_num = v.to(phi_k.dtype)  # values of the numerator (dropout acts here only)
    if dropout_p > 0.0:
        z = torch.rand(B, H_kv, S, 1, device=v.device) >= dropout_p  # (B, H_kv, S, 1)
        v_num = v_num * z.to(v_num.dtype) / (1.0 - dropout_p)
    phi_q = phi_q.reshape(B, H_kv, n_rep, T, phi_q.shape[-1])  # (B, H_kv, r, T, M)
    if is_causal:
        num, den = _causal(phi_q, phi_k, v_num, chunk_size)
    else:
        kv = torch.einsum("bgsm,bgsd->bgmd", phi_k, v_num)  # (B, H_kv, M, Dv)
        num = torch.einsum("bgrtm,bgmd->bgrtd", phi_q, kv)  # (B, H_kv, r, T, Dv)
        den = torch.einsum("bgrtm,bgm->bgrt", phi_q, phi_k.sum(dim=2)).unsqueeze(-1)
    # Rows with no key (all masked) have den == 0 and give zeros; a NaN den (a NaN or inf in
    # q, k or v reached the row) stays NaN rather than becoming 0.
    empty = den == 0
    out = torch.where(empty, 0.0, num / torch.where(empty, 1.0, den))
    return out.reshape(B, H, T, Dv).to(q.dtype)


def _positive_max(x: Tensor, dims: tuple[int, ...]) -> Tensor:
    """The max of the finite entries of non-negative ``x`` over ``dims`` (kept), 1 where it is
    0 (nothing to scale). Non-finite entries are left out: an inf feature must not divide every
    other key's features to 0 (which would return zeros for rows that never see it)."""
    m = torch.where(torch.isfinite(x), x, 0.0).amax(dim=dims, keepdim=True)
    return torch.where(m > 0, m, 1.0)


def _causal(phi_q: Tensor, phi_k: Tensor, v: Tensor, c: int) -> tuple[Tensor, Tensor]:
    """Causal numerator and denominator by chunks: intra-chunk quadratic + inter-chunk prefix.

    Shapes:
        phi_q ``(B, H_kv, r, T, M)``, phi_k ``(B, H_kv, S, M)``, v ``(B, H_kv, S, Dv)`` ->
        num ``(B, H_kv, r, T, Dv)``, den ``(B, H_kv, r, T, 1)``.
    """
    B, H_kv, r, T, M = phi_q.shape
    S = phi_k.shape[2]
    # Align bottom-right: query i sits at key position i + S - T. Pad the shorter side in front
    # (padded queries are dropped after, padded keys have zero features) so positions coincide.
    front_q, front_k = max(S - T, 0), max(T - S, 0)
    L = max(S, T)
    C = -(-L // c)
    tail = C * c - L
    phi_q = F.pad(phi_q, (0, 0, front_q, tail)).view(B, H_kv, r, C, c, M)
    phi_k = F.pad(phi_k, (0, 0, front_k, tail)).view(B, H_kv, C, c, M)
    v = F.pad(v, (0, 0, front_k, tail)).view(B, H_kv, C, c, v.shape[-1])

    # Between chunks: everything strictly before chunk n (exclusive prefix sum).
    kv = torch.einsum("bgncm,bgncd->bgnmd", phi_k, v)  # (B, H_kv, C, M, Dv)
    kv_prev = kv.cumsum(dim=2) - kv
    z = phi_k.sum(dim=3)  # (B, H_kv, C, M)
    z_prev = z.cumsum(dim=2) - z
    num = torch.einsum("bgrncm,bgnmd->bgrncd", phi_q, kv_prev)  # (B, H_kv, r, C, c, Dv)
    den = torch.einsum("bgrncm,bgnm->bgrnc", phi_q, z_prev)  # (B, H_kv, r, C, c)

    # Inside a chunk: the small quadratic form with a causal mask.
    tri = torch.ones(c, c, dtype=torch.bool, device=phi_q.device).tril()  # (c, c)
    a = torch.einsum("bgrncm,bgnem->bgrnce", phi_q, phi_k).masked_fill(~tri, 0.0)  # (..., c, c)
    num = num + torch.einsum("bgrnce,bgned->bgrncd", a, v)
    den = den + a.sum(dim=-1)
    num = num.reshape(B, H_kv, r, C * c, -1)[:, :, :, front_q : front_q + T]
    den = den.reshape(B, H_kv, r, C * c, 1)[:, :, :, front_q : front_q + T]
    return num, den


class LinearAttention:
    """The ``"linear"`` backend with a chosen feature map (a callable with the backend signature).

    Args:
        feature_map: ``"elu"`` (default) or ``"favor"`` (Performer random features).
        n_features: M for ``"favor"``.
        seed: seed of the ``"favor"`` projection (fixed for the life of the backend).
        orthogonal: orthogonal random features for ``"favor"``.
        chunk_size: chunk length of the causal form.

    Raises:
        ValueError: for an unknown feature map or non-positive sizes.
    """

    __name__ = "linear"
    softmax = False  # no softmax weights exist: MultiHeadAttention(need_weights=True) refuses

    def __init__(
        self,
        feature_map: FeatureMap = "elu",
        n_features: int = 256,
        seed: int = 0,
        orthogonal: bool = True,
        chunk_size: int = DEFAULT_CHUNK,
    ) -> None:
        if feature_map not in FEATURE_MAPS:
            raise ValueError(
                f"unknown feature_map {feature_map!r}; valid: {', '.join(FEATURE_MAPS)}"
            )
        if n_features < 1 or chunk_size < 1:
            raise ValueError(
                f"n_features and chunk_size must be positive, got {n_features}, {chunk_size}"
            )
        self.feature_map: FeatureMap = feature_map
        self.n_features, self.seed, self.orthogonal = n_features, seed, orthogonal
        self.chunk_size = chunk_size
        self._projections: dict[tuple[int, str], Tensor] = {}

    def projection(self, d_head: int, device: torch.device) -> Tensor | None:
        """ω for this head size and device (``None`` for ``"elu"``); drawn once, then cached.

        Shapes:
            returns ``(n_features, d_head)`` float32.
        """
        if self.feature_map != "favor":
            return None
        key = (d_head, str(device))
        if key not in self._projections:
            self._projections[key] = favor_projection(
                d_head, self.n_features, seed=self.seed, orthogonal=self.orthogonal, device=device
            )
        return self._projections[key]

    def __call__(
        self,
        q: Tensor,
        k: Tensor,
        v: Tensor,
        *,
        mask: Tensor | None = None,
        is_causal: bool = False,
        dropout_p: float = 0.0,
        scale: float | None = None,
    ) -> Tensor:
        return linear_attention(
            q,
            k,
            v,
            mask=mask,
            is_causal=is_causal,
            dropout_p=dropout_p,
            scale=scale,
            feature_map=self.feature_map,
            projection=self.projection(q.shape[-1], q.device),
            chunk_size=self.chunk_size,
        )

    def __repr__(self) -> str:
        extra = (
            f", n_features={self.n_features}, seed={self.seed}, orthogonal={self.orthogonal}"
            if self.feature_map == "favor"
            else ""
        )
        return (
            f"LinearAttention(feature_map={self.feature_map!r}{extra}, "
            f"chunk_size={self.chunk_size})"
        )


ATTENTION_BACKENDS.add("linear", LinearAttention())
ATTENTION_BACKEND_FACTORIES.add("linear", LinearAttention)

__all__ = [
    "FEATURE_MAPS",
    "FeatureMap",
    "LinearAttention",
    "favor_projection",
    "linear_attention",
    "linear_attention_features",
]
