"""The progress model of approximate rounds, checked against a simulation that does not use
the library: a quadratic loss with isotropic curvature ``L``, a cohort of ``k`` client
updates ``u_i = g + z_i`` (``g`` the gradient, ``z_i`` zero-mean noise), the exact update
their mean ``u``, an approximate one the mean ``v`` of ``k'`` of them chosen independently of
the data (which replies arrive does not depend on what they hold), and the server stepping
``rho`` times the best step for ``u``. Its expected loss decrease is
``1 - rho / (2 - rho) * E|v - u|^2 / E|u|^2`` of the exact update's (docs/adaptive.md, the
stated progress model): at the best step, one minus the ratio of expectations that
``error_power = 2``'s mean of ``e**2`` stands in for."""

from __future__ import annotations

import numpy as np
import pytest

DIM, K, SIGMA, CURVATURE = 12, 10, 0.6, 2.0


def _simulate(kept: int, rho: float, draws: int = 40_000) -> tuple[float, float]:
    """(expected loss decrease of ``v`` over that of ``u``, E|v - u|^2 / E|u|^2), by Monte
    Carlo; the step is ``rho`` times ``|g|^2 / (L E|u|^2)``, the best step for ``u``."""
    rng = np.random.default_rng([4, kept, int(rho * 100)])
    g = np.linspace(-0.5, 0.4, DIM)
    updates = g + SIGMA * rng.standard_normal((draws, K, DIM))
    u, v = updates.mean(axis=1), updates[:, :kept].mean(axis=1)
    second = float(np.mean(np.sum(u * u, axis=1)))
    step = rho * float(g @ g) / (CURVATURE * second)

    def decrease(x: np.ndarray) -> float:  # f(theta) - f(theta - step x), in expectation
        return float(np.mean(step * (x @ g) - CURVATURE * step ** 2 / 2 * np.sum(x * x, axis=1)))

    return decrease(v) / decrease(u), float(np.mean(np.sum((v - u) ** 2, axis=1))) / second


@pytest.mark.parametrize("kept", [3, 6, 9])
@pytest.mark.parametrize("rho", [1.0, 0.5, 0.2])
def test_a_data_independent_drop_costs_rho_over_two_minus_rho_of_its_squared_error(kept, rho):
    share, e2 = _simulate(kept, rho)
    # E|v - u|^2 / E|u|^2 worked out: sigma^2 d (1/k' - 1/k) over |g|^2 + sigma^2 d / k
    g2 = float(np.sum(np.linspace(-0.5, 0.4, DIM) ** 2))
    noise = SIGMA ** 2 * DIM
    assert e2 == pytest.approx(noise * (1 / kept - 1 / K) / (g2 + noise / K), rel=0.02)
    assert share == pytest.approx(1 - rho / (2 - rho) * e2, abs=0.01)
