"""Property tests of STAPO's gradient-norm theorem (arXiv 2602.15620 §4; the lemma of Yang et al. 2025,
arXiv 2505.12929; the entropy-change form of Cui et al. 2025, arXiv 2505.22617), float64.

Claims checked (numbered in the test comments): T1 the logit gradient of one token's surrogate,
∇_a J = w (e_k − π), with ‖∇‖² = w² (1 − 2π_k + S), S = Σπ²; T2/T4 the bounds e^{−H} ≤ S ≤ 1 − C_V H², hence the
two-sided bound on ‖∇‖²; T5/T6 the first-order entropy change dH/dη = −Â π_k (ln π_k + H) and its sign rule;
T7 the constant C_V = (|V| − 1) / (|V| (ln |V|)²) at Qwen3's vocabulary.

Oracles: torch autograd for ∇_a J; verl's ``calculate_sum_pi_squared_from_logits`` for S and
``entropy_from_logits`` for H (``verl.utils.torch_functional``).
"""

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from verl.utils.torch_functional import calculate_sum_pi_squared_from_logits, entropy_from_logits


def c_v(vocab: int) -> float:
    """C_V = (|V| − 1) / (|V| (ln |V|)²) of the theorem's upper bound on S = Σπ²."""
    return (vocab - 1) / (vocab * math.log(vocab) ** 2)


