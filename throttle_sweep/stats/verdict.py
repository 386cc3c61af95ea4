"""Drift-aware comparison of two arms: pure functions, no I/O.

Model: log(cost_i) = a + d * candidate_i + g * position_i + e_i, fitted by least squares. The position
term absorbs linear machine drift over the run, so an interleaved order estimates the arm effect d free
of it; exp(d) is the candidate/baseline cost ratio. The interval is t-based with n - 3 degrees of freedom
(honest for the handful of replicates a GPU budget allows). Verdicts compare the whole interval with the
decision thresholds:
  CHEAPER        upper bound < 1 - claim   (a one-sided claim at alpha/2; claim = max(min_effect, margin))
  PRICIER        lower bound > 1 + claim
  NO DIFFERENCE  interval inside [1 - claim, 1 + claim]
  INCONCLUSIVE   anything else, with how many more replicates per arm would likely decide
Each verdict is a fixed region the whole interval must lie in, and the regions do not overlap, so an
interval inside a decided one has its verdict: a saving claimed is one worth a change, and one pinned inside
the margin is never CHEAPER when measured loosely and NO DIFFERENCE when measured well.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence
from dataclasses import dataclass, field, replace

import numpy as np
from scipy import special

from throttle_sweep.errors import ConfigError
from throttle_sweep.stats.fit import JointFit, Observation, fit_joint
from throttle_sweep.stats.schedule import BASELINE, CANDIDATE, confounding


# Student's t and Fisher's F through scipy.special: the same functions as scipy.stats' distributions, without
# their generic machinery, which costs most of an estimate (benchmarks/stats_speed.py)
def t_quantile(q: float, df: float) -> float:
    return float(special.stdtrit(df, q))


def t_upper_tail(x: float, df: float) -> float:
    return float(special.stdtr(df, -x))


CHEAPER, PRICIER, NO_DIFFERENCE, INCONCLUSIVE = "CHEAPER", "PRICIER", "NO DIFFERENCE", "INCONCLUSIVE"
WITHHELD = "WITHHELD"  # the denominator moved: no verdict is honest
CONFOUNDING_WARN = 0.5


@dataclass(frozen=True)
class Thresholds:
    alpha: float = 0.05
    min_effect: float = 0.0
    equivalence_margin: float = 0.02

    @property
    def claim(self) -> float:
        """The one margin of every verdict: a difference smaller than it (or than min_effect, if larger) is
        not worth a change, so CHEAPER and PRICIER need the whole interval beyond it, NO DIFFERENCE inside."""
        return max(self.min_effect, self.equivalence_margin)

    def check(self, source: str = "compare") -> None:
        if not 0 < self.alpha < 1:
            raise ConfigError(f"{source}.alpha must be in (0, 1), but got {self.alpha!r}")
        if not 0 <= self.min_effect < 1:
            raise ConfigError(f"{source}.min_effect must be in [0, 1), but got {self.min_effect!r}")
        if not 0 <= self.equivalence_margin < 1:
            raise ConfigError(f"{source}.equivalence_margin must be in [0, 1), but got {self.equivalence_margin!r}")


@dataclass(frozen=True)
class Estimate:
    ratio: float
    ci_low: float
    ci_high: float
    p_value: float  # two-sided, for "ratio = 1"
    se_log: float
    df: int
    drift_per_position: float  # relative change of cost per run position, estimated
    confounding: float
    n_baseline: int
    n_candidate: int
    verdict: str
    more_replicates_per_arm: int | None = None
    warnings: tuple[str, ...] = field(default_factory=tuple)
    resid_var: float | None = None  # its own residual variance of log cost (what a sweep pools), not moderated
    resid_df: int | None = None  # ... and its own df

    @property
    def percent(self) -> tuple[float, float, float]:
        return (100 * (self.ratio - 1), 100 * (self.ci_low - 1), 100 * (self.ci_high - 1))


def check_observations(observations: Sequence[Observation], arms: Sequence[str] = (BASELINE, CANDIDATE)) -> None:
    unknown = {o.arm for o in observations} - set(arms)
    if unknown:
        raise ConfigError(f"arm must be 'baseline' or 'candidate', but got {sorted(unknown)}")
    for arm in arms:
        n = sum(o.arm == arm for o in observations)
        if n < 2:
            raise ConfigError(f"need at least 2 replicates of the {arm} arm, but got {n}")
    bad = [o for o in observations if not (math.isfinite(o.cost) and o.cost > 0)]
    if bad:
        raise ConfigError(f"cost must be a positive number, but got {bad[0].cost!r} at position {bad[0].position}")
    positions = [(o.segment, o.position) for o in observations]  # each schedule numbers its own runs
    if len(set(positions)) != len(positions):
        dup = sorted({p[1] for p in positions if positions.count(p) > 1})
        raise ConfigError(f"run positions must be unique, but {dup} occur more than once")


LACK_OF_FIT_P = 0.05


def lack_of_fit(observations: Sequence[Observation]) -> list[str]:
    """Warnings when the run order shows more than linear drift: an F-test of the linear model against one
    with curvature (position squared) and an odd/even rhythm, as far as the runs allow (two residual df
    kept). The verdict stays the linear model's: with a balanced schedule those patterns do not bias the
    ratio (simulated: coverage holds), so switching models on a pretest would only cost power. If the
    schedule is not balanced against a pattern, the ratio may carry it, and that is said too."""
    design = drift_design(tuple(float(o.position) for o in observations),
                          tuple(o.arm == CANDIDATE for o in observations))
    if design is None:
        return []
    kept, linear_hat, extended_hat, unbalanced = design
    y = np.log([o.cost for o in observations])

    def sse(hat: np.ndarray) -> float:
        resid = y - hat @ y
        return float(resid @ resid)

    linear, extended = sse(linear_hat), sse(extended_hat)
    df = len(y) - 3 - len(kept)
    if extended <= 1e-24 * max(linear, 1e-300):
        return []
    f = ((linear - extended) / len(kept)) / (extended / df)
    p = float(special.fdtrc(len(kept), df, f))
    if p >= LACK_OF_FIT_P:
        return []
    out = [f"the run order shows more than linear drift ({' or '.join(kept)}; F-test p = {p:.3f})"]
    if unbalanced:
        out[0] += (f"; the schedule is not balanced against the {' and '.join(unbalanced)}, so the ratio may "
                   "carry it: use compare.schedule=abba with a multiple of 4 replicates")
    else:
        out[0] += "; the schedule is balanced against it, so the ratio is not biased by it"
    return out


@functools.lru_cache(maxsize=512)
def drift_design(positions: tuple[float, ...], candidate: tuple[bool, ...]
                 ) -> tuple[tuple[str, ...], np.ndarray, np.ndarray, tuple[str, ...]] | None:
    """lack_of_fit's models for one run order, which depend on the order alone (cached: a sweep and its
    calibration studies judge the same few orders many times): the patterns the runs can test, the hat
    matrices of the linear and the extended model, and the patterns the schedule is not balanced against."""
    pos = np.array(positions)
    arm = np.array(candidate, dtype=float)
    pc = pos - pos.mean()
    # the rhythm of the machine is the parity of the run's position (a joint confirmation's view has gaps:
    # its runs' ranks alternate where their positions may not); positions that are not run indices (an
    # analyze input numbered 10, 20, ...) fall back to the rank in run order
    parity = pos % 2
    if not np.all(pos == np.round(pos)) or np.ptp(parity) == 0:
        parity = np.argsort(np.argsort(pos)) % 2
    extras = {"curvature": pc**2 - (pc**2).mean(), "odd/even rhythm": parity - parity.mean()}
    cols, kept = [np.ones(len(pos)), arm, pc], []
    for name, col in extras.items():
        trial = np.column_stack([*cols, col])
        if np.linalg.matrix_rank(trial) == trial.shape[1] and len(pos) - trial.shape[1] >= 2:
            cols.append(col)
            kept.append(name)
    if not kept:
        return None
    centred = arm - arm.mean()
    unbalanced = tuple(name for name, col in zip(kept, cols[3:], strict=True) if abs(col @ centred) > 1e-9)
    hats = tuple(x @ np.linalg.pinv(x) for x in (np.column_stack(cols[:3]), np.column_stack(cols)))
    for hat in hats:
        hat.setflags(write=False)
    return tuple(kept), hats[0], hats[1], unbalanced


def clearly_lower(a: Estimate, b: Estimate, alpha: float = 0.05) -> bool:
    """Is a's ratio below b's beyond doubt? A direct contrast of two comparisons against the same baseline:
    log(a) - log(b) with the Welch-Satterthwaite df, one-sided at alpha/2 (the test statistic study of the
    winner rule: names the tied, and rarely names a wrong one alone)."""
    var_a, var_b = a.se_log**2, b.se_log**2
    if var_a + var_b == 0:
        return a.ratio < b.ratio
    spread = sum(v**2 / e.df for v, e in ((var_a, a), (var_b, b)) if e.df > 0)
    df = (var_a + var_b) ** 2 / spread if spread > 0 else 1.0
    diff = math.log(a.ratio) - math.log(b.ratio)
    return diff + t_quantile(1 - alpha / 2, max(df, 1.0)) * math.sqrt(var_a + var_b) < 0


def decide(lo: float, hi: float, t: Thresholds) -> str:
    """An interval wholly inside the equivalence margin is NO DIFFERENCE even when it excludes 1: a saving
    the data pin below the margin is not worth a change, and calling it CHEAPER would say it is. For the
    same reason CHEAPER needs the whole interval beyond the margin too (`Thresholds.claim`)."""
    if t.claim > 0 and 1 - t.claim <= lo and hi <= 1 + t.claim:
        return NO_DIFFERENCE
    if hi < 1 - t.claim:
        return CHEAPER
    if lo > 1 + t.claim:
        return PRICIER
    return INCONCLUSIVE


def replicates_to_decide(est_log: float, se_log: float, n_per_arm: int, t: Thresholds,
                         limit: int = 200, power: float = 0.8) -> int | None:
    """More replicates per arm after which the interval clears a decision threshold with probability
    `power`, if the estimate and noise are what was measured (SE shrinks as 1/sqrt(n)): the half-width plus
    the `power` quantile of the estimate's own scatter must fit in the room left. None: not within `limit`."""
    room = [math.log(1 - t.claim) - est_log, est_log - math.log(1 + t.claim)]
    if t.claim > 0:
        room.append(min(math.log(1 + t.claim) - est_log, est_log - math.log(1 - t.claim)))
    best = max(room)
    if best <= 0 or not math.isfinite(se_log) or se_log <= 0:
        return None
    hits = np.nonzero(half_widths_per_se(n_per_arm, t.alpha, power, limit) * se_log < best)[0]
    return int(hits[0] + 1) if hits.size else None


