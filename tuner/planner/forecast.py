"""The next interval's arrival rate, for the SLO planner (spec.autoscaling.forecast).

- `none`: the last interval's rate, as observed;
- `holt`: Holt's linear trend (double exponential smoothing: a level and a trend, each
  smoothed), fitted by statsmodels on the last WINDOW intervals' rates and projected
  `horizon` intervals ahead (1 + the replicas' start-up in intervals: what the replicas
  asked for now will serve; a falling trend one interval ahead), never below 0. A ramp is met with the replicas its next interval needs
  rather than the last one's; a flat rate forecasts itself. Until MIN_POINTS intervals have
  been seen, or when the fit fails, it is `none`'s answer.

Why Holt from statsmodels: the series a planner sees is short (one point per 30-s interval,
restarted with every new spec) and what it must anticipate is a trend, not a season; Holt
has two smoothing parameters, fits a few dozen points in milliseconds and needs no order
selection (ARIMA does, and is unstable on short series); Prophet models daily and weekly
seasonality and brings a Stan toolchain; a Kalman filter (filterpy) would be a hand-tuned
noise model in a package that is no longer maintained. statsmodels is maintained, on
conda-forge and PyPI, and already rests on the scipy and pandas this project installs.
"""
from __future__ import annotations

import warnings
from collections import deque

FORECASTS = ("none", "holt")
WINDOW = 30       # intervals the fit looks back over (15 minutes at 30 s)
MIN_POINTS = 4    # fewer: the last rate


class Forecaster:
    """One service's forecaster: `next(rate)` takes an interval's observed rate and returns
    the forecast for the next interval."""

    def __init__(self, method: str = "none", horizon: float = 1.0) -> None:
        if method not in FORECASTS:
            raise ValueError(f"forecast {method!r}: expected one of {FORECASTS}")
        if not horizon >= 1:
            raise ValueError(f"the forecast horizon must be >= 1 interval, got {horizon}")
        self.method, self.horizon = method, horizon
        self.rates: deque[float] = deque(maxlen=WINDOW)

    def next(self, rate: float) -> float:
        self.rates.append(rate)
        if self.method == "none" or len(self.rates) < MIN_POINTS:
            return rate
        return max(0.0, holt(list(self.rates), fallback=rate, horizon=self.horizon))


def holt(series: list[float], *, fallback: float, horizon: float = 1.0) -> float:
    """Holt's forecast of `series` `horizon` steps ahead (its level plus the horizon times
    its trend: a fraction of a step too) when it rises, one step ahead when it falls;
    fallback when it cannot be fitted."""
    if max(series) == min(series):   # flat: its own forecast (and no fit to fail)
        return series[-1]
    from statsmodels.tsa.holtwinters import Holt

    try:
        with warnings.catch_warnings():   # short series: convergence notes, not errors
            warnings.simplefilter("ignore")
            fit = Holt(series, initialization_method="estimated").fit()
        one, two = (float(v) for v in fit.forecast(2))
        # a falling trend is not projected past the next interval: replicas removed go at
        # once (the start-up delays only those added), and the next decision can add back
        value = max(one, one + (horizon - 1) * (two - one))
    except (ValueError, ArithmeticError, RuntimeError):
        return fallback
    return value if value == value else fallback   # NaN from a degenerate fit
