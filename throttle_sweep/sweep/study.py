"""The Optuna study both sweeps keep: its sampler, and the study created or loaded to resume (the cost sweep's
commands/sweep.py, the goodput sweep's commands/goodput.py)."""

from __future__ import annotations

import numpy as np
import optuna
from sqlalchemy.exc import SQLAlchemyError

from throttle_sweep.errors import ConfigError


def make_sampler(name: str, seed: int, n_trials: int, *, parallel: bool = False, offset: int = 0
                 ) -> optuna.samplers.BaseSampler:
    """study.sampler's sampler; `offset`: the trials a resumed study holds (its sampler gets a seed of its own,
    well mixed: the same seed would propose the points it proposed last time again, and nearby seeds can start
    alike)."""
    if offset:
        seed = int(np.random.SeedSequence([seed, offset]).generate_state(1)[0])
    if name == "tpe":
        startup = max(3, min(10, n_trials // 3))
        # constraints (preemption, latency limits) reach the samplers through Trial.set_constraint (sweep/trials.py)
        return optuna.samplers.TPESampler(seed=seed, n_startup_trials=startup, constant_liar=parallel)
    if name == "gp":
        return optuna.samplers.GPSampler(seed=seed)
    return optuna.samplers.RandomSampler(seed=seed)  # random; grid: the sweep enqueues each point, this fills gaps


def open_study(name: str, storage: str | None, directions: list[str], sampler: optuna.samplers.BaseSampler, *,
               unset: str, objectives_from: str) -> optuna.Study:
    """Create the study, or load it to resume (`storage` None: in memory); refused if its objectives differ.
    `unset`: where the study lives without study.storage; `objectives_from`: what sets this sweep's objectives."""
    optuna.logging.set_verbosity(optuna.logging.WARNING)  # the sweep says what it opened, in its own words
    try:
        study = optuna.create_study(study_name=name, storage=storage, directions=directions, load_if_exists=True,
                                    sampler=sampler)
    except ValueError as exc:
        raise ConfigError(f"study {name!r} in {storage} cannot be opened: {exc}") from exc
    except (ImportError, OSError, SQLAlchemyError) as exc:  # no driver for the URL, a server that does not answer
        reason = str(getattr(exc, "orig", None) or exc).strip().splitlines()[0]
        raise ConfigError(f"study.storage={storage!r} cannot be opened ({type(exc).__name__}: {reason}); give an "
                          "Optuna storage URL that works here (sqlite:///path/study.db, or a database this "
                          f"machine can reach with its driver installed), or leave study.storage unset for "
                          f"{unset}") from None
    if len(study.directions) != len(directions):
        raise ConfigError(f"study {name!r} in {storage} has {len(study.directions)} objective(s), but "
                          f"{objectives_from} needs {len(directions)}; choose another study.name")
    return study


def left_running(study: optuna.Study) -> list[optuna.trial.Trial]:
    """Trials an earlier driver left RUNNING (killed, interrupted, or out of slots): this run owns them now."""
    stale = study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.RUNNING,))
    return [optuna.trial.Trial(study, t._trial_id) for t in stale]  # noqa: SLF001 - no public way