@functools.lru_cache(maxsize=256)
def half_widths_per_se(n_per_arm: int, alpha: float, power: float, limit: int) -> np.ndarray:
    """replicates_to_decide's half-widths in units of today's SE, after 1..limit more replicates per arm
    (cached: they depend on the sizes alone, and 400 t quantiles per call were most of its time)."""
    n = np.arange(n_per_arm + 1, n_per_arm + limit + 1)
    df = 2 * n - 3
    half = (special.stdtrit(df, 1 - alpha / 2) + special.stdtrit(df, power)) * np.sqrt(n_per_arm / n)
    half.setflags(write=False)
    return half


@dataclass(frozen=True)
class Prior:
    """The noise of a sweep's other comparisons: residual variance `s2` on `df` prior degrees of freedom."""
    s2: float
    df: int
    comparisons: int


POOL_MIN = 4  # comparisons before their noise is pooled
POOL_OWN_DF_MIN = 3  # a comparison's own df before it is pooled
PRIOR_DF_MAX = 10  # the review's simulations: calibrated at about 10 prior df, under heavy tails and drift
GUARD_P = 0.10  # a comparison whose residuals are this improbable under the pool keeps its own noise (simulated:
# at 0.01 one +10% run among 8 at 2% noise gave 5.5% false verdicts a side, at 0.10 3.1%, while 6% of clean
# comparisons go unpooled)