def _logits(seed: int, vocab: int, kind: str) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    if kind == "gauss":
        return torch.randn(vocab, generator=g, dtype=torch.float64) * 3
    if kind == "peaked":
        a = torch.randn(vocab, generator=g, dtype=torch.float64)
        a[torch.randint(vocab, (1,), generator=g)] += 25.0
        return a
    if kind == "cauchy":
        return torch.tan(math.pi * (torch.rand(vocab, generator=g, dtype=torch.float64) - 0.5)).clamp(-50, 50)
    if kind == "support":  # uniform on a random support (lower bound tight)
        a = torch.full((vocab,), -1e4, dtype=torch.float64)
        m = int(torch.randint(1, vocab + 1, (1,), generator=g))
        a[torch.randperm(vocab, generator=g)[:m]] = 0.0
        return a
    # two-level distribution
    a = torch.zeros(vocab, dtype=torch.float64)
    a[: max(1, vocab // 3)] = 4.0
    return a


@settings(max_examples=60, deadline=None, derandomize=True)
@given(
    seed=st.integers(0, 10_000),
    vocab=st.sampled_from([2, 3, 10, 1000, 151936]),
    kind=st.sampled_from(["gauss", "peaked", "cauchy", "support", "two"]),
    adv=st.floats(-3, 3).filter(lambda x: abs(x) > 1e-3),
    log_ratio=st.floats(-0.15, 0.15),
)
def test_gradient_norm_identity_and_two_sided_bound(seed, vocab, kind, adv, log_ratio):
    a = _logits(seed, vocab, kind).requires_grad_(True)
    k = int(torch.randint(vocab, (1,), generator=torch.Generator().manual_seed(seed + 1)))
    logp = torch.log_softmax(a, -1)[k]
    logp_old = logp.detach() - log_ratio
    J = adv * torch.exp(logp - logp_old)  # unclipped region: |log ratio| ≤ 0.15 < ln(1.2)
    (grad,) = torch.autograd.grad(J, a)
    pi = torch.softmax(a.detach(), -1)
    w = adv * math.exp(log_ratio)
    # T1: ∇_a J = w (e_k − π) and ‖∇‖² = w² (1 − 2π_k + S)
    e_k = torch.zeros_like(pi)
    e_k[k] = 1
    torch.testing.assert_close(grad, w * (e_k - pi), rtol=1e-10, atol=1e-12)
    S = float(calculate_sum_pi_squared_from_logits(a.detach()))
    assert S == pytest.approx(float((pi**2).sum()), rel=1e-10)
    norm2 = float((grad**2).sum())
    assert norm2 == pytest.approx(w**2 * (1 - 2 * float(pi[k]) + S), rel=1e-9, abs=1e-13)
    # same identity without the cancellation of 1 − 2π_k + S when π_k → 1: (1 − π_k)² + Σ_{n≠k} π_n²
    rest = torch.cat([pi[:k], pi[k + 1 :]])
    stable = float(rest.sum()) ** 2 + float((rest**2).sum())
    # autograd's own ∂/∂a_k = w(1 − π_k) carries an absolute error ~ε, i.e. a relative error ε/(1 − π_k) on ‖∇‖²
    eps = torch.finfo(torch.float64).eps
    assert norm2 == pytest.approx(w**2 * stable, rel=1e-9, abs=8 * w**2 * float(rest.sum()) * eps)
    # T2/T4: e^{−H} ≤ S ≤ 1 − C_V H²  ⇒  w²(1 − 2π_k + e^{−H}) ≤ ‖∇‖² ≤ w²(2 − 2π_k − C_V H²)
    H = float(entropy_from_logits(a.detach()))
    tol = 1e-12
    assert math.exp(-H) <= S + tol
    assert S <= 1 - c_v(vocab) * H**2 + tol
    assert w**2 * (1 - 2 * float(pi[k]) + math.exp(-H)) <= norm2 * (1 + 1e-9) + tol
    assert norm2 <= w**2 * (2 - 2 * float(pi[k]) - c_v(vocab) * H**2) * (1 + 1e-9) + tol


@pytest.mark.parametrize("vocab", [2, 10, 1000, 151936])
def test_equality_cases(vocab):
    uniform = torch.zeros(vocab, dtype=torch.float64)
    S, H = float(calculate_sum_pi_squared_from_logits(uniform)), float(entropy_from_logits(uniform))
    assert H == pytest.approx(math.log(vocab), rel=1e-12)
    assert S == pytest.approx(math.exp(-H), rel=1e-9)  # lower bound tight
    assert S == pytest.approx(1 - c_v(vocab) * H**2, rel=1e-9)  # upper bound tight
    one_hot = torch.full((vocab,), -1e4, dtype=torch.float64)
    one_hot[0] = 0
    S, H = float(calculate_sum_pi_squared_from_logits(one_hot)), float(entropy_from_logits(one_hot))
    assert S == pytest.approx(1.0) and abs(H) < 1e-9


def test_c_v_qwen3_vocab():
    assert c_v(151936) == pytest.approx(7.0247e-3, abs=1e-7)  # T7


@settings(max_examples=40, deadline=None, derandomize=True)
@given(seed=st.integers(0, 10_000), vocab=st.sampled_from([3, 10, 1000]), adv=st.floats(0.1, 3))
def test_entropy_change_first_order_and_sign_rule(seed, vocab, adv):
    # T5/T6: a ← a + η Â e_k gives dH/dη = −Â π_k (ln π_k + H); Â > 0 and π_k < e^{−H} ⇒ entropy rises.
    a = _logits(seed, vocab, "gauss")
    k = int(torch.argmin(a))  # a rare token
    pi = torch.softmax(a, -1)
    H = float(entropy_from_logits(a))
    e_k = torch.zeros_like(a)
    e_k[k] = adv

    def central(h):
        return (float(entropy_from_logits(a + h * e_k)) - float(entropy_from_logits(a - h * e_k))) / (2 * h)

    # central differences + one Richardson step: O(h⁴) truncation while round-off stays ≪ the tiny dH
    h = 1e-2
    fd = (4 * central(h / 2) - central(h)) / 3
    analytic = -adv * float(pi[k]) * (math.log(float(pi[k])) + H)
    assert fd == pytest.approx(analytic, rel=1e-3, abs=1e-12)
    if float(pi[k]) < math.exp(-H):
        assert analytic > 0
