"""RGE (Gao et al. eq. 1) and MeZO's seed trick (Alg. 3): the claims chapters 2 and 3 build on."""
import math

import pytest
import torch

from prge_lib.zo.mezo import add_noise_, explicit_noise, mezo_step
from prge_lib.zo.rge import check_zo_dtype, gaussian, mix_seed, rge, rge_error_theory


def test_noise_is_a_function_of_seed_and_index():
    a = gaussian(7, 3, (5, 4))
    assert torch.equal(a, gaussian(7, 3, (5, 4)))
    assert not torch.equal(a, gaussian(7, 4, (5, 4)))
    assert not torch.equal(a, gaussian(8, 3, (5, 4)))
    assert len({mix_seed(s, i) for s in range(50) for i in range(50)}) == 2500


def test_noise_statistics():
    z = gaussian(1, 0, (400_000,))
    assert abs(float(z.mean())) < 0.01 and abs(float(z.std()) - 1) < 0.01


def test_perturb_twice_and_restore_returns_the_parameters_up_to_rounding():
    torch.manual_seed(0)
    # the second tensor has more than 2^20 elements, so its noise is drawn in row chunks
    params = [torch.randn(30, 20), torch.randn(1100, 1000)]
    before = [p.clone() for p in params]
    eps = 1e-3
    add_noise_(params, 42, eps)
    moved = max(float((p - b).abs().max()) for p, b in zip(params, before))
    add_noise_(params, 42, -2 * eps)
    add_noise_(params, 42, eps)
    for p, b in zip(params, before):
        # three fp32 roundings of |θ| + 2ε|z| at most: the seed trick is exact up to float rounding
        bound = 3 * torch.finfo(torch.float32).eps * (b.abs() + 2 * eps * 6)
        assert bool(((p - b).abs() <= bound).all())
    assert moved > 1e-4   # the perturbation did happen


def test_mezo_update_equals_the_explicit_noise_formula():
    torch.manual_seed(0)
    params = [torch.randn(30, 20), torch.randn(1100, 1000)]
    start = [p.clone() for p in params]
    target = [torch.randn_like(p) for p in params]

    def loss():
        return sum(float(((p.double() - t.double()) ** 2).sum()) for p, t in zip(params, target)) / 2

    seeds, eps, lr = [11, 12, 13], 1e-3, 1e-4
    out = mezo_step(params, loss, seeds, eps, lr)
    assert out["finite"]
    expected = [s.clone() for s in start]
    for seed, g in zip(seeds, out["projected_grad"]):
        for e, z in zip(expected, explicit_noise(start, seed)):
            e -= lr * g / len(seeds) * z
    for p, e in zip(params, expected):
        torch.testing.assert_close(p, e, rtol=0, atol=1e-5)
    # on a quadratic the central difference is exact: g_i = z_iᵀ∇L at the start
    grad = [s - t for s, t in zip(start, target)]
    exact = sum(float((z * g).sum()) for z, g in zip(explicit_noise(start, seeds[0]), grad))
    assert out["projected_grad"][0] == pytest.approx(exact, rel=2e-3)


def test_mezo_skips_the_update_on_a_non_finite_loss():
    params = [torch.ones(4)]
    out = mezo_step(params, lambda: float("nan"), [1], 1e-3, 1.0)
    assert not out["finite"]
    torch.testing.assert_close(params[0], torch.ones(4), rtol=0, atol=1e-6)


def test_rge_is_exact_for_any_eps_on_a_quadratic():
    torch.manual_seed(0)
    d = 8
    h = torch.randn(d, d, dtype=torch.float64)
    h = h @ h.T
    b = torch.randn(d, dtype=torch.float64)
    theta = torch.randn(d, dtype=torch.float64)

    def f(x):
        return 0.5 * x @ h @ x + b @ x

    grad = h @ theta + b
    for eps in (1.0, 1e-2):
        _, z, g = rge(f, theta, q=5, eps=eps)
        torch.testing.assert_close(g, z @ grad)


def test_rge_bias_on_a_non_quadratic_shrinks_as_eps_squared():
    theta = torch.tensor([0.3, -0.2, 0.5], dtype=torch.float64)

    def f(x):
        return torch.exp(x).sum()

    grad = torch.exp(theta)
    errors = []
    for eps in (1e-1, 5e-2):
        _, z, g = rge(f, theta, q=1, eps=eps, seed=3)
        errors.append(float((g - z @ grad).abs()))
    assert errors[0] / errors[1] == pytest.approx(4, rel=0.05)


@pytest.mark.parametrize("d,q", [(4, 1), (4, 8), (50, 1), (50, 16)])
def test_rge_error_follows_d_plus_one_over_q(d, q):
    """Monte Carlo over 20 000 estimates of a linear loss (no ε bias): mean squared error within 4% of
    (d + 1)‖g‖²/q. With d = 4 the alternative d‖g‖²/q is 20% lower, far outside the band."""
    gen = torch.Generator().manual_seed(d * 100 + q)
    grad = torch.randn(d, generator=gen, dtype=torch.float64)
    trials = 20_000
    z = torch.randn(trials, q, d, generator=gen, dtype=torch.float64)
    estimate = ((z @ grad)[..., None] * z).mean(1)
    error = float(((estimate - grad) ** 2).sum(1).mean())
    assert error == pytest.approx(rge_error_theory(d, q, float(grad @ grad)), rel=0.04)


def test_bf16_is_refused_with_the_reason():
    with pytest.raises(ValueError, match="bfloat16.*rounding"):
        check_zo_dtype([torch.zeros(2, dtype=torch.bfloat16)])
    with pytest.raises(ValueError, match="bfloat16"):
        mezo_step([torch.zeros(2, dtype=torch.bfloat16)], lambda: 0.0, [1], 1e-3, 1e-3)


def test_rge_rejects_bad_arguments():
    with pytest.raises(ValueError, match="q must be at least 1"):
        rge(lambda x: x.sum(), torch.zeros(3), q=0, eps=1e-3)
    with pytest.raises(ValueError, match="eps must be positive"):
        rge(lambda x: x.sum(), torch.zeros(3), q=1, eps=0.0)
    assert math.isclose(rge_error_theory(9, 2, 1.0), 5.0)