def trigamma_inverse(y: float) -> float:
    """x with trigamma(x) = y (Newton's method from limma's starting point; trigamma decreases)."""
    if y > 1e7:
        return 1 / math.sqrt(y)
    if y < 1e-6:
        return 1 / y
    x = 0.5 + 1 / y
    for _ in range(50):
        tri = float(special.polygamma(1, x))
        step = tri * (1 - tri / y) / float(special.polygamma(2, x))
        x += step
        if -step / x < 1e-8:
            break
    return x


def pooled_prior(variances: Sequence[tuple[float | None, float]]) -> Prior | None:
    """The prior for a moderated t (Smyth 2004, limma's moment estimate): from (residual variance, df) of a
    sweep's comparisons, the scale s0^2 and the prior df d0 that their scatter beyond chance leaves (at most
    PRIOR_DF_MAX, whole df, at least 1). None with fewer than POOL_MIN comparisons, or variances that scatter
    too much to pool."""
    kept = [(s2, d) for s2, d in variances if s2 is not None and d and d > 0 and math.isfinite(s2) and s2 > 0]
    if len(kept) < POOL_MIN:
        return None
    d = np.array([k[1] for k in kept], dtype=float)
    e = np.log([k[0] for k in kept]) - special.digamma(d / 2) + np.log(d / 2)
    excess = float(np.var(e, ddof=1) - np.mean(special.polygamma(1, d / 2)))
    d0 = PRIOR_DF_MAX if excess <= 0 else min(PRIOR_DF_MAX, math.floor(2 * trigamma_inverse(excess)))
    if d0 < 1:
        return None
    s2 = math.exp(float(np.mean(e)) + float(special.digamma(d0 / 2)) - math.log(d0 / 2))
    return Prior(s2, int(d0), len(kept))


def estimate(observations: Sequence[Observation], thresholds: Thresholds = Thresholds(),
             prior: Prior | None = None) -> Estimate:
    """The drift-aware candidate/baseline cost ratio, its interval and the verdict. With a `prior` (the
    sweep's pooled noise), its residual variance is shrunk toward the prior's and its interval gets both
    df, unless its residuals disagree with the pool (one slow run, noise of its own): then its own alone."""
    check_observations(observations)
    joint = fit_joint(observations)
    coef, df = joint.coef, joint.df
    own_df = df
    se = float(math.sqrt(max(joint.cov[1, 1], 0.0))) if df > 0 else float("nan")
    scale = float(joint.unscaled[1, 1])  # se^2 = residual variance x scale
    own = joint.sigma2 if df > 0 and scale > 0 else None
    notes = []
    # not at a first look (B C C B: 1 own df): its end runs' leverage hides a slow run or a noisier comparison
    # from the guard, and the pool would cut the t quantile from 12.7 to 2.2 (review: 5-9% false verdicts)
    if prior is not None and own is not None and df >= POOL_OWN_DF_MIN:
        disagree = disagreement(observations, joint, prior)
        if disagree:
            notes.append(f"its residuals disagree with the noise pooled over {prior.comparisons} other comparisons "
                         f"({disagree}): judged on its own noise")
        else:
            moderated = (prior.df * prior.s2 + df * own) / (prior.df + df)
            se, df = math.sqrt(moderated * scale), df + prior.df
            notes.append(f"noise pooled with {prior.comparisons} other comparisons ({prior.df} prior df)")
    est = judged(float(coef[1]), se, df, float(coef[2]), observations, thresholds)
    return replace(est, resid_var=own, resid_df=own_df, warnings=est.warnings + tuple(notes))


def disagreement(observations: Sequence[Observation], joint: JointFit, prior: Prior) -> str | None:
    """Why this comparison's residuals (`joint`: its fit) do not fit the pooled noise, or None: its variance
    improbably large (an F-test), or one run improbably far from the fit (its residual studentized by the
    pooled noise, a Bonferroni t-test over the runs): a slow run that would otherwise hide in the pooled
    variance."""
    if prior.s2 <= 0:
        return "the pool has no noise"
    p = float(special.fdtrc(joint.df, prior.df, joint.sigma2 / prior.s2))
    if p < GUARD_P:
        return f"variance {joint.sigma2 / prior.s2:.1f}x theirs, F-test p = {p:.4f}"
    studentized = np.abs(joint.resid) / np.sqrt(prior.s2 * np.clip(1 - joint.leverage, 1e-12, None))
    worst = int(np.argmax(studentized))
    limit = t_quantile(1 - GUARD_P / (2 * len(observations)), prior.df)
    if studentized[worst] > limit:
        return (f"the run at position {observations[worst].position:g} is {studentized[worst]:.1f} pooled standard "
                f"deviations from the fit, beyond {limit:.1f}")
    return None


def estimate_joint(observations: Sequence[Observation], thresholds: Thresholds = Thresholds()) -> dict[str, Estimate]:
    """Each arm's ratio to the baseline from one fit over a joint schedule's runs (`fit_joint`): in a
    balanced joint schedule the same estimates as each arm's two-arm view, the drift from all the runs, and
    each arm's own noise (Welch-Satterthwaite df). Each arm's checks (lack of fit, confounding) are of its
    own view."""
    arms = sorted({o.arm for o in observations} - {BASELINE})
    check_observations(observations, [BASELINE, *arms])
    joint = fit_joint(observations)
    out = {}
    for arm in arms:
        view = [Observation(BASELINE if o.arm == BASELINE else CANDIDATE, o.position, o.cost)
                for o in observations if o.arm in (BASELINE, arm)]
        effect, se, df = joint.effect(arm)
        out[arm] = judged(effect, se, df, float(joint.coef[1 + len(joint.arms)]), view, thresholds)
    return out


def judged(effect: float, se: float, df: int, drift: float, observations: Sequence[Observation],
           thresholds: Thresholds) -> Estimate:
    """The interval, p-value, verdict and warnings for a fitted log ratio (`observations`: its two arms)."""
    if df > 0 and se <= 1e-12 * max(1.0, abs(effect)):
        se = 0.0  # a perfect fit up to rounding (a deterministic engine): no scatter to speak of
    tq = t_quantile(1 - thresholds.alpha / 2, df) if df > 0 else float("inf")
    lo, hi = math.exp(effect - tq * se), math.exp(effect + tq * se)
    if df > 0 and se > 0:
        p = 2 * t_upper_tail(abs(effect / se), df)
    else:  # a perfect fit: any effect at all is certain, none is no evidence (never NaN, which sorts nowhere)
        p = (0.0 if effect != 0 else 1.0) if df > 0 else float("nan")
    n_b = sum(o.arm == BASELINE for o in observations)
    n_c = len(observations) - n_b
    conf = confounding([o.arm for o in observations], [o.position for o in observations])
    warnings = []
    warnings.extend(lack_of_fit(observations))
    if conf > CONFOUNDING_WARN:
        warnings.append(f"the run order confounds arm with time (|corr(arm, position)| = {conf:.2f}): "
                        "drift and the flag cannot be told apart well; use an interleaved schedule")
    verdict = decide(lo, hi, thresholds)
    if verdict == NO_DIFFERENCE and (hi < 1 or lo > 1):
        small, large = (1 - hi, 1 - lo) if hi < 1 else (lo - 1, hi - 1)
        warnings.append(f"{'cheaper' if hi < 1 else 'pricier'} by {100 * small:.1f}% to {100 * large:.1f}%, inside "
                        f"the ±{100 * thresholds.claim:g}% equivalence margin: no difference worth a "
                        "change (compare.equivalence_margin sets the margin)")
    elif verdict == INCONCLUSIVE and (hi < 1 or lo > 1):
        small, large = (1 - hi, 1 - lo) if hi < 1 else (lo - 1, hi - 1)
        warnings.append(f"{'cheaper' if hi < 1 else 'pricier'} by {100 * small:.1f}% to {100 * large:.1f}%: beyond "
                        f"the noise, but it may lie inside the ±{100 * thresholds.claim:g}% margin a claim must clear, "
                        "where no difference is worth a change (compare.equivalence_margin and min_effect set it)")
    more = replicates_to_decide(effect, se, min(n_b, n_c), thresholds) if verdict == INCONCLUSIVE else None
    return Estimate(ratio=math.exp(effect), ci_low=lo, ci_high=hi, p_value=p, se_log=se, df=df,
                    drift_per_position=math.exp(drift) - 1, confounding=conf, n_baseline=n_b,
                    n_candidate=n_c, verdict=verdict, more_replicates_per_arm=more, warnings=tuple(warnings))
